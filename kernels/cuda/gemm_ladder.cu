// The GEMM ladder: four hand-written CUDA kernels for C = alpha op(A) op(B) + beta C, each a step
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
// 4. tensor_core (gemm_tensor_core, bf16/f16 in, f32 accumulate): the FMA units are replaced by
//    tensor cores through mma.sync.m16n8k16 (one instruction: a 16x16 by 16x8 product, 2048 FMAs).
//    Block tile 128 x 128 x 32 with 4 warps, or 128 x 256 x 32 with 8 warps for large problems,
//    each warp owning 64 x 64 of C (4 x 8 mma tiles, 128 f32 accumulators per thread). Operands
//    move global -> shared with cp.async (16 bytes per instruction, no registers, asynchronous)
//    through a 4-stage ring so three k-tiles are in flight while one is computed; shared ->
//    registers with ldmatrix (a warp loads four 8x8 matrices in one instruction, already in mma's
//    fragment layout; .trans for mn-contiguous operands). Shared memory is XOR-swizzled so neither
//    cp.async's writes nor ldmatrix's reads conflict on banks. C leaves through shared memory as
//    16-byte stores. Per k-tile: 16 KiB (24 KiB) from global for 1 (2) MFLOP = 64 (85) FLOP/byte.
//    Predicted on an H200 (docs/performance-model.md): never tensor-bound. Small problems are
//    shared-memory-bound; large ones L2-bound at 128 x 128 and shared-memory-bound at 128 x 256,
//    because mma.sync keeps the accumulators in registers, which caps the tile (and so the reuse
//    out of L2), and each warp loads its own fragments through ldmatrix (1/32 byte of shared
//    memory per FLOP). Step 4 below has the numbers, and what Hopper's wgmma and TMA multicast
//    would change.
//
// What the fast paths require (checked on the host; otherwise the same kernel takes its general
// path, predicated element loads, so any shape, layout and pointer works):
//   register_tiled: float4 loads when the operand's pointer is 16-byte aligned and its ld (and batch
//     stride, if batch > 1) are multiples of 4; the same for C's float4 stores.
//   tensor_core: 16-byte cp.async when the pointer is 16-byte aligned and ld and batch stride are
//     multiples of 8 elements; the same for C's 16-byte stores (8 elements).
//   At the edges of m, n and k, only the vectors that cross the edge go element by element (and
//   those wholly outside become zeros); whole tiles inside an aligned operand skip every check.
// Sizes: m, n, k must fit in int (as for cuBLAS); offsets are computed in 64 bits.
//
// Compile time: one tile configuration per step (two for tensor_core); the tensor-core kernel is
// instantiated for {bf16, f16} x {A k-contiguous or not} x {B k-contiguous or not} x {128, 256}
// because the layout decides the ldmatrix flavour inside the hottest loop. Everything else takes its
// layout as a runtime flag. Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see
// docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_ladder.h"
#include "kernels/cuda/native.cuh"

