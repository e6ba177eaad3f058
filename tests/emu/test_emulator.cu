// Tests of the CUDA emulator itself (built in the MG_CUDA=EMULATE build only).
//
// Two kinds: (1) the emulated PTX wrappers and warp collectives against plain arithmetic, and
// (2) deliberately wrong kernels -- each mistake a GPU would let through silently or turn into
// undefined behaviour must here give a wrong result or an error naming what went wrong.
// Runs on the CPU under the emulator only (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <catch2/catch.hpp>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu/emulator.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "tests/emu/device_buffers.h"

using mg::kernels::cuda::launch_kernel;

namespace {

// ---- helpers ----------------------------------------------------------------------------------
// Runs `launch`, expects the launch itself to be accepted and the kernel to fault at the next
// synchronisation; returns the fault's message.
template <class F>
std::string expect_fault(F&& launch) {
  launch();
  const cudaError_t err = cudaDeviceSynchronize();
  CHECK(err == cudaErrorLaunchFailure);
  cudaGetLastError();
  return mg_emu::last_fault();
}

// Runs `launch`, expects the launch to be rejected; returns the error and leaves it cleared.
template <class F>
cudaError_t expect_rejected(F&& launch) {
  try {
    launch();
  } catch (const std::exception& e) {
    cudaGetLastError();
    (void)e;
    return cudaErrorInvalidValue;  // the helper threw (MG_CUDA_CHECK_LAUNCH); the code is in e.what()
  }
  return cudaSuccess;
}

uint16_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }
float bf16_value(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }

// ---- kernels: correct ones ----------------------------------------------------------------------
__global__ void neighbour_sum(const float* in, float* out, int n) {
  __shared__ float tile[256];
  const int i = threadIdx.x;
  tile[i] = in[i];
  __syncthreads();
  out[i] = tile[i] + tile[(i + 1) % n];
}

__global__ void warp_reduce(const float* in, float* out) {
  float v = in[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  out[threadIdx.x] = v;
}

__global__ void shuffles(const int* in, int* idx, int* up, int* down, unsigned* ballot) {
  const int v = in[threadIdx.x];
  idx[threadIdx.x] = __shfl_sync(0xffffffffu, v, 31 - (threadIdx.x % 32));
  up[threadIdx.x] = __shfl_up_sync(0xffffffffu, v, 3, 8);
  down[threadIdx.x] = __shfl_down_sync(0xffffffffu, v, 5);
  ballot[threadIdx.x] = __ballot_sync(0xffffffffu, v % 3 == 0);
}

__global__ void count_atomically(unsigned long long* counter, float* sum) {
  atomicAdd(counter, 1ull);
  atomicAdd(sum, 0.5f);
}

// ---- kernels: deliberately wrong ones -----------------------------------------------------------
__global__ void neighbour_sum_no_barrier(const float* in, float* out, int n) {
  __shared__ float tile[256];
  const int i = threadIdx.x;
  tile[i] = in[i];
  // missing __syncthreads(): thread i reads tile[i + 1] before thread i + 1 may have written it
  out[i] = tile[i] + tile[(i + 1) % n];
}

__global__ void neighbour_sum_dynamic_no_barrier(const float* in, float* out, int n) {
  extern __shared__ float tile[];
  const int i = threadIdx.x;
  tile[i] = in[i];
  out[i] = tile[i] + tile[(i + 1) % n];  // missing __syncthreads()
}

__global__ void off_by_one_tail(float* out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i <= n) out[i] = 1.f;  // should be i < n
}

__global__ void trivial(float* out) { out[threadIdx.x] = 1.f; }

__global__ void uses_dynamic_shared(float* out) {
  extern __shared__ float s[];
  s[threadIdx.x] = 2.f;
  __syncthreads();
  out[threadIdx.x] = s[threadIdx.x];
}

// 40 KiB of static shared memory (a plain __shared__ array); with `dynamic` bytes of
// dynamic shared memory on top. Each thread reads its slot before anyone wrote it (the bug the
// poison shows), then writes and reads back after a barrier.
__global__ void uses_static_shared(float* out) {
  __shared__ float s[10 * 1024];
  out[threadIdx.x] = s[threadIdx.x];  // never written: NaN
  __syncthreads();
  s[threadIdx.x] = 3.f;
  __syncthreads();
  out[32 + threadIdx.x] = s[threadIdx.x];
}

