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
// Each rung's counters and its predicted H200 time are in docs/kernels.md (the kernel lab), made by
// bench_kernels --profile --family lab; this file says why, not how fast.
//
// 1. naive (softmax_naive): one thread per row walks it three times (max, sum of exp, write). A
//    warp's 32 lanes read 32 different rows: every request touches 32 sectors for 128 useful
//    bytes (12% sector efficiency), and L2 serves 16x the ideal bytes; a long row with few rows
//    leaves most SMs idle and each thread with 3 x dim dependent loads (latency-bound).
//
// 2. warp (softmax_warp): a warp per row. Lanes stride over the row, so a request is 128
//    contiguous bytes (4 sectors, 100%); the max and the sum are combined by 5 shuffles each: no
//    shared memory, no barrier. Still three sweeps (L2 traffic 2x the ideal; DRAM once, the row
//    stays in L2) of 4-byte loads: one 128-byte request per round trip per warp, 3 x dim / 32 round
//    trips a row, and the resident warps' bytes in flight cannot cover HBM's latency.
//
// 3. block (softmax_block; the production kernel before the lab): a block of up to 256 threads per
//    row (row_block), the same three sweeps, the reductions through shared memory (block_max,
//    block_sum: two __syncthreads each). A long row now has 8 warps instead of 1; still
//    latency-bound: the bytes were never the problem, 4-byte loads one per round trip are.
//
// 4. online (softmax_online): 16-byte loads (float4): 512 bytes per warp request instead of 128.
//    The max and the sum come from ONE sweep: each thread keeps a running max m and the sum of
//    exp(x - m), rescaled by exp(m_old - m_new) when m grows (the online softmax of Milakov and
//    Gimelshein, 2018), and the threads' states merge by the same rule, once per row. The second
//    sweep rereads the row (from L2) and writes it: L2 traffic 1.5x the ideal, DRAM 1.0x:
//    DRAM-bound.
//
// 5. registers (softmax_registers): the row held in registers. A warp per row; each lane issues
//    its 8 float4 loads at once and keeps them (32 registers), so the row is read from DRAM once
//    and from L2 once: L2 traffic 1.0x the ideal. Each lane's max and sum of exp over its registers
//    become one online state, merged over the row once; the outputs are computed from the registers
//    and stored as float4s. In the model the same time as rung 4 (DRAM binds, and the reread's L2
//    traffic stays under its own limit); what it buys beyond the model: half the L2 traffic, and
//    no reliance on a row surviving in L2 between the sweeps. What it costs: registers.
//
// The production kernels are rungs 4 and 5 for every floating dtype (softmax.cu:
// softmax_online_kernel and softmax_registers_kernel), with what a teaching version leaves out:
// misaligned rows cut into a scalar head, 16-byte packs and a scalar tail (row_packs.cuh), a block
// per row for rows too long for a warp's registers (up to 32768 f32), several packs a thread in
// flight. softmax_rows_forward (kernel_lab.h) runs them with the design forced, so the lab's
// benchmark shows the teaching rungs and the production code side by side.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernel_lab.h"
#include "kernels/cuda/online_softmax.cuh"

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

// ================================================================================================
// Rung 4: online. A block per row, 16-byte loads (float4) when the row's start is 16-byte aligned
// (4-byte loads for a row that is not), and ONE sweep for the statistics: each thread keeps the
// online state of the values it reads -- a running max m and sum(exp(x - m)), the sum rescaled by
// exp(m_old - m_new) when m grows -- and the block merges the threads' states by the same rule
// (online_softmax.cuh, the header the production softmax and cross-entropy share). The write sweep
// rereads the row (from L2) and stores float4s. The production version (softmax.cu,
// softmax_online_kernel) also splits a misaligned row into a scalar head, 16-byte packs and a scalar
// tail, so every row gets the packs, and keeps four packs a thread in flight.
// ================================================================================================