namespace mg::kernels::cuda {
namespace {

// ---- the problem as the kernels see it ---------------------------------------------------------

// One input matrix as an (mn x k) operand (see the top of the file).
struct Operand {
  const void* ptr = nullptr;  // element (0, 0) of the first batch entry of this launch
  int64_t ld = 0;             // leading dimension, in elements
  int64_t batch_stride = 0;   // elements between batch entries; 0 = the same matrix for all
  bool k_contiguous = true;   // element (mn, p) at mn*ld + p (true) or p*ld + mn (false)
  bool vector_ok = false;     // pointer, ld, batch stride allow the step's vector loads
};

struct Problem {
  int m = 0, n = 0, k = 0;
  Operand a;  // op(A): m x k
  Operand b;  // op(B) seen as n x k: B^T's rows are op(B)'s columns
  void* c = nullptr;
  int64_t ldc = 0, batch_stride_c = 0;
  bool c_vector_ok = false;  // C allows the step's vector stores (float4 / pairs of halves)
  float alpha = 1.f, beta = 0.f;
};

// The index helpers and tile loaders are __host__ __device__: a host program can replay a block's
// index arithmetic (which element lands where in shared memory, which lane reads what) against a
// plain GEMM without a GPU. Only the PTX wrappers (native.cuh) differ between the two sides, and the
// host side asserts the alignment the GPU would need. (Their short fixed loops carry no
// `#pragma unroll`, which the host compiler would warn about; nvcc unrolls them anyway.)
__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ constexpr int min_int(int a, int b) { return a < b ? a : b; }
__host__ __device__ constexpr int max_int(int a, int b) { return a > b ? a : b; }

// The shared_array ids (common.cuh) of a kernel's two static operand tiles: A's and B's tiles have
// one type, so each needs an id of its own to be an array of its own.
constexpr int kATileId = 0;
constexpr int kBTileId = 1;

// A read-only global load (the read-only data path on the GPU).
template <class T>
__host__ __device__ __forceinline__ T load_readonly(const T* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  assert(reinterpret_cast<uintptr_t>(p) % sizeof(T) == 0);
  return *p;
#endif
}

// Offset of element (mn, p) of an operand.
__host__ __device__ __forceinline__ int64_t element_offset(const Operand& op, int mn, int p) {
  return op.k_contiguous ? int64_t(mn) * op.ld + p : int64_t(p) * op.ld + mn;
}

// This block's batch entry (blockIdx.z) of an operand / of C.
template <class T>
__device__ __forceinline__ const T* batch_entry(const Operand& op) {
  return static_cast<const T*>(op.ptr) + int64_t(blockIdx.z) * op.batch_stride;
}
template <class T>
__device__ __forceinline__ T* batch_entry_c(const Problem& p) {
  return static_cast<T*>(p.c) + int64_t(blockIdx.z) * p.batch_stride_c;
}

// C = alpha * acc + beta * C for one f32 element; beta == 0 never reads C (it may hold NaN).
__device__ __forceinline__ void write_c(float* c, float acc, float alpha, float beta) {
  float v = alpha * acc;
  if (beta != 0.f) v = fmaf(beta, *c, v);
  *c = v;
}

// The (m0, n0) corner of block tile number `tile` (blockIdx.x). Tiles are numbered in groups of
// kGroupRows tile-rows, column by column inside a group, so blocks running at the same time share
// a few rows of A and a few columns of B and find them in L2 (a plain row-by-row order would sweep
// all of B for every row of tiles).
constexpr int kGroupRows = 8;
struct TileCorner {
  int m0, n0;
};
__host__ __device__ __forceinline__ TileCorner grouped_tile(int tile, int tiles_m, int tiles_n, int tile_m,
                                                            int tile_n) {
  const int per_group = kGroupRows * tiles_n;
  const int first_row = (tile / per_group) * kGroupRows;
  const int rows = min_int(tiles_m - first_row, kGroupRows);
  const int local = tile % per_group;
  return TileCorner{(first_row + local % rows) * tile_m, (local / rows) * tile_n};
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
  float(&a_tile)[kSmemTile][kSmemTile + 1] =
      shared_array<float[kSmemTile][kSmemTile + 1], kATileId>();  // [k][m]
  float(&b_tile)[kSmemTile][kSmemTile + 1] =
      shared_array<float[kSmemTile][kSmemTile + 1], kBTileId>();  // [k][n]
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
  float(&a_tile)[2][kRtDepth][kRtRow] =
      shared_array<float[2][kRtDepth][kRtRow], kATileId>();  // [buffer][k][m]
  float(&b_tile)[2][kRtDepth][kRtRow] =
      shared_array<float[2][kRtDepth][kRtRow], kBTileId>();  // [buffer][k][n]
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
// Step 4: tensor cores. Block tile 128 (m) x kTileN (n), kTileN = 128 or 256, k in steps of 32;
// kTileN / 32 warps in a 2 (m) x kTileN/64 (n) grid, each owning a 64 x 64 piece of C as 4 (m) x 8
// (n) tiles of mma.m16n8k16 (f32 accumulators: 4 per thread per tile, 128 in all). Inputs are
// 16-bit (bf16 or f16), so one 16-byte chunk is 8 elements.
//
// Shared memory: a ring of 4 stages, each an A tile (128 x 32 elements, 8 KiB) and a B tile
// (kTileN x 32: 8 or 16 KiB): 64 KiB per block for the 128 x 128 tile, 96 KiB for 128 x 256. An
// operand's tile keeps its global layout, because cp.async copies 16 bytes as they are:
//   k-contiguous: [mn][32 k], rows of 64 bytes = 4 chunks; chunk c of row r is stored at chunk
//     position c ^ ((r >> 1) & 3).
//   mn-contiguous: [32 k][128 or 256 mn], rows of 16 or 32 chunks; chunk c of row r at c ^ (r & 7).
// ldmatrix reads eight 16-byte rows of one 8x8 matrix at a time, which are eight consecutive tile
// rows at the same logical chunk: the XOR sends them to eight different 16-byte bank groups (the
// unswizzled layout would put all eight on the same 4 banks: an 8-way conflict). cp.async's writes
// (eight consecutive chunks per 8 threads) stay conflict-free too.
//
// Loading (per stage and operand: mn-size x 32 / 8 chunks, 2 or 4 per thread): thread tid copies
// chunk (tid % 4) of rows tid/4 + (threads/4) i (k-contiguous) or chunk tid % (mn-size/8) of k-rows
// tid / (mn-size/8) + 8 or 16 i (mn-contiguous). Either way a thread's chunk i lands 8 x threads
// elements after its chunk 0 in the tile. Interior tiles of an aligned operand use cp.async.cg (16
// bytes, bypassing L1); chunks crossing or outside the matrix's edge, or of a misaligned operand,
// are loaded element by element (zeros outside) and stored with a plain 16-byte shared store.
//
// Fragments: mma's A operand is a 16x16 row-major block = four 8x8 matrices (rows 0-7 / 8-15 x
// k 0-7 / 8-15), its B operand a 16x8 block stored "column-major" = two 8x8 matrices (k 0-7, 8-15)
// of 8 n each. ldmatrix.x4 loads four 8x8 matrices; lane l supplies the address of row l % 8 of
// matrix l / 8. For a k-contiguous tile a matrix row is 8 k of one mn, already what mma wants; for
// an mn-contiguous tile it is 8 mn of one k, and ldmatrix.trans transposes the 8x8 matrix on the
// way. One ldmatrix.x4 gives a whole A fragment, or the B fragments of two neighbouring n8 tiles.
//
// Epilogue: mma leaves each lane 2 neighbouring columns of a row (4 bytes of bf16), 4 lanes per row
// over 8 rows: stored straight from the fragments, a warp's request touches 8 sectors and fills
// half of each. Instead the block stages C in shared memory, in f32 (so beta * C is added to the
// unrounded product, as before), half the block tile (64 rows) at a time: the ring holds
// 64 x (kTileN + 8) floats (34 KiB / 66 KiB of 64 / 96), not all 128 rows. Each lane writes its
// float2s; then each thread reads 8 consecutive columns (two float4) and writes them to C as one
// 16-byte store: a warp stores 512 contiguous bytes (2 rows of 256 or 1 of 512), 16 full sectors.
// Banks: a staged row is kTileN + 8 floats, 8 banks further than the one above, so a fragment
// store (8 rows x 8 floats per n8 tile) covers the 32 banks twice, the ideal 2 wavefronts; and
// float4 g of a row is stored at g ^ ((g >> 3) & 1), so the float4 reads of the 16 (or 32)
// threads of a row, 8 floats apart, fall evenly on all 32 banks (4 wavefronts, the ideal)
// instead of on half of them. The 16-byte path needs C's pointer 16-byte aligned and ldc and its
// batch stride multiples of 8; otherwise, and for chunks crossing the n edge, element stores.
//
// Counting, per block and 32-deep k-tile: (128 + kTileN) x 32 x 2 bytes from global (via L2) for
// 2 x 128 x kTileN x 32 FLOPs: 64 FLOP/byte at 128 x 128, 85 at 128 x 256. Per warp and 16-deep k
// step: 4 + 4 ldmatrix.x4 (4 KiB from shared memory) feed 32 mma (65,536 FMAs), whatever kTileN.
//
// What limits it (the emulator's access tracer and H200 model, docs/performance-model.md; every
// time a prediction). Global loads fill whole sectors (16 per request), and with the staged
// epilogue so do the stores; every shared access runs at its ideal wavefronts. Three budgets, per
// FLOP, against the H200's 989 TFLOP/s of dense bf16:
//   L2       9.78 TB/s: 0.0099 bytes per FLOP. A BM x BN block tile reads (BM + BN) x K x 2 bytes
//            for 2 BM BN K FLOPs: 1/BM + 1/BN bytes per FLOP, 0.0156 at 128 x 128, 0.0117 at 128 x
//            256. Below the budget needs BM = BN >= 203.
//   shared   132 SMs x 128 bytes per clock = 33.4 TB/s: 0.0338 bytes per FLOP. The fill (cp.async
//            writes) is the same 1/BM + 1/BN; ldmatrix reads each warp's A and B fragments, (64 +
//            64) x 2 bytes per k for a 64 x 64 warp tile: 1/32 = 0.0313 bytes per FLOP whatever the
//            block tile, 0.92 of the budget on its own. Total 0.0469 (128 x 128), 0.0430 (128 x 256).
//   registers  the f32 accumulators of a block tile are 4 BM BN bytes: 128 KiB at 128 x 256, half
//            of an SM's 256 KiB register file, with 256 threads at 240 registers each (ptxas, sm_90;
//            238 at 128 x 128, no spills) using 61K of the 64K registers. 64 x 64 is the largest warp
//            tile (128 accumulators per thread of the 255 allowed), so no bigger block tile fits:
//            256 x 256 needs the whole file for accumulators alone.
// So with mma.sync the model cannot call this kernel tensor-bound:
//   * 1024^3 (64 blocks of 128 x 128, under one per SM): shared-bound, per block and k-tile 128
//     wavefronts of cp.async writes and 256 of ldmatrix reads at 1 per SM and clock; an SM cannot
//     borrow another's shared memory. The staged epilogue adds 2 x 512 wavefronts a block (6%).
//   * 4096^3: 128 x 128 (1024 blocks) moves 1024 x 2 MiB = 2.15 GB through L2, 220 us against 139
//     us of tensor work: L2-bound (229 us predicted). 128 x 256, picked for large grids (the host's
//     tensor_core_tile_n), moves 512 x 3 MiB = 1.61 GB (165 us) and then binds on shared memory:
//     704 wavefronts per k-tile, 92K per block, 4 blocks on the busiest SM: 186 us (189 us
//     predicted).
// What Hopper changes (wgmma and TMA, sm_90a; this kernel keeps to sm_80's mma.sync). wgmma, a
// warpgroup (4 warps) MMA, takes B (and A) straight from shared memory once per warpgroup instead
// of once per warp: a 64 x 256 warpgroup tile reads 1/64 + 1/256 = 0.0195 bytes per FLOP instead
// of 1/32, and its registers hold only accumulators (CUTLASS runs 128 x 256 tiles with two
// consumer warpgroups and setmaxnreg). TMA fills shared memory without per-thread instructions,
// and TMA multicast in a cluster of 2 CTAs lets one L2 read land in both CTAs' shared memories:
// two 128 x 256 tiles stacked in m share their B tile, so the pair reads A 2 x 128 + B 256 rows per
// k for a 256 x 256 piece of C, the L2 traffic of a 256 x 256 tile: 1/256 + 1/256 = 0.0078 bytes
// per FLOP, 1.07 GB at 4096^3, 110 us of L2 under the 139 us of tensor work. Shared memory then
// needs 0.0195 + 0.0078 = 0.0273 bytes per FLOP of its 0.0338. Both together bring L2 and shared
// memory under the tensor cores, and the model would call it tensor-bound.
// ================================================================================================
constexpr int kTcTileM = 128;    // block tile, m
constexpr int kTcDepth = 32;     // k per stage
constexpr int kTcStages = 4;     // cp.async ring depth
constexpr int kTcWarpTile = 64;  // each warp: 64 x 64 of C

// The block tile 128 x kTileN and what follows from it.
template <int kTileN>
struct TcConfig {
  static_assert(kTileN == 128 || kTileN == 256, "the two configurations");
  static constexpr int kWarpsN = kTileN / kTcWarpTile;
  static constexpr int kThreads = 32 * (kTcTileM / kTcWarpTile) * kWarpsN;  // 128 / 256
  static constexpr int kATileElems = kTcTileM * kTcDepth;
  static constexpr int kBTileElems = kTileN * kTcDepth;
  static constexpr int kStageElems = kATileElems + kBTileElems;
  static constexpr int kSmemBytes = kTcStages * kStageElems * 2;  // 64 / 96 KiB
  static constexpr int kAChunks = kATileElems / 8 / kThreads;     // per thread and stage: 4 / 2
  static constexpr int kBChunks = kBTileElems / 8 / kThreads;     // 4 / 4
  // Epilogue staging: half the block tile (64 rows) in f32 at a time, rows padded by 8 floats.
  static constexpr int kStageRows = kTcTileM / 2;
  static constexpr int kStageRow = kTileN + 8;
  static constexpr int kRowChunks = kTileN / 8;                               // 16-byte C chunks per row
  static constexpr int kEpilogueChunks = kStageRows * kRowChunks / kThreads;  // per thread and pass: 8
  static_assert(kStageRows * kStageRow * 4 <= kSmemBytes, "the staged C must fit in the ring");
  static_assert(kAChunks * kThreads * 8 == kATileElems && kBChunks * kThreads * 8 == kBTileElems, "");
};

// Swizzled element offsets inside one operand tile (see above). `row` is the mn-contiguous tile's
// row length (128 or 256).
__host__ __device__ __forceinline__ int swizzle_k_contiguous(int mn, int kk) {  // tile [mn][32]
  return mn * kTcDepth + ((((kk >> 3) ^ ((mn >> 1) & 3))) << 3) + (kk & 7);
}
__host__ __device__ __forceinline__ int swizzle_mn_contiguous(int kk, int mn, int row) {  // tile [32][row]
  return kk * row + ((((mn >> 3) ^ (kk & 7))) << 3) + (mn & 7);
}

// Float offset of C's (row, col) in the epilogue's staging buffer (rows of kTileN + 8 floats, float4
// g of a row at g ^ ((g >> 3) & 1)).
template <int kTileN>
__host__ __device__ __forceinline__ int staged_c_offset(int row, int col) {
  return row * TcConfig<kTileN>::kStageRow + ((((col >> 2) ^ ((col >> 5) & 1))) << 2) + (col & 3);
}

// ---- PTX wrappers (sm_80+) ----
// cp_async_16, cp_async_commit, cp_async_wait, ldmatrix_x4 and mma_16816 are in native.cuh.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Where one thread copies its chunks of an operand tile from and to.
struct TcTileLoader {
  const uint16_t* ptr;   // chunk 0 of the next k-tile to load
  int64_t chunk_stride;  // elements between the thread's chunks in global memory
  int64_t step;          // elements from one k-tile to the next
  int smem_offset;       // element offset of chunk 0 in the tile; chunk i is + smem_stride i
  int smem_stride;       // 8 x threads
  int mn_first;          // matrix mn of chunk 0 (k-contiguous: its row; mn-contiguous: first element)
  int k_first;           // k of chunk 0 within the tile (k-contiguous: first element; else its row)
  int mn_step, k_step;   // mn and k from one of the thread's chunks to the next (one of them 0)
  int mn_size, k_size;
  bool k_contiguous, vector_ok;
};

// `tile_mn`: the operand tile's mn size (128 or 256); `threads`: the block's.
__host__ __device__ __forceinline__ TcTileLoader make_tc_loader(const Operand& op, const uint16_t* base,
                                                                int mn0, int mn_size, int k_size, int tid,
                                                                int tile_mn, int threads) {
  TcTileLoader l;
  l.k_contiguous = op.k_contiguous;
  l.vector_ok = op.vector_ok;
  l.mn_size = mn_size;
  l.k_size = k_size;
  l.smem_stride = 8 * threads;
  if (op.k_contiguous) {  // rows tid/4 + (threads/4) i, chunk tid%4
    const int row = tid / 4, chunk = tid % 4, rows_apart = threads / 4;
    l.mn_first = mn0 + row;
    l.k_first = chunk * 8;
    l.mn_step = rows_apart;
    l.k_step = 0;
    l.chunk_stride = rows_apart * op.ld;
    l.step = kTcDepth;
    l.smem_offset = swizzle_k_contiguous(row, chunk * 8);
  } else {  // k-rows tid/(tile_mn/8) + (threads/(tile_mn/8)) i, chunk tid%(tile_mn/8)
    const int per_row = tile_mn / 8, row = tid / per_row, chunk = tid % per_row,
              rows_apart = threads / per_row;
    l.mn_first = mn0 + chunk * 8;
    l.k_first = row;
    l.mn_step = 0;
    l.k_step = rows_apart;
    l.chunk_stride = rows_apart * op.ld;
    l.step = kTcDepth * op.ld;
    l.smem_offset = swizzle_mn_contiguous(row, chunk * 8, tile_mn);
  }
  // Matches element (mn_first, k_first); never dereferenced where outside (see tc_load_tile).
  l.ptr = base + element_offset(op, l.mn_first, l.k_first);
  return l;
}

// Queues the copy of k-tile starting at k0 into `tile` (shared). `interior`: the whole tile is
// inside the matrix and the operand is 16-byte aligned, so every chunk is one cp.async without
// checks.
template <int kChunks>
__host__ __device__ __forceinline__ void tc_load_tile(TcTileLoader& l, int k0, bool interior,
                                                      uint16_t* tile) {
  for (int i = 0; i < kChunks; ++i) {
    const uint16_t* src = l.ptr + i * l.chunk_stride;
    uint16_t* dst = tile + l.smem_offset + i * l.smem_stride;
    if (interior) {
      cp_async_16(dst, src);
      continue;
    }
    // How many of the chunk's 8 elements lie inside the matrix.
    const int mn = l.mn_first + l.mn_step * i, kk = k0 + l.k_first + l.k_step * i;
    int valid;
    if (l.k_contiguous) {
      valid = mn < l.mn_size ? min_int(max_int(l.k_size - kk, 0), 8) : 0;
    } else {
      valid = kk < l.k_size ? min_int(max_int(l.mn_size - mn, 0), 8) : 0;
    }
    if (valid == 8 && l.vector_ok) {
      cp_async_16(dst, src);
    } else {
      uint32_t word[4] = {0u, 0u, 0u, 0u};
      for (int e = 0; e < 8; ++e)
        if (e < valid) word[e / 2] |= uint32_t(load_readonly(src + e)) << (16 * (e % 2));
      *reinterpret_cast<uint4*>(dst) = make_uint4(word[0], word[1], word[2], word[3]);
    }
  }
  l.ptr += l.step;
}

// Element offset, in an operand tile, of the row that this lane hands to ldmatrix.x4 for the 16 x 16
// block at (mn0, k0). `a_order`: the four matrices are (mn 0-7, k 0-7), (mn 8-15, k 0-7),
// (mn 0-7, k 8-15), (mn 8-15, k 8-15), which is mma's A fragment a0..a3; otherwise (mn 0-7, k 0-7),
// (mn 0-7, k 8-15), (mn 8-15, k 0-7), (mn 8-15, k 8-15): the B fragments of n-tile mn0 then mn0 + 8.
// `tile_mn`: the tile's mn size.
template <bool kKContiguous>
__host__ __device__ __forceinline__ int fragment_row_offset(int lane, int mn0, int k0, bool a_order,
                                                            int tile_mn) {
  const int matrix = lane / 8, row = lane % 8;
  const int mn_half = a_order ? (matrix & 1) : (matrix >> 1);
  const int k_half = a_order ? (matrix >> 1) : (matrix & 1);
  if (kKContiguous) return swizzle_k_contiguous(mn0 + 8 * mn_half + row, k0 + 8 * k_half);
  return swizzle_mn_contiguous(k0 + 8 * k_half + row, mn0 + 8 * mn_half, tile_mn);
}

// Stores one f32 value as T (round to nearest even).
template <class T>
__device__ __forceinline__ T to_half(float v) {
  if constexpr (std::is_same<T, bf16_t>::value) {
    return make_bf16(v);
  } else {
    return make_f16(v);
  }
}

// C[row][col .. col + 7] = alpha * v + beta * C (beta == 0: C not read); columns past n are left
// alone. One 16-byte access when C allows it and all 8 columns are inside.
template <class T>
__device__ __forceinline__ void tc_store_chunk(const Problem& p, T* c, int row, int col, float (&v)[8]) {
  if (row >= p.m) return;
  T* cp = c + int64_t(row) * p.ldc + col;
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] *= p.alpha;
  if (p.c_vector_ok && col + 8 <= p.n) {
    if (p.beta != 0.f) {
      const uint4 old = *reinterpret_cast<const uint4*>(cp);
      const uint32_t w[4] = {old.x, old.y, old.z, old.w};
#pragma unroll
      for (int e = 0; e < 8; ++e)
        v[e] = fmaf(p.beta, to_float(T{uint16_t(w[e / 2] >> (16 * (e % 2)))}), v[e]);
    }
    uint32_t w[4];
#pragma unroll
    for (int e = 0; e < 4; ++e)
      w[e] = uint32_t(to_half<T>(v[2 * e]).bits) | (uint32_t(to_half<T>(v[2 * e + 1]).bits) << 16);
    *reinterpret_cast<uint4*>(cp) = make_uint4(w[0], w[1], w[2], w[3]);
    return;
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    if (col + e >= p.n) break;
    float out = v[e];
    if (p.beta != 0.f) out = fmaf(p.beta, to_float(cp[e]), out);
    cp[e] = to_half<T>(out);
  }
}

template <class T, bool kAKContiguous, bool kBKContiguous, int kTileN>
__global__ void __launch_bounds__(TcConfig<kTileN>::kThreads, kTileN == 128 ? 2 : 1)
    gemm_tensor_core(const Problem p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.sync bf16, ldmatrix and cp.async need sm_80 (the host refuses older GPUs)
#else
  using Cfg = TcConfig<kTileN>;
  uint16_t* const smem = reinterpret_cast<uint16_t*>(dynamic_shared_memory());
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // This warp's 64 x 64 of the block tile.
  const int warp_m = (warp / Cfg::kWarpsN) * kTcWarpTile, warp_n = (warp % Cfg::kWarpsN) * kTcWarpTile;
  const TileCorner t0 =
      grouped_tile(blockIdx.x, ceil_div(p.m, kTcTileM), ceil_div(p.n, kTileN), kTcTileM, kTileN);
  TcTileLoader la =
      make_tc_loader(p.a, batch_entry<uint16_t>(p.a), t0.m0, p.m, p.k, tid, kTcTileM, Cfg::kThreads);
  TcTileLoader lb =
      make_tc_loader(p.b, batch_entry<uint16_t>(p.b), t0.n0, p.n, p.k, tid, kTileN, Cfg::kThreads);
  const bool a_rows_in = t0.m0 + kTcTileM <= p.m && p.a.vector_ok;
  const bool b_rows_in = t0.n0 + kTileN <= p.n && p.b.vector_ok;
  const int tiles_k = ceil_div(p.k, kTcDepth);

  auto stage_a = [&](int s) { return smem + s * Cfg::kStageElems; };
  auto stage_b = [&](int s) { return smem + s * Cfg::kStageElems + Cfg::kATileElems; };
  auto load_stage = [&](int t) {  // k-tile t into stage t % kTcStages
    const int k0 = t * kTcDepth, s = t % kTcStages;
    const bool k_in = k0 + kTcDepth <= p.k;
    tc_load_tile<Cfg::kAChunks>(la, k0, a_rows_in && k_in, stage_a(s));
    tc_load_tile<Cfg::kBChunks>(lb, k0, b_rows_in && k_in, stage_b(s));
  };

  // This lane's ldmatrix row offsets for each 16-deep half of a stage: A per m16 tile, B per pair of
  // n8 tiles.
  int a_offset[2][4], b_offset[2][4];
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a_offset[ks][i] = fragment_row_offset<kAKContiguous>(lane, warp_m + 16 * i, 16 * ks, true, kTcTileM);
      b_offset[ks][i] = fragment_row_offset<kBKContiguous>(lane, warp_n + 16 * i, 16 * ks, false, kTileN);
    }

