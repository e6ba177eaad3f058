// Plain CUDA through the emulation build's front end (cuda_emu/cu_rewrite/): `<<<>>>` launches and
// `__shared__` declarations written as a textbook writes them, with no multigrad helper.
// Runs on the CPU under the emulator only (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda_emu/emulator.h"
#include "tests/emu/device_buffers.h"

namespace {

// A block-wide sum in dynamic shared memory, templated on the element type and the block size: the
// launch names its template arguments, a dynamic size and a stream.
template <class T, int kThreads>
__global__ void block_sum(const T* in, T* out, int n) {
  extern __shared__ unsigned char smem[];
  T* partial = reinterpret_cast<T*>(smem);
  const int i = blockIdx.x * kThreads + threadIdx.x;
  partial[threadIdx.x] = i < n ? in[i] : T(0);
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

// Two arrays of one type, a scalar and a multi-declarator line: each its own memory, per block.
__global__ void two_arrays(float* out) {
  __shared__ float a[64], b[64];
  __shared__ int count;
  const int t = threadIdx.x;
  if (t == 0) count = 0;
  a[t] = float(t);
  b[t] = float(100 + t);
  __syncthreads();
  atomicAdd(&count, 1);
  __syncthreads();
  out[blockIdx.x * 64 + t] = a[63 - t] + b[t] + float(count) + float(blockIdx.x) * 1000.f;
}

// A read before any write: the poison (NaN) shows, block after block.
__global__ void read_unwritten(float* out) {
  __shared__ float never_written[32];
  out[blockIdx.x * 32 + threadIdx.x] = never_written[threadIdx.x];
  __syncthreads();
  never_written[threadIdx.x] = 1.f;  // the next block on this OS thread must not see this
}

// 52 KiB of static shared memory: over the 48 KiB a GPU lets static arrays have.
__global__ void too_much_shared(float* out) {
  __shared__ float big[13 * 1024];
  big[threadIdx.x] = 1.f;
  __syncthreads();
  out[threadIdx.x] = big[threadIdx.x];
}

// An array declared at namespace scope, as older CUDA code does: still one per block.
__shared__ float g_tile[128];
__global__ void uses_namespace_scope_shared(float* out) {
  g_tile[threadIdx.x] = float(threadIdx.x) * 2.f;
  __syncthreads();
  out[threadIdx.x] = g_tile[127 - threadIdx.x];
}

__global__ void fill(float* out, float v) { out[blockIdx.x * blockDim.x + threadIdx.x] = v; }

}  // namespace

TEST_CASE("plain CUDA: a templated <<<>>> launch with dynamic shared memory on a stream", "[emu][plain]") {
  const int n = 1000, blocks = 4;
  std::vector<double> h(n);
  for (int i = 0; i < n; ++i) h[static_cast<size_t>(i)] = 0.5 * i;
  double* in = device_alloc<double>(n);
  double* out = device_alloc<double>(blocks);
  REQUIRE(cudaMemcpy(in, h.data(), n * sizeof(double), cudaMemcpyHostToDevice) == cudaSuccess);
  cudaStream_t stream;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  const uint64_t launches = mg_emu::counters().kernel_launches;
  block_sum<double, 256><<<blocks, 256, 256 * sizeof(double), stream>>>(in, out, n);
  CHECK(cudaGetLastError() == cudaSuccess);
  CHECK(mg_emu::counters().kernel_launches == launches + 1);
  REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  const std::vector<double> sums = to_host(out, blocks);
  for (int b = 0; b < blocks; ++b) {
    double expect = 0;
    for (int i = b * 256; i < std::min(n, (b + 1) * 256); ++i) expect += 0.5 * i;
    CHECK(sums[static_cast<size_t>(b)] == expect);
  }
  cudaStreamDestroy(stream);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("plain CUDA: each __shared__ declaration is its own array, one per block", "[emu][plain]") {
  float* out = device_alloc<float>(3 * 64);
  two_arrays<<<3, 64>>>(out);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> h = to_host(out, 3 * 64);
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 64; ++t)
      CHECK(h[static_cast<size_t>(b * 64 + t)] == float(63 - t) + float(100 + t) + 64.f + 1000.f * b);
  cudaFree(out);
}

TEST_CASE("plain CUDA: __shared__ memory is poisoned at every block's start", "[emu][plain]") {
  float* out = device_alloc<float>(8 * 32);
  read_unwritten<<<8, 32>>>(out);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  for (float v : to_host(out, 8 * 32)) CHECK(std::isnan(v));
  cudaFree(out);
}

TEST_CASE("plain CUDA: a namespace-scope __shared__ array is one per block too", "[emu][plain]") {
  float* out = device_alloc<float>(128);
  uses_namespace_scope_shared<<<2, 128>>>(out);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  const std::vector<float> h = to_host(out, 128);
  CHECK(h[0] == 254.f);
  CHECK(h[127] == 0.f);
  cudaFree(out);
}

TEST_CASE("plain CUDA: an over-sized __shared__ array fails the launch", "[emu][plain]") {
  float* out = device_alloc<float>(32);
  // The first launch: the emulator meets the array in the first block and stops the grid.
  too_much_shared<<<1, 32>>>(out);
  CHECK(cudaGetLastError() == cudaSuccess);  // accepted: the size is not known before a block runs
  CHECK(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  CHECK_THAT(mg_emu::last_fault(),
             Catch::Contains("53248 bytes of static shared memory per block, over 48 KiB") &&
                 Catch::Contains("too_much_shared"));
  cudaGetLastError();
  // From then on the kernel's size is known, and the launch is refused as a GPU refuses it.
  too_much_shared<<<1, 32>>>(out);
  CHECK(cudaGetLastError() == cudaErrorLaunchOutOfResources);
  CHECK(cudaGetLastError() == cudaSuccess);  // not sticky
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  cudaFree(out);
}

TEST_CASE("plain CUDA: a refused <<<>>> launch leaves its error for cudaGetLastError", "[emu][plain]") {
  float* out = device_alloc<float>(2048);
  const uint64_t launches = mg_emu::counters().kernel_launches;
  fill<<<1, 1025>>>(out, 1.f);  // over 1024 threads per block
  CHECK(mg_emu::counters().kernel_launches == launches);
  CHECK(cudaPeekAtLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
  CHECK(cudaGetLastError() == cudaSuccess);
  fill<<<dim3(2), dim3(32), 0, 0>>>(out, 7.f);  // the legacy default stream, written as 0
  CHECK(cudaGetLastError() == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(to_host(out, 64)[63] == 7.f);
  cudaFree(out);
}
