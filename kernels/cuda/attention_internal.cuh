// What the two attention files share: attention.cu (the CUDA-core kernels, the backward, the entry
// points) and attention_tensor_core.cu (the forward on tensor cores). Semantics:
// kernels/cpu/attention.h.
#pragma once

#include <cstdint>

#include "base/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/kernel_args.h"

namespace mg::kernels::cuda::attention_internal {

// One operand: element (b, h, t, d) at base + b * batch + h * head + t * row + d (the last dim
// contiguous). vector_ok: every row starts 16-byte aligned, so a row can move in 16-byte pieces.
template <class T>
struct View {
  const T* base;
  int64_t batch, head, row;
  bool vector_ok;
  __host__ __device__ __forceinline__ const T* at(int64_t b, int64_t h, int64_t t) const {
    return base + b * batch + h * head + t * row;
  }
};

template <class T>
View<T> make_view(const void* base, const AttentionStrides& s) {
  const bool aligned = aligned16(base) && s.batch % (16 / int64_t(sizeof(T))) == 0 &&
                       s.head % (16 / int64_t(sizeof(T))) == 0 && s.row % (16 / int64_t(sizeof(T))) == 0;
  return View<T>{static_cast<const T*>(base), s.batch, s.head, s.row, aligned};
}

// The problem as every kernel reads it (sizes, the softmax scale, the causal mask, dropout).
struct Params {
  int64_t B, H, Tq, Tk;
  int D;
  double scale;
  bool causal, dropout;
  float threshold;    // keep an element when its uniform draw >= float(p), as mg::dropout
  double keep_scale;  // 1 / (1 - p), 0 when p == 1
  uint64_t seed, offset;
};

inline Params make_params(const AttentionProblem& p) {
  Params r{};
  r.B = p.B, r.H = p.H, r.Tq = p.Tq, r.Tk = p.Tk, r.D = static_cast<int>(p.D);
  r.scale = p.scale;
  r.causal = p.causal;
  r.dropout = p.dropout_p > 0;
  r.threshold = static_cast<float>(p.dropout_p);
  r.keep_scale = p.dropout_p < 1 ? 1.0 / (1.0 - p.dropout_p) : 0.0;
  r.seed = p.seed, r.offset = p.offset;
  return r;
}

// Whether dropout keeps score (bh, i, j): mg::dropout's draw for element ((bh Tq + i) Tk + j) of a
// contiguous [B, H, Tq, Tk] tensor, so the CPU kernel, the composed path and this one agree.
__device__ __forceinline__ bool dropout_keeps(const Params& p, int64_t bh, int64_t i, int64_t j) {
  const uint64_t e = static_cast<uint64_t>((bh * p.Tq + i) * p.Tk + j);
  return philox_dropout_uniform(p.seed, e, p.offset) >= p.threshold;
}

// The last key a query block [i0, i0 + rows) can see, plus one: causal blocks stop at the diagonal.
__host__ __device__ __forceinline__ int64_t key_end(const Params& p, int64_t i0, int64_t rows) {
  const int64_t end = i0 + rows;
  return p.causal ? (end < p.Tk ? end : p.Tk) : p.Tk;
}

// The tensor-core kernels (attention_tensor_core.cu, attention_tensor_core_backward.cu): bf16/f16,
// D = 64 or 128, sm_80+.
bool tensor_cores_apply(DType dtype, int64_t D);
void launch_forward_tensor_core(cudaStream_t stream, DType dtype, const Params& p, const void* q,
                                const AttentionStrides& qs, const void* k, const AttentionStrides& ks,
                                const void* v, const AttentionStrides& vs, void* o, float* lse);
// dK, dV and dQ (contiguous) from the forward's O (contiguous) and LSE; writes delta = rowsum(dO O)
// too (its queries' kernel computes it, before the keys' kernel reads it: no launch of its own).
void launch_backward_tensor_core(cudaStream_t stream, DType dtype, const Params& p, const void* q,
                                 const AttentionStrides& qs, const void* k, const AttentionStrides& ks,
                                 const void* v, const AttentionStrides& vs, const void* o, const void* dout,
                                 const AttentionStrides& gs, const float* lse, float* delta, void* dq,
                                 void* dk, void* dv);

}  // namespace mg::kernels::cuda::attention_internal
