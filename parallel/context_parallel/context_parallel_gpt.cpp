// The context-parallel GPT: TinyGPT's forward on this rank's positions, with the attention of
// every block replaced by ring or Ulysses attention over the group (the header draws it).
#include "parallel/context_parallel/context_parallel_gpt.h"

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "core/ops.h"
#include "nn/transformer.h"
#include "parallel/context_parallel/ulysses_attention.h"

namespace mg::parallel {
namespace {

ContextLayout default_layout(const ContextParallelOptions& options) {
  if (options.layout) return *options.layout;
  return options.attention == ContextAttention::ring ? ContextLayout::zigzag : ContextLayout::contiguous;
}

}  // namespace

int64_t context_padded_length(int64_t T, int world, ContextLayout layout) {
  MG_CHECK(T >= 1 && world >= 1, "context_padded_length: T ", T, " and world ", world, " must be positive");
  const int64_t multiple = int64_t{world} * (layout == ContextLayout::zigzag ? 2 : 1);
  return (T + multiple - 1) / multiple * multiple;
}

ContextParallelGPT::ContextParallelGPT(nn::TinyGPT& gpt, ProcessGroup group, ContextParallelOptions options)
    : gpt_(gpt), group_(std::move(group)), options_(options), layout_(default_layout(options)) {
  MG_CHECK(group_.defined(), "ContextParallelGPT: the process group is undefined");
  const nn::GPTConfig& c = gpt_.config;
  if (options_.attention == ContextAttention::ulysses) {
    MG_CHECK(layout_ == ContextLayout::contiguous,
             "ContextParallelGPT: Ulysses attention takes the contiguous layout (each rank's all-to-all "
             "part must be one run of positions)");
    MG_CHECK(c.n_head % group_.size() == 0, "ContextParallelGPT: Ulysses needs n_head (", c.n_head,
             ") divisible by the ", group_.size(), " ranks of the group");
  } else {
    MG_CHECK(c.dropout == 0.0,
             "ContextParallelGPT: ring attention has no attention dropout; build the GPT "
             "with dropout 0 (got ",
             c.dropout, ")");
  }
  MG_CHECK(!c.checkpoint_activations,
           "ContextParallelGPT: checkpoint_activations is not supported (the "
           "recomputed blocks would have to repeat the ring's transfers)");
  register_module("gpt", gpt_);
}

std::string ContextParallelGPT::extra_repr() const {
  return str_cat(options_.attention == ContextAttention::ring ? "ring" : "ulysses", " attention over ",
                 group_.size(), " ranks, ", layout_ == ContextLayout::zigzag ? "zigzag" : "contiguous",
                 " layout");
}

ContextBatch context_parallel_batch(const Tensor& inputs, const Tensor& targets, const ProcessGroup& group,
                                    ContextLayout layout, int64_t block_size) {
  MG_CHECK(inputs.defined() && targets.defined() && inputs.dim() == 2 && targets.shape() == inputs.shape() &&
               is_integral(inputs.dtype()) && is_integral(targets.dtype()),
           "context_parallel_batch: expected inputs and targets [B, T] of token ids, got ",
           inputs.defined() ? shape_str(inputs.shape()) : std::string("undefined"), " and ",
           targets.defined() ? shape_str(targets.shape()) : std::string("undefined"));
  const int64_t B = inputs.size(0), T = inputs.size(1);
  MG_CHECK(T <= block_size, "context_parallel_batch: sequence length ", T, " exceeds block_size ",
           block_size);
  const int world = group.size();
  const int64_t padded = context_padded_length(T, world, layout);
  Tensor x = inputs, y = targets;
  if (padded > T) {
    const TensorOptions i64{DType::i64, inputs.device()};
    x = cat({inputs.to(DType::i64), full({B, padded - T}, 0, i64)}, 1);
    y = cat({targets.to(DType::i64), full({B, padded - T}, -100, i64)}, 1);  // ignore_index: no loss
  }
  return {context_shard(x, 1, group.rank(), world, layout), context_shard(y, 1, group.rank(), world, layout),
          B * T};
}

Tensor context_positions(int64_t local, const ProcessGroup& group, ContextLayout layout, int64_t block_size,
                         Device device) {
  const int world = group.size();
  const int64_t padded = local * world;
  MG_CHECK(padded <= context_padded_length(block_size, world, layout), "context parallelism: ", local,
           " positions on each of ", world, " ranks exceed block_size ", block_size,
           " (padded); cut the batch with context_parallel_batch");
  MG_CHECK(padded == context_padded_length(padded, world, layout), "context parallelism: ", local,
           " positions per rank do not split into the zigzag's two chunks; cut the batch with "
           "context_parallel_batch");
  // This rank's positions, taken as context_shard takes its tokens; those past the model's block
  // size are padding and take the last real embedding row.
  std::vector<int64_t> positions =
      context_shard(arange(padded, TensorOptions{DType::i64}), 0, group.rank(), world, layout)
          .to_vector<int64_t>();
  for (int64_t& p : positions) p = std::min(p, block_size - 1);
  return tensor<int64_t>(positions, {local}, TensorOptions{DType::i64, device});
}

ContextBatch ContextParallelGPT::context_parallel_batch(const Tensor& inputs, const Tensor& targets) const {
  return parallel::context_parallel_batch(inputs, targets, group_, layout_, gpt_.config.block_size);
}

Tensor ContextParallelGPT::attention(nn::CausalSelfAttention& a, const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = a.n_embd, H = a.n_head, D = C / H;
  std::vector<Tensor> qkv = split(a.c_attn(x), C, /*dim=*/2);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2).contiguous(); };
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
  Tensor y;
  if (options_.attention == ContextAttention::ring) {
    RingAttentionOptions ring;
    ring.causal = true;
    ring.layout = layout_;
    ring.stats = options_.stats;
    y = ring_attention(q, k, v, group_, ring);
  } else {
    const double p = a.attn_dropout.is_training() ? a.attn_dropout.p : 0.0;
    y = ulysses_attention(q, k, v, group_, AttentionOptions{true, p, std::nullopt});
  }
  return a.resid_dropout(a.c_proj(y.transpose(1, 2).reshape({B, T, C})));
}

Tensor ContextParallelGPT::forward(const Tensor& idx) {
  MG_CHECK(
      idx.defined() && idx.dim() == 2 && is_integral(idx.dtype()),
      "ContextParallelGPT: expected this rank's token ids [B, T/N] (i64), got ",
      idx.defined() ? str_cat(shape_str(idx.shape()), " ", idx.dtype()) : std::string("an undefined tensor"));
  const Tensor pos = context_positions(idx.size(1), group_, layout_, gpt_.config.block_size, idx.device());
  Tensor x = gpt_.drop(add(gpt_.wte(idx), gpt_.wpe(pos)));
  for (const auto& module : gpt_.h) {
    auto& block = dynamic_cast<nn::TransformerBlock&>(*module);
    // The block's own hooks see a call of the block (FSDP gathers a block unit in them).
    x = block.call_with_hooks(x, [&](const Tensor& in) {
      Tensor h = add(in, attention(block.attn, block.ln_1(in)));
      return add(h, block.mlp(block.ln_2(h)));
    });
  }
  return gpt_.lm_head(gpt_.ln_f(x));
}

}  // namespace mg::parallel
