// The layer-norm ladder: layer norm forward over the last axis of a [rows, cols] f32 matrix,
// y = (x - mean) * rstd * weight + bias with rstd = 1 / sqrt(var + eps), saving mean and rstd per
// row, as five kernels, each a step up from the one before (the kernel lab,
// kernels/cuda/kernel_lab.h; in the manner of llm.c's dev/cuda). Every rung keeps the CPU's
// numerics (kernels/cpu/layer_norm.cpp) but rung 4: the corrected two-pass, a rough mean from the
// sum, then the sums of the deviations d = x - rough_mean (their mean corrects the rough mean's
// rounding) and of d^2 (the variance, without the E[x^2] - E[x]^2 cancellation when |mean| >> std).
//
// Counting. Per element a perfect kernel reads 4 bytes and writes 4 (weight, bias, mean and rstd
// add 8 bytes per column and per row), and does ~9 FLOPs (a sum, a deviation and its square, a
// subtract, two multiplies and an add). At the lab's shapes ([87381, 768]: GPT-2 small's width;
// [16384, 4096]; 256 MiB in, 256 MiB out) that is 537 MB of DRAM traffic, 112 us at 4.8 TB/s,
// against 0.6 GFLOP (9 us): memory-bound, as softmax (softmax_ladder.cu), with three sweeps over
// the row to the CPU's two reductions. Each rung's counters and its predicted H200 time are in
// docs/kernels.md (the kernel lab), made by bench_kernels --profile --family lab; this file says
// why each step helps, not how fast it is.
//
// 1. naive (layer_norm_naive): one thread per row walks it three times (sum; deviations and
//    squares; the write, reading weight and bias). A warp's lanes read 32 different rows: 32
//    sectors per request of x (weight and bias are one broadcast sector), L2 traffic 16x the
//    ideal; a long row with few rows leaves most SMs idle (latency-bound).
//
// 2. warp (layer_norm_warp): a warp per row, coalesced 4-byte sweeps (4 sectors per request), the
//    sums by shuffles: no shared memory, no barrier. Three sweeps and weight and bias per row: L2
//    traffic 3x the ideal, and one 128-byte request per round trip per warp: latency-bound.
//
// 3. block (layer_norm_block; the production kernel before the lab): a block of up to 256 threads
//    per row (row_block), the same sweeps, three block reductions (six __syncthreads). Still
//    4-byte loads: latency-bound, or bound by its L2 traffic (3x the ideal).
//
// 4. online (layer_norm_online): 16-byte loads (float4), and the statistics in ONE sweep: each
//    thread keeps Welford's count, mean and M2 (the sum of squared deviations from the running
//    mean; one divide per element), and the threads' states merge by Chan, Golub and LeVeque's
//    rule, once per row, in a fixed order (every lane gets the same bits). The second sweep
//    rereads the row (from L2) and writes it: L2 traffic 1.5x the ideal, DRAM 1.0x, 16 sectors per
//    load request: DRAM-bound. Numerics: Welford's, not the CPU's two-pass; as accurate, equal to
//    rounding.
//
// 5. registers (layer_norm_registers): the row held in registers, a warp per row; each lane issues
//    its 8 float4 loads at once and keeps them: the row is read once, from DRAM and from L2. The
//    statistics are the CPU's corrected two-pass over the registers. In the model the same time
//    as rung 4 (DRAM binds); what it buys beyond the model: a third less L2 traffic, the CPU's
//    exact arithmetic, and no reliance on the row surviving in L2. What it costs: registers.
//
// The production kernels are rungs 4 and 5 for every floating dtype (layer_norm.cu:
// forward_online_kernel and forward_registers_kernel), with what a teaching version leaves out:
// misaligned rows cut into a scalar head, 16-byte packs and a scalar tail (row_packs.cuh), a block
// per row for rows too long for a warp's registers (up to 32768 f32), weight and bias staged in
// shared memory once per block (so they cost L2 once per block, not once per row), several packs a
// thread in flight. layer_norm_rows_forward (kernel_lab.h) runs them with the design forced;
// bench_kernels measures them beside the ladder as layer_norm/production.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_lab.h"
#include "kernels/cuda/welford.cuh"

