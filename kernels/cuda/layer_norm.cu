// Layer norm over the last axis on the GPU: x is [rows, cols]. Semantics
// (and the saved statistics: mean and rstd per row, f64 for f64 inputs and
// f32 otherwise): kernels/cpu/layer_norm.h.
//
// Decomposition.
//   Forward: the kernel lab's top rung (kernels/cuda/layer_norm_ladder.cu climbs to it and says what
//     each step buys). The row is held in registers as 16-byte packs (row_packs.cuh): a warp per row up to
//     32 x 8 packs (1024 f32, 512 f64, 2048 f16/bf16), a block per row up to 1024 x 8 packs (512 x 8 for
//     f16/bf16), each thread's packs loaded at once, so the row is read once. From the registers, as the
//     CPU does: (1) the sum, for a rough mean; (2) the deviations from it and their squares (their sum
//     corrects the mean's rounding, their squares give the variance -- no E[x^2] - E[x]^2 cancellation):
//     one reduction each (shuffles; for a block, one exchange through shared memory); (3) the normalised,
//     scaled and shifted write, stored as packs. Weight and bias are staged in shared memory once per
//     block (up to 32 KB for both), each block looping over its rows (at most two waves of blocks). Rank 0
//     writes mean and rstd. Rows too long for registers are streamed (the lab's rung 4): a block per row,
//     one sweep of Welford states (count, mean, M2) merged once, then the write sweep (the row reread
//     from L2).
//   Backward grad_x: one block per row, two sweeps: the row sums of
//     g = gy * weight and g * xhat, then gx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
//   Backward grad_weight / grad_bias: column sums over all rows, of gy * xhat and of gy. Splitting only
//     the columns (the first version: one block per 32 columns walking every row) gave 24 blocks for
//     [8192, 768], 18% of an H200's 132 SMs, so the rows are split too, in two passes:
//     pass 1 (params_partials_kernel): a grid of column tiles x row slices. A block is 32 x 8 threads;
//       thread (tx, ty) owns V adjacent columns (V = 16 bytes / element size: 4 f32, 2 f64, 8 f16/bf16,
//       when cols % V == 0 and gy and x are 16-byte aligned, else V = 1), and the rows ty, ty + 8, ...
//       of the block's slice; each row is one vector load of gy and one of x, so a warp reads 32 V
//       adjacent elements (512 contiguous bytes) of one row. The 8 row-threads' sums are added in shared
//       memory in a fixed order and written as the slice's partial sums ([slices, cols] in the compute
//       type, in a scratch workspace), or, with a single slice, straight to grad_weight / grad_bias.
//     pass 2 (params_finish_kernel): a block of 32 x 8 threads per 32 columns; thread (tx, ty) adds
//       slices ty, ty + 8, ... of its column in order (coalesced: a warp reads 32 adjacent partials),
//       then the 8 sums are added in shared memory in a fixed order.
//     Slices: about kTargetBlocks = 4 x 132 blocks in pass 1 (half an SM's 2048 threads each), with at
//     least kMinSliceRows = 64 rows (8 per thread) per slice. f32 [8192, 768]: V = 4, 6 tiles x 86
//     slices of 96 rows = 516 blocks (f64: 12 x 43 = 516; f16/bf16: 3 x 128 = 384), then 24 blocks
//     that add 86 partials per column. Every output and every partial has exactly one writer and
//     every sum has a fixed order: no atomics, bitwise the same run to run (the grid depends only on
//     the shape, the dtype and the pointers' alignment).
//
// Cost. Forward reads each element once and writes it once (2 n s bytes, plus weight and bias once per
// block), ~9 FLOPs per element. In the H200 model (bench_kernels --profile: docs/performance-model.md)
// f32 [87381, 768] and [16384, 4096] are DRAM-bound near the roofline (the three-sweep block-per-row
// kernel before it was bound by L2 traffic and by bytes in flight); docs/kernels.md has the times.
// Backward reads gy and x twice for grad_x and once more for the column sums.
// The column sums do 4 FLOPs per element for 2 s bytes read (0.5 FLOP/byte in
// f32): bandwidth bound. Pass 1 reads 2 rows cols s bytes (50 MB for f32
// [8192, 768], ~11 us at the H200's ~4.8 TB/s) plus mean/rstd per row and tile
// (from L2) and writes 2 slices cols partials (0.5 MB there, ~1% of the reads);
// pass 2 rereads them from L2 (four slices' loads in flight per thread). What
// limits it: DRAM bandwidth for pass 1 (a thread has up to 4 rows x 2 vector
// loads outstanding with the unrolled loop), launch latency for pass 2. The H200
// model (cuda_emu/h200_model.h, docs/performance-model.md; PREDICTED, not
// measured) calls f32 [8192, 768]'s pass 1 DRAM bound and pass 2 launch bound,
// where the columns-only kernel before it (24 blocks) was bound by bytes in
// flight, ~20x slower; docs/kernels.md has the predicted times.
//
// Arithmetic in float for f32/f16/bf16 and double for f64, like the CPU; the
// summation order differs (tree instead of sequential), so results agree to
// rounding, not bit for bit.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_lab.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/row_packs.cuh"
#include "kernels/cuda/welford.cuh"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