  float acc[4][8][4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
    }
  }

  // Prologue: k-tiles 0 .. kTcStages-2 in flight. Every iteration commits one group (maybe empty),
  // so "group t has landed" is always wait_group<kTcStages - 2> at iteration t.
#pragma unroll
  for (int s = 0; s < kTcStages - 1; ++s) {
    if (s < tiles_k) load_stage(s);
    cp_async_commit();
  }

  for (int t = 0; t < tiles_k; ++t) {
    cp_async_wait<kTcStages - 2>();  // this thread's copies of k-tile t are in shared memory...
    __syncthreads();                 // ...and everyone's; and everyone is done with k-tile t - 1
    if (t + kTcStages - 1 < tiles_k) load_stage(t + kTcStages - 1);  // into t - 1's stage
    cp_async_commit();

    const uint32_t a_base = shared_address(stage_a(t % kTcStages));
    const uint32_t b_base = shared_address(stage_b(t % kTcStages));
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t a_frag[4][4], b_frag[8][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) ldmatrix_x4<!kAKContiguous>(a_frag[i], a_base + 2 * a_offset[ks][i]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t r[4];
        ldmatrix_x4<!kBKContiguous>(r, b_base + 2 * b_offset[ks][j]);
        b_frag[2 * j][0] = r[0], b_frag[2 * j][1] = r[1];
        b_frag[2 * j + 1][0] = r[2], b_frag[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) mma_16816<T>(acc[i][j], a_frag[i], b_frag[j][0], b_frag[j][1]);
    }
  }
  cp_async_wait<0>();  // only empty groups can be left; nothing may land after the block exits
  __syncthreads();     // every warp's last ldmatrix is done: the ring becomes the staging buffer

