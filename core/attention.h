// scaled_dot_product_attention: PyTorch's torch.nn.functional.scaled_dot_product_attention.
//
//   q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, D]  ->  [B, H, Tq, D]
//   out = dropout(softmax(q k^T * scale + mask), dropout_p) v
//
// scale defaults to 1 / sqrt(D). causal masks key j for query i when j > i (PyTorch's is_causal:
// the mask is aligned to the top left, also when Tq != Tk). A query row that sees no key (Tk == 0)
// gives 0, and a zero gradient, never NaN. The value dim must equal D. Dropout is applied whenever
// dropout_p > 0 (as PyTorch's function does: a module passes 0 in eval mode); its mask is drawn
// from the default generator exactly as mg::dropout would draw it for the [B, H, Tq, Tk]
// probabilities, so the fused and the composed path drop the same elements for the same state.
//
// CPU tensors run the fused kernel (kernels/cpu/attention.h): the [Tq, Tk] scores are never
// stored, only O and one log-sum-exp per row, and the backward rebuilds the probabilities from
// them. q, k, v may be strided views (a transpose(1, 2) of [B, T, H, D]) read in place when their
// last dim is contiguous; otherwise they are copied to contiguous first. Any floating dtype
// (f16 / bf16 accumulate in f32 tiles). CUDA tensors take the composed path for now (matmul,
// where, softmax, dropout, matmul), which does store the scores. No autocast policy: the op runs in
// the dtype of its inputs. See docs/attention.md.
#pragma once

#include <optional>

#include "core/tensor.h"

namespace mg {

struct AttentionOptions {
  bool causal = false;
  double dropout_p = 0.0;
  std::optional<double> scale;  // default 1 / sqrt(D)
};

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// The same function composed from general ops (matmul, mul, where, softmax, dropout, matmul), on
// any device; it materialises the [B, H, Tq, Tk] scores. The fused path's reference in tests and
// benchmarks, and what CUDA tensors run until the fused CUDA kernel exists.
Tensor scaled_dot_product_attention_composed(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options = {});

}  // namespace mg
