// The GEMM ladder: five hand-written CUDA kernels for C = alpha op(A) op(B) + beta C, each a step
// up from the one before, beside the cuBLAS call in gemm.cu. The semantics are kernels/cpu/gemm.h's
// (row-major, trans flags, leading dimensions, batch strides with 0 = broadcast, beta == 0 never
// reads C, alpha == 0 never reads A or B); gemm_ladder.h says how to pick a step for matmul.
//
// One view of the operands serves every step. C[i][j] = sum_p opA(i, p) opB(p, j). Call i and j the
// "mn" index of their operand and p the "k" index: both A and B are then an (mn x k) matrix, stored
// either with k contiguous (element (mn, p) at mn*ld + p) or with mn contiguous (at p*ld + mn).
// A without trans_a and B with trans_b are k-contiguous; A with trans_a and B without trans_b are
// mn-contiguous. Each kernel loads "a tile of an operand" with code that works for either layout,
// so the four trans combinations are one code path with a layout flag, not four kernels.
//
// Counting. A GEMM does 2mnk FLOPs. An H200 (132 SMs, up to 1.98 GHz) does about 67 TFLOP/s of f32 FMA
// (128 FMA/clock/SM) and about 990 TFLOP/s of dense bf16 on tensor cores; HBM delivers ~4.8 TB/s,
// L2 several times that, shared memory 128 bytes/clock/SM (32 banks x 4 bytes). At 4096^3 the
// operands are 3 x 64 MiB in f32, so the memory system could feed a kernel that reads each element
// once in ~40 us; the 137 GFLOPs take 2 ms at f32 peak. GEMM is compute-bound *if* each loaded
// element is reused enough. The ladder is the story of that reuse:
//
// 1. naive (gemm_naive): one thread per C element, a k-long dot product read straight from global
//    memory. 2 loads (8 bytes) per FMA: arithmetic intensity 0.25 FLOP/byte. The loads hit L1/L2
//    (a warp's 32 threads share their A element, and neighbouring warps share B), but L1 bandwidth
//    is the limit, far below the FMA units. With trans_b the 32 threads of a warp read B with a
//    stride of ldb: every load touches 32 sectors. Expect a few percent of cuBLAS.
//
// 2. smem_tiled (gemm_smem_tiled): a block of 32 x 32 threads owns a 32 x 32 tile of C and walks k
//    in steps of 32. Each step stages a 32 x 32 tile of A and of B in shared memory (every element
//    loaded from global once, coalesced for either layout), then each thread does 32 FMAs out of
//    shared memory. Global traffic: 8 KiB per 65,536 FLOPs = 8 FLOP/byte, 32x better. But every
//    FMA still needs two shared-memory loads (a broadcast of A, a row of B), and shared memory
//    serves one 128-byte wavefront per clock per SM: one warp-wide FMA (32 FMAs) per two clocks,
//    ~16 FMA/clock/SM of the 128 the SM can do. Expect at most ~1/8 of peak.
//
// 3. register_tiled (gemm_register_tiled): the real SGEMM. A block of 256 threads owns a 128 x 128
//    tile of C, each thread an 8 x 8 sub-tile held in 64 registers. Per k step a thread reads 8
//    floats of A and 8 of B from shared memory (four 16-byte loads) and does 64 FMAs with them:
//    4 FMA per float read instead of 0.5. Global traffic per 8-deep k step: (128 + 128) x 8 floats =
//    8 KiB for 262,144 FLOPs = 32 FLOP/byte. Global loads are float4 when the data allow it; A and
//    B are stored in shared memory k-major ([k][mn], the "transposed" layout for a row-major A) so
//    the inner loop reads float4 from shared memory; the tile for step t+1 is fetched into
//    registers while step t computes and written to the second of two shared buffers (double
//    buffering: one __syncthreads per step). FMA throughput is the limit.
//
// 4. mma_tiled (gemm_mma_tiled, bf16/f16 in, f32 accumulate): the FMA units are replaced by tensor
//    cores, one mma.sync.m16n8k16 per 16x16 by 16x8 product, and nothing else changes: step 2's
//    synchronous element loads into padded shared tiles (64 x 64 x 16), each mma operand register
//    read with a plain 32-bit shared load in mma's fragment layout, which this step spells out.
//    32 FLOP/byte from global, 1/16 byte of shared memory per FLOP.
//
// 5. tensor_core (gemm_tensor_core, the production step; its own file, gemm_tensor_core.cu,
//    explains it): step 4 fed properly. Operands arrive by cp.async (16 bytes, asynchronous)
//    through a 4-stage shared-memory ring, swizzled so that ldmatrix (four fragment registers per
//    instruction) reads them without bank conflicts; 64 x 64 warp tiles in 128 x 128 or 128 x 256
//    block tiles; C leaves through shared memory as 16-byte stores. 64 (85) FLOP/byte from
//    global, 1/32 byte of shared memory per FLOP.
//
// What the fast paths require (checked on the host; otherwise the same kernel takes its general
// path, predicated element loads, so any shape, layout and pointer works):
//   register_tiled: float4 loads when the operand's pointer is 16-byte aligned and its ld (and batch
//     stride, if batch > 1) are multiples of 4; the same for C's float4 stores.
//   mma_tiled: none (element loads and stores, any alignment).
//   tensor_core: 16-byte cp.async when the pointer is 16-byte aligned and ld and batch stride are
//     multiples of 8 elements; the same for C's 16-byte stores (8 elements).
//   At the edges of m, n and k, only the vectors that cross the edge go element by element (and
//   those wholly outside become zeros); whole tiles inside an aligned operand skip every check.
// Sizes: m, n, k must fit in int (as for cuBLAS); offsets are computed in 64 bits.
//
// Compile time: one tile configuration per step, mma_tiled once per 16-bit dtype (two for
// tensor_core, whose layouts are template parameters: see gemm_tensor_core.cu). Everything else takes its
// layout as a runtime flag. Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see
// docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_ladder.h"
#include "kernels/cuda/gemm_ladder_internal.cuh"
#include "kernels/cuda/native.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace gemm_ladder_internal;  // Problem, the index helpers, the grid and batch helpers

