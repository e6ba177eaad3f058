// Softmax, log-softmax and cross-entropy (fused with log-softmax) on the GPU.
// Semantics: kernels/cpu/softmax.h and kernels/cpu/cross_entropy.h.
//
// Decomposition. The softmax axis is the middle one of [outer, dim, inner].
//   - inner == 1 (last-axis softmax: classifiers, attention): the kernel lab's
//     top rung (kernels/cuda/softmax_ladder.cu climbs to it and says what each
//     step buys). The row is held in registers as 16-byte packs
//     (row_packs.cuh): a warp per row up to 32 x 8 packs (1024 f32, 512 f64,
//     2048 f16/bf16), a block per row up to 1024 x 8 packs (512 x 8 for
//     f16/bf16), each thread's packs loaded at once, so the row is read once.
//     Each thread's max and sum of exp over its registers form an online
//     state (OnlineLse, the cross-entropy's below), merged over the row once;
//     the outputs come from the registers, stored as packs. Rows too long for
//     registers are streamed (the lab's rung 4): a block per row, one sweep of
//     online states (a running max and a rescaled sum), one merge, then the
//     write sweep (the row reread from L2).
//   - inner > 1: one thread per (outer, inner) column walking the dim axis.
//     Neighbouring threads read neighbouring inner indices: coalesced. Its
//     max and sum-of-exp sweeps are one device function (max_and_sum_exp).
// Cross-entropy: one block per row of logits, as above, but ONE sweep. Each
// thread keeps the online log-sum-exp of the logits it reads -- a running max
// m and sum(exp(x - m)), the sum multiplied by exp(m_old - m_new) whenever m
// grows (and, with label smoothing, sum(x - m), shifted by count * (m_old -
// m_new)) -- and the block merges the threads' states with the same rule
// (warp shuffles, then one state per warp in shared memory): m = max(m_a,
// m_b), s = s_a exp(m_a - m) + s_b exp(m_b - m). The row is read as 16-byte
// packs (row_packs.cuh's cut, as the online softmax: a loose head up to the
// first 16-byte boundary -- a row of 50257 f32 starts wherever row * 50257
// puts it --, packs of 4 f32 / 2 f64 / 8 f16,bf16 strided over the threads,
// four in flight a thread, then a loose tail; the backward also writes packs,
// when its gradients are misaligned like the logits, else both go element by
// element). So each thread sums its logits in another order than the CPU
// (and than the element-strided sweep before), within the tests' tolerances;
// ignore_index, smoothing and the special values are unchanged (the online
// rule is exact for them in any order). The forward writes ONE loss
// per row (no [rows, classes] log-probabilities in memory) and saves the row's
// (m, log s) in a [rows, 2] f32 (f64 for f64) tensor, as layer norm saves mean
// and rstd: two numbers, not m + log s, because every use subtracts a logit
// first and (x - m) - log s keeps digits that x - (m + log s) loses when |m|
// is large (the CPU's rule). The backward then reads each logit once and
// writes each gradient once: g * (exp((x - m) - log s) - eps/C - (1 - eps)[j == t]).
// Its entry point still takes no stats (the stats are then recomputed first in
// the same kernel: one more read).
//
// Cost. Softmax forward over the last axis reads each element once and writes
// it once (2 n s bytes; rows too long for registers read twice, the second time
// from L2), ~6 FLOPs and two exps per element (as the CPU). Predicted on an H200
// (bench_kernels --profile: docs/performance-model.md) for f32 [65536, 1024] and
// [2048, 32768]: 114 us each, DRAM-bound, 98% of the roofline (the three-sweep
// block-per-row kernel before it: 214 and 217 us, bound by bytes in flight).
// Over a middle axis: the column kernel's three sweeps. Backward: reads y and gy
// twice, writes gx: ~5 n s bytes. Memory bound for rows longer than a few
// hundred elements; short rows (10 classes) are bound by latency, with many
// rows in flight.
// Cross-entropy over [rows, C] (C = 50257, GPT-2's vocabulary, 201 KB per f32
// row): forward reads the logits once from DRAM (4 C bytes per f32 row, plus 8
// to 16 bytes of loss and stats written), one exp and ~4 FLOPs per logit (6 with
// smoothing), and a second exp only when a thread's running max grows (about
// ln(C / 256) ~ 5 times per thread on random logits, every element on a
// row sorted ascending). Backward: one read and one write, 8 C bytes per f32
// row, one exp and ~5 FLOPs per logit. Before the online sweep the forward
// read each row twice (max, then sum) and the backward three times (max, sum,
// write pass): 8 C -> 4 C bytes forward, 16 C -> 8 C backward. With 4-byte
// lanes over unaligned rows the H200 model (bench_kernels --profile, f32
// [1335, 50257]) had both bound by bytes in flight, 4.87 sectors a request
// (82% sector efficiency): forward 130 us, 43% of the roofline, backward 139
// us, 80%. With the packs: 16.5 sectors a request (97%), DRAM-bound, forward
// 64 us (88%), backward 114 us (98%); [333, 50257]: 69 -> 22 us and 71 -> 30
// us. Not measured on a GPU yet: at HBM speed (H200: ~4.8 TB/s, ~1.2 T f32
// logits/s) the expf per logit (one MUFU.EX2 and a few FMAs) stays under
// the special-function units' ~4 T/s (132 SMs x 16 per clock).
//
// Arithmetic in float for f32/f16/bf16 and double for f64, like the CPU.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_lab.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/row_packs.cuh"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log_(float x) { return logf(x); }
__device__ __forceinline__ double log_(double x) { return log(x); }