// ---- forward: the row held in registers (the kernel lab's top rung) ----------------------------------
// kernels/cuda/layer_norm_ladder.cu climbs to this design and says what each step buys. A warp
// (rows of up to 32 x 8 packs: 1024 f32) or a block (up to 1024 x 8 packs: 32768 f32) per row;
// each thread loads its packs of the row (row_packs.cuh) in one go, 16 bytes a lane, and keeps
// them: the row comes from DRAM once. The statistics are the CPU's corrected two-pass, over the
// registers: the sum (one reduction), then the deviations from the rough mean and their squares
// (one reduction of the pair). A block first copies weight and bias to shared memory (when
// both fit in kStagedParamsBytes) and serves all its rows from there, so they cost L2 once per
// block instead of once per row. Longer rows take the online design (below).

// Weight and bias staged in dynamic shared memory: both, each rounded up to 16 bytes, at most this.
constexpr size_t kStagedParamsBytes = 32 * 1024;

template <class T>
size_t staged_params_bytes(int64_t cols, bool any) {
  const size_t one = (static_cast<size_t>(cols) * sizeof(T) + 15) / 16 * 16;
  return any && 2 * one <= kStagedParamsBytes ? 2 * one : 0;
}

// With `staged`, copies weight and bias (those not null) to the block's dynamic shared memory and
// points them there. Every thread of the block must call it.
template <class T>
__device__ void stage_params(const T*& weight, const T*& bias, int64_t cols, bool staged) {
  constexpr int V = pack_width<T>();
  if (!staged) return;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  T* sw = reinterpret_cast<T*>(dynamic_smem);
  T* sb = sw + (cols + V - 1) / V * V;  // 16-byte aligned
  for (int i = 0; i < 2; ++i) {
    const T* from = i == 0 ? weight : bias;
    T* to = i == 0 ? sw : sb;
    if (from == nullptr) continue;
    if (aligned16(from) && cols % V == 0) {
      for (int64_t q = threadIdx.x; q < cols / V; q += blockDim.x)
        store_row_pack(to + q * V, load_row_pack(from + q * V, true), true);
    } else {
      for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) to[c] = from[c];
    }
  }
  __syncthreads();
  if (weight) weight = sw;
  if (bias) bias = sb;
}

