// Fused scaled-dot-product attention on the CPU (FlashAttention-2 arrangement), forward and
// backward, with dropout drawn inside the kernel.
//
// For q [B, H, Tq, D], k and v [B, H, Tk, D]:
//   S = scale * q k^T      (row i of a head sees key j <= i only when causal: PyTorch's top-left mask)
//   P = softmax(S) per row, then dropout: P~ = P * keep / (1 - p)
//   O = P~ v              [B, H, Tq, D]
//   LSE = log(sum_j exp(S_ij)) per row, [B, H, Tq]: all the backward needs to rebuild P.
// Neither S nor P is ever stored: each thread holds one tile of scores at a time. A row that sees
// no key at all (Tk == 0) gets O = 0 and LSE = -inf, and a zero gradient.
//
// Dropout's keep of element (b, h, i, j) is philox_dropout_uniform(seed, e, offset) >= float(p)
// with e = ((b * H + h) * Tq + i) * Tk + j: the same draw mg::dropout makes for element e of a
// contiguous [B, H, Tq, Tk] tensor, so the composed path with the same generator state drops the
// same elements, and the backward regenerates the mask from (seed, offset) alone.
//
// AttentionProblem and AttentionStrides are in kernels/kernel_args.h (shared with the CUDA twin,
// kernels/cuda/attention.cu).
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// o: [B, H, Tq, D] contiguous, of `dtype`; lse: [B, H, Tq] contiguous, of attention_stats_dtype.
// dtype: f32, f64, f16 or bf16 (halves are widened to f32 tile by tile).
void attention_forward(DType dtype, const AttentionProblem& p, const void* q, AttentionStrides q_strides,
                       const void* k, AttentionStrides k_strides, const void* v, AttentionStrides v_strides,
                       void* o, void* lse);

// Given the forward's o (contiguous) and lse and the output gradient dout (strided like q), writes
// dq [B, H, Tq, D], dk and dv [B, H, Tk, D] (contiguous, overwritten). delta is a workspace of
// B * H * Tq elements of attention_stats_dtype (it receives rowsum(dout * o)). Deterministic: every
// output element is written by one thread, summing in a fixed order.
void attention_backward(DType dtype, const AttentionProblem& p, const void* q, AttentionStrides q_strides,
                        const void* k, AttentionStrides k_strides, const void* v, AttentionStrides v_strides,
                        const void* o, const void* lse, const void* dout, AttentionStrides dout_strides,
                        void* delta, void* dq, void* dk, void* dv);

}  // namespace mg::kernels::cpu