template <class A>
__device__ __forceinline__ A neg_inf() {
  return -INFINITY;
}

// The first two sweeps of softmax and log-softmax: the max of `count` elements x[j * stride] (NaN
// wins, like the CPU's max), then the sum of exp(x - max). With Block, the threads of the block
// share the elements (j = threadIdx.x, += blockDim.x) and every thread gets the block's max and
// sum; otherwise one thread walks them all. Every thread of a block must call it (block
// reductions). (The cross-entropy's single sweep, row_online_lse below, merges running maxima
// instead.)
template <class A>
struct MaxSumExp {
  A max, sum;
};
template <bool Block, class T, class A = acc_t<T>>
__device__ __forceinline__ MaxSumExp<A> max_and_sum_exp(const T* x, int64_t count, int64_t stride) {
  const int64_t first = Block ? int64_t(threadIdx.x) : 0, step = Block ? int64_t(blockDim.x) : 1;
  A m = neg_inf<A>();
  for (int64_t j = first; j < count; j += step) {
    const A v = load(x + j * stride);
    m = (v > m || v != v) ? v : m;
  }
  if constexpr (Block) m = block_max(m);
  A s = 0;
  for (int64_t j = first; j < count; j += step) s += exp_(A(load(x + j * stride)) - m);
  if constexpr (Block) s = block_sum(s);
  return MaxSumExp<A>{m, s};
}

// ---- softmax, inner > 1: a thread per column -------------------------------------------------
template <class T>
__global__ void softmax_columns_kernel(int64_t outer, int64_t dim, int64_t inner, const T* in, T* out,
                                       bool log_out) {
  using A = acc_t<T>;
  const int64_t columns = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = c / inner, i = c % inner;
    const T* x = in + o * dim * inner + i;
    T* y = out + o * dim * inner + i;
    const MaxSumExp<A> r = max_and_sum_exp<false>(x, dim, inner);
    const A m = r.max, s = r.sum, log_s = log_(s);
    for (int64_t d = 0; d < dim; ++d) {
      const A z = A(load(x + d * inner)) - m;
      store(y + d * inner, log_out ? z - log_s : exp_(z) / s);
    }
  }
}

// softmax:      gx = y * (gy - sum(gy * y))
// log_softmax:  gx = gy - exp(y) * sum(gy)
template <class T>
__global__ void softmax_backward_rows_kernel(int64_t rows, int64_t dim, const T* gy, const T* y, T* gx,
                                             bool log_out) {
  using A = acc_t<T>;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t base = row * dim;
    A s = 0;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x)
      s += log_out ? A(load(gy + base + j)) : A(load(gy + base + j)) * A(load(y + base + j));
    s = block_sum(s);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      const A g = load(gy + base + j), v = load(y + base + j);
      store(gx + base + j, log_out ? g - exp_(v) * s : v * (g - s));
    }
  }
}

