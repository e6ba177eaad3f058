// The tracer itself (cuda_emu/profiler.h), with exact expected counts: small kernels whose
// requests, sectors and wavefronts a reader can count by hand. This file is compiled with the same
// access instrumentation as libmultigrad_traced (tests/CMakeLists.txt: MG_TRACE_FLAGS).
// Runs on the CPU under the emulator only (MG_CUDA=EMULATE): see docs/performance-model.md.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emu/profiler.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"

using mg::kernels::cuda::bf16_t;
using mg::kernels::cuda::launch_kernel;
namespace profile = mg_emu::profile;

namespace {

// ---- kernels ------------------------------------------------------------------------------------
__global__ void copy_kernel(const float* in, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i];
}

// Lane i reads in[i * 32]: every lane its own 32-byte sector.
__global__ void strided_read_kernel(const float* in, float* out) {
  const int i = static_cast<int>(threadIdx.x);
  out[i] = in[i * 32];
}

struct alignas(16) Float4 {
  float v[4];
};
__global__ void vector_copy_kernel(const Float4* in, Float4* out) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  out[i] = in[i];
}

// Every lane reads the word at column 0 of its own row of a [32][32] tile: 32 distinct words in
// bank 0, a 32-way conflict. Then every lane reads tile[0][0]: one word, a broadcast.
__global__ void bank_kernel(float* out) {
  __shared__ float tile[32][32];
  const int lane = static_cast<int>(threadIdx.x);
  for (int c = 0; c < 32; ++c) tile[lane][c] = float(lane * 32 + c);
  __syncthreads();
  const float conflicted = tile[lane][0];
  const float broadcast = tile[0][0];
  out[lane] = conflicted + broadcast;
}

// A 32 x 32 transpose through shared memory: written by rows, read by columns. Without padding
// the column read hits one bank 32 times; a 33-float row spreads it over all 32 banks.
template <int Pad>
__global__ void transpose_kernel(const float* in, float* out) {
  __shared__ float tile[32][32 + Pad];
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  tile[y][x] = in[y * 32 + x];
  __syncthreads();
  out[y * 32 + x] = tile[x][y];
}

// The same transpose in dynamic shared memory (the launch's third argument), rows `pitch` floats.
__global__ void transpose_dynamic_kernel(const float* in, float* out, int pitch) {
  extern __shared__ float rows[];
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  rows[y * pitch + x] = in[y * 32 + x];
  __syncthreads();
  out[y * 32 + x] = rows[x * pitch + y];
}

// And with the tile declared at namespace scope, as older CUDA code declares it.
__shared__ float g_padded_tile[32][33];
__global__ void transpose_namespace_scope_kernel(const float* in, float* out) {
  const int x = static_cast<int>(threadIdx.x), y = static_cast<int>(threadIdx.y);
  g_padded_tile[y][x] = in[y * 32 + x];
  __syncthreads();
  out[y * 32 + x] = g_padded_tile[x][y];
}

__global__ void histogram_kernel(const int* values, unsigned* bins, int n, int nbins) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) atomicAdd(&bins[values[i] % nbins], 1u);
}

// Each thread reads in[i] and in[n - 1 - i]: the second read finds its sector in an unbounded L2,
// not in a tiny one.
__global__ void two_reads_kernel(const float* in, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = in[i] + in[n - 1 - i];
}

// Four iterations of a loop: each waits for the last one's load (4 round trips); then two loads
// of different instructions issued together (1 round trip).
__global__ void round_trips_kernel(const float* in, float* out) {
  const int i = static_cast<int>(threadIdx.x);
  float sum = 0;
  for (int k = 0; k < 4; ++k) sum += in[k * 32 + i] * 0.5f;
  __syncthreads();
  out[i] = sum + in[i] + in[32 + i];
}

// A cp.async of 16 bytes a lane, waited for, then a plain load: two round trips, the first the
// cp.async wait's (LaunchProfile::async_round_trips), which the PTX count leaves to the tracer.
__global__ void async_then_load_kernel(const float* in, float* out) {
  extern __shared__ float tile[];
  mg_emu::cp_async_16(tile + 4 * threadIdx.x, in + 4 * threadIdx.x, __FILE__, __LINE__);
  mg_emu::cp_async_commit();
  mg_emu::cp_async_wait(0);
  out[threadIdx.x] = tile[4 * threadIdx.x] + in[128 + threadIdx.x];
}

// Every warp of the block reads the same 128-byte row of `rows` at step i (as a GEMM's warps read
// one row of B), then row 0 again.
__global__ void shared_rows_kernel(const float* rows, float* out, int steps) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  float sum = 0;
  for (int i = 0; i < steps; ++i) sum += rows[i * 32 + lane];
  out[threadIdx.x] = sum + rows[lane];
}