// C = alpha * acc + beta * C for one f32 element; beta == 0 never reads C (it may hold NaN).
__device__ __forceinline__ void write_c(float* c, float acc, float alpha, float beta) {
  float v = alpha * acc;
  if (beta != 0.f) v = fmaf(beta, *c, v);
  *c = v;
}

// ================================================================================================
// Step 1: naive. One thread per element of C; block 32 (n) x 8 (m) threads, so a warp is 32
// neighbouring columns of one row: it shares each A element (one broadcast load) and reads 32
// neighbouring B elements (one 128-byte line when B is n-contiguous, 32 lines when it is not).
// Per thread: k loads of A, k loads of B, 2k FLOPs.
// ================================================================================================
constexpr int kNaiveBlockN = 32, kNaiveBlockM = 8;

__global__ void __launch_bounds__(kNaiveBlockN* kNaiveBlockM) gemm_naive(const Problem p) {
  const int tiles_n = ceil_div(p.n, kNaiveBlockN);
  const int i = (blockIdx.x / tiles_n) * kNaiveBlockM + threadIdx.y;
  const int j = (blockIdx.x % tiles_n) * kNaiveBlockN + threadIdx.x;
  if (i >= p.m || j >= p.n) return;
  const float* a = batch_entry<float>(p.a) + element_offset(p.a, i, 0);
  const float* b = batch_entry<float>(p.b) + element_offset(p.b, j, 0);
  const int64_t a_step = p.a.k_contiguous ? 1 : p.a.ld;  // to the next k
  const int64_t b_step = p.b.k_contiguous ? 1 : p.b.ld;
  float acc = 0.f;
  for (int kk = 0; kk < p.k; ++kk) {
    acc = fmaf(*a, *b, acc);
    a += a_step;
    b += b_step;
  }
  write_c(batch_entry_c<float>(p) + int64_t(i) * p.ldc + j, acc, p.alpha, p.beta);
}

// ================================================================================================
// Step 2: shared-memory tiling. A block of 32 x 32 threads owns a 32 x 32 tile of C; thread
// (tx, ty) computes C[m0 + ty][n0 + tx]. For each 32-deep slice of k, every thread loads one
// element of the A tile and one of the B tile (global: 2 x 4 KiB per block per slice, each element
// once), then does 32 FMAs reading both tiles from shared memory.
//
// Both tiles live as [k][mn] with one float of padding per row (33): the inner loop reads
// a_tile[kk][ty] (one address per warp: a broadcast) and b_tile[kk][tx] (32 consecutive floats),
// and the loads write 32 consecutive mn (mn-contiguous operand) or 32 consecutive k (k-contiguous:
// a column of the tile, which the padding spreads over 32 different banks).
// ================================================================================================
constexpr int kSmemTile = 32;

