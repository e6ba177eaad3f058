// The CPU caching allocator: reuse of freed blocks (no new system allocation),
// 64-byte alignment, allocated/reserved/peak accounting, empty_cache, and a
// multi-threaded smoke test.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <thread>
#include <vector>

#include "multigrad.h"

using namespace mg;

namespace {

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

}  // namespace

TEST_CASE("a freed block is reused for a tensor of the same size", "[allocator]") {
  cpu_empty_cache();
  // An unusual size so no other cached block can serve it.
  const int64_t n = 123457;
  void* first_ptr = nullptr;
  const AllocatorStats before = cpu_allocator_stats();
  {
    Tensor a = empty({n});
    first_ptr = a.storage()->data();
    CHECK(aligned64(first_ptr));
  }
  const AllocatorStats after_first = cpu_allocator_stats();
  CHECK(after_first.system_allocations == before.system_allocations + 1);
  CHECK(after_first.allocated_bytes == before.allocated_bytes);        // freed again
  CHECK(after_first.reserved_bytes >= before.reserved_bytes + n * 4);  // kept in the cache
  {
    Tensor b = empty({n});
    CHECK(b.storage()->data() == first_ptr);
    CHECK(aligned64(b.storage()->data()));
    const AllocatorStats during = cpu_allocator_stats();
    CHECK(during.system_allocations == after_first.system_allocations);  // cache hit
    CHECK(during.cache_hits == after_first.cache_hits + 1);
    CHECK(during.allocated_bytes >= after_first.allocated_bytes + n * 4);
    CHECK(during.reserved_bytes == after_first.reserved_bytes);
  }
  // Same byte count with another dtype and shape is served from the cache too.
  {
    Tensor c = empty({n / 1, 1}, TensorOptions{DType::i32});
    CHECK(c.storage()->data() == first_ptr);
    CHECK(cpu_allocator_stats().system_allocations == after_first.system_allocations);
  }
  // Many alloc/free cycles of one size cost one system allocation at most.
  const AllocatorStats loop_before = cpu_allocator_stats();
  for (int i = 0; i < 100; ++i) {
    Tensor t = empty({n});
    t.data<float>()[i] = static_cast<float>(i);
  }
  CHECK(cpu_allocator_stats().system_allocations == loop_before.system_allocations);
}

TEST_CASE("storage is 64-byte aligned for every size and dtype", "[allocator]") {
  for (int64_t n : {1, 3, 7, 17, 63, 64, 65, 1000, 4097, 100000}) {
    for (DType t : {DType::f32, DType::f64, DType::f16, DType::boolean, DType::i64}) {
      Tensor x = empty({n}, TensorOptions{t});
      INFO("n " << n << " dtype " << dtype_name(t));
      CHECK(aligned64(x.storage()->data()));
      CHECK(x.storage()->nbytes() >= static_cast<size_t>(n) * dtype_size(t));
    }
  }
  // Several live tensors at once do not overlap and are each aligned.
  std::vector<Tensor> live;
  for (int i = 1; i <= 32; ++i) live.push_back(full({i * 3}, static_cast<double>(i)));
  for (int i = 1; i <= 32; ++i) {
    CHECK(aligned64(live[i - 1].storage()->data()));
    CHECK(live[i - 1].to_vector<float>() == std::vector<float>(i * 3, static_cast<float>(i)));
  }
  void* raw = cpu_allocate(100);
  CHECK(aligned64(raw));
  cpu_free(raw, 100);
  CHECK(aligned64(empty({0}).storage()->data()));
}

