// C = A B for row-major A (m x k) and B (k x n), two ways (docs/tutorial-kernels.md):
//
//   naive   one thread per C element, k steps along a row of A and a column of B in global memory:
//           each element of A and B is read from memory n (or m) times;
//   tiled   a block computes a 16 x 16 tile of C; A and B pass through shared memory 16 x 16 tiles
//           at a time, each element read from global memory once per tile pass (n / 16 and m / 16
//           times instead of n and m), the 16 products per loaded value served from shared memory.
//
// FLOPs: 2 m n k. The naive kernel moves 8 m n k bytes through the memory system, the tiled one
// about 1/16 of that; both are far below a tensor-core GEMM (the GEMM ladder, docs/kernels.md).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kTile = 16;

__global__ void matmul_naive(const float* a, const float* b, float* c, int m, int n, int k) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= m || col >= n) return;
  float acc = 0.f;
  for (int i = 0; i < k; ++i) acc += a[row * k + i] * b[i * n + col];
  c[row * n + col] = acc;
}

__global__ void matmul_tiled(const float* a, const float* b, float* c, int m, int n, int k) {
  __shared__ float a_tile[kTile][kTile];
  __shared__ float b_tile[kTile][kTile];
  const int row = blockIdx.y * kTile + threadIdx.y, col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0.f;
  for (int k0 = 0; k0 < k; k0 += kTile) {
    // each thread loads one element of each tile (zeros past the edges)
    a_tile[threadIdx.y][threadIdx.x] = row < m && k0 + threadIdx.x < k ? a[row * k + k0 + threadIdx.x] : 0.f;
    b_tile[threadIdx.y][threadIdx.x] =
        k0 + threadIdx.y < k && col < n ? b[(k0 + threadIdx.y) * n + col] : 0.f;
    __syncthreads();  // the tiles are complete
    for (int i = 0; i < kTile; ++i) acc += a_tile[threadIdx.y][i] * b_tile[i][threadIdx.x];
    __syncthreads();  // everyone is done with them before the next pass overwrites them
  }
  if (row < m && col < n) c[row * n + col] = acc;
}

int main(int argc, char** argv) {
  const int m = argc > 1 ? std::atoi(argv[1]) : 96, n = argc > 2 ? std::atoi(argv[2]) : 80,
            k = argc > 3 ? std::atoi(argv[3]) : 72;
  if (m <= 0 || n <= 0 || k <= 0) return 2;
  std::vector<float> ha(size_t(m) * k), hb(size_t(k) * n), ref(size_t(m) * n), hc(ref.size());
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = float(int(i % 17) - 8) / 8.f;
  for (size_t i = 0; i < hb.size(); ++i) hb[i] = float(int(i % 13) - 6) / 6.f;
  for (int r = 0; r < m; ++r)
    for (int col = 0; col < n; ++col) {
      double acc = 0;
      for (int i = 0; i < k; ++i) acc += double(ha[size_t(r) * k + i]) * hb[size_t(i) * n + col];
      ref[size_t(r) * n + col] = float(acc);
    }
  float *a, *b, *c;
  cudaMalloc(&a, ha.size() * sizeof(float));
  cudaMalloc(&b, hb.size() * sizeof(float));
  cudaMalloc(&c, hc.size() * sizeof(float));
  cudaMemcpy(a, ha.data(), ha.size() * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(b, hb.data(), hb.size() * sizeof(float), cudaMemcpyHostToDevice);
  const dim3 block(kTile, kTile), grid((n + kTile - 1) / kTile, (m + kTile - 1) / kTile);
  bool all_ok = true;
  for (int version = 0; version < 2; ++version) {
    cudaMemset(c, 0, hc.size() * sizeof(float));
    if (version == 0)
      matmul_naive<<<grid, block>>>(a, b, c, m, n, k);
    else
      matmul_tiled<<<grid, block>>>(a, b, c, m, n, k);
    cudaMemcpy(hc.data(), c, hc.size() * sizeof(float), cudaMemcpyDeviceToHost);
    double worst = 0;
    for (size_t i = 0; i < hc.size(); ++i) worst = std::fmax(worst, std::fabs(double(hc[i]) - ref[i]));
    const bool ok = cudaGetLastError() == cudaSuccess && worst < 1e-4 * k;
    all_ok &= ok;
    std::printf("%s: %dx%d = %dx%d * %dx%d, largest error %.2g: %s\n",
                version == 0 ? "matmul_naive" : "matmul_tiled", m, n, m, k, k, n, worst,
                ok ? "correct" : "WRONG");
  }
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return all_ok ? 0 : 1;
}
