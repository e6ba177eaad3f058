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
// (f16 / bf16 accumulate in f32 tiles). CUDA tensors run its twin (kernels/cuda/attention.cu; on
// tensor cores for bf16/f16 at D = 64 or 128, attention_tensor_core*.cu). No autocast policy: the
// op runs in the dtype of its inputs. See docs/attention.md.
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
// benchmarks, and GPTConfig::attention = composed.
Tensor scaled_dot_product_attention_composed(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options = {});

// ---- attention over blocks of keys: what ring attention is built from ------------------------
// The fused kernels without autograd or dropout, for attention whose keys and values are split
// into blocks held apart (context parallelism keeps one block per rank and passes them around a
// ring). A block's result is exact over its own keys; merge_attention_blocks combines the results
// over two disjoint key sets into the result over their union, exactly, through the log-sum-exp;
// attention_block_backward gives one block's share of the gradients from the merged out and lse
// (the forward's P rebuilt as exp(S - lse) with the whole row's lse), and the shares over all
// blocks sum to the whole attention's gradients: dq is the sum of the blocks' dq, each block's dk
// and dv are its keys' gradients. `causal` masks a block as the op does (top-left aligned), which
// is what a block of keys at the same positions as the queries (the diagonal block) needs; a
// block wholly before the queries is unmasked, one wholly after them is not computed at all.
struct AttentionBlock {
  Tensor out;  // [B, H, Tq, D] of q's dtype, contiguous
  Tensor lse;  // [B, H, Tq] (f32; f64 for f64): log sum_j exp(S_ij) over the keys; -inf where none
};

AttentionBlock attention_block_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                       std::optional<double> scale = std::nullopt);

// The result over the union of two disjoint key sets; a row that saw no key in either keeps out = 0
// and lse = -inf.
AttentionBlock merge_attention_blocks(const AttentionBlock& a, const AttentionBlock& b);

struct AttentionBlockGrads {
  Tensor dq;      // [B, H, Tq, D]: this block's share of q's gradient
  Tensor dk, dv;  // [B, H, Tk, D]: the gradients of this block's keys and values from these queries
};

// `merged`: the out and lse over every block; dout: the gradient of the loss with respect to it.
AttentionBlockGrads attention_block_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionBlock& merged, const Tensor& dout,
                                             bool causal = false, std::optional<double> scale = std::nullopt);

}  // namespace mg