__device__ __forceinline__ void load_smem_tile_element(const Operand& op, const float* base, int mn0, int k0,
                                                       int mn_size, int k_size,
                                                       float (&tile)[kSmemTile][kSmemTile + 1]) {
  // Consecutive threadIdx.x read consecutive addresses whichever dimension is contiguous.
  const int mn = op.k_contiguous ? threadIdx.y : threadIdx.x;
  const int kk = op.k_contiguous ? threadIdx.x : threadIdx.y;
  const int g_mn = mn0 + mn, g_k = k0 + kk;
  tile[kk][mn] = (g_mn < mn_size && g_k < k_size) ? base[element_offset(op, g_mn, g_k)] : 0.f;
}

__global__ void __launch_bounds__(kSmemTile* kSmemTile) gemm_smem_tiled(const Problem p) {
  __shared__ float a_tile[kSmemTile][kSmemTile + 1];  // [k][m]
  __shared__ float b_tile[kSmemTile][kSmemTile + 1];  // [k][n]
  const int tiles_n = ceil_div(p.n, kSmemTile);
  const int m0 = (blockIdx.x / tiles_n) * kSmemTile, n0 = (blockIdx.x % tiles_n) * kSmemTile;
  const float* a = batch_entry<float>(p.a);
  const float* b = batch_entry<float>(p.b);
  float acc = 0.f;
  for (int k0 = 0; k0 < p.k; k0 += kSmemTile) {
    load_smem_tile_element(p.a, a, m0, k0, p.m, p.k, a_tile);
    load_smem_tile_element(p.b, b, n0, k0, p.n, p.k, b_tile);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSmemTile; ++kk) acc = fmaf(a_tile[kk][threadIdx.y], b_tile[kk][threadIdx.x], acc);
    __syncthreads();  // before the next slice overwrites the tiles
  }
  const int i = m0 + threadIdx.y, j = n0 + threadIdx.x;
  if (i < p.m && j < p.n) write_c(batch_entry_c<float>(p) + int64_t(i) * p.ldc + j, acc, p.alpha, p.beta);
}

// ================================================================================================
// Step 3: register tiling. Block tile 128 (m) x 128 (n), k in steps of 8, 256 threads, 8 x 8
// outputs per thread.
//
// Thread (tx, ty) = (tid % 16, tid / 16) owns rows {4ty..4ty+3, 64+4ty..64+4ty+3} and columns
// {4tx..4tx+3, 64+4tx..64+4tx+3} of the block tile. With both tiles stored [k][mn] (row length
// 128 + 4 padding), a k step reads a_tile[kk][4ty], a_tile[kk][64+4ty], b_tile[kk][4tx],
// b_tile[kk][64+4tx] as four float4 and does 64 FMAs. In a warp (ty takes 2 values, tx 16) the A
// reads are 2 addresses (broadcast) and the B reads 256 contiguous bytes: no bank conflicts.
//
// Loading a 128 x 8 operand tile (1024 floats, 4 per thread):
//   k-contiguous: thread reads 4 consecutive k of row tid/2 (k offset 4*(tid%2)): one float4, then
//     4 scalar stores into column tid/2 of the [k][mn] tile. The padding of 4 puts the two k
//     halves of a warp's 16 rows on disjoint banks.
//   mn-contiguous: thread reads 4 consecutive mn (4*(tid%32)) of k row tid/32: one float4 in, one
//     float4 out.
// The float4 path needs the operand's vector_ok and all 4 elements inside the matrix; otherwise the
// thread loads element by element with bounds checks (zeros outside), so edges and odd leading
// dimensions are exact.
//
// Pipeline: tile t+1 is loaded into registers before tile t is computed (its latency hides behind
// 512 FMAs per thread) and stored into the other shared buffer afterwards; one __syncthreads per
// tile. Shared memory: 2 buffers x 2 operands x 8 x 132 floats = 16.5 KiB; ~128 registers per
// thread, so two blocks (16 warps) per SM.
// Per block and k-tile: 8 KiB loaded, 262,144 FLOPs (32 FLOP/byte). Shared memory: per thread and
// k step, four float4 reads (64 bytes) for 64 FMAs; per warp 6 wavefronts for 64 warp-wide FMAs.
// ================================================================================================
constexpr int kRtTile = 128;  // block tile, m and n
constexpr int kRtDepth = 8;   // k per tile
constexpr int kRtThreads = 256;
constexpr int kRtRow = kRtTile + 4;  // padded row of the [k][mn] shared tiles

// Where one thread fetches its 4 elements of an operand tile, and where they go in shared memory.
struct RtTileLoader {
  const float* ptr;  // first of the thread's 4 elements in the next k-tile to load
  int64_t step;      // elements from one k-tile to the next
  int mn_pos;        // thread's mn within the tile (first of 4 if mn-contiguous)
  int k_pos;         // thread's k within the tile (first of 4 if k-contiguous)
  int mn_left;       // elements of the matrix from mn_pos on, along mn (<= 0: row outside)
  int k_size;
  bool k_contiguous, vector_ok;
};

