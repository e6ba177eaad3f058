// Two mistakes a GPU often lets through, and how the emulator shows them (docs/tutorial-kernels.md).
//
//   ./mistakes barrier   a neighbour sum through shared memory without the __syncthreads() between
//                        the write and the read: on a GPU the warps of a block usually run close
//                        enough together that the answer comes out right. The emulator runs each
//                        block's threads in a new order (forward, reverse, shuffled) between
//                        barriers, so some thread reads its neighbour's slot before the neighbour
//                        wrote it: the poison (NaN) or a stale value shows in the result.
//   ./mistakes bounds    an off-by-one tail (`i <= n`) that reads one float past the end of the
//                        input: on a GPU it reads whatever lies there. Run under the memcheck
//                        (MG_EMU_MEMCHECK=1, a program built with mg-nvcc --memcheck), the read is
//                        an error naming the kernel, thread and source line.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

constexpr int kThreads = 128;

__global__ void neighbour_sum_missing_barrier(const float* in, float* out) {
  __shared__ float tile[kThreads];
  const int t = threadIdx.x;
  tile[t] = in[blockIdx.x * kThreads + t];
  // the __syncthreads() that belongs here is missing
  out[blockIdx.x * kThreads + t] = tile[t] + tile[(t + 1) % kThreads];
}

// `out` has room for n + 1 values (say, a header slot); `in` holds n: only the read is out of bounds.
__global__ void scale_off_by_one(const float* in, float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = 2.f * in[i];  // should be i < n: thread n reads in[n]
}

int main(int argc, char** argv) {
  const char* which = argc > 1 ? argv[1] : "";
  if (std::strcmp(which, "barrier") == 0) {
    const int blocks = 8, n = blocks * kThreads;
    std::vector<float> h(n, 1.f), back(n);
    float *in, *out;
    cudaMalloc(&in, n * sizeof(float));
    cudaMalloc(&out, n * sizeof(float));
    cudaMemcpy(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    neighbour_sum_missing_barrier<<<blocks, kThreads>>>(in, out);
    cudaMemcpy(back.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost);
    int wrong = 0;
    for (float v : back) wrong += v != 2.f;
    std::printf("neighbour sums: %d of %d wrong (every one should be 2)\n", wrong, n);
    return wrong == 0 ? 0 : 1;
  }
  if (std::strcmp(which, "bounds") == 0) {
    const int n = 1000;
    std::vector<float> h(n, 1.f);
    float *in, *out;
    cudaMalloc(&in, n * sizeof(float));
    cudaMalloc(&out, (n + 1) * sizeof(float));
    cudaMemcpy(in, h.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    scale_off_by_one<<<(n + 255) / 256, 256>>>(in, out, n);
    const cudaError_t e = cudaDeviceSynchronize();
    std::printf("scale_off_by_one: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
  }
  std::fprintf(stderr, "usage: mistakes barrier|bounds\n");
  return 2;
}
