// The softmax ladder: softmax (and log-softmax) forward over the last axis of a [rows, dim] f32
// matrix, y = exp(x - max) / sum(exp(x - max)) per row, as five kernels, each a step up from the
// one before (the kernel lab, kernels/cuda/kernel_lab.h; in the manner of llm.c's dev/cuda). The
// semantics are kernels/cpu/softmax.h's: the max is subtracted first, so no exp overflows; y is
// exp(x - m) * (1 / s), log-softmax (x - m) - log s. A row of -inf (or with +inf or NaN) gives NaN,
// as on the CPU.
//
// Counting. Per element a perfect kernel reads 4 bytes and writes 4, and computes a max, two
// exps (one for the sum, one for the output: the CPU's arithmetic) and ~6 FLOPs. At the lab's
// shapes ([65536, 1024] and [2048, 32768]: 256 MiB in, 256 MiB out) that is 537 MB of DRAM
// traffic, 112 us at the H200's 4.8 TB/s, against 0.4 GFLOP (6 us of the FP32 units) and 134 M
// exps (32 us of the special-function units, 16 a clock per SM): memory-bound, and the ladder is the
// story of reaching DRAM's roofline: coalescing, then bytes in flight, then reading the row once.
// The numbers below are the emulator's counters and the H200 model's PREDICTIONS
// (docs/performance-model.md; bench_kernels --profile --family lab), never measurements.
//
// 1. naive (softmax_naive): one thread per row walks it three times (max, sum of exp, write). A
//    warp's 32 lanes read 32 different rows: every request touches 32 sectors for 128 useful
//    bytes (12% sector efficiency), and L2 serves 16x the ideal bytes. Predicted [65536, 1024]:
//    881 us, L2-bound; [2048, 32768]: 2048 threads are 8 blocks on 8 of the 132 SMs, each thread
//    3 x 32768 dependent loads: 15.6 ms, latency-bound (6% of the roofline).
//
// 2. warp (softmax_warp): a warp per row. Lanes stride over the row, so a request is 128
//    contiguous bytes (4 sectors, 100%); the max and the sum are combined by 5 shuffles each: no
//    shared memory, no barrier. Still three sweeps (L2 traffic 2x the ideal; DRAM once, the row
//    stays in L2) of 4-byte loads: one 128-byte request per round trip per warp, 3 x dim / 32 round
//    trips a row. Predicted [65536, 1024]: 212 us, latency (bytes in flight) bound, 53% of the
//    roofline: 8448 resident warps x 128 bytes in flight cannot cover HBM's latency (the model's
//    worked example). [2048, 32768]: 2048 warps for 8448 warp slots: 860 us.
//
// 3. block (softmax_block; the production kernel before the lab): a block of up to 256 threads per
//    row (row_block), the same three sweeps, the reductions through shared memory (block_max,
//    block_sum: two __syncthreads each). A long row now has 8 warps instead of 1. Predicted 214 us
//    and 217 us: latency-bound at both shapes, 52% of the roofline. The bytes were never the
//    problem; 4-byte loads, one per round trip, are.
//
// 4. online (softmax.cu, softmax_online_kernel): 16-byte loads (packs of 4 f32; row_packs.cuh: a
//    scalar head up to the first 16-byte boundary, a scalar tail), four packs per thread in flight:
//    2 KB per warp per round trip instead of 128 bytes. The max and the sum come from ONE sweep:
//    each thread keeps a running max m and the sum of exp(x - m), rescaled by exp(m_old - m_new)
//    when m grows (the online softmax of Milakov and Gimelshein, 2018), and the threads' states
//    merge by the same rule, once per row. The second sweep rereads the row (from L2) and writes
//    it: L2 traffic 1.5x the ideal, DRAM 1.0x. 16 sectors per request. Predicted 114 us at both
//    shapes, DRAM-bound, 98% of the roofline.
//
// 5. registers (softmax.cu, softmax_registers_kernel; THE PRODUCTION KERNEL, every dtype): the
//    row held in registers. A warp per row up to 32 x 8 packs (1024 f32), a block of up to 1024
//    threads per row up to 1024 x 8 packs (32768 f32); each thread issues its (up to) 8 pack loads
//    at once and keeps them (32 registers), so the row is read from DRAM once and from L2 once: L2
//    traffic 1.0x the ideal. Each thread's max and sum of exp over its registers become one online
//    state, merged over the row once; the outputs are computed from the registers and stored as
//    packs. Longer rows take rung 4's design. Predicted 114 us at both shapes, DRAM-bound, 98%: in
//    the model the same time as rung 4, because DRAM binds and the reread's L2 traffic (82 us of
//    L2 bandwidth at 1.5x) stays under it. What it buys beyond the model: half the L2 traffic, and
//    no reliance on a row surviving in L2 between the sweeps (at [2048, 32768] the 264 resident
//    rows are 34 MB of the 50 MB L2). What it costs: registers (nvcc: the f32 warp kernel takes 76 a
//    thread, 24 warps of an SM's 64; the 1024-thread block kernel 64, one block an SM, no overlap
//    of one block's loads with another's stores).
//
// The lab's entry point (softmax_lab) takes f32; rungs 4 and 5 are the production code of
// softmax.cu (softmax_rows_forward, kernel_lab.h), which takes every floating dtype.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_lab.h"