  // Epilogue, in two passes of 64 block rows. Accumulator e of tile (i, j) is C[warp_m + 16i + lane/4
  // + 8*(e/2)][warp_n + 8j + 2*(lane%4) + e%2] of the block tile. Pass h stages tiles i = 2h, 2h + 1
  // of every warp: staged row r is block row (r / 32) * 64 + 32h + r % 32.
  float* const staged = reinterpret_cast<float*>(smem);
  T* c = batch_entry_c<T>(p);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (h == 1) __syncthreads();  // everyone has read pass 0 before pass 1 overwrites it
#pragma unroll
    for (int ii = 0; ii < 2; ++ii) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = (warp_m / 2) + 16 * ii + 8 * half + lane / 4;
          const int col = warp_n + 8 * j + 2 * (lane % 4);
          *reinterpret_cast<float2*>(staged + staged_c_offset<kTileN>(row, col)) =
              make_float2(acc[2 * h + ii][j][2 * half], acc[2 * h + ii][j][2 * half + 1]);
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < Cfg::kEpilogueChunks; ++i) {
      const int q = tid + i * Cfg::kThreads;
      const int row = q / Cfg::kRowChunks, col = 8 * (q % Cfg::kRowChunks);
      const float4 lo = *reinterpret_cast<const float4*>(staged + staged_c_offset<kTileN>(row, col));
      const float4 hi = *reinterpret_cast<const float4*>(staged + staged_c_offset<kTileN>(row, col + 4));
      float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      tc_store_chunk<T>(p, c, t0.m0 + (row / 32) * 64 + 32 * h + row % 32, t0.n0 + col, v);
    }
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
  check(g.m <= kMaxSize && g.n <= kMaxSize && g.k <= kMaxSize, what, ": m=", g.m, " n=", g.n, " k=", g.k,
        " exceed the kernels' 32-bit limit of ", kMaxSize);
}

