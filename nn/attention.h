// CausalSelfAttention: multi-head self-attention where position t only sees
// positions <= t (GPT's decoder attention). For x [B, T, C] with H heads of size
// D = C / H:
//
//   q, k, v = split(c_attn(x), C)                     each [B, T, C] -> [B, H, T, D]
//   att     = q k^T / sqrt(D)                         [B, H, T, T]
//   att     = where(key <= query, att, -inf)          the causal mask
//   att     = dropout(softmax(att, -1))
//   y       = att v                                   [B, H, T, D] -> [B, T, C]
//   out     = dropout(c_proj(y))
//
// The parameter names follow nanoGPT (c_attn: [3C, C], c_proj: [C, C]); PyTorch's
// nn.MultiheadAttention packs the same three projections as in_proj_weight [3C, C].
//
// scaled_dot_product_attention(q, k, v, {causal, dropout_p, scale}) is the functional form
// (PyTorch's torch.nn.functional name): fused on the CPU and on CUDA, never storing the [Tq, Tk]
// scores; core/attention.h has its contract. causal_attention (so CausalSelfAttention, TinyGPT
// and the tensor-parallel attention) runs it by default; AttentionImpl::composed selects the steps
// above instead, the reference the tests compare with.
#pragma once

#include "core/attention.h"
#include "nn/dropout.h"
#include "nn/linear.h"
#include "nn/module.h"

namespace mg::nn {

// How causal_attention computes: the fused kernel, or the composed ops (matmul, where, softmax,
// dropout, matmul) that store the [T, T] scores. Both draw the same dropout mask from the same
// generator state, so they agree to rounding.
enum class AttentionImpl { fused, composed };

// q [B, H, Tq, D], k and v [B, H, Tk, D] -> [B, H, Tq, D]: softmax(q k^T * scale, causal mask)
// with dropout (whenever options.dropout_p > 0), times v. mg::scaled_dot_product_attention.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// The middle of attention, for q, k, v [B, H, T, D] -> [B, H, T, D]: softmax(q k^T / sqrt(D))
// masked causally, dropout (attn_dropout's p in training mode, none in eval), times v, computed as
// `impl` says. Shared by CausalSelfAttention and the tensor-parallel attention
// (parallel/tensor_parallel/tensor_parallel_gpt.h), which runs it on its own heads only.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v, Dropout& attn_dropout,
                        AttentionImpl impl = AttentionImpl::fused);

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(int64_t n_embd, int64_t n_head, double dropout = 0.0,
                      AttentionImpl impl = AttentionImpl::fused);
  Tensor forward(const Tensor& x) override;  // [B, T, n_embd] -> [B, T, n_embd]
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;

  // [T, T] bool, true where query i may attend to key j (j <= i).
  static Tensor causal_mask(int64_t T, Device device);

  const int64_t n_embd, n_head;
  const double dropout_p;
  const AttentionImpl impl;
  Linear c_attn;  // q, k, v projections, stacked: [3 n_embd, n_embd]
  Linear c_proj;  // output projection
  Dropout attn_dropout, resid_dropout;
};

}  // namespace mg::nn
