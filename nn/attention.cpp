// CausalSelfAttention: projections and head views around causal_attention, which runs the fused
// scaled_dot_product_attention or, selected, the composed matmul, where, softmax and dropout (the
// header's formulas step by step, differentiated by autograd).
#include "nn/attention.h"

#include <cmath>
#include <limits>

#include "core/ops.h"

namespace mg::nn {

CausalSelfAttention::CausalSelfAttention(int64_t embd, int64_t heads, double p, AttentionImpl attention_impl)
    : n_embd(embd),
      n_head(heads),
      dropout_p(p),
      impl(attention_impl),
      c_attn(embd, 3 * embd),
      c_proj(embd, embd),
      attn_dropout(p),
      resid_dropout(p) {
  MG_CHECK(heads > 0 && embd % heads == 0, "CausalSelfAttention: n_embd ", embd,
           " must be divisible by n_head ", heads);
  register_module("c_attn", c_attn);
  register_module("c_proj", c_proj);
  register_module("attn_dropout", attn_dropout);
  register_module("resid_dropout", resid_dropout);
}

Tensor CausalSelfAttention::causal_mask(int64_t T, Device device) {
  const TensorOptions idx{DType::i64, device, false};
  return ge(arange(T, idx).unsqueeze(1), arange(T, idx).unsqueeze(0));  // row = query i, column = key j
}

Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, Dropout& attn_dropout,
                        AttentionImpl impl) {
  if (impl == AttentionImpl::fused) {
    // The fused kernel: the same function without storing the [T, T] scores. Its dropout draws one
    // generator call, as attn_dropout would, and the same mask for the same generator state.
    const double p = attn_dropout.is_training() ? attn_dropout.p : 0.0;
    return mg::scaled_dot_product_attention(q, k, v, AttentionOptions{true, p, std::nullopt});
  }
  const int64_t T = q.size(-2), D = q.size(-1);
  Tensor att = mul(matmul(q, k.transpose(-2, -1)), 1.0 / std::sqrt(static_cast<double>(D)));  // [B, H, T, T]
  const Tensor minus_inf =
      full({}, -std::numeric_limits<double>::infinity(), TensorOptions{att.dtype(), att.device()});
  att = where(CausalSelfAttention::causal_mask(T, q.device()), att, minus_inf);
  att = attn_dropout(softmax(att, -1));
  return matmul(att, v);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  return mg::scaled_dot_product_attention(q, k, v, options);
}

Tensor CausalSelfAttention::forward(const Tensor& x) {
  MG_CHECK(x.defined() && x.dim() == 3 && x.size(2) == n_embd, "CausalSelfAttention: expected input [B, T, ",
           n_embd, "], got ", x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const int64_t B = x.size(0), T = x.size(1), C = n_embd, H = n_head, D = C / H;

  std::vector<Tensor> qkv = split(c_attn(x), C, /*dim=*/2);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };  // [B, H, T, D]
  Tensor q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);

  Tensor y =
      causal_attention(q, k, v, attn_dropout, impl).transpose(1, 2).reshape({B, T, C});  // heads side by side
  return resid_dropout(c_proj(y));
}

std::shared_ptr<Module> CausalSelfAttention::clone_empty() const {
  return std::make_shared<CausalSelfAttention>(n_embd, n_head, dropout_p, impl);
}

std::string CausalSelfAttention::extra_repr() const {
  return str_cat("n_embd=", n_embd, ", n_head=", n_head, ", dropout=", dropout_p,
                 impl == AttentionImpl::composed ? ", attention=composed" : "");
}

}  // namespace mg::nn
