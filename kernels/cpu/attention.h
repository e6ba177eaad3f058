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
// The argument struct lives here until a CUDA twin exists; it then moves to kernels/kernel_args.h.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mg::kernels::cpu {

// Element (b, h, t, d) of an operand is at b * batch + h * head + t * row + d: the last dim must
// be contiguous (stride 1), every other stride is free (e.g. a transpose(1, 2) of [B, T, H, D]).
struct AttentionStrides {
  int64_t batch = 0, head = 0, row = 0;
};

struct AttentionProblem {
  int64_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0;
  double scale = 1.0;
  bool causal = false;
  double dropout_p = 0.0;  // in [0, 1]; 0 draws nothing
  uint64_t seed = 0, offset = 0;
};

// The dtype of LSE and of the backward's row workspace: f64 for f64 inputs, f32 otherwise.
inline DType attention_stats_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

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
