// The CUDA caching allocator (core/cuda_allocator.{h,cu}) through the public API:
//   - reuse within a stream (the same block back) and no reuse across streams;
//   - exact statistics: allocated, reserved, peak and its reset, cudaMalloc calls, cache hits;
//   - empty_cache returns what is cached and keeps what is live;
//   - record_stream: a block freed while another stream may still use it is handed out again
//     only with the new user ordered after that stream's work (a device-side wait). Deterministic:
//     the other stream is held by a host function that waits for a flag, so "still running" is
//     a fact, not a race;
//   - the out-of-memory error names what was asked and what is held, after emptying the cache;
//   - the floor: steps 3..8 of a small MLP training on cuda:0 make no cudaMalloc call.
// Runs only with a GPU (gpu_main.cpp exits 77 otherwise). test_cuda_tensor.cpp has the first,
// simpler allocator checks.
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using Catch::Matchers::Contains;

constexpr int64_t kMiB = int64_t(1) << 20;

Tensor gpu_floats(int64_t n) { return empty({n}, TensorOptions{DType::f32, gpu()}); }

// A clean start: nothing queued, nothing cached, the peak at what is live now.
AllocatorStats fresh_stats() {
  cuda::synchronize_device(0);
  cuda::empty_cache();
  cuda::reset_peak_memory_stats(0);
  return cuda::memory_stats(0);
}

TEST_CASE("a freed block is reused by the next request on its stream, not on another stream",
          "[gpu][allocator]") {
  const AllocatorStats start = fresh_stats();
  const cuda::Stream side = cuda::create_stream(0);
  void* first = nullptr;
  {
    const Tensor a = gpu_floats(kMiB / 4);  // 1 MiB: a large block of exactly 1 MiB
    first = a.data_ptr();
  }
  {
    const Tensor b = gpu_floats(kMiB / 4);  // the same size on the same stream: the same block
    CHECK(b.data_ptr() == first);
    const AllocatorStats s = cuda::memory_stats(0);
    CHECK(s.system_allocations == start.system_allocations + 1);
    CHECK(s.cache_hits == start.cache_hits + 1);
  }
  void* on_side = nullptr;
  {
    cuda::StreamGuard guard(side);  // another stream must not take the default stream's block
    const Tensor c = gpu_floats(kMiB / 4);
    on_side = c.data_ptr();
    CHECK(on_side != first);
    CHECK(cuda::memory_stats(0).system_allocations == start.system_allocations + 2);
  }
  {
    const Tensor d = gpu_floats(kMiB / 4);  // back on the default stream: its own block again
    CHECK(d.data_ptr() == first);
  }
  {
    cuda::StreamGuard guard(side);
    const Tensor e = gpu_floats(kMiB / 4);
    CHECK(e.data_ptr() == on_side);
  }
  CHECK(cuda::memory_stats(0).system_allocations == start.system_allocations + 2);
  cuda::synchronize(side);
}