__host__ __device__ __forceinline__ RtTileLoader make_rt_loader(const Operand& op, const float* base, int mn0,
                                                                int mn_size, int k_size, int tid) {
  RtTileLoader l;
  l.k_contiguous = op.k_contiguous;
  l.vector_ok = op.vector_ok;
  if (op.k_contiguous) {
    l.mn_pos = tid / 2;
    l.k_pos = (tid % 2) * 4;
  } else {
    l.k_pos = tid / 32;
    l.mn_pos = (tid % 32) * 4;
  }
  l.mn_left = mn_size - (mn0 + l.mn_pos);
  l.k_size = k_size;
  l.step = op.k_contiguous ? kRtDepth : kRtDepth * op.ld;
  // Rows past the matrix are never dereferenced (mn_left <= 0 masks them).
  l.ptr = base + (l.mn_left > 0 ? element_offset(op, mn0 + l.mn_pos, l.k_pos) : 0);
  if (l.mn_left <= 0) l.step = 0;
  return l;
}

// The thread's 4 elements of the k-tile starting at k0 (zeros outside the matrix).
__host__ __device__ __forceinline__ void rt_load(RtTileLoader& l, int k0, float (&r)[4]) {
  const int kk = k0 + l.k_pos;
  const bool row_in = l.k_contiguous ? l.mn_left > 0 : kk < l.k_size;
  const bool all_in = row_in && (l.k_contiguous ? kk + 4 <= l.k_size : l.mn_left >= 4);
  if (l.vector_ok && all_in) {
    const float4 v = load_readonly(reinterpret_cast<const float4*>(l.ptr));
    r[0] = v.x, r[1] = v.y, r[2] = v.z, r[3] = v.w;
  } else {
    for (int e = 0; e < 4; ++e) {
      const bool in = row_in && (l.k_contiguous ? kk + e < l.k_size : e < l.mn_left);
      r[e] = in ? load_readonly(l.ptr + e) : 0.f;
    }
  }
  l.ptr += l.step;
}

__host__ __device__ __forceinline__ void rt_store(const RtTileLoader& l, const float (&r)[4],
                                                  float (*tile)[kRtRow]) {
  if (l.k_contiguous) {
    for (int e = 0; e < 4; ++e) tile[l.k_pos + e][l.mn_pos] = r[e];
  } else {
    *reinterpret_cast<float4*>(&tile[l.k_pos][l.mn_pos]) = make_float4(r[0], r[1], r[2], r[3]);
  }
}

