// The performance model against a tuned SGEMM ladder measured on two GPUs: siboehm/SGEMM_CUDA
// ("How to Optimize a CUDA Matmul Kernel for cuBLAS-like Performance", MIT licence), GFLOP/s at
// 4096^3 from 50 back-to-back launches between CUDA events, in two tables of its README: an A100
// at commit c09b350 (2023-02-26) and an RTX A6000 at HEAD 60cba6f (the table of 4820c60).
// docs/data/validation-sources.md has the figures, each commit's configurations and why kernel 11
// is left out.
//
// C = alpha A B + beta C, row-major fp32, M = N = K = 4096 (beta != 0: C is read and written).
// The kernels below are our own, written from the article's description of each rung:
//
//   K1  naive             32 x 32 threads, one output each; threadIdx.x walks the ROWS, so a
//                         warp reads A 32 rows apart and writes C uncoalesced (B is a broadcast)
//   K2  coalesced         the same with the warp along a row of C: A broadcast, B and C coalesced
//   K3  shared tiles      32 x 32 tiles of A and B in shared memory, one output a thread
//   K4  1-D block tiles   64 x 64 outputs a block of 512 threads, BK = 8; a thread owns a column
//                         of 8 outputs and reuses one B value from a register for all 8
//   K5  2-D block tiles   128 x 128 a block of 256 threads, BK = 8; a thread owns 8 x 8 outputs,
//                         an outer product of 8 A and 8 B values from registers per k
//   K6  vectorised        K5 with float4 global loads and stores, A stored transposed in shared
//                         memory so a thread's 8 A values are contiguous
//   K7  linearised B      K6 with B's tile permuted in shared memory so a warp's reads of it are
//                         consecutive words (no bank conflicts)
//   K8  padded B          K6 with B's tile rows padded by 5 floats (the other cure)
//   K9  autotuned         K6's algorithm at each GPU's tuned tile sizes
//   K10 warp tiles        128 threads; each warp owns a quarter of the block tile, walked as
//                         sub-tiles, a lane's outputs computed from registers (per-GPU settings)
//
// Each rung is checked against a CPU product on a small problem first, then its 4096^3 launch is
// traced (the first blocks of the grid; the rest extrapolated) and predicted on the GPU with its
// 2 M N K FLOPs declared.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "validation.h"