TEST_CASE("allocator statistics: allocated, reserved, peak and its reset, cudaMalloc calls",
          "[gpu][allocator]") {
  const AllocatorStats start = fresh_stats();
  CHECK(start.reserved_bytes == start.allocated_bytes);  // nothing cached after empty_cache
  CHECK(start.peak_allocated_bytes == start.allocated_bytes);
  const int64_t small = 4096;       // 1000 floats = 4000 bytes, rounded up to a multiple of 512
  const int64_t large = 12 * kMiB;  // 3M floats: a multiple of 1 MiB already
  Tensor t1 = gpu_floats(1000);
  AllocatorStats s = cuda::memory_stats(0);
  CHECK(s.allocated_bytes == start.allocated_bytes + small);
  CHECK(s.reserved_bytes == start.reserved_bytes + small);
  CHECK(s.system_allocations == start.system_allocations + 1);
  {
    const Tensor t2 = gpu_floats(3 * kMiB);
    s = cuda::memory_stats(0);
    CHECK(s.allocated_bytes == start.allocated_bytes + small + large);
    CHECK(s.reserved_bytes == start.reserved_bytes + small + large);
    CHECK(s.peak_allocated_bytes == start.allocated_bytes + small + large);
    CHECK(s.system_allocations == start.system_allocations + 2);
  }
  s = cuda::memory_stats(0);  // t2 freed: no longer allocated, still reserved (cached)
  CHECK(s.allocated_bytes == start.allocated_bytes + small);
  CHECK(s.reserved_bytes == start.reserved_bytes + small + large);
  CHECK(s.peak_allocated_bytes == start.allocated_bytes + small + large);
  cuda::reset_peak_memory_stats(0);
  s = cuda::memory_stats(0);
  CHECK(s.peak_allocated_bytes == start.allocated_bytes + small);
  {
    const Tensor t3 = gpu_floats(3 * kMiB - 1000);  // a slightly smaller request: the cached block
    s = cuda::memory_stats(0);
    CHECK(s.system_allocations == start.system_allocations + 2);
    CHECK(s.cache_hits == start.cache_hits + 1);
    CHECK(s.allocated_bytes == start.allocated_bytes + small + large);  // the whole block counts
    CHECK(s.peak_allocated_bytes == start.allocated_bytes + small + large);
  }
  // empty_cache gives the cached block back and keeps the live one, whose data survives.
  t1.fill_(3.0);
  cuda::empty_cache();
  s = cuda::memory_stats(0);
  CHECK(s.reserved_bytes == s.allocated_bytes);
  CHECK(s.allocated_bytes == start.allocated_bytes + small);
  CHECK(sum(t1).item<double>() == 3000.0);
}

TEST_CASE("record_stream on the allocating stream changes nothing; bad arguments are refused",
          "[gpu][allocator][record_stream]") {
  fresh_stats();
  void* first = nullptr;
  {
    const Tensor a = gpu_floats(kMiB / 4);
    first = a.data_ptr();
    cuda::record_stream(a, cuda::current_stream(0));
    cuda::record_stream(a.narrow(0, 5, 10), cuda::current_stream(0));  // views share the block
  }
  {
    const Tensor b = gpu_floats(kMiB / 4);
    CHECK(b.data_ptr() == first);  // reusable at once: no other stream was involved
  }
  CHECK_THROWS_WITH(cuda::record_stream(Tensor(), cuda::current_stream(0)), Contains("undefined"));
  CHECK_THROWS_WITH(cuda::record_stream(zeros({3}), cuda::current_stream(0)),
                    Contains("cpu:0") && Contains("only CUDA tensors"));
  if (cuda::device_count() > 1 && cuda::physical_device(1) != cuda::physical_device(0)) {
    const Tensor a = gpu_floats(16);
    CHECK_THROWS_WITH(cuda::record_stream(a, cuda::current_stream(1)), Contains("belongs to cuda:1"));
  }
}

// Holds a stream at a point until `release` is set, like a long-running kernel whose end the
// test decides. It gives up after 30 s (and says so) so that a broken test cannot hang.
struct StreamBlocker {
  std::atomic<bool> release{false};
  std::atomic<bool> timed_out{false};
  std::atomic<bool> started{false};

