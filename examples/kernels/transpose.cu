// A matrix transpose three ways, as the kernel tutorial builds it (docs/tutorial-kernels.md):
//
//   copy       out[y][x] = in[y][x]: the ceiling, every read and write coalesced;
//   naive      through a 32 x 32 shared tile, rows in, columns out: coalesced global accesses, but
//              the column read of the tile hits one shared-memory bank 32 times;
//   padded     the same with 33 floats per tile row: the column read spreads over all 32 banks.
//
// Bytes: each kernel reads and writes n*n floats once (8 n^2 bytes); no arithmetic to speak of.
// Build with nvcc or, without a GPU, with mg-nvcc; run ./transpose [n].
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kTile = 32;

__global__ void copy(const float* in, float* out, int n) {
  const int x = blockIdx.x * kTile + threadIdx.x, y = blockIdx.y * kTile + threadIdx.y;
  out[y * n + x] = in[y * n + x];
}

__global__ void transpose_naive(const float* in, float* out, int n) {
  __shared__ float tile[kTile][kTile];
  int x = blockIdx.x * kTile + threadIdx.x, y = blockIdx.y * kTile + threadIdx.y;
  tile[threadIdx.y][threadIdx.x] = in[y * n + x];  // a row of the tile: 32 banks, one word each
  __syncthreads();
  x = blockIdx.y * kTile + threadIdx.x;  // the transposed block
  y = blockIdx.x * kTile + threadIdx.y;
  out[y * n + x] = tile[threadIdx.x][threadIdx.y];  // a column: 32 words 32 floats apart, one bank
}

__global__ void transpose_padded(const float* in, float* out, int n) {
  __shared__ float tile[kTile][kTile + 1];  // row r starts at bank r: a column hits every bank once
  int x = blockIdx.x * kTile + threadIdx.x, y = blockIdx.y * kTile + threadIdx.y;
  tile[threadIdx.y][threadIdx.x] = in[y * n + x];
  __syncthreads();
  x = blockIdx.y * kTile + threadIdx.x;
  y = blockIdx.x * kTile + threadIdx.y;
  out[y * n + x] = tile[threadIdx.x][threadIdx.y];
}

#define CHECK(call)                                                                               \
  do {                                                                                            \
    cudaError_t e_ = (call);                                                                      \
    if (e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 256;
  if (n <= 0 || n % kTile != 0) {
    std::fprintf(stderr, "n must be a positive multiple of %d\n", kTile);
    return 2;
  }
  std::vector<float> h(size_t(n) * n), back(h.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(i);
  float *in, *out;
  CHECK(cudaMalloc(&in, h.size() * sizeof(float)));
  CHECK(cudaMalloc(&out, h.size() * sizeof(float)));
  CHECK(cudaMemcpy(in, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice));
  const dim3 grid(n / kTile, n / kTile), block(kTile, kTile);

  copy<<<grid, block>>>(in, out, n);
  CHECK(cudaGetLastError());
  transpose_naive<<<grid, block>>>(in, out, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(back.data(), out, back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int y = 0; y < n; ++y)
    for (int x = 0; x < n; ++x) wrong += back[size_t(y) * n + x] != h[size_t(x) * n + y];
  std::printf("transpose_naive:  %d of %d elements wrong\n", wrong, n * n);

  CHECK(cudaMemset(out, 0, back.size() * sizeof(float)));
  transpose_padded<<<grid, block>>>(in, out, n);
  CHECK(cudaGetLastError());
  CHECK(cudaMemcpy(back.data(), out, back.size() * sizeof(float), cudaMemcpyDeviceToHost));
  wrong = 0;
  for (int y = 0; y < n; ++y)
    for (int x = 0; x < n; ++x) wrong += back[size_t(y) * n + x] != h[size_t(x) * n + y];
  std::printf("transpose_padded: %d of %d elements wrong\n", wrong, n * n);
  CHECK(cudaFree(in));
  CHECK(cudaFree(out));
  return wrong == 0 ? 0 : 1;
}