TEST_CASE("allocated and peak bytes are tracked", "[allocator]") {
  cpu_empty_cache();
  const AllocatorStats s0 = cpu_allocator_stats();
  const int64_t big = 8 << 20;  // 8 MiB
  {
    Tensor a = empty({big / 4});
    const AllocatorStats s1 = cpu_allocator_stats();
    CHECK(s1.allocated_bytes >= s0.allocated_bytes + big);
    CHECK(s1.allocated_bytes < s0.allocated_bytes + big + 4096);
    CHECK(s1.peak_allocated_bytes >= s1.allocated_bytes);
    {
      Tensor b = empty({big / 4});
      const AllocatorStats s2 = cpu_allocator_stats();
      CHECK(s2.allocated_bytes >= s0.allocated_bytes + 2 * big);
      CHECK(s2.peak_allocated_bytes >= s0.allocated_bytes + 2 * big);
    }
    const AllocatorStats s3 = cpu_allocator_stats();
    CHECK(s3.allocated_bytes == s1.allocated_bytes);                 // b went back to the cache
    CHECK(s3.peak_allocated_bytes >= s0.allocated_bytes + 2 * big);  // the peak stays
    CHECK(s3.reserved_bytes >= s3.allocated_bytes + big);            // b's block is cached
  }
  const AllocatorStats s4 = cpu_allocator_stats();
  CHECK(s4.allocated_bytes == s0.allocated_bytes);
  CHECK(s4.peak_allocated_bytes >= s0.allocated_bytes + 2 * big);
  CHECK(s4.peak_allocated_bytes >= s0.peak_allocated_bytes);

  // A small allocation is counted by its (rounded-up) size.
  const AllocatorStats t0 = cpu_allocator_stats();
  void* p = cpu_allocate(100);
  const AllocatorStats t1 = cpu_allocator_stats();
  CHECK(t1.allocated_bytes - t0.allocated_bytes >= 100);
  CHECK(t1.allocated_bytes - t0.allocated_bytes <= 256);
  CHECK((t1.allocated_bytes - t0.allocated_bytes) % 64 == 0);
  cpu_free(p, 100);
  CHECK(cpu_allocator_stats().allocated_bytes == t0.allocated_bytes);
}

TEST_CASE("cpu_empty_cache drops the cached bytes", "[allocator]") {
  {
    std::vector<Tensor> temp;
    for (int i = 0; i < 8; ++i) temp.push_back(empty({50000 + i * 1000}));
  }
  const AllocatorStats full_cache = cpu_allocator_stats();
  CHECK(full_cache.reserved_bytes > full_cache.allocated_bytes);
  CHECK(full_cache.reserved_bytes - full_cache.allocated_bytes >= 8 * 50000 * 4);
  cpu_empty_cache();
  const AllocatorStats emptied = cpu_allocator_stats();
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);
  CHECK(emptied.allocated_bytes == full_cache.allocated_bytes);
  // Live tensors survive empty_cache with their data intact.
  Tensor keep = full({1000}, 3.0);
  cpu_empty_cache();
  CHECK(keep.to_vector<float>() == std::vector<float>(1000, 3.0f));
  CHECK(cpu_allocator_stats().reserved_bytes == cpu_allocator_stats().allocated_bytes);
  // After emptying, the next allocation goes to the system again.
  const int64_t before = cpu_allocator_stats().system_allocations;
  { Tensor t = empty({77777}); }
  CHECK(cpu_allocator_stats().system_allocations == before + 1);
}

TEST_CASE("the allocator is thread-safe", "[allocator][threads]") {
  const AllocatorStats s0 = cpu_allocator_stats();
  std::atomic<int> errors{0};
  std::vector<std::thread> threads;
  for (int tid = 0; tid < 4; ++tid) {
    threads.emplace_back([tid, &errors] {
      try {
        for (int i = 0; i < 500; ++i) {
          const int64_t n = 1 + ((i * 37 + tid * 101) % 4000);
          Tensor t = full({n}, static_cast<double>(tid * 1000 + i % 1000));
          if (!aligned64(t.storage()->data())) ++errors;
          void* raw = cpu_allocate(static_cast<size_t>(n) * 3);
          if (!aligned64(raw)) ++errors;
          static_cast<char*>(raw)[0] = static_cast<char>(tid);
          const float* d = t.data<float>();
          const float want = static_cast<float>(tid * 1000 + i % 1000);
          if (d[0] != want || d[n - 1] != want) ++errors;
          cpu_free(raw, static_cast<size_t>(n) * 3);
          if (i % 100 == 0) cpu_empty_cache();
        }
      } catch (...) {
        ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  CHECK(errors.load() == 0);
  const AllocatorStats s1 = cpu_allocator_stats();
  CHECK(s1.allocated_bytes == s0.allocated_bytes);
  CHECK(s1.reserved_bytes >= s1.allocated_bytes);
  CHECK(s1.peak_allocated_bytes >= s0.peak_allocated_bytes);
}

TEST_CASE("tensors on logical CPU devices share the one allocator", "[allocator]") {
  cpu_empty_cache();
  const AllocatorStats s0 = cpu_allocator_stats();
  {
    Tensor t = empty({4096}, TensorOptions{DType::f32, Device::cpu(3)});
    CHECK(t.device() == Device::cpu(3));
    CHECK(aligned64(t.storage()->data()));
    CHECK(cpu_allocator_stats().allocated_bytes >= s0.allocated_bytes + 4096 * 4);
  }
  CHECK(cpu_allocator_stats().allocated_bytes == s0.allocated_bytes);
}