// Grid size in tiles, refusing what a 1-D grid cannot hold.
unsigned tile_count(int64_t m, int64_t n, int tile_m, int tile_n, const char* step) {
  const int64_t tiles = ((m + tile_m - 1) / tile_m) * ((n + tile_n - 1) / tile_n);
  check(tiles <= INT_MAX, "gemm_ladder (", step, "): ", tiles, " tiles do not fit one grid");
  return static_cast<unsigned>(tiles);
}

// Launches `launch(problem, batch_count)` once per at most 65535 batch entries (grid.z's limit),
// moving the pointers along.
template <class Launch>
void for_each_batch_chunk(const Problem& p, int64_t batch, size_t elem, Launch&& launch) {
  constexpr int64_t kMaxGridZ = 65535;
  for (int64_t first = 0; first < batch; first += kMaxGridZ) {
    Problem q = p;
    q.a.ptr = static_cast<const char*>(p.a.ptr) + first * p.a.batch_stride * elem;
    q.b.ptr = static_cast<const char*>(p.b.ptr) + first * p.b.batch_stride * elem;
    q.c = static_cast<char*>(p.c) + first * p.batch_stride_c * elem;
    launch(q, static_cast<unsigned>(std::min(kMaxGridZ, batch - first)));
  }
}

// cudaFuncSetAttribute for more than 48 KiB of dynamic shared memory, once per (kernel, device).
void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;
  int device = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  if (done.count({kernel, device})) return;
  MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  done.insert({kernel, device});
}