__global__ void __launch_bounds__(kRtThreads, 2) gemm_register_tiled(const Problem p) {
  __shared__ float a_tile[2][kRtDepth][kRtRow];  // [buffer][k][m]
  __shared__ float b_tile[2][kRtDepth][kRtRow];  // [buffer][k][n]
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const TileCorner t0 =
      grouped_tile(blockIdx.x, ceil_div(p.m, kRtTile), ceil_div(p.n, kRtTile), kRtTile, kRtTile);
  RtTileLoader la = make_rt_loader(p.a, batch_entry<float>(p.a), t0.m0, p.m, p.k, tid);
  RtTileLoader lb = make_rt_loader(p.b, batch_entry<float>(p.b), t0.n0, p.n, p.k, tid);

  float acc[8][8];
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

  float ra[4], rb[4];
  rt_load(la, 0, ra);
  rt_load(lb, 0, rb);
  rt_store(la, ra, a_tile[0]);
  rt_store(lb, rb, b_tile[0]);
  __syncthreads();

  const int tiles_k = ceil_div(p.k, kRtDepth);
  for (int t = 0; t < tiles_k; ++t) {
    const int cur = t & 1;
    const bool more = t + 1 < tiles_k;
    if (more) {  // next tile's global loads in flight during this tile's FMAs
      rt_load(la, (t + 1) * kRtDepth, ra);
      rt_load(lb, (t + 1) * kRtDepth, rb);
    }
#pragma unroll
    for (int kk = 0; kk < kRtDepth; ++kk) {
      float a[8], b[8];
      const float4 a_lo = *reinterpret_cast<const float4*>(&a_tile[cur][kk][4 * ty]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&a_tile[cur][kk][64 + 4 * ty]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&b_tile[cur][kk][4 * tx]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&b_tile[cur][kk][64 + 4 * tx]);
      a[0] = a_lo.x, a[1] = a_lo.y, a[2] = a_lo.z, a[3] = a_lo.w;
      a[4] = a_hi.x, a[5] = a_hi.y, a[6] = a_hi.z, a[7] = a_hi.w;
      b[0] = b_lo.x, b[1] = b_lo.y, b[2] = b_lo.z, b[3] = b_lo.w;
      b[4] = b_hi.x, b[5] = b_hi.y, b[6] = b_hi.z, b[7] = b_hi.w;
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    if (more) {
      // The other buffer was last read in tile t-1, and every thread passed the barrier after it.
      rt_store(la, ra, a_tile[cur ^ 1]);
      rt_store(lb, rb, b_tile[cur ^ 1]);
    }
    __syncthreads();
  }

  // Epilogue: row i of the thread's 8 is block row (i < 4 ? 4ty + i : 64 + 4ty + i - 4); its 8
  // columns are two float4-wide groups, 4tx and 64 + 4tx.
  float* c = batch_entry_c<float>(p);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int row = t0.m0 + (i < 4 ? 4 * ty + i : 64 + 4 * ty + (i - 4));
    if (row >= p.m) continue;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int col = t0.n0 + 64 * h + 4 * tx;
      float* cp = c + int64_t(row) * p.ldc + col;
      if (p.c_vector_ok && col + 4 <= p.n) {
        float4 out = make_float4(p.alpha * acc[i][4 * h], p.alpha * acc[i][4 * h + 1],
                                 p.alpha * acc[i][4 * h + 2], p.alpha * acc[i][4 * h + 3]);
        if (p.beta != 0.f) {
          const float4 old = *reinterpret_cast<const float4*>(cp);
          out.x = fmaf(p.beta, old.x, out.x), out.y = fmaf(p.beta, old.y, out.y);
          out.z = fmaf(p.beta, old.z, out.z), out.w = fmaf(p.beta, old.w, out.w);
        }
        *reinterpret_cast<float4*>(cp) = out;
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (col + e < p.n) write_c(cp + e, acc[i][4 * h + e], p.alpha, p.beta);
      }
    }
  }
}

// ================================================================================================
// Step 4: tensor cores, fed the simplest way. Block tile 64 (m) x 64 (n), k in steps of 16 (one
// mma's depth), 128 threads = 4 warps in a 2 x 2 grid, each warp owning 32 x 32 of C as 2 (m) x 4
// (n) tiles of mma.m16n8k16: 8 instructions per k step, each a 16x16 by 16x8 product (2048 FMAs).
//
// What mma.sync wants. A warp holds its operands spread over its 32 lanes in a fixed "fragment"
// layout. With g = lane / 4 (0..7) and q = lane % 4 (0..3), and every register two 16-bit values
// at neighbouring k (or, for C, f32 values at neighbouring columns):
//   A (16 x 16, m x k)  a[0]: row g,   k 2q, 2q+1    a[1]: row g+8, k 2q, 2q+1
//                       a[2]: row g,   k 2q+8, +9    a[3]: row g+8, k 2q+8, +9
//   B (16 x 8, k x n)   b[0]: column g, k 2q, 2q+1   b[1]: column g, k 2q+8, +9
//   C (16 x 8, f32)     c[0], c[1]: row g, columns 2q, 2q+1   c[2], c[3]: row g+8, same columns
// So both tiles are kept in shared memory as [mn][k] (k contiguous): every register is then one
// aligned 32-bit load, a_tile[row][2q] or b_tile[column][2q]. A row holds 16 k plus 8 halves of
// padding: 48 bytes = 12 banks, so the 8 rows g of one load start 12 banks apart and, with the 4
// q, cover all 32 banks once (without the padding rows 0, 2, 4, 6 would share banks: 4-way).
//
// Loading is step 2's, element by element: element e = tid + 128 i of a 64 x 16 tile is (mn, k) =
// (e / 16, e % 16) for a k-contiguous operand and (e % 64, e / 64) for an mn-contiguous one, so a
// warp reads consecutive addresses of either layout; zeros outside the matrix. An mn-contiguous
// operand's stores then walk down a column of the [mn][k] tile, rows 12 banks apart: 4-way bank
// conflicts, which the production step's ldmatrix.trans removes.
//
// What this step buys: the FMAs move to the tensor cores (an H200's dense bf16 peak is ~15x its
// f32 FMA peak), and the C tile a warp keeps in registers is only 32 floats a thread. And what it
// does not: the tensor cores wait on memory. The H200 model calls this step latency-bound, slower
// than step 3 (docs/kernels.md): 2-byte loads put too few bytes in flight. What it leaves, and
// step 5 (gemm_tensor_core.cu) adds: global loads are 2-byte scalars and synchronous
// (every warp waits at the barrier for its tile; nothing is in flight during the mma); a fragment
// register costs one shared-load instruction where ldmatrix.x4 fills four; the 32 x 32 warp tile
// reads 1/16 byte of shared memory per FLOP where 64 x 64 reads 1/32. Per block and k step: 4 KiB
// from global for 131,072 FLOPs (32 FLOP/byte); per warp, 16 shared loads per lane for 8 mma.
// 6 KiB of shared memory; 158 registers (ptxas, sm_90, capped for 3 blocks = 12 warps per SM), most
// of them the 16 element loads of a k step in flight at once.
// ================================================================================================
constexpr int kMmaTile = 64;            // block tile, m and n
constexpr int kMmaDepth = 16;           // k per tile: one mma.m16n8k16
constexpr int kMmaRow = kMmaDepth + 8;  // padded row of the [mn][k] tiles, in 16-bit elements
constexpr int kMmaThreads = 128;