__global__ void softmax_online(int64_t rows, int64_t dim, const float* x, float* y, bool log) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xr = x + row * dim;
    float* yr = y + row * dim;
    const int64_t quads = aligned16(xr) && aligned16(yr) ? dim / 4 : 0;  // float4s, then the rest
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    OnlineLse<float> st = online_empty<float>();
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const float4 v = x4[q];
      online_add(st, v.x, false);
      online_add(st, v.y, false);
      online_add(st, v.z, false);
      online_add(st, v.w, false);
    }
    for (int64_t j = 4 * quads + threadIdx.x; j < dim; j += blockDim.x) online_add(st, xr[j], false);
    const OnlineLse<float> r = block_merge(st, false);
    const float inv_s = 1.f / r.sum, log_s = logf(r.sum);
    for (int64_t q = threadIdx.x; q < quads; q += blockDim.x) {
      const float4 v = x4[q];
      reinterpret_cast<float4*>(yr)[q] =
          make_float4(softmax_out(v.x, r.max, inv_s, log_s, log), softmax_out(v.y, r.max, inv_s, log_s, log),
                      softmax_out(v.z, r.max, inv_s, log_s, log), softmax_out(v.w, r.max, inv_s, log_s, log));
    }
    for (int64_t j = 4 * quads + threadIdx.x; j < dim; j += blockDim.x)
      yr[j] = softmax_out(xr[j], r.max, inv_s, log_s, log);
  }
}

// ================================================================================================
// Rung 5: registers. A warp per row, the whole row held in registers: each lane issues its (up to)
// 8 float4 loads at once and keeps them (32 registers), so the row is read from DRAM once and
// never again. The lane's max and sum of exp over its registers make one online state, merged over
// the warp once (warp_merge: 5 shuffle rounds); the outputs are computed from the registers and
// stored as float4s. Here rows of up to 32 x 8 x 4 = 1024 floats, 16-byte aligned, a multiple of
// 4 long; any other row takes rung 4. The production version (softmax.cu,
// softmax_registers_kernel) does the same for every dtype, with misaligned rows cut into a head,
// packs and a tail, and a block per row (up to 1024 x 8 packs) for rows too long for a warp.
// ================================================================================================
constexpr int kRegisterQuads = 8;  // float4s a lane keeps

inline bool fits_registers(int64_t dim, const float* x, const float* y) {
  return dim % 4 == 0 && dim <= 32 * 4 * kRegisterQuads && aligned16(x) && aligned16(y);
}

__global__ void softmax_registers(int64_t rows, int64_t dim, const float* x, float* y, bool log) {
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(blockIdx.x) * kWarpRowsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;
  const float4* x4 = reinterpret_cast<const float4*>(x + row * dim);
  float4* y4 = reinterpret_cast<float4*>(y + row * dim);
  const int quads = static_cast<int>(dim / 4);
  float4 v[kRegisterQuads];
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k)  // every load issued before any value is used
    if (lane + 32 * k < quads) v[k] = x4[lane + 32 * k];
  float m = -INFINITY, s = 0.f;
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k)
    if (lane + 32 * k < quads) m = max_nan(max_nan(max_nan(max_nan(m, v[k].x), v[k].y), v[k].z), v[k].w);
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k)
    if (lane + 32 * k < quads) s += expf(v[k].x - m) + expf(v[k].y - m) + expf(v[k].z - m) + expf(v[k].w - m);
  const long long mine = 4ll * ((quads - lane + 31) / 32);  // values this lane holds (0: the empty state)
  const OnlineLse<float> r = warp_merge(OnlineLse<float>{m, s, 0.f, mine}, false);
  const float inv_s = 1.f / r.sum, log_s = logf(r.sum);
#pragma unroll
  for (int k = 0; k < kRegisterQuads; ++k)
    if (lane + 32 * k < quads)
      y4[lane + 32 * k] = make_float4(
          softmax_out(v[k].x, r.max, inv_s, log_s, log), softmax_out(v[k].y, r.max, inv_s, log_s, log),
          softmax_out(v[k].z, r.max, inv_s, log_s, log), softmax_out(v[k].w, r.max, inv_s, log_s, log));
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
    case RowKernel::registers:
      if (fits_registers(dim, x, y)) {
        const int64_t blocks = (rows + kWarpRowsPerBlock - 1) / kWarpRowsPerBlock;
        launch_kernel<softmax_registers>(static_cast<unsigned>(blocks), 32 * kWarpRowsPerBlock, 0, stream,
                                         rows, dim, x, y, log);
        return;
      }
      [[fallthrough]];  // a row registers do not take: rung 4
    case RowKernel::online:
      launch_kernel<softmax_online>(row_grid(rows), row_block(dim), 0, stream, rows, dim, x, y, log);
      return;
  }
  throw Error("softmax_lab: unknown rung");
}

}  // namespace mg::kernels::cuda