// One tile configuration of one of the four layout instantiations, with its shared-memory opt-in.
template <class T, bool kAKContiguous, bool kBKContiguous, int kTileN>
void launch_tensor_core_tile(const Problem& p, int64_t batch, cudaStream_t stream) {
  using Cfg = TcConfig<kTileN>;
  allow_dynamic_smem(reinterpret_cast<const void*>(gemm_tensor_core<T, kAKContiguous, kBKContiguous, kTileN>),
                     Cfg::kSmemBytes);
  const unsigned tiles = tile_count(p.m, p.n, kTcTileM, kTileN, "tensor_core");
  for_each_batch_chunk(p, batch, sizeof(T), [&](const Problem& q, unsigned z) {
    launch_kernel<gemm_tensor_core<T, kAKContiguous, kBKContiguous, kTileN>>(dim3(tiles, 1, z), Cfg::kThreads,
                                                                             Cfg::kSmemBytes, stream, q);
  });
}

std::atomic<int> g_tensor_core_tile_n{0};  // 0: chosen per call (set_tensor_core_tile_n)

// The block tile's n for a call: 128 x 256 halves B's share of the L2 traffic per FLOP (see Step 4)
// but makes half as many blocks of twice the work, one per SM. It is taken when that costs no wave:
// counting in 128 x 128 blocks' work, the busiest SM does ceil(wide blocks / SMs) x 2 against
// ceil(narrow blocks / SMs) x 1. On 132 SMs: 4096^3, 4 x 2 against 8, and 2048^3, 1 x 2 against 2,
// take 128 x 256; 1024^3, 1 x 2 against 1 (32 wide blocks would leave 100 SMs idle), 128 x 128.
int tensor_core_tile_n(const Problem& p, int64_t batch, int device) {
  const int forced = g_tensor_core_tile_n.load(std::memory_order_acquire);
  if (forced != 0) return forced;
  int sms = 0;
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t rows = (int64_t(p.m) + kTcTileM - 1) / kTcTileM;
  const int64_t narrow = rows * ((int64_t(p.n) + 127) / 128) * batch;
  const int64_t wide = rows * ((int64_t(p.n) + 255) / 256) * batch;
  const int64_t s = std::max(sms, 1);
  return ((wide + s - 1) / s) * 2 <= (narrow + s - 1) / s ? 256 : 128;
}