// The thread's 8 elements of a 64 x 16 operand tile at (mn0, k0), into the [mn][k] shared tile.
template <class T>
__device__ __forceinline__ void load_mma_tile(const Operand& op, const T* base, int mn0, int k0, int mn_size,
                                              int k_size, T (&tile)[kMmaTile][kMmaRow]) {
  for (int i = 0; i < kMmaTile * kMmaDepth / kMmaThreads; ++i) {
    const int e = threadIdx.x + kMmaThreads * i;
    const int mn = op.k_contiguous ? e / kMmaDepth : e % kMmaTile;
    const int kk = op.k_contiguous ? e % kMmaDepth : e / kMmaTile;
    const int g_mn = mn0 + mn, g_k = k0 + kk;
    tile[mn][kk] = (g_mn < mn_size && g_k < k_size) ? base[element_offset(op, g_mn, g_k)] : T{0};
  }
}

// Two neighbouring 16-bit elements of a shared tile as one 32-bit mma register.
template <class T>
__device__ __forceinline__ uint32_t pair_at(const T (&tile)[kMmaTile][kMmaRow], int row, int col) {
  return *reinterpret_cast<const uint32_t*>(&tile[row][col]);
}

template <class T>
__global__ void __launch_bounds__(kMmaThreads, 3) gemm_mma_tiled(const Problem p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.sync with bf16 needs sm_80 (the host refuses older GPUs)
#else
  __shared__ __align__(16) T a_tile[kMmaTile][kMmaRow];  // [m][k]
  __shared__ __align__(16) T b_tile[kMmaTile][kMmaRow];  // [n][k]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int g = lane / 4, q = lane % 4;
  const int warp_m = (warp / 2) * 32, warp_n = (warp % 2) * 32;  // this warp's 32 x 32 of the block tile
  const int tiles_n = ceil_div(p.n, kMmaTile);
  const int m0 = (blockIdx.x / tiles_n) * kMmaTile, n0 = (blockIdx.x % tiles_n) * kMmaTile;
  const T* a = batch_entry<T>(p.a);
  const T* b = batch_entry<T>(p.b);

  float acc[2][4][4] = {};  // [m16 tile][n8 tile][c register]
  for (int k0 = 0; k0 < p.k; k0 += kMmaDepth) {
    load_mma_tile(p.a, a, m0, k0, p.m, p.k, a_tile);
    load_mma_tile(p.b, b, n0, k0, p.n, p.k, b_tile);
    __syncthreads();
    uint32_t a_frag[2][4], b_frag[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = warp_m + 16 * i + g;
      a_frag[i][0] = pair_at(a_tile, row, 2 * q);
      a_frag[i][1] = pair_at(a_tile, row + 8, 2 * q);
      a_frag[i][2] = pair_at(a_tile, row, 2 * q + 8);
      a_frag[i][3] = pair_at(a_tile, row + 8, 2 * q + 8);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int col = warp_n + 8 * j + g;
      b_frag[j][0] = pair_at(b_tile, col, 2 * q);
      b_frag[j][1] = pair_at(b_tile, col, 2 * q + 8);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) mma_16816<T>(acc[i][j], a_frag[i], b_frag[j][0], b_frag[j][1]);
    __syncthreads();  // before the next k step overwrites the tiles
  }

  // Register r of tile (i, j) is C[warp_m + 16i + g + 8 (r / 2)][warp_n + 8j + 2q + r % 2].
  T* c = batch_entry_c<T>(p);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + warp_m + 16 * i + g + 8 * (r / 2), col = n0 + warp_n + 8 * j + 2 * q + r % 2;
        if (row >= p.m || col >= p.n) continue;
        T* cp = c + int64_t(row) * p.ldc + col;
        float v = p.alpha * acc[i][j][r];
        if (p.beta != 0.f) v = fmaf(p.beta, load(cp), v);
        store(cp, v);
      }