template <class T>
__global__ void softmax_backward_columns_kernel(int64_t outer, int64_t dim, int64_t inner, const T* gy,
                                                const T* y, T* gx, bool log_out) {
  using A = acc_t<T>;
  const int64_t columns = outer * inner;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t base = (c / inner) * dim * inner + c % inner;
    A s = 0;
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t k = base + d * inner;
      s += log_out ? A(load(gy + k)) : A(load(gy + k)) * A(load(y + k));
    }
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t k = base + d * inner;
      const A g = load(gy + k), v = load(y + k);
      store(gx + k, log_out ? g - exp_(v) * s : v * (g - s));
    }
  }
}

// ---- cross-entropy ---------------------------------------------------------------------------
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
  __shared__ OnlineLse<A> partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  st = warp_merge(st, smooth);
  __syncthreads();  // the previous row's merge may still be reading `partial`
  if (lane == 0) partial[warp] = st;
  __syncthreads();
  return warp_merge(lane < warps ? partial[lane] : online_empty<A>(), smooth);
}

// ---- softmax, inner == 1: the row held in registers (the kernel lab's top rung) ------------------
// kernels/cuda/softmax_ladder.cu climbs to this design and says what each step buys. A warp (rows
// of up to 32 x 8 packs: 1024 f32) or a block (up to 1024 x 8 packs: 32768 f32) per row; each
// thread loads its packs of the row (row_packs.cuh) in one go, 16 bytes a lane, and keeps them:
// the row comes from DRAM once. From the registers, each thread's max m_t and sum of exp(x - m_t)
// make an OnlineLse state (the cross-entropy's, above), and ONE merge over the row's threads
// (shuffles, plus one exchange through shared memory for a block) gives the row's max m and sum s
// by the online rule. Then y = exp(x - m) * (1 / s), or (x - m) - log s, as the CPU computes them,
// stored as packs. Longer rows take the online design (below).

// The block's merge of its threads' states (a warp's merged, then one per warp through shared
// memory); every thread gets the row's. Every thread of the block must call it.
template <class A>
__device__ OnlineLse<A> block_merge(OnlineLse<A> st) {
  __shared__ OnlineLse<A> partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  st = warp_merge(st, false);
  __syncthreads();  // the previous row's merge may still be reading `partial`
  if (lane == 0) partial[warp] = st;
  __syncthreads();
  return warp_merge(lane < warps ? partial[lane] : online_empty<A>(), false);
}
template <bool Warp, class A>
__device__ __forceinline__ OnlineLse<A> row_merge(const OnlineLse<A>& st) {
  if constexpr (Warp) {
    return warp_merge(st, false);
  } else {
    return block_merge(st);
  }
}

// The outputs from the row's max and sum: what RowRegisters::store and the online write sweep call.
template <class T>
struct SoftmaxOut {
  using A = acc_t<T>;
  static constexpr int V = pack_width<T>();
  A m, inv_s, log_s;
  bool log;
  __device__ SoftmaxOut(const OnlineLse<A>& row, bool log_out)
      : m(row.max), inv_s(A(1) / row.sum), log_s(log_(row.sum)), log(log_out) {}
  __device__ __forceinline__ A one(A x, int64_t) const {
    const A z = x - m;
    return log ? z - log_s : exp_(z) * inv_s;
  }
  __device__ __forceinline__ Pack<T, V> pack(const Pack<T, V>& x, int64_t col) const {
    Pack<T, V> y;
    MG_ROW_UNROLL
    for (int j = 0; j < V; ++j) store(&y.v[j], one(A(load(&x.v[j])), col + j));
    return y;
  }
};