  static void CUDART_CB wait_for_release(void* self_ptr) {
    auto* self = static_cast<StreamBlocker*>(self_ptr);
    self->started = true;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!self->release.load()) {
      if (std::chrono::steady_clock::now() > deadline) {
        self->timed_out = true;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  void block(cuda::Stream s) {
    REQUIRE(cudaLaunchHostFunc(static_cast<cudaStream_t>(s.handle), wait_for_release, this) == cudaSuccess);
    blocked = static_cast<cudaStream_t>(s.handle);
  }
  // Returns once the stream has reached the block (at most 10 s).
  bool wait_until_blocking() const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!started.load() && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    return started.load();
  }
  // A failing REQUIRE still lets the stream go, and the host function is done with `this`
  // before it is destroyed.
  ~StreamBlocker() {
    release = true;
    if (blocked != nullptr) cudaStreamSynchronize(blocked);
  }
  cudaStream_t blocked = nullptr;
};

// Whether `s` has work left. cudaStreamQuery's "not ready" is also left as the runtime's last
// error, which the next kernel launch check would report: clear it.
bool still_running(cuda::Stream s) {
  const cudaError_t status = cudaStreamQuery(static_cast<cudaStream_t>(s.handle));
  cudaGetLastError();
  return status == cudaErrorNotReady;
}

TEST_CASE("record_stream: a block used on another stream is reused only behind that stream's work",
          "[gpu][allocator][record_stream]") {
  const AllocatorStats start = fresh_stats();
  const cuda::Stream side = cuda::create_stream(0);  // non-blocking: no implicit sync with stream 0
  const int64_t n = kMiB;                            // 4 MiB of floats
  StreamBlocker blocker;

  Tensor a = full({n}, 1.0, TensorOptions{DType::f32, gpu()});  // allocated on the default stream
  void* const block_a = a.data_ptr();
  {
    cuda::Event a_ready;
    a_ready.record(cuda::current_stream(0));
    a_ready.wait(side);
    blocker.block(side);  // the side stream stops here...
    cuda::StreamGuard guard(side);
    a.fill_(2.0);  // ...so this write to a's block is queued behind it and cannot have run yet
  }
  REQUIRE(blocker.wait_until_blocking());
  cuda::record_stream(a, side);
  const AllocatorStats before_free = cuda::memory_stats(0);
  a = Tensor();  // freed while the side stream still has to write it
  const AllocatorStats after_free = cuda::memory_stats(0);
  CHECK(after_free.allocated_bytes == before_free.allocated_bytes - 4 * n);
  CHECK(after_free.reserved_bytes == before_free.reserved_bytes);  // waiting, still reserved
  CHECK(still_running(side));                                      // the setup holds

  // The same size on the default stream, with nothing else cached: it takes a's block at once,
  // the default stream made to wait on the device for the side stream's write -- so our 5.0 is
  // written after its 2.0, and no cudaMalloc is needed however late the side stream runs.
  Tensor b = full({n}, 5.0, TensorOptions{DType::f32, gpu()});
  CHECK(b.data_ptr() == block_a);
  const AllocatorStats during = cuda::memory_stats(0);
  CHECK(during.system_allocations == after_free.system_allocations);
  CHECK(during.cache_hits == after_free.cache_hits + 1);
  CHECK(still_running(side));
  CHECK(still_running(cuda::current_stream(0)));  // the fill waits behind the side stream
  CHECK_FALSE(blocker.timed_out.load());

  // A second block of that size, while b holds a's: nothing free, nothing pending -- cudaMalloc.
  {
    const Tensor c = gpu_floats(n);
    CHECK(c.data_ptr() != block_a);
    CHECK(cuda::memory_stats(0).system_allocations == during.system_allocations + 1);
  }
  // Let the side stream finish; the default stream's fill then runs.
  blocker.release = true;
  cuda::synchronize(side);
  CHECK_FALSE(blocker.timed_out.load());
  // b holds our 5.0: its fill ran after the side stream had written 2.0 to the same block.
  CHECK(sum(b).item<double>() == 5.0 * double(n));
  CHECK(max(b).item<double>() == 5.0);

  // A pending block is waited for, not leaked, by empty_cache.
  {
    Tensor d = gpu_floats(n);
    {
      cuda::StreamGuard guard(side);
      d.fill_(1.0);
    }
    cuda::record_stream(d, side);
  }
  cuda::empty_cache();
  const AllocatorStats emptied = cuda::memory_stats(0);
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);
  b = Tensor();
  CHECK(cuda::memory_stats(0).allocated_bytes == start.allocated_bytes);
}