#endif
}

// ================================================================================================
// alpha == 0 or k == 0: no product, C = beta * C (0 when beta == 0, C not read). One thread per
// element, grid-stride over the m x n matrix of batch entry blockIdx.z.
// ================================================================================================
template <class T>
__global__ void scale_c(T* c, int m, int n, int64_t ldc, int64_t batch_stride_c, float beta) {
  c += int64_t(blockIdx.z) * batch_stride_c;
  const int64_t count = int64_t(m) * n;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < count;
       e += int64_t(gridDim.x) * blockDim.x) {
    T* cp = c + (e / n) * ldc + e % n;
    store(cp, beta == 0.f ? 0.f : beta * load(cp));
  }
}

// ================================================================================================
// Host side
// ================================================================================================

std::atomic<int> g_matmul_kernel{-1};  // -1: not chosen yet (read MG_CUDA_MATMUL)
std::atomic<int> g_allow_tf32{-1};     // -1: not chosen yet (read MG_CUDA_ALLOW_TF32)

bool aligned(const void* ptr, int64_t ld, int64_t batch_stride, int64_t batch, size_t elem, size_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0 && (static_cast<uint64_t>(ld) * elem) % bytes == 0 &&
         (batch <= 1 || (static_cast<uint64_t>(batch_stride) * elem) % bytes == 0);
}

// The same checks as every gemm (kernels/kernel_args.h: check_gemm_args), plus the 32-bit limits of
// the kernels.
void validate(const GemmArgs& g, const char* step) {
  const std::string what = str_cat("gemm_ladder (", step, ")");
  check_gemm_args(g, what.c_str());
  // 32-bit tile arithmetic, with room for a tile past the end.
  constexpr int64_t kMaxSize = INT_MAX - 256;
  MG_CHECK(g.m <= kMaxSize && g.n <= kMaxSize && g.k <= kMaxSize, what, ": m=", g.m, " n=", g.n, " k=", g.k,
           " exceed the kernels' 32-bit limit of ", kMaxSize);
}

template <class T>
void launch_scale_c(const GemmArgs& g, cudaStream_t stream) {
  constexpr int64_t kMaxGridZ = 65535;
  const unsigned blocks = grid_for(g.m * g.n);
  for (int64_t first = 0; first < g.batch; first += kMaxGridZ) {
    const unsigned z = static_cast<unsigned>(std::min(kMaxGridZ, g.batch - first));
    T* c = static_cast<T*>(g.c) + first * g.batch_stride_c;
    launch_kernel<scale_c<T>>(dim3(blocks, 1, z), kThreads, 0, stream, c, int(g.m), int(g.n), g.ldc,
                              g.batch_stride_c, static_cast<float>(g.beta));
  }
}

}  // namespace

// ---- selection ---------------------------------------------------------------------------------

GemmKernel matmul_kernel() {
  const int chosen = g_matmul_kernel.load(std::memory_order_acquire);
  if (chosen >= 0) return static_cast<GemmKernel>(chosen);
  const char* env = std::getenv("MG_CUDA_MATMUL");
  const GemmKernel from_env = env && *env ? parse_gemm_kernel(env, "MG_CUDA_MATMUL") : GemmKernel::cublas;
  int expected = -1;  // a concurrent set_matmul_kernel wins
  g_matmul_kernel.compare_exchange_strong(expected, static_cast<int>(from_env), std::memory_order_acq_rel);
  return static_cast<GemmKernel>(g_matmul_kernel.load(std::memory_order_acquire));
}

void set_matmul_kernel(GemmKernel kernel) {
  g_matmul_kernel.store(static_cast<int>(kernel), std::memory_order_release);
}

bool allow_tf32() {
  const int chosen = g_allow_tf32.load(std::memory_order_acquire);
  if (chosen >= 0) return chosen != 0;
  const char* env = std::getenv("MG_CUDA_ALLOW_TF32");
  int value = 0;
  if (env && *env) {
    const std::string s = env;
    if (s == "1" || s == "true" || s == "on") {
      value = 1;
    } else {
      MG_CHECK(s == "0" || s == "false" || s == "off",
               "MG_CUDA_ALLOW_TF32: expected 1/true/on or 0/false/off, got '", s, "'");
    }
  }
  int expected = -1;
  g_allow_tf32.compare_exchange_strong(expected, value, std::memory_order_acq_rel);
  return g_allow_tf32.load(std::memory_order_acquire) != 0;
}

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow ? 1 : 0, std::memory_order_release); }