// Warp: a warp per row, 8 rows per 256-thread block at a time; else a block per row.
template <class T, bool Warp>
__global__ void __launch_bounds__(Warp ? 32 * kRowWarpsPerBlock : max_row_threads<T>())
    softmax_registers_kernel(int64_t rows, int64_t dim, const T* in, T* out, bool log_out, bool vector) {
  using A = acc_t<T>;
  const int threads = Warp ? 32 : static_cast<int>(blockDim.x);
  const int rank = Warp ? static_cast<int>(threadIdx.x % 32) : static_cast<int>(threadIdx.x);
  const int64_t per_block = Warp ? blockDim.x / 32 : 1;
  const int64_t first = int64_t(blockIdx.x) * per_block + (Warp ? threadIdx.x / 32 : 0);
  for (int64_t row = first; row < rows; row += int64_t(gridDim.x) * per_block) {
    const T* x = in + row * dim;
    const RowCut cut = row_cut(x, dim, vector);
    RowRegisters<T, kRowPacks> r;
    r.load(x, cut, rank, threads, vector);
    A m = neg_inf<A>();
    r.for_each(cut, rank, threads, [&](A v) { m = (v > m || v != v) ? v : m; });  // NaN wins
    A s = 0;
    r.for_each(cut, rank, threads, [&](A v) { s += exp_(v - m); });
    const OnlineLse<A> mine{m, s, A(0), r.count};  // count 0: the empty state
    r.store(out + row * dim, cut, rank, threads, vector, SoftmaxOut<T>(row_merge<Warp>(mine), log_out));
  }
}

// ---- softmax, inner == 1, rows too long for registers: the online design (the lab's rung 4) ------
// A block per row, two sweeps of 16-byte loads, four packs a thread in flight at a time. The first
// keeps each thread's online state (max and rescaled sum: online_add), merged over the block once;
// the second rereads the row (from L2: a row of 32768 f32 is 128 KB) and writes it.
template <class T>
__global__ void __launch_bounds__(512)
    softmax_online_kernel(int64_t rows, int64_t dim, const T* in, T* out, bool log_out, bool vector) {
  using A = acc_t<T>;
  constexpr int V = pack_width<T>(), U = kRowStreamUnroll;
  const int threads = static_cast<int>(blockDim.x), rank = static_cast<int>(threadIdx.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * dim;
    T* y = out + row * dim;
    const RowCut cut = row_cut(x, dim, vector);
    const int64_t loose = loose_column<T>(cut, rank);
    OnlineLse<A> st = online_empty<A>();
    for (int64_t q0 = rank; q0 < cut.packs; q0 += int64_t(U) * threads) {
      Pack<T, V> p[U]{};
      load_row_packs(p, x, cut, q0, threads, vector);
      MG_ROW_UNROLL
      for (int u = 0; u < U; ++u) {
        if (q0 + int64_t(u) * threads >= cut.packs) continue;
        MG_ROW_UNROLL
        for (int j = 0; j < V; ++j) online_add(st, A(load(&p[u].v[j])), false);
      }
    }
    if (loose >= 0) online_add(st, A(load(x + loose)), false);
    const SoftmaxOut<T> f(block_merge(st), log_out);
    map_row_packs<U, A>(y, x, cut, loose, rank, threads, vector, f);
  }
}

// Rows of `dim` elements: registers (a warp or a block per row) when they fit, else online.
// `online` forces the online design (the kernel lab's rung 4).
template <class T>
void launch_softmax_rows(cudaStream_t stream, int64_t rows, int64_t dim, const T* x, T* y, bool log,
                         bool online) {
  const bool vector = rows_vector_ok(x, y, sizeof(T));
  if (!online && dim <= warp_row_capacity<T>()) {
    constexpr int kWarpBlockThreads = 32 * kRowWarpsPerBlock;
    const int64_t groups = (rows + kRowWarpsPerBlock - 1) / kRowWarpsPerBlock;
    launch_kernel<softmax_registers_kernel<T, true>>(row_blocks(groups, kWarpBlockThreads), kWarpBlockThreads,
                                                     0, stream, rows, dim, x, y, log, vector);
  } else if (!online && dim <= block_row_capacity<T>()) {
    const int threads = row_register_threads<T>(dim);
    launch_kernel<softmax_registers_kernel<T, false>>(row_blocks(rows, threads), threads, 0, stream, rows,
                                                      dim, x, y, log, vector);
  } else {
    const int threads = row_stream_threads<T>(dim);
    launch_kernel<softmax_online_kernel<T>>(row_blocks(rows, threads), threads, 0, stream, rows, dim, x, y,
                                            log, vector);
  }
}