namespace mg::kernels::cuda {
namespace {

// What every rung computes from a row's two sums: the CPU's corrected two-pass (kernels/cpu/
// layer_norm.cpp). `sum` is the row's sum; `deviations` and `squares` the sums of d = x - rough_mean
// and d * d, with rough_mean = sum / cols.
struct RowStats {
  float mean, rstd;
};
__device__ __forceinline__ RowStats row_stats(float rough_mean, float deviations, float squares,
                                              float inv_cols, double eps) {
  const float correction = deviations * inv_cols;
  const float var = fmaxf(0.f, squares * inv_cols - correction * correction);
  return RowStats{rough_mean + correction, 1.f / sqrtf(var + float(eps))};
}
__device__ __forceinline__ float norm_out(float x, RowStats s, const float* weight, const float* bias,
                                          int64_t c) {
  float v = (x - s.mean) * s.rstd;
  if (weight) v *= weight[c];
  if (bias) v += bias[c];
  return v;
}

// ================================================================================================
// Rung 1: naive. One thread per row, three passes over its row.
// ================================================================================================
constexpr int kNaiveThreads = 256;

__global__ void layer_norm_naive(int64_t rows, int64_t cols, const float* x, const float* weight,
                                 const float* bias, double eps, float* y, float* mean, float* rstd) {
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  float* yr = y + r * cols;
  const float inv_cols = cols > 0 ? 1.f / float(cols) : 0.f;
  float sum = 0.f;
  for (int64_t c = 0; c < cols; ++c) sum += xr[c];
  const float rough_mean = sum * inv_cols;
  float deviations = 0.f, squares = 0.f;
  for (int64_t c = 0; c < cols; ++c) {
    const float d = xr[c] - rough_mean;
    deviations += d;
    squares += d * d;
  }
  const RowStats s = row_stats(rough_mean, deviations, squares, inv_cols, eps);
  for (int64_t c = 0; c < cols; ++c) yr[c] = norm_out(xr[c], s, weight, bias, c);
  mean[r] = s.mean;
  rstd[r] = s.rstd;
}

// ================================================================================================
// Rung 2: a warp per row. The 32 lanes stride over the row (coalesced), the sums are combined by
// shuffles. 8 warps (rows) per block; no shared memory, no __syncthreads.
// ================================================================================================
constexpr int kWarpRowsPerBlock = 8;

__global__ void layer_norm_warp(int64_t rows, int64_t cols, const float* x, const float* weight,
                                const float* bias, double eps, float* y, float* mean, float* rstd) {
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const float* xr = x + r * cols;
  float* yr = y + r * cols;
  const float inv_cols = cols > 0 ? 1.f / float(cols) : 0.f;
  float sum = 0.f;
  for (int64_t c = lane; c < cols; c += 32) sum += xr[c];
  const float rough_mean = warp_sum(sum) * inv_cols;
  float deviations = 0.f, squares = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float d = xr[c] - rough_mean;
    deviations += d;
    squares += d * d;
  }
  const RowStats s = row_stats(rough_mean, warp_sum(deviations), warp_sum(squares), inv_cols, eps);
  for (int64_t c = lane; c < cols; c += 32) yr[c] = norm_out(xr[c], s, weight, bias, c);
  if (lane == 0) {
    mean[r] = s.mean;
    rstd[r] = s.rstd;
  }
}

// ================================================================================================
// Rung 3: a block per row (the production kernel before the lab). 32 to 256 threads (row_block),
// the same three sweeps; the three sums are block reductions through shared memory (block_sum:
// two __syncthreads each).
// ================================================================================================
__global__ void layer_norm_block(int64_t rows, int64_t cols, const float* x, const float* weight,
                                 const float* bias, double eps, float* y, float* mean, float* rstd) {
  const float inv_cols = cols > 0 ? 1.f / float(cols) : 0.f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float sum = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += xr[c];
    const float rough_mean = block_sum(sum) * inv_cols;
    float deviations = 0.f, squares = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float d = xr[c] - rough_mean;
      deviations += d;
      squares += d * d;
    }
    deviations = block_sum(deviations);
    squares = block_sum(squares);
    const RowStats s = row_stats(rough_mean, deviations, squares, inv_cols, eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = norm_out(xr[c], s, weight, bias, c);
    if (threadIdx.x == 0) {
      mean[r] = s.mean;
      rstd[r] = s.rstd;
    }
  }
}

