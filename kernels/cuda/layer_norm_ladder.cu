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
// the row to the CPU's two reductions. The numbers below are the emulator's counters and the H200
// model's PREDICTIONS (docs/performance-model.md; bench_kernels --profile --family lab).
//
// 1. naive (layer_norm_naive): one thread per row walks it three times (sum; deviations and
//    squares; the write, reading weight and bias). A warp's lanes read 32 different rows: 32
//    sectors per request of x (weight and bias are one broadcast sector), L2 traffic 16x the
//    ideal. Predicted [87381, 768]: 896 us, L2-bound; [16384, 4096]: 64 blocks on 64 SMs, 1.95 ms,
//    latency-bound.
//
// 2. warp (layer_norm_warp): a warp per row, coalesced 4-byte sweeps (4 sectors per request), the
//    sums by shuffles: no shared memory, no barrier. Three sweeps and weight and bias per row: L2
//    traffic 3x the ideal. Predicted 175 us and 174 us, latency-bound (94% of a roofline that is
//    itself the L2 moving 3x the bytes).
//
// 3. block (layer_norm_block; the production kernel before the lab): a block of up to 256 threads
//    per row (row_block), the same sweeps, three block reductions (six __syncthreads). Predicted
//    [16384, 4096]: 175 us, latency-bound. At [87381, 768] the table shows 250 us, L2-bound, DRAM
//    1.50x the ideal: an artefact of the tracer's sampling, not of the kernel. 87381 rows over a
//    grid of 65535 blocks give the first 21846 blocks two rows and the rest one; the tracer times
//    the first 132 blocks and extrapolates their two rows each to every block (1.5x the rows).
//    Divided by that 1.5 it is ~167 us, L2-bound (L2 traffic 3x the ideal), as at 4096.
//
// 4. online (layer_norm.cu, forward_online_kernel): 16-byte loads (packs of 4 f32 after a scalar
//    head, then a scalar tail; row_packs.cuh), four packs per thread in flight, and the
//    statistics in ONE sweep: each thread keeps Welford's count, mean and M2 (the sum of squared
//    deviations from the running mean; one divide per element), and the threads' states merge by
//    Chan, Golub and LeVeque's rule, once per row, in a fixed order (every lane gets the same
//    bits). The second sweep rereads the row (from L2) and writes it. Weight and bias are staged
//    in shared memory once per block (below). L2 traffic 1.5x the ideal, DRAM 1.0x, 16 sectors
//    per load request. Predicted 114 us at both shapes, DRAM-bound, 98% of the roofline. Numerics:
//    Welford's, not the CPU's two-pass; as accurate, equal to rounding.
//
// 5. registers (layer_norm.cu, forward_registers_kernel; THE PRODUCTION KERNEL, every dtype): the
//    row held in registers, a warp per row up to 32 x 8 packs (1024 f32), a block of up to 1024
//    threads per row up to 1024 x 8 packs (32768 f32); longer rows take rung 4's design. Each
//    thread issues its (up to) 8 pack loads at once and keeps them: the row is read once, from
//    DRAM and from L2. The statistics are the CPU's corrected two-pass over the registers: the sum
//    (one reduction), then the deviations and their squares (one reduction of the pair). The grid
//    is at most two waves, each block looping over its rows, and a block first copies weight and
//    bias to shared memory (when both fit in 32 KB: up to 4096 f32 columns), so they cost L2
//    once per block instead of once per row: L2 traffic 1.03x the ideal at [87381, 768] (48 rows a
//    block), 1.13x at [16384, 4096] (8 rows a block). Predicted 114 us at both shapes, DRAM-bound,
//    98%: the same time as rung 4 in the model (DRAM binds; rung 4's reread is L2 traffic under
//    its limit). What it buys beyond the model: a third less L2 traffic, the CPU's exact
//    arithmetic, and no reliance on the row surviving in L2. What it costs: registers (nvcc: 80 a
//    thread for the f32 warp kernel, 24 warps of an SM's 64).
//
// The lab's entry point (layer_norm_lab) takes f32; rungs 4 and 5 are the production code of
// layer_norm.cu (layer_norm_rows_forward, kernel_lab.h), which takes every floating dtype.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_lab.h"

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
    case RowKernel::online:
    case RowKernel::registers:  // layer_norm.cu, for every dtype
      layer_norm_rows_forward(stream, DType::f32, x, weight, bias, rows, cols, eps, y, mean, rstd,
                              rung == RowKernel::online);
      return;
  }
  throw Error("layer_norm_lab: unknown rung");
}

}  // namespace mg::kernels::cuda
