// Welford's running statistics of a row -- count, mean and M2, the sum of squared deviations from
// the running mean, one divide per element -- and the rule that merges two of them exactly (Chan,
// Golub and LeVeque), so threads, then warps, then the block combine theirs into the row's in one
// sweep over the data. Shared by layer_norm.cu (the streamed forward) and layer_norm_ladder.cu
// (its teaching rung 4).
#pragma once

#include "kernels/cuda/common.cuh"

namespace mg::kernels::cuda {

template <class S>
struct Welford {
  S n, mean, m2;
};
template <class S>
__device__ __forceinline__ void welford_add(Welford<S>& w, S v) {
  w.n += S(1);
  const S d = v - w.mean;
  w.mean += d / w.n;
  w.m2 += d * (v - w.mean);
}
// Chan, Golub & LeVeque's merge of two parts. Not symmetric in a and b bit for bit, so callers pass
// the parts in a fixed order (the lower lane first) and every lane computes the same state.
template <class S>
__device__ __forceinline__ Welford<S> welford_merge(const Welford<S>& a, const Welford<S>& b) {
  if (b.n == S(0)) return a;
  if (a.n == S(0)) return b;
  const S n = a.n + b.n, d = b.mean - a.mean, fb = b.n / n;
  return Welford<S>{n, a.mean + d * fb, a.m2 + b.m2 + d * d * a.n * fb};
}
template <class S>
__device__ __forceinline__ Welford<S> warp_welford(Welford<S> w) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Welford<S> other{__shfl_xor_sync(0xffffffffu, w.n, o), __shfl_xor_sync(0xffffffffu, w.mean, o),
                           __shfl_xor_sync(0xffffffffu, w.m2, o)};
    w = (lane & o) ? welford_merge(other, w) : welford_merge(w, other);
  }
  return w;
}
template <class S>
__device__ Welford<S> block_welford(Welford<S> w) {
  __shared__ Welford<S> partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  w = warp_welford(w);
  __syncthreads();  // the previous row's merge may still be reading `partial`
  if (lane == 0) partial[warp] = w;
  __syncthreads();
  return warp_welford(lane < warps ? partial[lane] : Welford<S>{S(0), S(0), S(0)});
}

}  // namespace mg::kernels::cuda
