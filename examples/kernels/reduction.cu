// A sum of n floats, two ways (docs/tutorial-kernels.md):
//
//   tree      each block loads 256 values into shared memory and halves them level by level,
//             a __syncthreads() between levels; one partial sum per block, summed on the host;
//   shuffle   each warp sums its 32 values in registers with __shfl_down_sync, the warps' sums
//             meet in 8 shared-memory slots, and each block adds its total with one atomicAdd.
//
// Bytes: 4 n read once; FLOPs: n - 1 additions. Both are bound by reading the input.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

constexpr int kThreads = 256;

__global__ void sum_tree(const float* in, float* block_sums, int n) {
  __shared__ float partial[kThreads];
  const int i = blockIdx.x * kThreads + threadIdx.x;
  partial[threadIdx.x] = i < n ? in[i] : 0.f;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();  // every level reads what the last one wrote
  }
  if (threadIdx.x == 0) block_sums[blockIdx.x] = partial[0];
}

__global__ void sum_shuffle(const float* in, float* total, int n) {
  __shared__ float warp_sums[kThreads / 32];
  const int i = blockIdx.x * kThreads + threadIdx.x;
  float v = i < n ? in[i] : 0.f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? warp_sums[lane] : 0.f;
    for (int offset = 4; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
    if (lane == 0) atomicAdd(total, v);
  }
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 100000;
  if (n <= 0) return 2;
  std::vector<float> h(static_cast<size_t>(n));
  double reference = 0;
  for (int i = 0; i < n; ++i) {
    h[static_cast<size_t>(i)] = float((i * 7919) % 1000) / 1000.f;
    reference += h[static_cast<size_t>(i)];
  }
  const int blocks = (n + kThreads - 1) / kThreads;
  float *in, *sums, *total;
  cudaMalloc(&in, size_t(n) * sizeof(float));
  cudaMalloc(&sums, size_t(blocks) * sizeof(float));
  cudaMalloc(&total, sizeof(float));
  cudaMemcpy(in, h.data(), size_t(n) * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(total, 0, sizeof(float));

  sum_tree<<<blocks, kThreads>>>(in, sums, n);
  sum_shuffle<<<blocks, kThreads>>>(in, total, n);
  std::vector<float> block_sums(static_cast<size_t>(blocks));
  float shuffled = 0;
  cudaMemcpy(block_sums.data(), sums, block_sums.size() * sizeof(float), cudaMemcpyDeviceToHost);
  cudaMemcpy(&shuffled, total, sizeof(float), cudaMemcpyDeviceToHost);
  if (cudaGetLastError() != cudaSuccess) return 1;
  double tree = 0;
  for (float s : block_sums) tree += s;
  // float sums in another order than the reference's: about n * 6e-8 of it apart at most
  const double tolerance = 1e-6 * reference + 1e-3;
  const bool ok = std::fabs(tree - reference) < tolerance && std::fabs(shuffled - reference) < tolerance;
  // The shuffle's per-block atomicAdds land in whatever order the blocks finish, so its last digits
  // change from run to run (on a GPU and under the emulator alike); the check allows for it.
  std::printf("reference %.3f, tree %.3f, shuffle %.3f\n", reference, tree, double(shuffled));
  std::printf("sum of %d floats: tree and shuffle %s\n", n, ok ? "agree with the reference" : "DISAGREE");
  cudaFree(in);
  cudaFree(sums);
  cudaFree(total);
  return ok ? 0 : 1;
}