// x = 2 x + y in place, y then zeroed: every sector of x and of y is read before it is written.
__global__ void in_place_kernel(float* x, float* y, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) {
    const float v = y[i];
    y[i] = 0.f;
    x[i] = 2.f * x[i] + v;
  }
}

__global__ void mma_kernel(float* out) {
  float d[4] = {0, 0, 0, 0};
  const uint32_t a[4] = {0x3f803f80u, 0, 0, 0};  // bf16 ones in the first register
  mg::kernels::cuda::mma_16816<bf16_t>(d, a, 0x3f803f80u, 0);
  out[blockIdx.x * blockDim.x + threadIdx.x] = d[0];
}

// ---- helpers ------------------------------------------------------------------------------------
template <class T>
T* device_buffer(size_t n, const std::vector<T>& init = {}) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  if (!init.empty())
    REQUIRE(cudaMemcpy(p, init.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return static_cast<T*>(p);
}

template <class Launch>
profile::LaunchProfile profile_one(Launch&& launch, profile::Options options = profile::Options{}) {
  REQUIRE(profile::available());
  profile::begin(options);
  launch();
  std::vector<profile::LaunchProfile> launches = profile::end();
  REQUIRE(cudaGetLastError() == cudaSuccess);
  REQUIRE(launches.size() == 1);
  return launches[0];
}

}  // namespace

TEST_CASE("a coalesced 4-byte copy: 4 sectors per request, DRAM bytes = the ideal", "[profile][tracer]") {
  const int n = 1 << 16;  // 256 KiB each way
  float* in = device_buffer<float>(n, std::vector<float>(n, 1.f));
  float* out = device_buffer<float>(n);
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<copy_kernel>(dim3(n / 256), dim3(256), 0, nullptr, in, out, n); });
  CHECK(p.blocks == 256);
  CHECK(p.traced_blocks == 256);
  CHECK(p.global_load.requests == n / 32);
  CHECK(p.global_load.sectors == n / 32 * 4);
  CHECK(p.global_load.bytes == n * 4.0);
  CHECK(p.global_load.wavefronts == n / 32);  // one 128-byte line: its 4 sectors in one pass
  CHECK(p.global_store.requests == n / 32);
  CHECK(p.global_store.sectors == n / 32 * 4);
  CHECK(p.shared_load.requests == 0);
  CHECK(p.dram_read_first_touch == n * 4.0);
  CHECK(p.dram_write_first_touch == n * 4.0);
  CHECK(p.dram_bytes_lru() == p.dram_bytes_first_touch());
  CHECK(p.load_round_trips == n / 32);  // one load per warp
  // Both accesses are named by their line in this file.
  REQUIRE(p.sites.size() == 2);
  for (const profile::SiteCounts& s : p.sites) CHECK(s.where.rfind("test_tracer.cu:", 0) == 0);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("sampling the first blocks scales to the whole grid", "[profile][tracer]") {
  const int n = 8 * 256;
  float* in = device_buffer<float>(n, std::vector<float>(n, 1.f));
  float* out = device_buffer<float>(n);
  profile::Options options;
  options.max_traced_blocks = 2;
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<copy_kernel>(dim3(8), dim3(256), 0, nullptr, in, out, n); }, options);
  CHECK(p.traced_blocks == 2);
  CHECK(p.scale == 4);
  CHECK(p.global_load.requests == n / 32);
  CHECK(p.global_load.sectors == n / 32 * 4);
  CHECK(p.dram_read_first_touch == n * 4.0);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("a stride-32 read touches 32 sectors per request", "[profile][tracer]") {
  float* in = device_buffer<float>(32 * 32, std::vector<float>(32 * 32, 2.f));
  float* out = device_buffer<float>(32);
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<strided_read_kernel>(dim3(1), dim3(32), 0, nullptr, in, out); });
  CHECK(p.global_load.requests == 1);
  CHECK(p.global_load.sectors == 32);
  CHECK(p.global_load.bytes == 128);  // sector efficiency 128 / (32 * 32) = 12.5 %
  // Every lane's sector is the first of its own 128-byte line: all 32 in the same place of the L1
  // data array's banks, so 32 passes (a bank conflict on global data), not 32 / 4.
  CHECK(p.global_load.wavefronts == 32);
  CHECK(p.global_store.sectors == 4);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("a 16-byte vector copy: one request of 16 sectors per warp", "[profile][tracer]") {
  const int n = 64;
  float* in = device_buffer<float>(4 * n, std::vector<float>(4 * n, 3.f));
  float* out = device_buffer<float>(4 * n);
  const profile::LaunchProfile p = profile_one([&] {
    launch_kernel<vector_copy_kernel>(dim3(1), dim3(n), 0, nullptr, reinterpret_cast<const Float4*>(in),
                                      reinterpret_cast<Float4*>(out));
  });
  CHECK(p.global_load.requests == 2);
  CHECK(p.global_load.sectors == 32);
  CHECK(p.global_load.lanes == 64);
  CHECK(p.global_load.bytes == 64 * 16);
  CHECK(p.global_load.wavefronts == 2 * 4);  // 4 lines a request, 4 sectors in each place
  CHECK(p.global_store.requests == 2);
  CHECK(p.global_store.sectors == 32);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("shared memory: a 32-way bank conflict and a broadcast", "[profile][tracer]") {
  float* out = device_buffer<float>(32);
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<bank_kernel>(dim3(1), dim3(32), 0, nullptr, out); });
  CHECK(p.shared_bytes_per_block == 32 * 32 * 4);
  // The fill: 32 stores, lane i writes row i, column c: a 32-way conflict each (a column again).
  CHECK(p.shared_store.requests == 32);
  CHECK(p.shared_store.wavefronts == 32 * 32);
  // The reads: 32 wavefronts for the conflicted one, 1 for the broadcast.
  CHECK(p.shared_load.requests == 2);
  CHECK(p.shared_load.wavefronts == 33);
  CHECK(p.shared_load.ideal_wavefronts == 2);
  bool saw_conflict = false, saw_broadcast = false;
  for (const profile::SiteCounts& s : p.sites) {
    if (s.space != profile::Space::shared || s.op != profile::Op::load) continue;
    saw_conflict |= s.counts.wavefronts == 32;
    saw_broadcast |= s.counts.wavefronts == 1;
  }
  CHECK(saw_conflict);
  CHECK(saw_broadcast);
  cudaFree(out);
}