template <class T, bool kAKContiguous, bool kBKContiguous>
void launch_tensor_core_layout(const Problem& p, int64_t batch, int tile_n, cudaStream_t stream) {
  if (tile_n == 256) return launch_tensor_core_tile<T, kAKContiguous, kBKContiguous, 256>(p, batch, stream);
  launch_tensor_core_tile<T, kAKContiguous, kBKContiguous, 128>(p, batch, stream);
}

template <class T>
void launch_tensor_core(const Problem& p, int64_t batch, cudaStream_t stream) {
  int device = 0, major = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  check(major >= 8,
        "gemm_ladder (tensor_core): needs a GPU of compute capability 8.0 or newer (mma.sync "
        "bf16/f16, ldmatrix, cp.async); device ",
        device, " is ", major, ".x");
  const int tile_n = tensor_core_tile_n(p, batch, device);
  if (p.a.k_contiguous) {
    if (p.b.k_contiguous) return launch_tensor_core_layout<T, true, true>(p, batch, tile_n, stream);
    return launch_tensor_core_layout<T, true, false>(p, batch, tile_n, stream);
  }
  if (p.b.k_contiguous) return launch_tensor_core_layout<T, false, true>(p, batch, tile_n, stream);
  return launch_tensor_core_layout<T, false, false>(p, batch, tile_n, stream);
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
      check(s == "0" || s == "false" || s == "off",
            "MG_CUDA_ALLOW_TF32: expected 1/true/on or 0/false/off, got '", s, "'");
    }
  }
  int expected = -1;
  g_allow_tf32.compare_exchange_strong(expected, value, std::memory_order_acq_rel);
  return g_allow_tf32.load(std::memory_order_acquire) != 0;
}

