// The tensor-parallel GPT: TinyGPT's forward with each block's attention and MLP cut into this
// rank's heads and hidden features; the layout and the communication are in the header.
#include "parallel/tensor_parallel/tensor_parallel_gpt.h"

#include "base/error.h"
#include "core/ops.h"
#include "nn/activation_checkpoint.h"
#include "nn/attention.h"
#include "parallel/context_parallel/context_parallel_gpt.h"

namespace mg::parallel {
namespace {

// A replicated layer: the same values as the single-device one.
void copy_values(nn::Module& replica, const nn::Module& full) { replica.load_state_dict(full.state_dict()); }

}  // namespace

// ---- TensorParallelAttention -------------------------------------------------------------------

TensorParallelAttention::TensorParallelAttention(const nn::CausalSelfAttention& full, ProcessGroup group,
                                                 ProcessGroup context)
    : n_embd(full.n_embd),
      n_head(full.n_head),
      heads_per_rank(group.defined() && group.size() > 0 ? full.n_head / group.size() : 0),
      dropout_p(full.dropout_p),
      impl(full.impl),
      attn_dropout(full.dropout_p),
      resid_dropout(full.dropout_p),
      group_(std::move(group)),
      context_(std::move(context)) {
  MG_CHECK(group_.defined(), "TensorParallelAttention: the process group is undefined");
  MG_CHECK(!context_.defined() || dropout_p == 0.0,
           "TensorParallelAttention: ring attention over a context group has no attention dropout; build "
           "the GPT with dropout 0 (got ",
           dropout_p, ")");
  MG_CHECK(n_head % group_.size() == 0, "TensorParallelAttention: n_head ", n_head,
           " does not divide over the group's ", group_.size(), " ranks");
  c_attn = register_module("c_attn",
                           std::make_shared<ColumnParallelLinear>(full.c_attn, group_,
                                                                  /*gather_output=*/false, /*blocks=*/3));
  c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(full.c_proj, group_));
  register_module("attn_dropout", attn_dropout);
  register_module("resid_dropout", resid_dropout);
}

Tensor TensorParallelAttention::forward(const Tensor& x) {
  MG_CHECK(x.defined() && x.dim() == 3 && x.size(2) == n_embd,
           "TensorParallelAttention: expected input [B, T, ", n_embd, "], got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const int64_t B = x.size(0), T = x.size(1), D = n_embd / n_head, H = heads_per_rank;
  std::vector<Tensor> qkv = split((*c_attn)(x), H * D, /*dim=*/2);  // this rank's q, k, v: [B, T, H D]
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };
  Tensor y;
  if (context_.defined() && context_.size() > 1) {  // this rank's heads, the sequence over the ring
    RingAttentionOptions ring;
    ring.causal = true;
    ring.layout = ContextLayout::zigzag;
    y = ring_attention(heads(qkv[0]).contiguous(), heads(qkv[1]).contiguous(), heads(qkv[2]).contiguous(),
                       context_, ring);
  } else {
    y = nn::causal_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), attn_dropout, impl);
  }
  return resid_dropout((*c_proj)(y.transpose(1, 2).reshape({B, T, H * D})));  // c_proj sums over ranks
}

std::shared_ptr<nn::Module> TensorParallelAttention::clone_empty() const {
  return std::make_shared<TensorParallelAttention>(nn::CausalSelfAttention(n_embd, n_head, dropout_p, impl),
                                                   group_, context_);
}

std::string TensorParallelAttention::extra_repr() const {
  return str_cat("n_embd=", n_embd, ", n_head=", n_head, " (", heads_per_rank, " on this rank of ",
                 group_.size(), "), dropout=", dropout_p);
}

// ---- TensorParallelTransformerMLP --------------------------------------------------------------

TensorParallelTransformerMLP::TensorParallelTransformerMLP(const nn::TransformerMLP& full, ProcessGroup group)
    : n_embd(full.n_embd), dropout_p(full.dropout_p), dropout(full.dropout_p), group_(std::move(group)) {
  c_fc = register_module("c_fc", std::make_shared<ColumnParallelLinear>(full.c_fc, group_));
  register_module("gelu", gelu);
  c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(full.c_proj, group_));
  register_module("dropout", dropout);
}

Tensor TensorParallelTransformerMLP::forward(const Tensor& x) { return dropout((*c_proj)(gelu((*c_fc)(x)))); }

std::shared_ptr<nn::Module> TensorParallelTransformerMLP::clone_empty() const {
  return std::make_shared<TensorParallelTransformerMLP>(nn::TransformerMLP(n_embd, dropout_p), group_);
}