// status[0]: rows counted (not ignored); status[1]: the first row with a bad
// target (rows when none); status[2]: that row's target (cross_entropy_finish_kernel).
// stats (may be null): per counted row, its max and log(sum(exp(x - max))), for the backward.
template <class T>
__global__ void cross_entropy_forward_kernel(int64_t rows, int64_t classes, const T* logits,
                                             const int64_t* targets, int64_t ignore_index, double smoothing,
                                             T* losses, acc_t<T>* stats, unsigned long long* status,
                                             bool vector) {
  using A = acc_t<T>;
  const A eps = A(smoothing);
  const bool smooth = eps > A(0);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t t = targets[row];
    const bool ignored = t == ignore_index;
    if (!ignored && (t < 0 || t >= classes)) {
      if (threadIdx.x == 0) atomicMin(status + 1, static_cast<unsigned long long>(row));
      continue;  // uniform across the block: every thread read the same t
    }
    if (ignored) {
      if (threadIdx.x == 0) store(losses + row, A(0));
      continue;
    }
    const T* x = logits + row * classes;
    const OnlineLse<A> r = row_online_lse(x, classes, smooth, vector);
    if (threadIdx.x == 0) {
      // As the CPU: logsumexp kept as m + log_s and every logit shifted by m first
      // ((m - x) + log_s, not (m + log_s) - x, which loses digits when |m| is large), and the
      // smoothing term only when eps > 0 -- with -inf (masked) logits it is +inf, and 0 * inf
      // would turn a finite loss into NaN.
      const A m = r.max, log_s = log_(r.sum);
      A loss = log_s - (A(load(x + t)) - m);
      if (smooth) loss = (A(1) - eps) * loss + eps * (log_s - r.shifted / A(classes));
      store(losses + row, loss);
      if (stats != nullptr) {
        stats[2 * row] = m;
        stats[2 * row + 1] = log_s;
      }
      atomicAdd(status, 1ull);
    }
  }
}

// status = {0 rows counted, no bad row yet (rows), no value}.
__global__ void cross_entropy_status_init_kernel(unsigned long long* status, int64_t rows) {
  status[0] = 0;
  status[1] = static_cast<unsigned long long>(rows);
  status[2] = 0;
}

// After the forward: the count as a float for the mean's divisor (exact up to 2^24 rows), and the
// bad row's target value for the deferred error message (the targets may be gone by then).
__global__ void cross_entropy_finish_kernel(unsigned long long* status, const int64_t* targets, int64_t rows,
                                            float* counted) {
  counted[0] = static_cast<float>(status[0]);
  if (status[1] < static_cast<unsigned long long>(rows))
    status[2] = static_cast<unsigned long long>(targets[status[1]]);
}

// The gradients from the row's stats: what the backward's pack and loose stores take.
template <class T>
struct CrossEntropyGrad {
  using A = acc_t<T>;
  static constexpr int V = pack_width<T>();
  A m, log_s, uniform, hit, g;  // hit: 1 - eps, taken off at the target
  int64_t t;
  __device__ __forceinline__ A one(A x, int64_t col) const {
    A d = exp_((x - m) - log_s) - uniform;
    if (col == t) d -= hit;
    return g * d;
  }
  __device__ __forceinline__ Pack<T, V> pack(const Pack<T, V>& x, int64_t col) const {
    Pack<T, V> y;
    MG_ROW_UNROLL
    for (int j = 0; j < V; ++j) store(&y.v[j], one(A(load(&x.v[j])), col + j));
    return y;
  }
};