void set_allow_tf32(bool allow) { g_allow_tf32.store(allow ? 1 : 0, std::memory_order_release); }

void set_tensor_core_tile_n(int tile_n) {
  check(tile_n == 0 || tile_n == 128 || tile_n == 256, "set_tensor_core_tile_n: expected 0, 128 or 256, got ",
        tile_n);
  g_tensor_core_tile_n.store(tile_n, std::memory_order_release);
}

// ---- the ladder's entry point ------------------------------------------------------------------

void gemm_ladder(cudaStream_t stream, ScratchAllocator& scratch, GemmKernel kernel, const GemmArgs& g) {
  if (kernel == GemmKernel::cublas) return gemm_cublas(stream, scratch, g);
  const char* step = gemm_kernel_name(kernel);
  check(gemm_kernel_supports(kernel, g.dtype), "gemm_ladder (", step, "): the ", step, " kernel takes ",
        kernel == GemmKernel::tensor_core ? "bf16 or f16 (f32 accumulation)" : "f32", ", got ",
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
    case GemmKernel::tensor_core:
      if (g.dtype == DType::bf16) return launch_tensor_core<bf16_t>(p, g.batch, stream);
      return launch_tensor_core<f16_t>(p, g.batch, stream);
    case GemmKernel::cublas: break;  // handled above
  }
}

}  // namespace mg::kernels::cuda
