// The online log-sum-exp: the state a softmax, a cross-entropy (and an attention) keep while they
// read a row once -- a running max m, the sum of exp(x - m) rescaled by exp(m_old - m_new) whenever
// m grows (Milakov and Gimelshein, 2018), and, for label smoothing, the sum of (x - m) -- and the
// rule that merges two states exactly (m = max(m_a, m_b), s = s_a exp(m_a - m) + s_b exp(m_b - m)),
// so threads, then warps, then the block combine theirs into the row's. Shared by softmax.cu and
// cross_entropy.cu.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/row_packs.cuh"

namespace mg::kernels::cuda {

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -INFINITY;
}

// The forward's one sweep keeps, per thread, the online log-sum-exp state of the logits it has
// seen: their running max m (NaN wins), the sum of exp(x - m) rescaled whenever m grows, and, for
// label smoothing, the sum of (x - m) shifted the same way. Two states merge exactly like this
// too, so threads, then warps, then the block combine theirs into the row's. The special values
// give what the CPU's two sweeps give (kernels/cpu/cross_entropy.cpp): an element of -inf adds
// exp(-inf) = 0 to the sum and -inf to the shifted sum unless the whole row is -inf; +inf makes
// the sum NaN (exp(inf - inf)); a NaN makes everything NaN.
template <class A>
struct OnlineLse {
  A max;            // of the elements seen (-inf before the first)
  A sum;            // sum of exp(x - max)
  A shifted;        // sum of (x - max), with label smoothing only (else 0)
  long long count;  // elements seen (long long: a type every shuffle takes)
};

template <class A>
__device__ __forceinline__ OnlineLse<A> online_empty() {
  return OnlineLse<A>{neg_inf<A>(), A(0), A(0), 0};
}

// The sum and the shifted sum of `x` re-expressed against a max m >= x.max. Elements all -inf
// against a larger max add exp(-inf) = 0 each and -inf to the shifted sum.
template <class A>
__device__ __forceinline__ A rescaled_sum(const OnlineLse<A>& x, A m) {
  return x.max == neg_inf<A>() && m != neg_inf<A>() ? A(0) : x.sum * exp_(x.max - m);
}
template <class A>
__device__ __forceinline__ A rescaled_shifted(const OnlineLse<A>& x, A m) {
  if (x.count == 0) return A(0);
  if (x.max == neg_inf<A>() && m != neg_inf<A>()) return neg_inf<A>();
  return x.shifted + A(x.count) * (x.max - m);
}

// One more element v: one exp, two when v is a new max (then the sum is rescaled first).
template <class A>
__device__ __forceinline__ void online_add(OnlineLse<A>& st, A v, bool smooth) {
  if (v > st.max || v != v) {
    st.sum = rescaled_sum(st, v) + exp_(v - v);  // exp(v - v): 1, or NaN for an infinite v
    if (smooth) st.shifted = rescaled_shifted(st, v) + (v - v);
    st.max = v;
  } else {
    st.sum += exp_(v - st.max);
    if (smooth) st.shifted += v - st.max;
  }
  ++st.count;
}

// The merge rule: both parts rescaled to the larger max. Symmetric in a and b, bit for bit, so
// every lane of a butterfly ends with the same state.
template <class A>
__device__ __forceinline__ OnlineLse<A> online_merge(const OnlineLse<A>& a, const OnlineLse<A>& b,
                                                     bool smooth) {
  if (a.count == 0) return b;
  if (b.count == 0) return a;
  const A m = (b.max > a.max || b.max != b.max) ? b.max : a.max;
  OnlineLse<A> r;
  r.max = m;
  r.sum = rescaled_sum(a, m) + rescaled_sum(b, m);
  r.shifted = smooth ? rescaled_shifted(a, m) + rescaled_shifted(b, m) : A(0);
  r.count = a.count + b.count;
  return r;
}

template <class A>
__device__ __forceinline__ OnlineLse<A> warp_merge(OnlineLse<A> v, bool smooth) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    OnlineLse<A> w;
    w.max = __shfl_xor_sync(0xffffffffu, v.max, o);
    w.sum = __shfl_xor_sync(0xffffffffu, v.sum, o);
    w.shifted = __shfl_xor_sync(0xffffffffu, v.shifted, o);
    w.count = __shfl_xor_sync(0xffffffffu, v.count, o);
    v = online_merge(v, w, smooth);
  }
  return v;
}

// The block's merge of its threads' states (a warp's merged, then one per warp through shared
// memory); every thread gets the row's. Every thread of the block must call it.
template <class A>
__device__ OnlineLse<A> block_merge(OnlineLse<A> st, bool smooth) {
  __shared__ OnlineLse<A> partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  st = warp_merge(st, smooth);
  __syncthreads();  // the previous row's merge may still be reading `partial`
  if (lane == 0) partial[warp] = st;
  __syncthreads();
  return warp_merge(lane < warps ? partial[lane] : online_empty<A>(), smooth);
}

// The row's state over `classes` logits, every thread of the block getting it: one read of each
// logit, as 16-byte packs (row_packs.cuh: a loose head up to the first 16-byte boundary, packs
// rank, rank + threads, ... four in flight a thread, a loose tail; `vector` false: the same cut
// with head 0 and each pack V element loads). Every thread of the block must call it.
template <class T, class A = acc_t<T>>
__device__ OnlineLse<A> row_online_lse(const T* x, int64_t classes, bool smooth, bool vector) {
  constexpr int V = pack_width<T>(), U = kRowStreamUnroll;
  const int threads = static_cast<int>(blockDim.x), rank = static_cast<int>(threadIdx.x);
  const RowCut cut = row_cut(x, classes, vector);
  OnlineLse<A> st = online_empty<A>();
  for (int64_t q0 = rank; q0 < cut.packs; q0 += int64_t(U) * threads) {
    Pack<T, V> p[U]{};
    load_row_packs(p, x, cut, q0, threads, vector);
    MG_ROW_UNROLL
    for (int u = 0; u < U; ++u) {
      if (q0 + int64_t(u) * threads >= cut.packs) continue;
      MG_ROW_UNROLL
      for (int j = 0; j < V; ++j) online_add(st, A(load(&p[u].v[j])), smooth);
    }
  }
  const int64_t loose = loose_column<T>(cut, rank);
  if (loose >= 0) online_add(st, A(load(x + loose)), smooth);
  return block_merge(st, smooth);
}

}  // namespace mg::kernels::cuda