// grad[j] = g * (exp((x_j - m) - log_s) - eps / classes - (1 - eps) [j == t]): one read of the
// row and one write with the forward's stats; without them (null), the row's stats first, from
// the same single online sweep (two reads). Reads and writes go as 16-byte packs (the row's cut,
// as row_online_lse's: `vector` when logits and gradients are misaligned alike), four packs a
// thread in flight.
template <class T>
__global__ void cross_entropy_backward_kernel(int64_t rows, int64_t classes, const T* logits,
                                              const int64_t* targets, int64_t ignore_index, double smoothing,
                                              const acc_t<T>* stats, const T* grad_losses, T* grad_logits,
                                              bool vector) {
  using A = acc_t<T>;
  constexpr int V = pack_width<T>(), U = kRowStreamUnroll;
  const int threads = static_cast<int>(blockDim.x), rank = static_cast<int>(threadIdx.x);
  const A eps = A(smoothing);
  const A uniform = eps / A(classes);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t t = targets[row];
    const T* x = logits + row * classes;
    T* gx = grad_logits + row * classes;
    const RowCut cut = row_cut(x, classes, vector);  // gx's too: misaligned alike when vector
    const int64_t loose = loose_column<T>(cut, rank);
    // Ignored rows (and, defensively, out-of-range targets, which the forward
    // already refused) get a zero gradient.
    if (t == ignore_index || t < 0 || t >= classes) {
      Pack<T, V> zero;
      MG_ROW_UNROLL
      for (int j = 0; j < V; ++j) store(&zero.v[j], A(0));
      for (int64_t q = rank; q < cut.packs; q += threads) store_row_pack(gx + cut.head + q * V, zero, vector);
      if (loose >= 0) store(gx + loose, A(0));
      continue;
    }
    A m, log_s;
    if (stats != nullptr) {
      m = stats[2 * row];
      log_s = stats[2 * row + 1];
    } else {
      const OnlineLse<A> r = row_online_lse(x, classes, false, vector);
      m = r.max;
      log_s = log_(r.sum);
    }
    const CrossEntropyGrad<T> f{m, log_s, uniform, A(1) - eps, A(load(grad_losses + row)), t};
    map_row_packs<U, A>(gx, x, cut, loose, rank, threads, vector, f);
  }
}

}  // namespace

void softmax_forward(cudaStream_t stream, DType dtype, const SoftmaxShape& s, const void* input, void* output,
                     bool log) {
  if (s.outer * s.dim * s.inner == 0) return;
  visit_float(dtype, log ? "log_softmax" : "softmax", [&](auto t) {
    using T = typename decltype(t)::type;
    if (s.inner == 1) {
      launch_softmax_rows(stream, s.outer, s.dim, static_cast<const T*>(input), static_cast<T*>(output), log,
                          false);
    } else {
      launch_kernel<softmax_columns_kernel<T>>(grid_for(s.outer * s.inner), kThreads, 0, stream, s.outer,
                                               s.dim, s.inner, static_cast<const T*>(input),
                                               static_cast<T*>(output), log);
    }
  });
}

void softmax_rows_forward(cudaStream_t stream, DType dtype, int64_t rows, int64_t dim, const void* x, void* y,
                          bool log, bool online) {
  if (rows * dim == 0) return;
  visit_float(dtype, log ? "log_softmax" : "softmax", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_softmax_rows(stream, rows, dim, static_cast<const T*>(x), static_cast<T*>(y), log, online);
  });
}

void softmax_backward(cudaStream_t stream, DType dtype, const SoftmaxShape& s, const void* grad_output,
                      const void* output, void* grad_input, bool log) {
  if (s.outer * s.dim * s.inner == 0) return;
  visit_float(dtype, log ? "log_softmax backward" : "softmax backward", [&](auto t) {
    using T = typename decltype(t)::type;
    const T* gy = static_cast<const T*>(grad_output);
    const T* y = static_cast<const T*>(output);
    T* gx = static_cast<T*>(grad_input);
    if (s.inner == 1) {
      launch_kernel<softmax_backward_rows_kernel<T>>(row_grid(s.outer), row_block(s.dim), 0, stream, s.outer,
                                                     s.dim, gy, y, gx, log);
    } else {
      launch_kernel<softmax_backward_columns_kernel<T>>(grid_for(s.outer * s.inner), kThreads, 0, stream,
                                                        s.outer, s.dim, s.inner, gy, y, gx, log);
    }
  });
}

