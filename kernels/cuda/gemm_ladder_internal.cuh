// What the GEMM ladder's two files share: gemm_ladder.cu (the overview, steps 1-4 and the entry point)
// and gemm_tensor_core.cu (step 5). The problem as the kernels see it (Operand, Problem), the
// index helpers every step uses, the grouped tile order, and the host's grid and batch helpers.
// Internal to those two files: the public interface is gemm_ladder.h.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cassert>
#include <climits>
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace mg::kernels::cuda::gemm_ladder_internal {

// ---- the problem as the kernels see it ---------------------------------------------------------

// One input matrix as an (mn x k) operand (see the top of gemm_ladder.cu).
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

// ---- host side ---------------------------------------------------------------------------------

// Grid size in tiles, refusing what a 1-D grid cannot hold.
inline unsigned tile_count(int64_t m, int64_t n, int tile_m, int tile_n, const char* step) {
  const int64_t tiles = ((m + tile_m - 1) / tile_m) * ((n + tile_n - 1) / tile_n);
  MG_CHECK(tiles <= INT_MAX, "gemm_ladder (", step, "): ", tiles, " tiles do not fit one grid");
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

// Refuses a GPU older than sm_80 (mma.sync with bf16, ldmatrix, cp.async) for the tensor-core steps.
inline void check_tensor_cores(const char* step) {
  int device = 0, major = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  MG_CHECK(
      major >= 8, "gemm_ladder (", step,
      "): needs a GPU of compute capability 8.0 or newer (mma.sync bf16/f16, ldmatrix, cp.async); device ",
      device, " is ", major, ".x");
}

// Step 5 (gemm_tensor_core.cu), T = bf16_t or f16_t: checks the GPU, picks the tile, launches.
template <class T>
void launch_tensor_core(const Problem& p, int64_t batch, cudaStream_t stream);

}  // namespace mg::kernels::cuda::gemm_ladder_internal