// ================================================================================================
// Rung 4: online. A block per row, 16-byte loads (float4) when the row's start is 16-byte aligned
// (4-byte loads for a row that is not; weight and bias read with x), and the statistics in ONE sweep: each
// thread keeps Welford's count, mean and M2 of the values it reads, and the block merges the threads' states
// by Chan's rule, once per row (welford.cuh, shared with the production kernel). The write sweep rereads the
// row (from L2) and stores float4s. The production version (layer_norm.cu, forward_online_kernel) also cuts a
// misaligned row into a scalar head, packs and a scalar tail, keeps four packs a thread in flight, and stages
// weight and bias in shared memory.
// ================================================================================================

// Four outputs from four inputs at columns c..c+3, weight and bias read as float4 too (the caller
// has checked they are 16-byte aligned, as c is a multiple of 4; a null one is aligned).
__device__ __forceinline__ float4 norm_out4(float4 v, RowStats s, const float* weight, const float* bias,
                                            int64_t c) {
  float4 y = make_float4((v.x - s.mean) * s.rstd, (v.y - s.mean) * s.rstd, (v.z - s.mean) * s.rstd,
                         (v.w - s.mean) * s.rstd);
  if (weight) {
    const float4 w = *reinterpret_cast<const float4*>(weight + c);
    y = make_float4(y.x * w.x, y.y * w.y, y.z * w.z, y.w * w.w);
  }
  if (bias) {
    const float4 b = *reinterpret_cast<const float4*>(bias + c);
    y = make_float4(y.x + b.x, y.y + b.y, y.z + b.z, y.w + b.w);
  }
  return y;
}

__global__ void layer_norm_online(int64_t rows, int64_t cols, const float* x, const float* weight,
                                  const float* bias, double eps, float* y, float* mean, float* rstd) {
  const float inv_cols = cols > 0 ? 1.f / float(cols) : 0.f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const bool vec = aligned16(xr) && aligned16(yr) && aligned16(weight) && aligned16(bias);
    const int64_t quads = vec ? cols / 4 : 0;  // float4s, then the rest
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    Welford<float> st{0.f, 0.f, 0.f};
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const float4 v = x4[q];
      welford_add(st, v.x);
      welford_add(st, v.y);
      welford_add(st, v.z);
      welford_add(st, v.w);
    }
    for (int64_t c = 4 * quads + threadIdx.x; c < cols; c += blockDim.x) welford_add(st, xr[c]);
    st = block_welford(st);
    const RowStats s{st.mean, 1.f / sqrtf(fmaxf(0.f, st.m2 * inv_cols) + float(eps))};
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const float4 v = x4[q];
      const int64_t c = 4 * q;
      reinterpret_cast<float4*>(yr)[q] = norm_out4(v, s, weight, bias, c);
    }
    for (int64_t c = 4 * quads + threadIdx.x; c < cols; c += blockDim.x)
      yr[c] = norm_out(xr[c], s, weight, bias, c);
    if (threadIdx.x == 0) {
      mean[r] = s.mean;
      rstd[r] = s.rstd;
    }
  }
}

// ================================================================================================
// Rung 5: registers. A warp per row, the whole row held in registers: each lane issues its (up to)
// 8 float4 loads at once and keeps them, so the row is read from DRAM once and never again. The
// statistics are the CPU's corrected two-pass, over the registers: the sum (one warp reduction),
// then the deviations from the rough mean and their squares (two more); the outputs come from the
// registers, stored as float4s. Here rows of up to 32 x 8 x 4 = 1024 floats, 16-byte aligned, a
// multiple of 4 long; any other row takes rung 4. The production version (layer_norm.cu,
// forward_registers_kernel) does the same for every dtype, with misaligned rows cut into a head,
// packs and a tail, a block per row for rows too long for a warp, weight and bias staged in shared
// memory once per block, and the last two sums in one exchange.
// ================================================================================================
constexpr int kRegisterQuads = 8;  // float4s a lane keeps

