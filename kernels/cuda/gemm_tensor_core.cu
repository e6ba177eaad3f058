// Step 5 of the GEMM ladder, the production one. gemm_ladder.cu has the overview of all five steps,
// the semantics and the (mn x k) view of the operands, steps 1-4 and the entry point; what both files share
// is in gemm_ladder_internal.cuh.
//
// 5. tensor_core (gemm_tensor_core, bf16/f16 in, f32 accumulate): the FMA units are replaced by
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
//    memory per FLOP). Step 5 below has the numbers, and what Hopper's wgmma and TMA multicast
//    would change.
//
// Fast path: 16-byte cp.async when the operand's pointer is 16-byte aligned and ld and batch stride
// are multiples of 8 elements; the same for C's 16-byte stores (8 elements). Otherwise, and for the
// vectors that cross the edges of m, n and k, the same kernel goes element by element.
//
// Compile time: the kernel is instantiated for {bf16, f16} x {A k-contiguous or not} x {B
// k-contiguous or not} x {128, 256} because the layout decides the ldmatrix flavour inside the
// hottest loop. Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see
// docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_ladder.h"
#include "kernels/cuda/gemm_ladder_internal.cuh"
#include "kernels/cuda/native.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace gemm_ladder_internal;  // Problem, the index helpers, the grid and batch helpers

// ================================================================================================
// Step 5: tensor cores, fed properly (step 4, gemm_mma_tiled in gemm_ladder.cu, has the same mma
// and the fragment layout spelled out, fed by plain loads). Block tile 128 (m) x kTileN (n), kTileN = 128 or
// 256, k in steps of 32; kTileN / 32 warps in a 2 (m) x kTileN/64 (n) grid, each owning a 64 x 64 piece of C
// as 4 (m) x 8 (n) tiles of mma.m16n8k16 (f32 accumulators: 4 per thread per tile, 128 in all). Inputs are
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
//     us of tensor work: L2-bound. 128 x 256, picked for large grids (the host's
//     tensor_core_tile_n), moves 512 x 3 MiB = 1.61 GB (165 us) and then binds on shared memory:
//     704 wavefronts per k-tile, 92K per block, 4 blocks on the busiest SM: 186 us. (The model's
//     predicted times, which also count latency and waves, are in docs/kernels.md.)
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
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  uint16_t* const smem = reinterpret_cast<uint16_t*>(dynamic_smem);
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
// Host side
// ================================================================================================

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

// The block tile's n for a call: 128 x 256 halves B's share of the L2 traffic per FLOP (see Step 5)
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

}  // namespace

namespace gemm_ladder_internal {

template <class T>
void launch_tensor_core(const Problem& p, int64_t batch, cudaStream_t stream) {
  check_tensor_cores("tensor_core");
  int device = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  const int tile_n = tensor_core_tile_n(p, batch, device);
  if (p.a.k_contiguous) {
    if (p.b.k_contiguous) return launch_tensor_core_layout<T, true, true>(p, batch, tile_n, stream);
    return launch_tensor_core_layout<T, true, false>(p, batch, tile_n, stream);
  }
  if (p.b.k_contiguous) return launch_tensor_core_layout<T, false, true>(p, batch, tile_n, stream);
  return launch_tensor_core_layout<T, false, false>(p, batch, tile_n, stream);
}

template void launch_tensor_core<bf16_t>(const Problem& p, int64_t batch, cudaStream_t stream);
template void launch_tensor_core<f16_t>(const Problem& p, int64_t batch, cudaStream_t stream);

}  // namespace gemm_ladder_internal

void set_tensor_core_tile_n(int tile_n) {
  MG_CHECK(tile_n == 0 || tile_n == 128 || tile_n == 256,
           "set_tensor_core_tile_n: expected 0, 128 or 256, got ", tile_n);
  g_tensor_core_tile_n.store(tile_n, std::memory_order_release);
}

}  // namespace mg::kernels::cuda