namespace {

// ---- K1, K2: one output a thread, straight from global memory --------------------------------

__global__ void sgemm_naive(int n, float alpha, const float* a, const float* b, float beta, float* c) {
  const int row = blockIdx.x * 32 + threadIdx.x, col = blockIdx.y * 32 + threadIdx.y;
  if (row >= n || col >= n) return;
  float acc = 0;
  for (int k = 0; k < n; ++k) acc += a[row * n + k] * b[k * n + col];
  c[row * n + col] = alpha * acc + beta * c[row * n + col];
}

__global__ void sgemm_coalesced(int n, float alpha, const float* a, const float* b, float beta, float* c) {
  const int row = blockIdx.x * 32 + threadIdx.x / 32, col = blockIdx.y * 32 + threadIdx.x % 32;
  if (row >= n || col >= n) return;
  float acc = 0;
  for (int k = 0; k < n; ++k) acc += a[row * n + k] * b[k * n + col];
  c[row * n + col] = alpha * acc + beta * c[row * n + col];
}

// ---- K3: 32 x 32 tiles in shared memory --------------------------------------------------------

__global__ void sgemm_shared(int n, float alpha, const float* a, const float* b, float beta, float* c) {
  __shared__ float a_tile[32 * 32];
  __shared__ float b_tile[32 * 32];
  const int ty = threadIdx.x / 32, tx = threadIdx.x % 32;
  const float* a_block = a + blockIdx.x * 32 * n;  // 32 rows of A
  const float* b_block = b + blockIdx.y * 32;      // 32 columns of B
  float acc = 0;
  for (int k0 = 0; k0 < n; k0 += 32) {
    a_tile[ty * 32 + tx] = a_block[ty * n + k0 + tx];
    b_tile[ty * 32 + tx] = b_block[(k0 + ty) * n + tx];
    __syncthreads();
    for (int k = 0; k < 32; ++k) acc += a_tile[ty * 32 + k] * b_tile[k * 32 + tx];
    __syncthreads();
  }
  float* out = c + (blockIdx.x * 32 + ty) * n + blockIdx.y * 32 + tx;
  *out = alpha * acc + beta * *out;
}

// ---- K4: a column of 8 outputs a thread ------------------------------------------------------

constexpr int k4M = 64, k4N = 64, k4K = 8, k4Rows = 8;  // 512 threads

__global__ void sgemm_1d_tiles(int n, float alpha, const float* a, const float* b, float beta, float* c) {
  __shared__ float a_tile[k4M * k4K];
  __shared__ float b_tile[k4K * k4N];
  const int block_row = blockIdx.y, block_col = blockIdx.x;
  const int col = threadIdx.x % k4N, row_group = threadIdx.x / k4N;  // 8 groups of 8 rows
  const int a_row = threadIdx.x / k4K, a_col = threadIdx.x % k4K;    // one A and one B value a thread
  const int b_row = threadIdx.x / k4N, b_col = threadIdx.x % k4N;
  const float* a_block = a + block_row * k4M * n;
  const float* b_block = b + block_col * k4N;
  float acc[k4Rows] = {};
  for (int k0 = 0; k0 < n; k0 += k4K) {
    a_tile[a_row * k4K + a_col] = a_block[a_row * n + k0 + a_col];
    b_tile[b_row * k4N + b_col] = b_block[(k0 + b_row) * n + b_col];
    __syncthreads();
    for (int k = 0; k < k4K; ++k) {
      const float b_value = b_tile[k * k4N + col];
      for (int r = 0; r < k4Rows; ++r) acc[r] += a_tile[(row_group * k4Rows + r) * k4K + k] * b_value;
    }
    __syncthreads();
  }
  for (int r = 0; r < k4Rows; ++r) {
    float* out = c + (block_row * k4M + row_group * k4Rows + r) * n + block_col * k4N + col;
    *out = alpha * acc[r] + beta * *out;
  }
}

// ---- K5: 8 x 8 outputs a thread, an outer product per k -----------------------------------------

constexpr int k5M = 128, k5N = 128, k5K = 8, k5T = 8, k5Threads = 256;

__global__ void sgemm_2d_tiles(int n, float alpha, const float* a, const float* b, float beta, float* c) {
  __shared__ float a_tile[k5M * k5K];
  __shared__ float b_tile[k5K * k5N];
  const int block_row = blockIdx.y, block_col = blockIdx.x;
  const int thread_row = threadIdx.x / (k5N / k5T), thread_col = threadIdx.x % (k5N / k5T);
  const int a_row = threadIdx.x / k5K, a_col = threadIdx.x % k5K;  // 32 rows of A per pass
  const int b_row = threadIdx.x / k5N, b_col = threadIdx.x % k5N;  // 2 rows of B per pass
  const float* a_block = a + block_row * k5M * n;
  const float* b_block = b + block_col * k5N;
  float acc[k5T * k5T] = {};
  float a_reg[k5T], b_reg[k5T];
  for (int k0 = 0; k0 < n; k0 += k5K) {
    for (int r = 0; r < k5M; r += k5Threads / k5K)
      a_tile[(a_row + r) * k5K + a_col] = a_block[(a_row + r) * n + k0 + a_col];
    for (int r = 0; r < k5K; r += k5Threads / k5N)
      b_tile[(b_row + r) * k5N + b_col] = b_block[(k0 + b_row + r) * n + b_col];
    __syncthreads();
    for (int k = 0; k < k5K; ++k) {
      for (int i = 0; i < k5T; ++i) a_reg[i] = a_tile[(thread_row * k5T + i) * k5K + k];
      for (int j = 0; j < k5T; ++j) b_reg[j] = b_tile[k * k5N + thread_col * k5T + j];
      for (int i = 0; i < k5T; ++i)
        for (int j = 0; j < k5T; ++j) acc[i * k5T + j] += a_reg[i] * b_reg[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < k5T; ++i)
    for (int j = 0; j < k5T; ++j) {
      float* out = c + (block_row * k5M + thread_row * k5T + i) * n + block_col * k5N + thread_col * k5T + j;
      *out = alpha * acc[i * k5T + j] + beta * *out;
    }
}

// ---- K6-K9: float4 loads, A transposed in shared memory; three layouts of B's tile --------------

enum class BLayout { plain, linearised, padded };

// Where B's tile element (row k, column j) lives in shared memory, for a tile of kN columns.
template <BLayout L, int kN>
__device__ __forceinline__ int b_index(int k, int j) {
  if constexpr (L == BLayout::padded) {
    return k * (kN + 5) + j;
  } else if constexpr (L == BLayout::linearised) {
    // Only for 16 threads of 8 columns each (kN = 128, a thread's columns t*8 .. t*8+7): the
    // element lands at (k*8 + i)*16 + t, so the 16 threads reading their i-th column read 16
    // consecutive words.
    return (k * 8 + j % 8) * 16 + j / 8;
  } else {
    return k * kN + j;
  }
}

// How many float4s of a kRows x kCols tile each of kThreads threads loads. A compile-time count,
// as in the article's kernels (an offset loop bounded by the tile), so nvcc unrolls the loop and a
// thread's loads of one tile are in flight together; a loop bounded by threadIdx.x is not unrolled
// and each of its loads waits for the shared store of the one before.
template <int kRows, int kCols, int kThreads>
constexpr int float4s_per_thread() {
  static_assert(kRows * kCols % (4 * kThreads) == 0, "the threads split the tile evenly");
  return kRows * kCols / (4 * kThreads);
}

// A's kM x kK tile at column k0, read as float4s and stored transposed: a_tile[k * kM + m].
template <int kM, int kK, int kThreads>
__device__ __forceinline__ void load_a_transposed(float* a_tile, const float* a_block, int n, int k0) {
  for (int i = 0; i < float4s_per_thread<kM, kK, kThreads>(); ++i) {
    const int v = threadIdx.x + i * kThreads;
    const int row = v / (kK / 4), col = (v % (kK / 4)) * 4;
    const float4 x = *reinterpret_cast<const float4*>(&a_block[row * n + k0 + col]);
    a_tile[(col + 0) * kM + row] = x.x;
    a_tile[(col + 1) * kM + row] = x.y;
    a_tile[(col + 2) * kM + row] = x.z;
    a_tile[(col + 3) * kM + row] = x.w;
  }
}

template <BLayout L, int kM, int kN, int kK, int kT, int kThreads>
__global__ void sgemm_vectorised(int n, float alpha, const float* a, const float* b, float beta, float* c) {
  constexpr int kBTileFloats = L == BLayout::padded ? kK * (kN + 5) : kK * kN;
  __shared__ __align__(16) float a_tile[kK * kM];  // transposed: a_tile[k * kM + m]
  __shared__ __align__(16) float b_tile[kBTileFloats];
  const int block_row = blockIdx.y, block_col = blockIdx.x;
  const int thread_row = threadIdx.x / (kN / kT), thread_col = threadIdx.x % (kN / kT);
  const float* a_block = a + block_row * kM * n;
  const float* b_block = b + block_col * kN;
  float acc[kT * kT] = {};
  float a_reg[kT], b_reg[kT];
  for (int k0 = 0; k0 < n; k0 += kK) {
    load_a_transposed<kM, kK, kThreads>(a_tile, a_block, n, k0);
    for (int i = 0; i < float4s_per_thread<kK, kN, kThreads>(); ++i) {  // float4s of B's tile
      const int v = threadIdx.x + i * kThreads;
      const int row = v / (kN / 4), col = (v % (kN / 4)) * 4;
      const float4 x = *reinterpret_cast<const float4*>(&b_block[(k0 + row) * n + col]);
      if constexpr (L == BLayout::plain) {
        *reinterpret_cast<float4*>(&b_tile[row * kN + col]) = x;
      } else {
        b_tile[b_index<L, kN>(row, col + 0)] = x.x;
        b_tile[b_index<L, kN>(row, col + 1)] = x.y;
        b_tile[b_index<L, kN>(row, col + 2)] = x.z;
        b_tile[b_index<L, kN>(row, col + 3)] = x.w;
      }
    }
    __syncthreads();
    for (int k = 0; k < kK; ++k) {
      for (int i = 0; i < kT; ++i) a_reg[i] = a_tile[k * kM + thread_row * kT + i];
      for (int j = 0; j < kT; ++j) b_reg[j] = b_tile[b_index<L, kN>(k, thread_col * kT + j)];
      for (int i = 0; i < kT; ++i)
        for (int j = 0; j < kT; ++j) acc[i * kT + j] += a_reg[i] * b_reg[j];
    }
    __syncthreads();
  }
  for (int i = 0; i < kT; ++i)
    for (int j = 0; j < kT; j += 4) {
      float4* out = reinterpret_cast<float4*>(
          &c[(block_row * kM + thread_row * kT + i) * n + block_col * kN + thread_col * kT + j]);
      float4 old = *out;
      old.x = alpha * acc[i * kT + j + 0] + beta * old.x;
      old.y = alpha * acc[i * kT + j + 1] + beta * old.y;
      old.z = alpha * acc[i * kT + j + 2] + beta * old.z;
      old.w = alpha * acc[i * kT + j + 3] + beta * old.w;
      *out = old;
    }
}

// ---- K10: warp tiles ---------------------------------------------------------------------------

// A block tile kM x kN of kThreads / 32 warps; a warp owns a kWarpM x kWarpN part, walked as
// kSubsM x kSubsN sub-tiles; in each, a lane owns kTM x kTN outputs.
template <int kM, int kN, int kK, int kWarpM, int kWarpN, int kSubsM, int kSubsN, int kTM, int kTN,
          int kThreads>
__global__ void sgemm_warp_tiles(int n, float alpha, const float* a, const float* b, float beta, float* c) {
  constexpr int kSubM = kWarpM / kSubsM, kSubN = kWarpN / kSubsN;  // a sub-tile
  constexpr int kLaneCols = kSubN / kTN;                           // lanes across a sub-tile
  static_assert((kSubM / kTM) * kLaneCols == 32, "a sub-tile is one warp's lanes");
  __shared__ __align__(16) float a_tile[kK * kM];  // transposed
  __shared__ __align__(16) float b_tile[kK * kN];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warp_row = warp / (kN / kWarpN), warp_col = warp % (kN / kWarpN);
  const int lane_row = lane / kLaneCols, lane_col = lane % kLaneCols;
  const float* a_block = a + blockIdx.y * kM * n;
  const float* b_block = b + blockIdx.x * kN;
  float acc[kSubsM * kTM * kSubsN * kTN] = {};
  float a_reg[kSubsM * kTM], b_reg[kSubsN * kTN];
  for (int k0 = 0; k0 < n; k0 += kK) {
    load_a_transposed<kM, kK, kThreads>(a_tile, a_block, n, k0);
    for (int i = 0; i < float4s_per_thread<kK, kN, kThreads>(); ++i) {
      const int v = threadIdx.x + i * kThreads;
      const int row = v / (kN / 4), col = (v % (kN / 4)) * 4;
      *reinterpret_cast<float4*>(&b_tile[row * kN + col]) =
          *reinterpret_cast<const float4*>(&b_block[(k0 + row) * n + col]);
    }
    __syncthreads();
    for (int k = 0; k < kK; ++k) {
      for (int s = 0; s < kSubsM; ++s)
        for (int i = 0; i < kTM; ++i)
          a_reg[s * kTM + i] = a_tile[k * kM + warp_row * kWarpM + s * kSubM + lane_row * kTM + i];
      for (int s = 0; s < kSubsN; ++s)
        for (int j = 0; j < kTN; ++j)
          b_reg[s * kTN + j] = b_tile[k * kN + warp_col * kWarpN + s * kSubN + lane_col * kTN + j];
      for (int r = 0; r < kSubsM * kTM; ++r)
        for (int q = 0; q < kSubsN * kTN; ++q) acc[r * kSubsN * kTN + q] += a_reg[r] * b_reg[q];
    }
    __syncthreads();
  }
  for (int sm = 0; sm < kSubsM; ++sm)
    for (int i = 0; i < kTM; ++i)
      for (int sn = 0; sn < kSubsN; ++sn) {
        const int row = blockIdx.y * kM + warp_row * kWarpM + sm * kSubM + lane_row * kTM + i;
        const int col = blockIdx.x * kN + warp_col * kWarpN + sn * kSubN + lane_col * kTN;
        const float* r = &acc[(sm * kTM + i) * kSubsN * kTN + sn * kTN];
        for (int j = 0; j < kTN; j += 4) {
          float4* out = reinterpret_cast<float4*>(&c[row * n + col + j]);
          float4 old = *out;
          old.x = alpha * r[j + 0] + beta * old.x;
          old.y = alpha * r[j + 1] + beta * old.y;
          old.z = alpha * r[j + 2] + beta * old.z;
          old.w = alpha * r[j + 3] + beta * old.w;
          *out = old;
        }
      }
}

// ---- the ladder ---------------------------------------------------------------------------------

struct Rung {
  const char* label;
  double measured_gflops;  // the README's table
  void (*launch)(int n, const float* a, const float* b, float* c);
};

constexpr float kAlpha = 0.5f, kBeta = 3.0f;  // the source's values

template <BLayout L, int kM, int kN, int kK, int kT, int kThreads>
void launch_vectorised(int n, const float* a, const float* b, float* c) {
  sgemm_vectorised<L, kM, kN, kK, kT, kThreads>
      <<<dim3(n / kN, n / kM), kThreads>>>(n, kAlpha, a, b, kBeta, c);
}

template <int kM, int kN, int kK, int kWarpM, int kWarpN, int kSubsM, int kSubsN, int kTM, int kTN,
          int kThreads>
void launch_warp_tiles(int n, const float* a, const float* b, float* c) {
  sgemm_warp_tiles<kM, kN, kK, kWarpM, kWarpN, kSubsM, kSubsN, kTM, kTN, kThreads>
      <<<dim3(n / kN, n / kM), kThreads>>>(n, kAlpha, a, b, kBeta, c);
}

void launch_naive(int n, const float* a, const float* b, float* c) {
  sgemm_naive<<<dim3(n / 32, n / 32), dim3(32, 32)>>>(n, kAlpha, a, b, kBeta, c);
}
void launch_coalesced(int n, const float* a, const float* b, float* c) {
  sgemm_coalesced<<<dim3(n / 32, n / 32), 1024>>>(n, kAlpha, a, b, kBeta, c);
}
void launch_shared(int n, const float* a, const float* b, float* c) {
  sgemm_shared<<<dim3(n / 32, n / 32), 1024>>>(n, kAlpha, a, b, kBeta, c);
}
void launch_1d_tiles(int n, const float* a, const float* b, float* c) {
  sgemm_1d_tiles<<<dim3(n / k4N, n / k4M), k4M * k4N / k4Rows>>>(n, kAlpha, a, b, kBeta, c);
}
void launch_2d_tiles(int n, const float* a, const float* b, float* c) {
  sgemm_2d_tiles<<<dim3(n / k5N, n / k5M), k5Threads>>>(n, kAlpha, a, b, kBeta, c);
}

using Launch = void (*)(int n, const float* a, const float* b, float* c);

// The ladder on the two GPUs: the A100 table (README at c09b350) and the RTX A6000 one (README at
// 60cba6f, from 4820c60). K1-K8 are the same kernels on both; K9 and K10 at each commit's tuned
// settings -- A100: K9 64 x 64 tiles, BK = 16, 4 x 4 a thread; K10 32 x 64 warp tiles walked as
// four 8 x 64 sub-tiles, 4 x 4 a lane. A6000: K9 128 x 128, BK = 16, 8 x 8 a thread; K10 64 x 64
// warp tiles walked as four 64 x 16 sub-tiles, 8 x 4 a lane. Kernel 11 (double buffering) is left
// out: which configuration its figure ran is not known.
struct LadderRung {
  const char* label;
  double a100_gflops, a6000_gflops;  // the two README tables
  Launch a100, a6000;
};

const std::vector<LadderRung>& ladder() {
  const Launch k6 = launch_vectorised<BLayout::plain, 128, 128, 8, 8, 256>;
  const Launch k7 = launch_vectorised<BLayout::linearised, 128, 128, 8, 8, 256>;
  const Launch k8 = launch_vectorised<BLayout::padded, 128, 128, 8, 8, 256>;
  static const std::vector<LadderRung> rungs = {
      {"K1 naive", 292.1, 309.0, launch_naive, launch_naive},
      {"K2 coalesced", 3119.0, 1986.5, launch_coalesced, launch_coalesced},
      {"K3 shared tiles", 5451.9, 2980.3, launch_shared, launch_shared},
      {"K4 1-D tiles", 10368.6, 8474.7, launch_1d_tiles, launch_1d_tiles},
      {"K5 2-D tiles", 14155.1, 15971.7, launch_2d_tiles, launch_2d_tiles},
      {"K6 vectorised", 15296.5, 18237.3, k6, k6},
      {"K7 linearised B", 15171.3, 16213.4, k7, k7},
      {"K8 padded B", 15086.2, 16459.2, k8, k8},
      {"K9 autotuned", 16344.1, 19721.0, launch_vectorised<BLayout::plain, 64, 64, 16, 4, 256>,
       launch_vectorised<BLayout::plain, 128, 128, 16, 8, 256>},
      {"K10 warp tiles", 17806.7, 21779.3, launch_warp_tiles<64, 128, 16, 32, 64, 4, 1, 4, 4, 128>,
       launch_warp_tiles<128, 128, 16, 64, 64, 1, 4, 8, 4, 128>},
  };
  return rungs;
}

// One GPU's column of the ladder.
std::vector<Rung> ladder_on(bool a100) {
  std::vector<Rung> rungs;
  for (const LadderRung& r : ladder())
    rungs.push_back({r.label, a100 ? r.a100_gflops : r.a6000_gflops, a100 ? r.a100 : r.a6000});
  return rungs;
}

struct DeviceMatrices {
  float *a = nullptr, *b = nullptr, *c = nullptr;
  explicit DeviceMatrices(int n) {
    const size_t bytes = size_t(n) * size_t(n) * sizeof(float);
    REQUIRE(cudaMalloc(&a, bytes) == cudaSuccess);
    REQUIRE(cudaMalloc(&b, bytes) == cudaSuccess);
    REQUIRE(cudaMalloc(&c, bytes) == cudaSuccess);
  }
  ~DeviceMatrices() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
};

}  // namespace

TEST_CASE("the SGEMM ladder's kernels compute C = alpha A B + beta C",
          "[gpu_model][validation][sgemm_ladder]") {
  const int n = 256;  // a multiple of every rung's tile
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> a(n * n), b(n * n), c0(n * n);
  for (float* v : {a.data(), b.data(), c0.data()})
    for (int i = 0; i < n * n; ++i) v[i] = dist(rng);
  std::vector<double> expected(n * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0;
      for (int k = 0; k < n; ++k) s += double(a[i * n + k]) * b[k * n + j];
      expected[i * n + j] = kAlpha * s + kBeta * double(c0[i * n + j]);
    }
  DeviceMatrices d(n);
  const size_t bytes = size_t(n) * n * sizeof(float);
  REQUIRE(cudaMemcpy(d.a, a.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(d.b, b.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
  for (const bool a100 : {true, false})
    for (const Rung& rung : ladder_on(a100)) {
      REQUIRE(cudaMemcpy(d.c, c0.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
      rung.launch(n, d.a, d.b, d.c);
      std::vector<float> got(n * n);
      REQUIRE(cudaMemcpy(got.data(), d.c, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
      double worst = 0;
      for (int i = 0; i < n * n; ++i) worst = std::max(worst, std::abs(got[i] - expected[i]));
      INFO(rung.label << ": largest error " << worst);
      CHECK(worst < 1e-3);
    }
}

namespace {

struct LadderSummary {
  validation::Summary all;
  double tuned_correlation;  // K5-K10 alone, the rungs the model has to tell apart
};

LadderSummary predict_ladder(const std::string& title, const mg_emu::GpuSpec& gpu,
                             const std::vector<Rung>& ladder) {
  const int n = 4096;
  const double flops = 2.0 * n * n * n;
  DeviceMatrices d(n);
  std::vector<validation::Row> rows;
  for (const Rung& rung : ladder) {
    // Two blocks traced: every block does the same work, and an L1 miss goes to L2 whatever the
    // other blocks did, so 2, 4 and 16 traced blocks give the same predictions (16 take 100 s).
    // One does not: on the A6000 a lone block's misses look like a wave too small to fill DRAM.
    const mg_emu::Prediction pr =
        validation::traced_launch(gpu, 2, flops, [&] { rung.launch(n, d.a, d.b, d.c); });
    rows.push_back({rung.label, flops / (rung.measured_gflops * 1e9), pr.seconds, pr.binding});
  }
  LadderSummary s{validation::report(title, gpu, rows), 0};
  std::vector<double> measured, predicted;
  for (size_t i = 4; i < rows.size(); ++i) {
    measured.push_back(rows[i].measured_seconds);
    predicted.push_back(rows[i].predicted_seconds);
  }
  s.tuned_correlation = validation::rank_correlation(measured, predicted);
  std::printf("  the tuned rungs K5-K10: rank correlation %.2f\n\n", s.tuned_correlation);
  return s;
}

}  // namespace

TEST_CASE("model validation: siboehm's SGEMM ladder on an A100", "[gpu_model][validation][sgemm_ladder]") {
  const LadderSummary s =
      predict_ladder("SGEMM ladder at 4096^3, README.md at c09b350", mg_emu::a100_sxm(), ladder_on(true));
  if (validation::instructions_counted()) {
    // With the PTX's vector shared loads and the L1's sector places (2026-12-05): 0.76-1.22, 0.99;
    // tuned 0.97. With memory and compute overlapping (2026-12-06): 0.75-1.20, 0.99; tuned 0.97. Before, K6
    // and K9's ld.shared.v4 counted as four scalar loads (0.69, 0.87; tuned 0.37) and K1's column reads as a
    // quarter of their passes through L1 (3.70). With a block's warps interleaved and pending L1
    // hits (2026-12-06): K2 0.75 -> 1.04, latency-bound; 0.76-1.20. With round trips from the PTX
    // (K2's loop unrolled by four: a quarter of them) and warps waiting together for a pending
    // fetch (2026-12-06, thirteenth session): K2 1.32; 0.76-1.32, 0.99, tuned 0.97. The tile
    // loads unrolled as in the article (fourteenth session): unchanged.
    validation::hold(s.all, 0.72, 1.40, 0.95);
    CHECK(s.tuned_correlation >= 0.93);
  } else {
    validation::hold(s.all, 0.65, 1.30, 0.85);  // without nvcc: 0.68-1.22, 0.87
    CHECK(s.tuned_correlation >= 0.35);         // 0.37
  }
}

TEST_CASE("model validation: siboehm's SGEMM ladder on an RTX A6000",
          "[gpu_model][validation][sgemm_ladder]") {
  const LadderSummary s =
      predict_ladder("SGEMM ladder at 4096^3, README.md at 60cba6f", mg_emu::rtx_a6000(), ladder_on(false));
  if (validation::instructions_counted()) {
    // With the vector shared loads, FP32 at its sustained 0.60 (calibrated on cuBLAS, not on
    // this ladder) and the L1's sector places: 0.63-1.52, 0.98; tuned 0.89, K6-K10 issue-bound
    // at 0.87-1.02 (1.34-1.48 at the FP32 peak), K1 0.94 (3.33). Before: 0.63-3.33, 0.92; tuned 0.60.
    // With memory and compute overlapping (2026-12-06): 0.61-1.52, 0.98; tuned 0.89, K6-K10 0.80-0.95.
    // With one block per SM's round trips added to its work (K3, 2026-12-06): 0.61-1.14, 0.98.
    // With a block's warps interleaved and pending L1 hits (K2 0.61 -> 0.68, 2026-12-06): 0.68-1.14.
    // With round trips from the PTX and warps waiting together (thirteenth session): K2 1.22, K1
    // 0.89; 0.70-1.22. With K6-K10's tile loads written as the article's kernels have them, a
    // compile-time count nvcc unrolls (fourteenth session), nvcc's instruction counts moved: K6
    // 0.92 -> 0.91, K7 0.95 -> 0.99; tuned 0.89 -> 0.94. K6 and K9 now in the GPU's order, but 0.4 %
    // apart where the GPU has 8 %; K7 and K8 (1.5 % apart on the GPU) still swapped.
    validation::hold(s.all, 0.65, 1.25, 0.95);
    CHECK(s.tuned_correlation >= 0.90);
  } else {
    // Without nvcc: 0.63-1.52, 0.90; tuned 0.53. With K3's round trips added (2026-12-06): 0.63-1.21.
    // With the warps interleaved and pending L1 hits (2026-12-06): 0.67-1.21.
    validation::hold(s.all, 0.60, 1.30, 0.85);
    CHECK(s.tuned_correlation >= 0.45);
  }
}