// The outputs from the row's mean and rstd: what RowRegisters::store and the online write sweep call.
// Weight and bias are read as packs where their columns are 16-byte aligned.
template <class T>
struct NormOut {
  using S = acc_t<T>;
  static constexpr int V = pack_width<T>();
  S mean, rstd;
  const T* weight;
  const T* bias;
  __device__ __forceinline__ S one(S x, int64_t c) const {
    S v = (x - mean) * rstd;
    if (weight) v *= S(load(weight + c));
    if (bias) v += S(load(bias + c));
    return v;
  }
  __device__ __forceinline__ Pack<T, V> pack(const Pack<T, V>& x, int64_t col) const {
    Pack<T, V> w, b, y;
    if (weight) w = load_row_pack(weight + col, aligned16(weight + col));
    if (bias) b = load_row_pack(bias + col, aligned16(bias + col));
    MG_ROW_UNROLL
    for (int j = 0; j < V; ++j) {
      S v = (S(load(&x.v[j])) - mean) * rstd;
      if (weight) v *= S(load(&w.v[j]));
      if (bias) v += S(load(&b.v[j]));
      store(&y.v[j], v);
    }
    return y;
  }
};

// Warp: a warp per row, 8 rows per 256-thread block at a time; else a block per row.
template <class T, bool Warp>
__global__ void __launch_bounds__(Warp ? 32 * kRowWarpsPerBlock : max_row_threads<T>())
    forward_registers_kernel(const T* x, const T* weight, const T* bias, int64_t rows, int64_t cols,
                             double eps, T* y, acc_t<T>* mean_out, acc_t<T>* rstd_out, bool vector,
                             bool staged) {
  using S = acc_t<T>;
  stage_params(weight, bias, cols, staged);
  const S inv_cols = cols > 0 ? S(1) / S(cols) : S(0);  // 0 columns: mean 0, as on the CPU
  const int threads = Warp ? 32 : static_cast<int>(blockDim.x);
  const int rank = Warp ? static_cast<int>(threadIdx.x % 32) : static_cast<int>(threadIdx.x);
  const int64_t per_block = Warp ? blockDim.x / 32 : 1;
  const int64_t first = int64_t(blockIdx.x) * per_block + (Warp ? threadIdx.x / 32 : 0);
  for (int64_t r = first; r < rows; r += int64_t(gridDim.x) * per_block) {
    const T* xr = x + r * cols;
    const RowCut cut = row_cut(xr, cols, vector);
    RowRegisters<T, kRowPacks> row;
    row.load(xr, cut, rank, threads, vector);
    S sum = 0;
    row.for_each(cut, rank, threads, [&](S v) { sum += v; });
    const S rough_mean = row_sum<Warp>(sum) * inv_cols;
    S deviations = 0, squares = 0;
    row.for_each(cut, rank, threads, [&](S v) {
      const S d = v - rough_mean;
      deviations += d;
      squares += d * d;
    });
    const SumPair<S> t = row_sum_pair<Warp>(deviations, squares);
    const S correction = t.a * inv_cols;
    const S mean = rough_mean + correction;
    const S var = max(S(0), t.b * inv_cols - correction * correction);
    const S rstd = S(1) / sqrt(var + S(eps));
    row.store(y + r * cols, cut, rank, threads, vector, NormOut<T>{mean, rstd, weight, bias});
    if (rank == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

// ---- forward, rows too long for registers: the online design (the lab's rung 4) --------------------
// A block per row, two sweeps of 16-byte loads, four packs a thread in flight at a time. The first
// keeps each thread's Welford state (count, mean, sum of squared deviations M2), merged over the
// block once by Chan's rule; the second rereads the row (from L2) and writes it.
template <class T>
__global__ void __launch_bounds__(512)
    forward_online_kernel(const T* x, const T* weight, const T* bias, int64_t rows, int64_t cols, double eps,
                          T* y, acc_t<T>* mean_out, acc_t<T>* rstd_out, bool vector, bool staged) {
  using S = acc_t<T>;
  constexpr int V = pack_width<T>(), U = kRowStreamUnroll;
  stage_params(weight, bias, cols, staged);
  const S inv_cols = cols > 0 ? S(1) / S(cols) : S(0);
  const int threads = static_cast<int>(blockDim.x), rank = static_cast<int>(threadIdx.x);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    const RowCut cut = row_cut(xr, cols, vector);
    const int64_t loose = loose_column<T>(cut, rank);
    Welford<S> st{S(0), S(0), S(0)};
    for (int64_t q0 = rank; q0 < cut.packs; q0 += int64_t(U) * threads) {
      Pack<T, V> p[U]{};
      load_row_packs(p, xr, cut, q0, threads, vector);
      MG_ROW_UNROLL
      for (int u = 0; u < U; ++u) {
        if (q0 + int64_t(u) * threads >= cut.packs) continue;
        MG_ROW_UNROLL
        for (int j = 0; j < V; ++j) welford_add(st, S(load(&p[u].v[j])));
      }
    }
    if (loose >= 0) welford_add(st, S(load(xr + loose)));
    st = block_welford(st);
    const S var = max(S(0), st.m2 * inv_cols);
    const NormOut<T> f{st.mean, S(1) / sqrt(var + S(eps)), weight, bias};
    map_row_packs<U, S>(yr, xr, cut, loose, rank, threads, vector, f);
    if (rank == 0) {
      mean_out[r] = f.mean;
      rstd_out[r] = f.rstd;
    }
  }
}

// Registers (a warp or a block per row) when the row fits, else online; `online` forces the online
// design (the kernel lab's rung 4).
template <class T>
void launch_forward(cudaStream_t stream, const T* x, const T* weight, const T* bias, int64_t rows,
                    int64_t cols, double eps, T* y, acc_t<T>* mean, acc_t<T>* rstd, bool online) {
  const bool vector = rows_vector_ok(x, y, sizeof(T));
  const size_t shared = staged_params_bytes<T>(cols, weight != nullptr || bias != nullptr);
  if (!online && cols <= warp_row_capacity<T>()) {
    constexpr int kWarpBlockThreads = 32 * kRowWarpsPerBlock;
    const int64_t groups = (rows + kRowWarpsPerBlock - 1) / kRowWarpsPerBlock;
    launch_kernel<forward_registers_kernel<T, true>>(row_blocks(groups, kWarpBlockThreads), kWarpBlockThreads,
                                                     shared, stream, x, weight, bias, rows, cols, eps, y,
                                                     mean, rstd, vector, shared > 0);
  } else if (!online && cols <= block_row_capacity<T>()) {
    const int threads = row_register_threads<T>(cols);
    launch_kernel<forward_registers_kernel<T, false>>(row_blocks(rows, threads), threads, shared, stream, x,
                                                      weight, bias, rows, cols, eps, y, mean, rstd, vector,
                                                      shared > 0);
  } else {
    const int threads = row_stream_threads<T>(cols);
    launch_kernel<forward_online_kernel<T>>(row_blocks(rows, threads), threads, shared, stream, x, weight,
                                            bias, rows, cols, eps, y, mean, rstd, vector, shared > 0);
  }
}

template <class T>
__global__ void grad_x_kernel(const T* gy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                              const T* weight, int64_t rows, int64_t cols, T* gx) {
  using S = acc_t<T>;
  const S inv_cols = S(1) / S(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gyr = gy + r * cols;
    const T* xr = x + r * cols;
    T* gxr = gx + r * cols;
    const S mu = mean[r], rs = rstd[r];
    S sum_g = 0, sum_g_xhat = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const S g = weight ? S(load(gyr + c)) * S(load(weight + c)) : S(load(gyr + c));
      sum_g += g;
      sum_g_xhat += g * (S(load(xr + c)) - mu) * rs;
    }
    const S mean_g = block_sum(sum_g) * inv_cols;
    const S mean_g_xhat = block_sum(sum_g_xhat) * inv_cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const S g = weight ? S(load(gyr + c)) * S(load(weight + c)) : S(load(gyr + c));
      const S xhat = (S(load(xr + c)) - mu) * rs;
      store(gxr + c, rs * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

// ---- grad_weight / grad_bias: column sums over all rows, split over row slices -------------------
// A block is kColumnThreads x kRowThreads = 32 x 8 threads. Thread (tx, ty) owns V adjacent columns
// (one V-wide vector load per row: 16 bytes when the rows allow it) and the rows ty, ty + 8, ... of its
// block's slice, so a warp reads 32 V adjacent elements of one row.
constexpr int kColumnThreads = 32, kRowThreads = 8;
// Row slices: enough blocks for about four per SM of an H200 (4 x 132), but at least kMinSliceRows
// rows (8 per thread) per slice, so that a block's loads outweigh its start, its shared-memory combine
// and the partials it writes.
constexpr int64_t kTargetBlocks = 4 * 132;
constexpr int64_t kMinSliceRows = 8 * kRowThreads;
// Elements per vector load: 16 bytes, when every row of gy and x starts 16-byte aligned.
template <class T>
constexpr int vector_width() {
  return static_cast<int>(16 / sizeof(T));
}

template <int V, class T>
__device__ __forceinline__ void load_vector(const T* p, T (&out)[V]) {
  if constexpr (V == 1) {
    out[0] = *p;
  } else {
    using Raw = raw_t<static_cast<int>(sizeof(T)) * V>;
    const Raw raw = *reinterpret_cast<const Raw*>(p);
    memcpy(&out, &raw, sizeof(Raw));
  }
}

// Pass 1: block (x, y) sums rows [y slice_rows, (y + 1) slice_rows) of columns [x 32 V, (x + 1) 32 V).
// The 8 row-threads of each column are added in shared memory in a fixed order (ty = 0, 1, ..., 7).
// With one slice (gridDim.y == 1) that is the answer, stored to grad_weight / grad_bias; otherwise it
// goes to row y of partial_w / partial_b ([slices, cols] in acc_t<T>) for params_finish_kernel.
template <class T, int V>
__global__ void params_partials_kernel(const T* gy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                                       int64_t rows, int64_t cols, int64_t slice_rows, acc_t<T>* partial_w,
                                       acc_t<T>* partial_b, T* grad_weight, T* grad_bias) {
  using S = acc_t<T>;
  __shared__ S shared_w[kRowThreads][V][kColumnThreads];
  __shared__ S shared_b[kRowThreads][V][kColumnThreads];
  const int64_t c = (int64_t(blockIdx.x) * kColumnThreads + threadIdx.x) * V;  // cols % V == 0
  const int64_t first = int64_t(blockIdx.y) * slice_rows;
  const int64_t last = first + slice_rows < rows ? first + slice_rows : rows;
  S sum_w[V], sum_b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) sum_w[j] = sum_b[j] = S(0);
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = first + threadIdx.y; r < last; r += kRowThreads) {
      T g[V], xv[V];
      load_vector<V>(gy + r * cols + c, g);
      load_vector<V>(x + r * cols + c, xv);
      const S mu = mean[r], rs = rstd[r];
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const S gj = S(load(&g[j]));
        sum_w[j] += gj * (S(load(&xv[j])) - mu) * rs;
        sum_b[j] += gj;
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    shared_w[threadIdx.y][j][threadIdx.x] = sum_w[j];
    shared_b[threadIdx.y][j][threadIdx.x] = sum_b[j];
  }
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < kRowThreads; ++k) {
#pragma unroll
    for (int j = 0; j < V; ++j) {
      sum_w[j] += shared_w[k][j][threadIdx.x];
      sum_b[j] += shared_b[k][j][threadIdx.x];
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (gridDim.y == 1) {
      if (grad_weight) store(grad_weight + c + j, sum_w[j]);
      if (grad_bias) store(grad_bias + c + j, sum_b[j]);
    } else {
      partial_w[int64_t(blockIdx.y) * cols + c + j] = sum_w[j];
      partial_b[int64_t(blockIdx.y) * cols + c + j] = sum_b[j];
    }
  }
}

// Pass 2: block x finishes columns [32 x, 32 (x + 1)). Thread (tx, ty) adds slices ty, ty + 8, ... of its
// column in order (a warp reads 32 adjacent partials of one slice; four slices' loads in flight at a
// time), then the 8 row-threads are added in shared memory in a fixed order, as in pass 1.
template <class T>
__global__ void params_finish_kernel(const acc_t<T>* partial_w, const acc_t<T>* partial_b, int64_t slices,
                                     int64_t cols, T* grad_weight, T* grad_bias) {
  using S = acc_t<T>;
  __shared__ S shared_w[kRowThreads][kColumnThreads];
  __shared__ S shared_b[kRowThreads][kColumnThreads];
  const int64_t c = int64_t(blockIdx.x) * kColumnThreads + threadIdx.x;
  S sum_w = 0, sum_b = 0;
  if (c < cols) {
    // Four slices' loads issued together (one memory round trip instead of four), added in order.
    int64_t z = threadIdx.y;
    for (; z + 3 * kRowThreads < slices; z += 4 * kRowThreads) {
      S w[4], b[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        w[u] = partial_w[(z + u * kRowThreads) * cols + c];
        b[u] = partial_b[(z + u * kRowThreads) * cols + c];
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        sum_w += w[u];
        sum_b += b[u];
      }
    }
    for (; z < slices; z += kRowThreads) {
      sum_w += partial_w[z * cols + c];
      sum_b += partial_b[z * cols + c];
    }
  }
  shared_w[threadIdx.y][threadIdx.x] = sum_w;
  shared_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < kRowThreads; ++k) {
    sum_w += shared_w[k][threadIdx.x];
    sum_b += shared_b[k][threadIdx.x];
  }
  if (grad_weight) store(grad_weight + c, sum_w);
  if (grad_bias) store(grad_bias + c, sum_b);
}

// How the column sums of a [rows, cols] backward are cut (see the top): the column tiles and the row
// slices, for `vector` columns per thread.
struct ParamsPlan {
  int64_t tiles = 1;       // blocks along the columns, 32 x vector columns each
  int64_t slices = 1;      // blocks along the rows
  int64_t slice_rows = 0;  // rows per slice (the last may have fewer)
};

ParamsPlan plan_params(int64_t rows, int64_t cols, int vector) {
  ParamsPlan p;
  p.tiles = (cols + kColumnThreads * vector - 1) / (kColumnThreads * vector);
  if (p.tiles < kTargetBlocks && rows >= 2 * kMinSliceRows) {
    p.slices = std::min((kTargetBlocks + p.tiles - 1) / p.tiles, rows / kMinSliceRows);
  }
  // Whole rows of threads per slice, then as many slices as that takes (none left empty).
  p.slice_rows = (rows + p.slices - 1) / p.slices;
  p.slice_rows = (p.slice_rows + kRowThreads - 1) / kRowThreads * kRowThreads;
  if (p.slice_rows == 0) p.slice_rows = kRowThreads;
  p.slices = (rows + p.slice_rows - 1) / p.slice_rows;
  if (p.slices == 0) p.slices = 1;  // rows == 0: one slice that writes zeros
  return p;
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class T, int V>
void launch_params(cudaStream_t stream, ScratchAllocator& scratch, const ParamsPlan& p, const T* gy,
                   const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, int64_t rows, int64_t cols,
                   T* grad_weight, T* grad_bias) {
  using S = acc_t<T>;
  const dim3 block(kColumnThreads, kRowThreads);
  const dim3 grid(static_cast<unsigned>(p.tiles), static_cast<unsigned>(p.slices));
  if (p.slices == 1) {
    launch_kernel<params_partials_kernel<T, V>>(grid, block, 0, stream, gy, x, mean, rstd, rows, cols,
                                                p.slice_rows, static_cast<S*>(nullptr),
                                                static_cast<S*>(nullptr), grad_weight, grad_bias);
    return;
  }
  const size_t count = static_cast<size_t>(p.slices * cols);
  Workspace partials(scratch, 2 * count * sizeof(S));
  S* partial_w = static_cast<S*>(partials.get());
  S* partial_b = partial_w + count;
  launch_kernel<params_partials_kernel<T, V>>(grid, block, 0, stream, gy, x, mean, rstd, rows, cols,
                                              p.slice_rows, partial_w, partial_b, grad_weight, grad_bias);
  const unsigned finish_blocks = static_cast<unsigned>((cols + kColumnThreads - 1) / kColumnThreads);
  launch_kernel<params_finish_kernel<T>>(finish_blocks, block, 0, stream, static_cast<const S*>(partial_w),
                                         static_cast<const S*>(partial_b), p.slices, cols, grad_weight,
                                         grad_bias);
}

}  // namespace

void layer_norm_forward(cudaStream_t stream, DType dtype, const void* x, const void* weight, const void* bias,
                        int64_t rows, int64_t cols, double eps, void* y, void* mean, void* rstd) {
  layer_norm_rows_forward(stream, dtype, x, weight, bias, rows, cols, eps, y, mean, rstd, /*online=*/false);
}

void layer_norm_rows_forward(cudaStream_t stream, DType dtype, const void* x, const void* weight,
                             const void* bias, int64_t rows, int64_t cols, double eps, void* y, void* mean,
                             void* rstd, bool online) {
  MG_CHECK(rows >= 0 && cols >= 0, "layer_norm_forward (CUDA): negative shape [", rows, ", ", cols, "]");
  MG_CHECK(eps >= 0, "layer_norm_forward (CUDA): eps must be >= 0, got ", eps);
  if (rows == 0) return;
  visit_float(dtype, "layer_norm_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    using S = acc_t<T>;
    launch_forward(stream, static_cast<const T*>(x), static_cast<const T*>(weight),
                   static_cast<const T*>(bias), rows, cols, eps, static_cast<T*>(y), static_cast<S*>(mean),
                   static_cast<S*>(rstd), online);
  });
}