void cross_entropy_forward_counted(cudaStream_t stream, DType dtype, const void* logits,
                                   const int64_t* targets, int64_t rows, int64_t classes,
                                   int64_t ignore_index, double label_smoothing, void* losses,
                                   void* row_stats, float* counted, void* check_words) {
  MG_CHECK(label_smoothing >= 0.0 && label_smoothing < 1.0,
           "cross_entropy (CUDA): label_smoothing must be in [0, 1), got ", label_smoothing);
  MG_CHECK(classes > 0 || rows == 0, "cross_entropy (CUDA): no classes");
  static_assert(kCrossEntropyCheckWords == 3, "rows counted, the first row with a bad target, its value");
  unsigned long long* status = static_cast<unsigned long long*>(check_words);
  launch_kernel<cross_entropy_status_init_kernel>(1, 1, 0, stream, status, rows);
  if (rows > 0) {
    visit_float(dtype, "cross_entropy", [&](auto t) {
      using T = typename decltype(t)::type;
      launch_kernel<cross_entropy_forward_kernel<T>>(
          row_grid(rows), row_block(classes), 0, stream, rows, classes, static_cast<const T*>(logits),
          targets, ignore_index, label_smoothing, static_cast<T*>(losses), static_cast<acc_t<T>*>(row_stats),
          status, rows_vector_ok(logits, logits, sizeof(T)));
    });
  }
  launch_kernel<cross_entropy_finish_kernel>(1, 1, 0, stream, status, targets, rows, counted);
}

std::string cross_entropy_target_error(const void* host_check_words, int64_t rows, int64_t classes,
                                       int64_t ignore_index) {
  const auto* w = static_cast<const unsigned long long*>(host_check_words);
  if (w[1] >= static_cast<unsigned long long>(rows)) return "";
  return str_cat("cross_entropy: target ", static_cast<int64_t>(w[2]), " of row ", w[1],
                 " is out of range [0, ", classes, ") (and is not ignore_index ", ignore_index,
                 "); found by the CUDA kernel, reported at the next synchronisation (as PyTorch's "
                 "device-side asserts are)");
}

int64_t cross_entropy_forward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* logits,
                              const int64_t* targets, int64_t rows, int64_t classes, int64_t ignore_index,
                              double label_smoothing, void* losses, void* row_stats) {
  if (rows == 0) return 0;
  // The check words, then the count (a float, after the 8-byte words): one buffer, one copy back.
  constexpr size_t kWordBytes = kCrossEntropyCheckWords * sizeof(unsigned long long);
  Workspace buffer(scratch, kWordBytes + sizeof(float));
  unsigned char* device = static_cast<unsigned char*>(buffer.get());
  cross_entropy_forward_counted(stream, dtype, logits, targets, rows, classes, ignore_index, label_smoothing,
                                losses, row_stats, reinterpret_cast<float*>(device + kWordBytes), device);
  unsigned long long host[kCrossEntropyCheckWords + 1] = {};
  MG_CUDA_CHECK(cudaMemcpyAsync(host, device, kWordBytes + sizeof(float), cudaMemcpyDeviceToHost, stream));
  MG_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::string error = cross_entropy_target_error(host, rows, classes, ignore_index);
  if (!error.empty()) throw Error(error);  // a bad target throws here, at the call
  float counted = 0;
  std::memcpy(&counted, host + kCrossEntropyCheckWords, sizeof(float));
  return static_cast<int64_t>(counted);
}

void cross_entropy_backward(cudaStream_t stream, DType dtype, const void* logits, const int64_t* targets,
                            int64_t rows, int64_t classes, int64_t ignore_index, double label_smoothing,
                            const void* grad_losses, void* grad_logits, const void* row_stats) {
  if (rows == 0 || classes == 0) return;
  visit_float(dtype, "cross_entropy backward", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<cross_entropy_backward_kernel<T>>(
        row_grid(rows), row_block(classes), 0, stream, rows, classes, static_cast<const T*>(logits), targets,
        ignore_index, label_smoothing, static_cast<const acc_t<T>*>(row_stats),
        static_cast<const T*>(grad_losses), static_cast<T*>(grad_logits),
        rows_vector_ok(logits, grad_logits, sizeof(T)));
  });
}

}  // namespace mg::kernels::cuda
