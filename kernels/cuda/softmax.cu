// Softmax and log-softmax on the GPU (cross-entropy, fused with log-softmax, is cross_entropy.cu).
// Semantics: kernels/cpu/softmax.h.
//
// Decomposition. The softmax axis is the middle one of [outer, dim, inner].
//   - inner == 1 (last-axis softmax: classifiers, attention): the kernel lab's
//     top rung (kernels/cuda/softmax_ladder.cu climbs to it and says what each
//     step buys). The row is held in registers as 16-byte packs
//     (row_packs.cuh): a warp per row up to 32 x 8 packs (1024 f32, 512 f64,
//     2048 f16/bf16), a block per row up to 1024 x 8 packs (512 x 8 for
//     f16/bf16), each thread's packs loaded at once, so the row is read once.
//     Each thread's max and sum of exp over its registers form an online
//     state (OnlineLse, online_softmax.cuh), merged over the row once;
//     the outputs come from the registers, stored as packs. Rows too long for
//     registers are streamed (the lab's rung 4): a block per row, one sweep of
//     online states (a running max and a rescaled sum), one merge, then the
//     write sweep (the row reread from L2).
//   - inner > 1: one thread per (outer, inner) column walking the dim axis.
//     Neighbouring threads read neighbouring inner indices: coalesced. Its
//     max and sum-of-exp sweeps are one device function (max_and_sum_exp).
//
// Cost. Softmax forward over the last axis reads each element once and writes
// it once (2 n s bytes; rows too long for registers read twice, the second time
// from L2), ~6 FLOPs and two exps per element (as the CPU). In the H200 model
// (bench_kernels --profile: docs/performance-model.md) f32 [65536, 1024] and
// [2048, 32768] are DRAM-bound near the roofline (the three-sweep block-per-row
// kernel before it was bound by bytes in flight); docs/kernels.md has the times.
// Over a middle axis: the column kernel's three sweeps. Backward: reads y and gy
// twice, writes gx: ~5 n s bytes. Memory bound for rows longer than a few
// hundred elements; short rows (10 classes) are bound by latency, with many
// rows in flight.
//
// Arithmetic in float for f32/f16/bf16 and double for f64, like the CPU.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_lab.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/online_softmax.cuh"
#include "kernels/cuda/row_packs.cuh"

namespace mg::kernels::cuda {
namespace {

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

// ---- softmax, inner == 1: the row held in registers (the kernel lab's top rung) ------------------
// kernels/cuda/softmax_ladder.cu climbs to this design and says what each step buys. A warp (rows
// of up to 32 x 8 packs: 1024 f32) or a block (up to 1024 x 8 packs: 32768 f32) per row; each
// thread loads its packs of the row (row_packs.cuh) in one go, 16 bytes a lane, and keeps them:
// the row comes from DRAM once. From the registers, each thread's max m_t and sum of exp(x - m_t)
// make an OnlineLse state (online_softmax.cuh), and ONE merge over the row's threads
// (shuffles, plus one exchange through shared memory for a block) gives the row's max m and sum s
// by the online rule. Then y = exp(x - m) * (1 / s), or (x - m) - log s, as the CPU computes them,
// stored as packs. Longer rows take the online design (below).

template <bool Warp, class A>
__device__ __forceinline__ OnlineLse<A> row_merge(const OnlineLse<A>& st) {
  if constexpr (Warp) {
    return warp_merge(st, false);
  } else {
    return block_merge(st, false);
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
  constexpr int U = kRowStreamUnroll;
  const int threads = static_cast<int>(blockDim.x), rank = static_cast<int>(threadIdx.x);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = in + row * dim;
    T* y = out + row * dim;
    const RowCut cut = row_cut(x, dim, vector);
    const SoftmaxOut<T> f(row_online_lse<T>(x, dim, /*smooth=*/false, vector), log_out);
    const int64_t loose = loose_column<T>(cut, rank);
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
}  // namespace mg::kernels::cuda