void layer_norm_backward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* grad_y,
                         const void* x, const void* mean, const void* rstd, const void* weight, int64_t rows,
                         int64_t cols, void* grad_x, void* grad_weight, void* grad_bias) {
  MG_CHECK(rows >= 0 && cols >= 0, "layer_norm_backward (CUDA): negative shape [", rows, ", ", cols, "]");
  if (cols == 0) return;
  visit_float(dtype, "layer_norm_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    using S = acc_t<T>;
    const T* gy = static_cast<const T*>(grad_y);
    const T* xs = static_cast<const T*>(x);
    const S* mu = static_cast<const S*>(mean);
    const S* rs = static_cast<const S*>(rstd);
    if (rows > 0) {
      launch_kernel<grad_x_kernel<T>>(row_grid(rows), row_block(cols), 0, stream, gy, xs, mu, rs,
                                      static_cast<const T*>(weight), rows, cols, static_cast<T*>(grad_x));
    }
    if (grad_weight || grad_bias) {  // rows == 0 still writes zeros, like the CPU
      constexpr int kVector = vector_width<T>();
      const bool vector = cols % kVector == 0 && aligned(gy, 16) && aligned(xs, 16);
      const ParamsPlan p = plan_params(rows, cols, vector ? kVector : 1);
      T* gw = static_cast<T*>(grad_weight);
      T* gb = static_cast<T*>(grad_bias);
      if (vector) {
        launch_params<T, kVector>(stream, scratch, p, gy, xs, mu, rs, rows, cols, gw, gb);
      } else {
        launch_params<T, 1>(stream, scratch, p, gy, xs, mu, rs, rows, cols, gw, gb);
      }
    }
  });
}

}  // namespace mg::kernels::cuda