TEST_CASE("out of memory: the error states what was asked and what is held, after emptying the cache",
          "[gpu][allocator]") {
  fresh_stats();
  { const Tensor cached = gpu_floats(16 * kMiB); }  // 64 MiB left in the cache
  const Tensor held = gpu_floats(kMiB);             // 4 MiB live
  const AllocatorStats before = cuda::memory_stats(0);
  REQUIRE(before.reserved_bytes - before.allocated_bytes >= 64 * kMiB);
  std::string msg;
  try {
    const Tensor huge = gpu_floats(int64_t(1) << 50);  // 4 PiB
    FAIL("allocating 4 PiB succeeded");
  } catch (const Error& e) {
    msg = e.what();
  }
  INFO(msg);
  std::printf("the out-of-memory message: %s\n", msg.c_str());
  CHECK_THAT(msg, Contains("CUDA out of memory on cuda:0 (physical GPU "));
  CHECK_THAT(msg, Contains("asked for 4 PiB (4503599627370496 bytes, rounded to"));
  CHECK_THAT(msg, Contains("in live tensors (peak"));
  CHECK_THAT(msg, Contains("64 MiB cached, which it returned to the driver (empty_cache) before retrying"));
  CHECK_THAT(msg, Contains("free of"));
  // The retry emptied the cache; the live tensor is intact and the allocator still works.
  const AllocatorStats after = cuda::memory_stats(0);
  CHECK(after.reserved_bytes == after.allocated_bytes);
  CHECK(after.allocated_bytes == before.allocated_bytes);
  CHECK(after.system_allocations == before.system_allocations);
  const Tensor ones_after = ones({10}, TensorOptions{DType::f32, gpu()});
  CHECK(sum(ones_after).item<float>() == 10.0f);
  CHECK(held.numel() == kMiB);
}

TEST_CASE("the floor: steady-state MLP training steps on cuda:0 make no cudaMalloc call",
          "[gpu][allocator][model]") {
  manual_seed(51);
  fresh_stats();
  nn::MLP model(64, {128, 128}, 10);
  model.to(gpu());
  optim::AdamWOptions options;
  options.lr = 1e-3;
  optim::AdamW opt(model.parameters(), options);
  std::vector<int64_t> labels(32);
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
  const Tensor targets = tensor<int64_t>(labels).to(gpu());
  int64_t mallocs_after_step2 = 0, hits_after_step2 = 0;
  size_t free_after_step2 = 0, free_end = 0, total = 0;
  std::vector<int64_t> mallocs;
  for (int step = 1; step <= 8; ++step) {
    const Tensor x = random_cpu({32, 64}).to(gpu());
    opt.zero_grad();
    const Tensor loss = cross_entropy(model.forward(x), targets);
    loss.backward();
    opt.step();
    CHECK(std::isfinite(loss.item<float>()));  // also waits for the step
    const AllocatorStats s = cuda::memory_stats(0);
    mallocs.push_back(s.system_allocations);
    if (step == 2) {
      mallocs_after_step2 = s.system_allocations;
      hits_after_step2 = s.cache_hits;
      REQUIRE(cudaMemGetInfo(&free_after_step2, &total) == cudaSuccess);
    }
  }
  const AllocatorStats end = cuda::memory_stats(0);
  REQUIRE(cudaMemGetInfo(&free_end, &total) == cudaSuccess);
  std::string per_step;
  for (int64_t m : mallocs) per_step += std::to_string(m) + " ";
  INFO("cudaMalloc calls so far after each step: " << per_step);
  std::printf(
      "MLP training: cudaMalloc calls after steps 1..8: %s; device free memory after step 2 %zu, "
      "after step 8 %zu bytes\n",
      per_step.c_str(), free_after_step2, free_end);
  CHECK(end.system_allocations == mallocs_after_step2);
  CHECK(end.cache_hits > hits_after_step2);
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