TEST_CASE("a shared-memory transpose: 32 wavefronts per column read, 1 after padding", "[profile][tracer]") {
  std::vector<float> h(32 * 32);
  for (size_t i = 0; i < h.size(); ++i) h[i] = float(i);
  float* in = device_buffer<float>(32 * 32, h);
  float* out = device_buffer<float>(32 * 32);
  const profile::LaunchProfile plain =
      profile_one([&] { launch_kernel<transpose_kernel<0>>(dim3(1), dim3(32, 32), 0, nullptr, in, out); });
  const profile::LaunchProfile padded =
      profile_one([&] { launch_kernel<transpose_kernel<1>>(dim3(1), dim3(32, 32), 0, nullptr, in, out); });
  CHECK(plain.shared_store.requests == 32);
  CHECK(plain.shared_store.wavefronts == 32);  // rows: conflict-free either way
  CHECK(padded.shared_store.wavefronts == 32);
  CHECK(plain.shared_load.requests == 32);
  CHECK(plain.shared_load.wavefronts == 32 * 32);
  CHECK(padded.shared_load.wavefronts == 32);
  std::vector<float> back(32 * 32);
  REQUIRE(cudaMemcpy(back.data(), out, back.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back[1] == 32.f);  // the padded run transposed

  // The same kernels with the tile in dynamic shared memory, and at namespace scope: the same counts.
  for (int pitch : {32, 33}) {
    const profile::LaunchProfile dynamic = profile_one(
        [&] { transpose_dynamic_kernel<<<1, dim3(32, 32), 32 * pitch * sizeof(float)>>>(in, out, pitch); });
    const profile::LaunchProfile& same = pitch == 32 ? plain : padded;
    CHECK(dynamic.shared_bytes_per_block == same.shared_bytes_per_block);
    CHECK(dynamic.shared_store.requests == same.shared_store.requests);
    CHECK(dynamic.shared_store.wavefronts == same.shared_store.wavefronts);
    CHECK(dynamic.shared_load.requests == same.shared_load.requests);
    CHECK(dynamic.shared_load.wavefronts == same.shared_load.wavefronts);
  }
  const profile::LaunchProfile global_tile =
      profile_one([&] { transpose_namespace_scope_kernel<<<1, dim3(32, 32)>>>(in, out); });
  CHECK(global_tile.shared_bytes_per_block == padded.shared_bytes_per_block);
  CHECK(global_tile.shared_load.wavefronts == padded.shared_load.wavefronts);
  CHECK(global_tile.shared_store.wavefronts == padded.shared_store.wavefronts);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("an atomic histogram: one atomic per element, performed", "[profile][tracer]") {
  const int n = 1024, nbins = 16;
  std::vector<int> values(n);
  for (int i = 0; i < n; ++i) values[static_cast<size_t>(i)] = i;
  int* v = device_buffer<int>(n, values);
  unsigned* bins = device_buffer<unsigned>(nbins, std::vector<unsigned>(nbins, 0u));
  const profile::LaunchProfile p = profile_one(
      [&] { launch_kernel<histogram_kernel>(dim3(n / 128), dim3(128), 0, nullptr, v, bins, n, nbins); });
  CHECK(p.global_atomic.lanes == n);
  CHECK(p.global_atomic.requests == n / 32);
  CHECK(p.global_atomic.sectors == n / 32 * 2);  // 32 lanes over 16 bins = 64 bytes = 2 sectors
  std::vector<unsigned> h(nbins);
  REQUIRE(cudaMemcpy(h.data(), bins, nbins * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
  for (unsigned c : h) CHECK(c == n / nbins);
  cudaFree(v);
  cudaFree(bins);
}

TEST_CASE("an LRU L2 smaller than the data re-reads it; the unbounded one does not", "[profile][tracer]") {
  const int n = 1 << 14;  // 64 KiB
  float* in = device_buffer<float>(n, std::vector<float>(n, 1.f));
  float* out = device_buffer<float>(n);
  profile::Options options;
  options.l2_bytes = 32;  // one sector: block 32's reads of what block 31 read have been evicted
  const profile::LaunchProfile p = profile_one(
      [&] { launch_kernel<two_reads_kernel>(dim3(n / 256), dim3(256), 0, nullptr, in, out, n); }, options);
  CHECK(p.dram_read_first_touch == n * 4.0);
  CHECK(p.dram_read_lru == 2.0 * n * 4.0);
  CHECK(p.dram_write_lru == n * 4.0);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("an update in place reads each sector from DRAM before writing it back", "[profile][tracer]") {
  const int n = 1 << 12;
  float* x = device_buffer<float>(n, std::vector<float>(n, 1.f));
  float* y = device_buffer<float>(n, std::vector<float>(n, 1.f));
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<in_place_kernel>(dim3(n / 256), dim3(256), 0, nullptr, x, y, n); });
  CHECK(p.dram_read_first_touch == 2.0 * n * 4);
  CHECK(p.dram_write_first_touch == 2.0 * n * 4);
  CHECK(p.dram_read_lru == 2.0 * n * 4);
  cudaFree(x);
  cudaFree(y);
}

TEST_CASE("mma.m16n8k16: one instruction per warp, 4096 tensor FLOPs each", "[profile][tracer]") {
  float* out = device_buffer<float>(128);
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<mma_kernel>(dim3(2), dim3(64), 0, nullptr, out); });
  CHECK(p.mma == 4);
  CHECK(p.tensor_flops == 4 * 4096.0);
  cudaFree(out);
}

TEST_CASE("round trips: a loop's iterations one after another, different loads together",
          "[profile][tracer]") {
  float* in = device_buffer<float>(128, std::vector<float>(128, 1.f));
  float* out = device_buffer<float>(64);
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<round_trips_kernel>(dim3(1), dim3(64), 0, nullptr, in, out); });
  CHECK(p.global_load.requests == 2 * 6);
  CHECK(p.load_round_trips == 2 * 5);  // two warps, 4 + 1 each
  CHECK(p.async_round_trips == 0);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("round trips: a cp.async wait is one, counted apart from the plain loads'", "[profile][tracer]") {
  float* in = device_buffer<float>(160, std::vector<float>(160, 1.f));
  float* out = device_buffer<float>(32);
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<async_then_load_kernel>(dim3(1), dim3(32), 512, nullptr, in, out); });
  CHECK(p.load_round_trips == 2);   // the wait, then the plain load
  CHECK(p.async_round_trips == 1);  // the wait
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("warps reading one row at the same step: the first fetches it, the others wait for it",
          "[profile][tracer]") {
  float* rows = device_buffer<float>(8 * 32, std::vector<float>(8 * 32, 1.f));
  float* out = device_buffer<float>(128);
  const profile::LaunchProfile p =
      profile_one([&] { launch_kernel<shared_rows_kernel>(dim3(1), dim3(128), 0, nullptr, rows, out, 8); });
  // 4 warps x 9 loads of one row (4 sectors). At each of the 8 steps warp 0 misses its row's 4
  // sectors and warps 1-3 hit them while they are on their way: 8 x 3 x 4 = 96 pending hits. Row
  // 0 read again at the end is a plain hit for all four (16 sectors): it landed long ago.
  CHECK(p.global_load.sectors == 4 * 9 * 4);
  CHECK(p.l1_hit_sectors == 96 + 16);
  CHECK(p.l1_pending_sectors == 96);
  CHECK(p.l2_sectors == 8 * 4 + 128 / 8);  // the 8 rows once, and the stores' 16 sectors
  cudaFree(rows);
  cudaFree(out);
}

TEST_CASE("outside a profile nothing is traced", "[profile][tracer]") {
  float* in = device_buffer<float>(256, std::vector<float>(256, 1.f));
  float* out = device_buffer<float>(256);
  launch_kernel<copy_kernel>(dim3(1), dim3(256), 0, nullptr, in, out, 256);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  profile::begin();
  CHECK(profile::end().empty());
  cudaFree(in);
  cudaFree(out);
}