namespace mg::kernels::cuda {
namespace {

// The row's max: NaN wins, as in the production kernels (a NaN anywhere makes the row NaN, as the
// CPU's sum of exp(NaN) does).
__device__ __forceinline__ float max_nan(float m, float v) { return (v > m || v != v) ? v : m; }

// y = exp(x - m) / s, or (x - m) - log s, as the CPU computes them (inv_s = 1 / s).
__device__ __forceinline__ float softmax_out(float x, float m, float inv_s, float log_s, bool log) {
  const float z = x - m;
  return log ? z - log_s : expf(z) * inv_s;
}

// ================================================================================================
// Rung 1: naive. One thread per row, three passes over its row.
// ================================================================================================
constexpr int kNaiveThreads = 256;

__global__ void softmax_naive(int64_t rows, int64_t dim, const float* x, float* y, bool log) {
  const int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  float m = -INFINITY;
  for (int64_t j = 0; j < dim; ++j) m = max_nan(m, xr[j]);
  float s = 0.f;
  for (int64_t j = 0; j < dim; ++j) s += expf(xr[j] - m);
  const float inv_s = 1.f / s, log_s = logf(s);
  for (int64_t j = 0; j < dim; ++j) yr[j] = softmax_out(xr[j], m, inv_s, log_s, log);
}

// ================================================================================================
// Rung 2: a warp per row. The 32 lanes stride over the row (coalesced: a request is 128
// contiguous bytes), the max and the sum are combined by shuffles. 8 warps (rows) per block; a warp
// whose row is past the end returns at once (there is no __syncthreads to wait for it).
// ================================================================================================
constexpr int kWarpRowsPerBlock = 8;

__global__ void softmax_warp(int64_t rows, int64_t dim, const float* x, float* y, bool log) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const float* xr = x + row * dim;
  float* yr = y + row * dim;
  float m = -INFINITY;
  for (int64_t j = lane; j < dim; j += 32) m = max_nan(m, xr[j]);
  m = warp_max(m);
  float s = 0.f;
  for (int64_t j = lane; j < dim; j += 32) s += expf(xr[j] - m);
  s = warp_sum(s);
  const float inv_s = 1.f / s, log_s = logf(s);
  for (int64_t j = lane; j < dim; j += 32) yr[j] = softmax_out(xr[j], m, inv_s, log_s, log);
}

// ================================================================================================
// Rung 3: a block per row (the production kernel before the lab). 32 to 256 threads (row_block),
// the same three sweeps; each reduction goes through shared memory (block_max, block_sum: a warp
// shuffle, one partial per warp, two __syncthreads, a second shuffle).
// ================================================================================================
__global__ void softmax_block(int64_t rows, int64_t dim, const float* x, float* y, bool log) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * dim;
    float* yr = y + row * dim;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) m = max_nan(m, xr[j]);
    m = block_max(m);
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) s += expf(xr[j] - m);
    s = block_sum(s);
    const float inv_s = 1.f / s, log_s = logf(s);
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) yr[j] = softmax_out(xr[j], m, inv_s, log_s, log);
  }
}

}  // namespace

void softmax_lab(cudaStream_t stream, RowKernel rung, int64_t rows, int64_t dim, const float* x, float* y,
                 bool log) {
  MG_CHECK(rows >= 0 && dim >= 0, "softmax_lab: negative shape [", rows, ", ", dim, "]");
  if (rows == 0 || dim == 0) return;
  switch (rung) {
    case RowKernel::naive: {
      const int64_t blocks = (rows + kNaiveThreads - 1) / kNaiveThreads;
      launch_kernel<softmax_naive>(static_cast<unsigned>(blocks), kNaiveThreads, 0, stream, rows, dim, x, y,
                                   log);
      return;
    }
    case RowKernel::warp: {
      const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
      launch_kernel<softmax_warp>(static_cast<unsigned>(blocks), 32 * kWarpRowsPerBlock, 0, stream, rows, dim,
                                  x, y, log);
      return;
    }
    case RowKernel::block:
      launch_kernel<softmax_block>(row_grid(rows), row_block(dim), 0, stream, rows, dim, x, y, log);
      return;
    case RowKernel::online:
    case RowKernel::registers:  // softmax.cu, for every dtype
      softmax_rows_forward(stream, DType::f32, rows, dim, x, y, log, rung == RowKernel::online);
      return;
  }
  throw Error("softmax_lab: unknown rung");
}

}  // namespace mg::kernels::cuda