inline bool fits_registers(int64_t cols, const float* x, const float* y, const float* weight,
                           const float* bias) {
  return cols % 4 == 0 && cols <= 32 * 4 * kRegisterQuads && aligned16(x) && aligned16(y) &&
         aligned16(weight) && aligned16(bias);
}

__global__ void layer_norm_registers(int64_t rows, int64_t cols, const float* x, const float* weight,
                                     const float* bias, double eps, float* y, float* mean, float* rstd) {
  const int lane = threadIdx.x % 32;
  const int64_t r = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const float4* x4 = reinterpret_cast<const float4*>(x + r * cols);
  float4* y4 = reinterpret_cast<float4*>(y + r * cols);
  const int quads = static_cast<int>(cols / 4);
  const float inv_cols = cols > 0 ? 1.f / float(cols) : 0.f;
  float4 v[kRegisterQuads];
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k)  // every load issued before any value is used
    if (lane + 32 * k < quads) v[k] = x4[lane + 32 * k];
  float sum = 0.f;
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k)
    if (lane + 32 * k < quads) sum += v[k].x + v[k].y + v[k].z + v[k].w;
  const float rough_mean = warp_sum(sum) * inv_cols;
  float deviations = 0.f, squares = 0.f;
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k) {
    if (lane + 32 * k >= quads) continue;
    const float d[4] = {v[k].x - rough_mean, v[k].y - rough_mean, v[k].z - rough_mean, v[k].w - rough_mean};
    for (float e : d) {
      deviations += e;
      squares += e * e;
    }
  }
  const RowStats s = row_stats(rough_mean, warp_sum(deviations), warp_sum(squares), inv_cols, eps);
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k) {
    const int q = lane + 32 * k;
    if (q >= quads) continue;
    const int64_t c = 4 * int64_t(q);
    y4[q] = norm_out4(v[k], s, weight, bias, c);
  }
  if (lane == 0) {
    mean[r] = s.mean;
    rstd[r] = s.rstd;
  }
}

}  // namespace

void layer_norm_lab(cudaStream_t stream, RowKernel rung, int64_t rows, int64_t cols, const float* x,
                    const float* weight, const float* bias, double eps, float* y, float* mean, float* rstd) {
  MG_CHECK(rows >= 0 && cols >= 0, "layer_norm_lab: negative shape [", rows, ", ", cols, "]");
  MG_CHECK(eps >= 0, "layer_norm_lab: eps must be >= 0, got ", eps);
  if (rows == 0) return;
  switch (rung) {
    case RowKernel::naive: {
      const int64_t blocks = (rows + kNaiveThreads - 1) / kNaiveThreads;
      launch_kernel<layer_norm_naive>(static_cast<unsigned>(blocks), kNaiveThreads, 0, stream, rows, cols, x,
                                      weight, bias, eps, y, mean, rstd);
      return;
    }
    case RowKernel::warp: {
      const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
      launch_kernel<layer_norm_warp>(static_cast<unsigned>(blocks), 32 * kWarpRowsPerBlock, 0, stream, rows,
                                     cols, x, weight, bias, eps, y, mean, rstd);
      return;
    }
    case RowKernel::block:
      launch_kernel<layer_norm_block>(row_grid(rows), row_block(cols), 0, stream, rows, cols, x, weight, bias,
                                      eps, y, mean, rstd);
      return;
    case RowKernel::registers:
      if (fits_registers(cols, x, y, weight, bias)) {
        const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
        launch_kernel<layer_norm_registers>(static_cast<unsigned>(blocks), 32 * kWarpRowsPerBlock, 0, stream,
                                            rows, cols, x, weight, bias, eps, y, mean, rstd);
        return;
      }
      [[fallthrough]];  // a row registers do not take: rung 4
    case RowKernel::online:
      launch_kernel<layer_norm_online>(row_grid(rows), row_block(cols), 0, stream, rows, cols, x, weight,
                                       bias, eps, y, mean, rstd);
      return;
  }
  throw Error("layer_norm_lab: unknown rung");
}

}  // namespace mg::kernels::cuda