__global__ void divergent_barrier(float* out) {
  if (threadIdx.x < 16) __syncthreads();  // only half the block reaches it
  out[threadIdx.x] = 1.f;
}

// The two halves of a block wait at __syncthreads() calls on different lines (as a published
// double-buffered SGEMM's halves do): on the GPU both are barrier 0, which opens once every live
// thread has arrived, so each half then reads what the other wrote.
__global__ void barriers_on_two_lines(float* out) {
  __shared__ float v[64];
  const int i = static_cast<int>(threadIdx.x);
  v[i] = static_cast<float>(i);
  if (i < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[i] = v[63 - i];
}

__global__ void partial_mask_shuffle(const float* in, float* out) {
  float v = in[threadIdx.x];
  if (threadIdx.x < 16) v += __shfl_xor_sync(0x0000ffffu, v, 16);  // lane 16 is not in the mask
  out[threadIdx.x] = v;
}

__global__ void slow_writer(float* out) {
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  out[threadIdx.x] = 42.f;
}

// cp.async through the emulated twin, with or without the wait that makes the copy land.
__global__ void cp_async_copy(const float* in, float* out, bool wait) {
  extern __shared__ float s[];
  mg_emu::cp_async_16(s + 4 * threadIdx.x, in + 4 * threadIdx.x, __FILE__, __LINE__);
  mg_emu::cp_async_commit();
  if (wait) mg_emu::cp_async_wait(0);
  __syncthreads();
  for (int e = 0; e < 4; ++e) out[4 * threadIdx.x + e] = s[4 * threadIdx.x + e];
}

// ---- what the stricter checks look at: call sites, all 16 bytes of a cp.async, phase orders ----
// Two branches that shuffle at two different lines: lanes of one warp at two different calls.
__global__ void divergent_shuffles(const float* in, float* out) {
  float v = in[threadIdx.x];
  if (threadIdx.x % 2 == 0) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v -= __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

// The same with mma: half the warp at one mma, half at another, as a divergent tensor-core loop.
__global__ void divergent_mma(float* out) {
  const uint32_t a[4] = {0, 0, 0, 0};
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (threadIdx.x < 16) {
    mg_emu::mma_m16n8k16(acc, a, 0u, 0u, true, __FILE__, __LINE__);
  } else {
    mg_emu::mma_m16n8k16(acc, a, 0u, 0u, true, __FILE__, __LINE__);
  }
  out[threadIdx.x] = acc[0];
}

// A tree reduction per block, with or without the barrier between its levels. Without it, a
// thread reads its partner's slot before (forward order) or after (reverse order) the partner
// added into it; only reverse order happens to give the right sum.
template <bool kBarrier>
__global__ void tree_sum(const float* in, float* out) {
  extern __shared__ float s[];
  const int t = threadIdx.x;
  s[t] = in[blockIdx.x * blockDim.x + t];
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    if (kBarrier) __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = s[0];
}

// ---- PTX twins ----------------------------------------------------------------------------------
// A 16x16 bf16 matrix A (row-major) and a 16x8 matrix B (row-major, k x n) in shared memory,
// loaded with ldmatrix (A plain: 4 8x8 matrices; B with .trans: 2 of its 8x8 matrices twice),
// multiplied with mma into D (16x8 f32), written out by the accumulator layout.
__global__ void ldmatrix_mma(const uint16_t* a, const uint16_t* b, float* d) {
  extern __shared__ uint16_t s[];
  const int lane = threadIdx.x;
  for (int e = lane; e < 256; e += 32) s[e] = a[e];
  for (int e = lane; e < 128; e += 32) s[256 + e] = b[e];
  __syncwarp();
  // A: matrix j = (rows 0-7 | 8-15) x (cols 0-7 | 8-15) in the order a[0..3] needs:
  // j=0 rows 0-7 cols 0-7, j=1 rows 8-15 cols 0-7, j=2 rows 0-7 cols 8-15, j=3 rows 8-15 cols 8-15.
  const int j = lane / 8, r = lane % 8;
  const int a_row = (j % 2) * 8 + r, a_col = (j / 2) * 8;
  uint32_t af[4];
  mg_emu::ldmatrix_x4(af, static_cast<uint32_t>((a_row * 16 + a_col) * 2), false, __FILE__, __LINE__);
  // B (k x n, row-major, n = 8): b0 needs k 0-7, b1 k 8-15, each transposed; lanes 16-31 repeat.
  const int b_row = (j % 2) * 8 + r;
  uint32_t bf[4];
  mg_emu::ldmatrix_x4(bf, static_cast<uint32_t>(512 + b_row * 16), true, __FILE__, __LINE__);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  mg_emu::mma_m16n8k16(acc, af, bf[0], bf[1], true, __FILE__, __LINE__);
  const int g = lane / 4, t = lane % 4;
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// mma alone, fragments built from the PTX ISA's table by each lane directly from global memory.
__global__ void mma_from_table(const uint16_t* a, const uint16_t* b, const float* c, float* d) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto pk = [](uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); };
  const uint32_t af[4] = {pk(a[g * 16 + 2 * t], a[g * 16 + 2 * t + 1]),
                          pk(a[(g + 8) * 16 + 2 * t], a[(g + 8) * 16 + 2 * t + 1]),
                          pk(a[g * 16 + 2 * t + 8], a[g * 16 + 2 * t + 9]),
                          pk(a[(g + 8) * 16 + 2 * t + 8], a[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t b0 = pk(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]);
  const uint32_t b1 = pk(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g]);
  float acc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  mg_emu::mma_m16n8k16(acc, af, b0, b1, true, __FILE__, __LINE__);
  d[g * 8 + 2 * t] = acc[0];
  d[g * 8 + 2 * t + 1] = acc[1];
  d[(g + 8) * 8 + 2 * t] = acc[2];
  d[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

// ldmatrix alone: every lane writes its four registers.
__global__ void ldmatrix_registers(const uint16_t* m, uint32_t* regs, bool trans) {
  extern __shared__ uint16_t s[];
  for (int e = threadIdx.x; e < 256; e += 32) s[e] = m[e];
  __syncwarp();
  uint32_t r[4];
  mg_emu::ldmatrix_x4(r, static_cast<uint32_t>(threadIdx.x * 16), trans, __FILE__,
                      __LINE__);  // row l at 16 l
  for (int j = 0; j < 4; ++j) regs[threadIdx.x * 4 + j] = r[j];
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace

TEST_CASE("emulator: a correct barrier gives the right answer in every thread order", "[emu]") {
  const int n = 256;
  const std::vector<float> in = random_floats(n, 1);
  float* d_in = to_device(in);
  float* d_out = device_alloc<float>(n);
  for (int order = -1; order < 3; ++order) {
    mg_emu::set_thread_order(order);
    launch_kernel<neighbour_sum>(1, n, 0, nullptr, d_in, d_out, n);
    const std::vector<float> out = to_host(d_out, n);
    for (int i = 0; i < n; ++i) REQUIRE(out[i] == in[i] + in[(i + 1) % n]);
  }
  mg_emu::set_thread_order(-1);
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_CASE("emulator: a missing __syncthreads gives a wrong answer", "[emu]") {
  const int n = 256;
  const std::vector<float> in = random_floats(n, 2);
  float* d_in = to_device(in);
  float* d_out = device_alloc<float>(n);
  // Forward order: thread i runs (to its end: no barrier) before thread i + 1 writes its element.
  // Dynamic shared memory is poisoned (NaN) at block start, so the read is NaN, not a lucky value.
  mg_emu::set_thread_order(0);
  launch_kernel<neighbour_sum_dynamic_no_barrier>(1, n, n * sizeof(float), nullptr, d_in, d_out, n);
  std::vector<float> out = to_host(d_out, n);
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += !(out[i] == in[i] + in[(i + 1) % n]);
  CHECK(wrong >= n - 1);
  CHECK(std::isnan(out[0]));
  // Static __shared__ arrays are not poisoned (thread-local storage), but the order still exposes
  // the race: every thread but the last reads its neighbour's slot before it is written.
  launch_kernel<neighbour_sum_no_barrier>(1, n, 0, nullptr, d_in, d_out, n);
  out = to_host(d_out, n);
  wrong = 0;
  for (int i = 0; i < n; ++i) wrong += !(out[i] == in[i] + in[(i + 1) % n]);
  CHECK(wrong >= n / 2);
  mg_emu::set_thread_order(-1);
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_CASE("emulator: warp shuffles, ballot and atomics", "[emu]") {
  const std::vector<float> in = random_floats(64, 3);
  float* d_in = to_device(in);
  float* d_out = device_alloc<float>(64);
  launch_kernel<warp_reduce>(1, 64, 0, nullptr, d_in, d_out);
  const std::vector<float> out = to_host(d_out, 64);
  for (int w = 0; w < 2; ++w) {
    double s = 0;
    for (int l = 0; l < 32; ++l) s += in[w * 32 + l];
    for (int l = 0; l < 32; ++l) REQUIRE(out[w * 32 + l] == Approx(s).margin(1e-5));
  }

  std::vector<int> vals(32);
  for (int i = 0; i < 32; ++i) vals[i] = i * 7 + 1;
  int* d_vals = to_device(vals);
  int *d_idx = device_alloc<int>(32), *d_up = device_alloc<int>(32), *d_down = device_alloc<int>(32);
  unsigned* d_ballot = device_alloc<unsigned>(32);
  launch_kernel<shuffles>(1, 32, 0, nullptr, d_vals, d_idx, d_up, d_down, d_ballot);
  const auto idx = to_host(d_idx, 32), up = to_host(d_up, 32), down = to_host(d_down, 32);
  const auto ballot = to_host(d_ballot, 32);
  unsigned want_ballot = 0;
  for (int l = 0; l < 32; ++l) want_ballot |= (vals[l] % 3 == 0 ? 1u : 0u) << l;
  for (int l = 0; l < 32; ++l) {
    CHECK(idx[l] == vals[31 - l]);
    CHECK(up[l] == (l % 8 >= 3 ? vals[l - 3] : vals[l]));  // width 8: no crossing of segments
    CHECK(down[l] == (l + 5 < 32 ? vals[l + 5] : vals[l]));
    CHECK(ballot[l] == want_ballot);
  }

  unsigned long long* d_count = device_alloc<unsigned long long>(1);
  float* d_sum = device_alloc<float>(1);
  cudaMemset(d_count, 0, sizeof(unsigned long long));
  cudaMemset(d_sum, 0, sizeof(float));
  launch_kernel<count_atomically>(64, 256, 0, nullptr, d_count, d_sum);  // blocks on several workers
  CHECK(to_host(d_count, 1)[0] == 64ull * 256);
  CHECK(to_host(d_sum, 1)[0] == 0.5f * 64 * 256);
  for (void* p : {static_cast<void*>(d_in), static_cast<void*>(d_out), static_cast<void*>(d_vals),
                  static_cast<void*>(d_idx), static_cast<void*>(d_up), static_cast<void*>(d_down),
                  static_cast<void*>(d_ballot), static_cast<void*>(d_count), static_cast<void*>(d_sum)})
    cudaFree(p);
}

TEST_CASE("emulator: ldmatrix and mma.m16n8k16 against a plain matrix product", "[emu][ptx]") {
  std::mt19937 rng(4);
  std::uniform_int_distribution<int> small(-8, 8);  // products and sums exact in f32
  std::vector<uint16_t> a(256), b(128);
  std::vector<float> c(128);
  for (auto& x : a) x = bf16_bits(small(rng) * 0.25f);
  for (auto& x : b) x = bf16_bits(small(rng) * 0.5f);
  for (auto& x : c) x = static_cast<float>(small(rng));
  std::vector<float> want(128), want_c(128);
  for (int i = 0; i < 16; ++i)
    for (int n = 0; n < 8; ++n) {
      double s = 0;
      for (int k = 0; k < 16; ++k) s += double(bf16_value(a[i * 16 + k])) * bf16_value(b[k * 8 + n]);
      want[i * 8 + n] = static_cast<float>(s);
      want_c[i * 8 + n] = static_cast<float>(s + c[i * 8 + n]);
    }
  uint16_t *d_a = to_device(a), *d_b = to_device(b);
  float *d_c = to_device(c), *d_d = device_alloc<float>(128);

  SECTION("mma with fragments from the PTX table") {
    launch_kernel<mma_from_table>(1, 32, 0, nullptr, d_a, d_b, d_c, d_d);
    const auto d = to_host(d_d, 128);
    for (int e = 0; e < 128; ++e) REQUIRE(d[e] == want_c[e]);
  }
  SECTION("ldmatrix (plain and .trans) feeding mma") {
    launch_kernel<ldmatrix_mma>(1, 32, 1024, nullptr, d_a, d_b, d_d);
    const auto d = to_host(d_d, 128);
    for (int e = 0; e < 128; ++e) REQUIRE(d[e] == want[e]);
  }
  SECTION("ldmatrix registers hold the documented elements") {
    std::vector<uint16_t> m(256);
    for (int e = 0; e < 256; ++e) m[e] = static_cast<uint16_t>(e);  // element value = its index
    uint16_t* d_m = to_device(m);
    uint32_t* d_r = device_alloc<uint32_t>(128);
    for (bool trans : {false, true}) {
      launch_kernel<ldmatrix_registers>(1, 32, 512, nullptr, d_m, d_r, trans);
      const auto r = to_host(d_r, 128);
      for (int l = 0; l < 32; ++l)
        for (int j = 0; j < 4; ++j) {
          // matrix j = rows 8j .. 8j+7 of m (row l of the 32 rows lies at 16 l bytes = 8 l elements)
          const int g = l / 4, t = l % 4;
          auto at = [&](int row, int col) { return uint32_t(8 * (8 * j + row) + col); };
          const uint32_t lo = trans ? at(2 * t, g) : at(g, 2 * t),
                         hi = trans ? at(2 * t + 1, g) : at(g, 2 * t + 1);
          REQUIRE(r[l * 4 + j] == (lo | (hi << 16)));
        }
    }
    cudaFree(d_m);
    cudaFree(d_r);
  }
  cudaFree(d_a);
  cudaFree(d_b);
  cudaFree(d_c);
  cudaFree(d_d);
}

TEST_CASE("emulator: a missing cp.async wait reads the poisoned destination", "[emu][ptx]") {
  const std::vector<float> in = random_floats(128, 5);
  float* d_in = to_device(in);
  float* d_out = device_alloc<float>(128);
  launch_kernel<cp_async_copy>(1, 32, 512, nullptr, d_in, d_out, true);
  auto out = to_host(d_out, 128);
  for (int e = 0; e < 128; ++e) REQUIRE(out[e] == in[e]);
  launch_kernel<cp_async_copy>(1, 32, 512, nullptr, d_in, d_out, false);
  out = to_host(d_out, 128);
  for (int e = 0; e < 128; ++e) REQUIRE(std::isnan(out[e]));
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_CASE("emulator: launch configurations an H200 rejects are rejected", "[emu]") {
  float* d = device_alloc<float>(2048);
  SECTION("1025 threads per block") {
    try {
      launch_kernel<trivial>(1, 1025, 0, nullptr, d);
      FAIL("the launch was accepted");
    } catch (const std::exception& e) {
      CHECK_THAT(e.what(), Catch::Contains("cudaErrorInvalidConfiguration"));
    }
  }
  SECTION("a zero-sized grid") {
    CHECK_THROWS_WITH(launch_kernel<trivial>(0, 32, 0, nullptr, d), Catch::Contains("invalid configuration"));
  }
  SECTION("grid.y over 65535") {
    CHECK_THROWS_WITH(launch_kernel<trivial>(dim3(1, 65536, 1), 32, 0, nullptr, d),
                      Catch::Contains("invalid configuration"));
  }
  SECTION("64 KiB of dynamic shared memory without cudaFuncSetAttribute, then with it") {
    CHECK_THROWS_WITH(launch_kernel<uses_dynamic_shared>(1, 32, 64 * 1024, nullptr, d),
                      Catch::Contains("cudaErrorInvalidValue"));
    REQUIRE(cudaFuncSetAttribute(reinterpret_cast<const void*>(uses_dynamic_shared),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) == cudaSuccess);
    launch_kernel<uses_dynamic_shared>(1, 32, 64 * 1024, nullptr, d);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(to_host(d, 32)[5] == 2.f);
    CHECK(cudaFuncSetAttribute(reinterpret_cast<const void*>(uses_dynamic_shared),
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               228 * 1024) == cudaErrorInvalidValue);
    cudaGetLastError();
  }
  SECTION("40 KiB of static shared memory + 16 KiB dynamic without cudaFuncSetAttribute") {
    // A GPU refuses this launch. The emulator learns a kernel's static arrays as its first blocks
    // use them (here: a launch that fits), then refuses the launch up front, as the runtime does.
    launch_kernel<uses_static_shared>(2, 32, 0, nullptr, d);  // 40 KiB alone: within 48 KiB
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<float> h = to_host(d, 64);
    CHECK(std::isnan(h[0]));  // poisoned at block start: an unwritten static shared read is NaN
    CHECK(h[32] == 3.f);
    CHECK_THROWS_WITH(launch_kernel<uses_static_shared>(1, 32, 16 * 1024, nullptr, d),
                      Catch::Contains("cudaErrorLaunchOutOfResources"));
    REQUIRE(cudaFuncSetAttribute(reinterpret_cast<const void*>(uses_static_shared),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * 1024) == cudaSuccess);
    launch_kernel<uses_static_shared>(1, 32, 16 * 1024, nullptr, d);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
  }
  cudaFree(d);
}

TEST_CASE("emulator: kernel faults name the kernel, block and thread", "[emu]") {
  float* d = device_alloc<float>(64);
  SECTION("a divergent barrier") {
    const std::string msg = expect_fault([&] { launch_kernel<divergent_barrier>(1, 32, 0, nullptr, d); });
    CHECK_THAT(msg, Catch::Contains("divergent_barrier"));
    CHECK_THAT(msg, Catch::Contains("block (0,0,0)"));
    CHECK_THAT(msg, Catch::Contains("divergent barrier"));
    CHECK_THAT(msg, Catch::Contains("test_emulator.cu"));
    CHECK_THAT(msg, Catch::Contains("MG_EMU_SEED="));  // the thread order's seed, to replay it
  }
  SECTION("barriers on two lines: one barrier, as on the GPU; an error under MG_EMU_STRICT_BARRIERS=1") {
    launch_kernel<barriers_on_two_lines>(1, 64, 0, nullptr, d);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<float> h = to_host(d, 64);
    for (int i = 0; i < 64; ++i) CHECK(h[static_cast<size_t>(i)] == static_cast<float>(63 - i));
    setenv("MG_EMU_STRICT_BARRIERS", "1", 1);
    const std::string msg = expect_fault([&] { launch_kernel<barriers_on_two_lines>(1, 64, 0, nullptr, d); });
    unsetenv("MG_EMU_STRICT_BARRIERS");
    CHECK_THAT(msg, Catch::Contains("at another __syncthreads()"));
    CHECK_THAT(msg, Catch::Contains("MG_EMU_STRICT_BARRIERS=1"));
  }
  SECTION("a shuffle that reads a lane outside its mask") {
    const std::vector<float> in = random_floats(32, 6);
    float* d_in = to_device(in);
    const std::string msg =
        expect_fault([&] { launch_kernel<partial_mask_shuffle>(1, 32, 0, nullptr, d_in, d); });
    CHECK_THAT(msg, Catch::Contains("partial_mask_shuffle"));
    // Lane l reads lane l ^ 16; which lane reports first depends on the thread order.
    CHECK_THAT(msg, Catch::Matches(".*__shfl_xor_sync with mask 0x0000ffff reads lane (1[6-9]|2[0-9]|3[01]), "
                                   "which the mask does not name.*"));
    cudaFree(d_in);
  }
  SECTION("an off-by-one tail writes past the allocation") {
    float* exact = device_alloc<float>(100);
    const std::string msg =
        expect_fault([&] { launch_kernel<off_by_one_tail>(1, 128, 0, nullptr, exact, 100); });
    CHECK_THAT(msg, Catch::Contains("off_by_one_tail"));
    CHECK_THAT(msg, Catch::Contains("past the end of a 400-byte device allocation"));
    cudaFree(exact);
  }
  cudaFree(d);
}

TEST_CASE("emulator: streams run asynchronously (a host read before synchronising is too early)", "[emu]") {
  float* d = device_alloc<float>(32);
  float* pinned = nullptr;
  REQUIRE(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 32 * sizeof(float), 0) == cudaSuccess);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  for (int i = 0; i < 32; ++i) pinned[i] = -1.f;
  launch_kernel<slow_writer>(1, 32, 0, s, d);
  REQUIRE(cudaMemcpyAsync(pinned, d, 32 * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
  CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
  CHECK(pinned[0] == -1.f);  // the copy has not happened yet: reading now is the race
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(pinned[0] == 42.f);
  cudaFreeHost(pinned);
  cudaFree(d);
}

// A wait captures the event's record as of the cudaStreamWaitEvent call: recording the same event
// again on another stream that finishes first must not release it (the caching allocator hands
// its spare events from block to block exactly like this).
TEST_CASE("emulator: a stream waits for the record it saw, not a later one of the same event", "[emu]") {
  cudaStream_t slow, fast, waiter;
  for (cudaStream_t* s : {&slow, &fast, &waiter})
    REQUIRE(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) == cudaSuccess);
  std::atomic<bool> release{false};
  auto hold = [](void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  };
  REQUIRE(cudaLaunchHostFunc(slow, hold, &release) == cudaSuccess);
  cudaEvent_t event;
  REQUIRE(cudaEventCreateWithFlags(&event, cudaEventDisableTiming) == cudaSuccess);
  REQUIRE(cudaEventRecord(event, slow) == cudaSuccess);           // completes once `slow` is released
  REQUIRE(cudaStreamWaitEvent(waiter, event, 0) == cudaSuccess);  // waits for that record
  REQUIRE(cudaEventRecord(event, fast) == cudaSuccess);           // a newer record, done at once
  REQUIRE(cudaStreamSynchronize(fast) == cudaSuccess);
  CHECK(cudaEventQuery(event) == cudaSuccess);  // the query reports the newest record
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(cudaStreamQuery(waiter) == cudaErrorNotReady);  // still behind the older one
  release = true;
  REQUIRE(cudaStreamSynchronize(waiter) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(slow) == cudaSuccess);
  cudaEventDestroy(event);
  for (cudaStream_t s : {slow, fast, waiter}) cudaStreamDestroy(s);
}

TEST_CASE("emulator: copies check their direction against the memory", "[emu]") {
  float* d = device_alloc<float>(8);
  std::vector<float> h(8, 1.f);
  CHECK(cudaMemcpy(h.data(), d, 32, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // dst is host memory
  CHECK(cudaMemcpy(d, h.data(), 32, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
  CHECK(cudaMemcpy(d, h.data(), 64, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);  // past the end
  cudaGetLastError();
  CHECK(cudaMemcpy(d, h.data(), 32, cudaMemcpyDefault) == cudaSuccess);
  cudaPointerAttributes attr;
  REQUIRE(cudaPointerGetAttributes(&attr, d) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice);
  REQUIRE(cudaPointerGetAttributes(&attr, h.data()) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeUnregistered);
  cudaFree(d);
}

TEST_CASE("emulator: cp.async checks all 16 bytes of its destination and its source", "[emu][ptx]") {
  const std::vector<float> in = random_floats(128, 7);
  float* d_in = to_device(in);
  float* d_out = device_alloc<float>(128);
  SECTION("dynamic shared memory of 504 bytes: the last 16-byte copy, at 496, runs 8 bytes past it") {
    const std::string msg =
        expect_fault([&] { launch_kernel<cp_async_copy>(1, 32, 504, nullptr, d_in, d_out, true); });
    CHECK_THAT(msg, Catch::Contains("cp_async_copy"));
    CHECK_THAT(msg, Catch::Contains("thread (31,0,0)"));
    CHECK_THAT(msg, Catch::Contains("the destination bytes [496, 512) run past the block's 504 bytes"));
  }
  SECTION("a 504-byte source allocation: the last copy reads 8 bytes past its end") {
    float* short_in = device_alloc<float>(126);
    REQUIRE(cudaMemcpy(short_in, in.data(), 126 * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    const std::string msg =
        expect_fault([&] { launch_kernel<cp_async_copy>(1, 32, 512, nullptr, short_in, d_out, true); });
    CHECK_THAT(msg, Catch::Contains("thread (31,0,0)"));
    CHECK_THAT(msg, Catch::Contains("run 8 bytes past the end of a 504-byte device allocation"));
    cudaFree(short_in);
  }
  SECTION("a source that is not device memory") {
    const std::string msg =
        expect_fault([&] { launch_kernel<cp_async_copy>(1, 32, 512, nullptr, in.data(), d_out, true); });
    CHECK_THAT(msg, Catch::Contains("is not inside a device allocation"));
  }
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_CASE("emulator: warp collectives meet only at the same call", "[emu]") {
  const std::vector<float> in = random_floats(32, 8);
  float* d_in = to_device(in);
  float* d_out = device_alloc<float>(32);
  SECTION("a shuffle at two lines of two branches") {
    const std::string msg =
        expect_fault([&] { launch_kernel<divergent_shuffles>(1, 32, 0, nullptr, d_in, d_out); });
    CHECK_THAT(msg, Catch::Contains("divergent_shuffles"));
    CHECK_THAT(msg, Catch::Contains("lanes of warp 0 disagree: __shfl_xor_sync"));
    CHECK_THAT(msg, Catch::Contains("another call site"));
  }
  SECTION("mma at two lines of two branches") {
    const std::string msg = expect_fault([&] { launch_kernel<divergent_mma>(1, 32, 0, nullptr, d_out); });
    CHECK_THAT(msg, Catch::Contains("lanes of warp 0 disagree: mma.m16n8k16.bf16"));
  }
  cudaFree(d_in);
  cudaFree(d_out);
}

TEST_CASE("emulator: the thread order changes at every barrier, so a missing one shows", "[emu]") {
  const int blocks = 16, threads = 64;
  std::vector<float> in(blocks * threads);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 7 + 1);  // sums exact in f32
  float* d_in = to_device(in);
  float* d_out = device_alloc<float>(blocks);
  auto wrong_blocks = [&](bool with_barrier) {
    if (with_barrier)
      launch_kernel<tree_sum<true>>(blocks, threads, threads * sizeof(float), nullptr, d_in, d_out);
    else
      launch_kernel<tree_sum<false>>(blocks, threads, threads * sizeof(float), nullptr, d_in, d_out);
    const std::vector<float> out = to_host(d_out, blocks);
    int wrong = 0;
    for (int b = 0; b < blocks; ++b) {
      float want = 0.f;
      for (int t = 0; t < threads; ++t) want += in[b * threads + t];
      wrong += out[b] != want;
    }
    return wrong;
  };
  const uint64_t saved_seed = mg_emu::thread_order_seed();
  // Reverse order for a whole launch is the lucky one: every partner finished before its slot is read.
  mg_emu::set_thread_order(1);
  CHECK(wrong_blocks(false) == 0);
  // The default draws forward, reverse or a shuffle for every phase of every block: whatever the
  // seed, some block's phase after the first barrier is not reverse, and its sum is wrong.
  mg_emu::set_thread_order(-1);
  for (uint64_t seed : {0ull, 1ull, 2ull, 3ull, 4ull, 12345ull}) {
    INFO("MG_EMU_SEED " << seed);
    mg_emu::set_thread_order_seed(seed);
    CHECK(wrong_blocks(false) > 0);
    CHECK(wrong_blocks(true) == 0);
  }
  for (int order = 0; order < 3; ++order) {  // the correct kernel in every pinned order
    mg_emu::set_thread_order(order);
    CHECK(wrong_blocks(true) == 0);
  }
  mg_emu::set_thread_order(-1);
  mg_emu::set_thread_order_seed(saved_seed);
  cudaFree(d_in);
  cudaFree(d_out);
}