// ---- TensorParallelBlock -----------------------------------------------------------------------

TensorParallelBlock::TensorParallelBlock(const nn::TransformerBlock& full, ProcessGroup group,
                                         ProcessGroup context)
    : n_embd(full.n_embd),
      n_head(full.n_head),
      dropout_p(full.dropout_p),
      ln_1(full.n_embd),
      ln_2(full.n_embd),
      group_(std::move(group)),
      context_(std::move(context)) {
  copy_values(ln_1, full.ln_1);
  copy_values(ln_2, full.ln_2);
  register_module("ln_1", ln_1);
  attn = register_module("attn", std::make_shared<TensorParallelAttention>(full.attn, group_, context_));
  register_module("ln_2", ln_2);
  mlp = register_module("mlp", std::make_shared<TensorParallelTransformerMLP>(full.mlp, group_));
}

Tensor TensorParallelBlock::forward(const Tensor& x) {
  Tensor h = add(x, (*attn)(ln_1(x)));
  return add(h, (*mlp)(ln_2(h)));
}

std::shared_ptr<nn::Module> TensorParallelBlock::clone_empty() const {
  return std::make_shared<TensorParallelBlock>(nn::TransformerBlock(n_embd, n_head, dropout_p, attn->impl),
                                               group_, context_);
}

// ---- TensorParallelGPT -------------------------------------------------------------------------

TensorParallelGPT::TensorParallelGPT(nn::GPTConfig c, ProcessGroup group)
    : TensorParallelGPT(nn::TinyGPT(c), std::move(group)) {}

TensorParallelGPT::TensorParallelGPT(const nn::TinyGPT& full, ProcessGroup group, ProcessGroup context)
    : generator_before_(generator_state()),
      config(full.config),
      wte(full.config.vocab_size, full.config.n_embd),
      wpe(full.config.block_size, full.config.n_embd),
      drop(full.config.dropout),
      ln_f(full.config.n_embd),
      lm_head(full.config.n_embd, full.config.vocab_size, /*bias=*/false),
      group_(std::move(group)),
      context_(std::move(context)) {
  MG_CHECK(!context_.defined() || !full.config.checkpoint_activations,
           "TensorParallelGPT: checkpoint_activations with a context group is not supported (the recomputed "
           "blocks would have to repeat the ring's transfers)");
  copy_values(wte, full.wte);
  copy_values(wpe, full.wpe);
  copy_values(ln_f, full.ln_f);
  copy_values(lm_head, full.lm_head);
  register_module("wte", wte);
  register_module("wpe", wpe);
  register_module("drop", drop);
  for (size_t i = 0; i < full.h.size(); ++i)
    h.emplace_back<TensorParallelBlock>(dynamic_cast<const nn::TransformerBlock&>(full.h[i]), group_,
                                        context_);
  register_module("h", h);
  register_module("ln_f", ln_f);
  register_module("lm_head", lm_head);
  set_generator_state(generator_before_);
}

Tensor TensorParallelGPT::forward(const Tensor& idx) {
  MG_CHECK(
      idx.defined() && idx.dim() == 2 && is_integral(idx.dtype()),
      "TensorParallelGPT: expected token ids [B, T] (i64), got ",
      idx.defined() ? str_cat(shape_str(idx.shape()), " ", idx.dtype()) : std::string("an undefined tensor"));
  const int64_t T = idx.size(1);
  Tensor positions;
  if (context_.defined()) {  // this rank's positions of the padded sequence
    positions = context_positions(T, context_, ContextLayout::zigzag, config.block_size, idx.device());
  } else {
    MG_CHECK(T <= config.block_size, "TensorParallelGPT: sequence length ", T, " exceeds block_size ",
             config.block_size);
    positions = arange(T, TensorOptions{DType::i64, idx.device()});
  }
  Tensor x = drop(add(wte(idx), wpe(positions)));
  // As TinyGPT: checkpoint_activations recomputes each block in backward -- its all-reduces too, on
  // every rank in the same order, since every rank recomputes the same blocks.
  for (const auto& block : h)
    x = config.checkpoint_activations ? nn::checkpoint_module(*block, x) : (*block)(x);
  return lm_head(ln_f(x));
}

std::shared_ptr<nn::Module> TensorParallelGPT::clone_empty() const {
  return std::make_shared<TensorParallelGPT>(nn::TinyGPT(config), group_, context_);
}

}  // namespace mg::parallel