// ---- the ladder's entry point ------------------------------------------------------------------

void gemm_ladder(cudaStream_t stream, ScratchAllocator& scratch, GemmKernel kernel, const GemmArgs& g) {
  if (kernel == GemmKernel::cublas) return gemm_cublas(stream, scratch, g);
  const char* step = gemm_kernel_name(kernel);
  MG_CHECK(gemm_kernel_supports(kernel, g.dtype), "gemm_ladder (", step, "): the ", step, " kernel takes ",
           uses_tensor_cores(kernel) ? "bf16 or f16 (f32 accumulation)" : "f32", ", got ",
           dtype_name(g.dtype), " (cuBLAS takes every floating dtype: GemmKernel::cublas)");
  validate(g, step);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  if (g.k == 0 || g.alpha == 0.0) {  // no product: A and B are not read
    if (g.dtype == DType::f32) return launch_scale_c<float>(g, stream);
    if (g.dtype == DType::bf16) return launch_scale_c<bf16_t>(g, stream);
    return launch_scale_c<f16_t>(g, stream);
  }

  const size_t elem = dtype_size(g.dtype);
  // Vector width in bytes of the step's fast loads: float4 (16) for register_tiled, 16-byte cp.async
  // for tensor_core; its C writes: float4 (16) / 8 halves (16). The others never vectorise.
  const size_t load_bytes = 16;
  const size_t store_bytes = 16;
  Problem p;
  p.m = static_cast<int>(g.m), p.n = static_cast<int>(g.n), p.k = static_cast<int>(g.k);
  p.a = Operand{g.a, g.lda, g.batch_stride_a, !g.trans_a,
                aligned(g.a, g.lda, g.batch_stride_a, g.batch, elem, load_bytes)};
  p.b = Operand{g.b, g.ldb, g.batch_stride_b, g.trans_b,
                aligned(g.b, g.ldb, g.batch_stride_b, g.batch, elem, load_bytes)};
  p.c = g.c;
  p.ldc = g.ldc;
  p.batch_stride_c = g.batch_stride_c;
  p.c_vector_ok = aligned(g.c, g.ldc, g.batch_stride_c, g.batch, elem, store_bytes);
  p.alpha = static_cast<float>(g.alpha);
  p.beta = static_cast<float>(g.beta);

  switch (kernel) {
    case GemmKernel::naive: {
      const unsigned tiles = tile_count(g.m, g.n, kNaiveBlockM, kNaiveBlockN, step);
      for_each_batch_chunk(p, g.batch, elem, [&](const Problem& q, unsigned z) {
        launch_kernel<gemm_naive>(dim3(tiles, 1, z), dim3(kNaiveBlockN, kNaiveBlockM), 0, stream, q);
      });
      return;
    }
    case GemmKernel::smem_tiled: {
      const unsigned tiles = tile_count(g.m, g.n, kSmemTile, kSmemTile, step);
      for_each_batch_chunk(p, g.batch, elem, [&](const Problem& q, unsigned z) {
        launch_kernel<gemm_smem_tiled>(dim3(tiles, 1, z), dim3(kSmemTile, kSmemTile), 0, stream, q);
      });
      return;
    }
    case GemmKernel::register_tiled: {
      const unsigned tiles = tile_count(g.m, g.n, kRtTile, kRtTile, step);
      for_each_batch_chunk(p, g.batch, elem, [&](const Problem& q, unsigned z) {
        launch_kernel<gemm_register_tiled>(dim3(tiles, 1, z), kRtThreads, 0, stream, q);
      });
      return;
    }
    case GemmKernel::mma_tiled: {
      check_tensor_cores(step);
      const unsigned tiles = tile_count(g.m, g.n, kMmaTile, kMmaTile, step);
      for_each_batch_chunk(p, g.batch, elem, [&](const Problem& q, unsigned z) {
        if (g.dtype == DType::bf16) {
          launch_kernel<gemm_mma_tiled<bf16_t>>(dim3(tiles, 1, z), kMmaThreads, 0, stream, q);
        } else {
          launch_kernel<gemm_mma_tiled<f16_t>>(dim3(tiles, 1, z), kMmaThreads, 0, stream, q);
        }
      });
      return;
    }
    case GemmKernel::tensor_core:
      if (g.dtype == DType::bf16) return launch_tensor_core<bf16_t>(p, g.batch, stream);
      return launch_tensor_core<f16_t>(p, g.batch, stream);
    case GemmKernel::cublas: break;  // handled above
  }
}

}  // namespace mg::kernels::cuda
