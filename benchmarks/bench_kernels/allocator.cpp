// bench_kernels family "allocator": what one allocation + free costs through the caching
// allocator (core/cuda_allocator.cu, behind every CUDA tensor) against raw cudaMalloc/cudaFree.
//
// Host time, not GPU time: allocating is host work (the caching allocator's map lookups under a
// mutex; the driver's bookkeeping, page mapping and, in cudaFree, a wait for the whole device).
// Each measurement runs `pairs` allocate+free pairs back to back under a steady clock; the row
// is the median over repeats, in microseconds per pair. Rows per size (512 B, 64 KiB, 1 MiB,
// 64 MiB):
//   "caching alloc+free"  mg::device_allocate/device_free: the allocator alone
//   "Tensor empty+free"   mg::empty on cuda + destruction: plus Storage and Tensor bookkeeping
// ceiling = cudaMalloc+cudaFree of the same size, ratio = raw / ours (above 1 = cheaper than
// the driver). A row whose timing loop reached cudaMalloc (it should not: the first pair
// warms the cache) says so in its name.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "bench_kernels.h"
#include "core/allocator.h"
#include "core/cuda_allocator.h"
#include "core/cuda_stream.h"
#include "core/tensor.h"

namespace mg::bench {
namespace {

// Median over `repeats` of the time per call of `pair`, each repeat timing `pairs` calls.
template <class F>
double median_us_per_pair(F&& pair, int pairs, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) pair();
  std::vector<double> times;
  for (int r = 0; r < std::max(1, repeats); ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) pair();
    const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
    times.push_back(elapsed.count() / pairs);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

std::string size_name(size_t bytes) {
  if (bytes >= (size_t(1) << 20)) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (size_t(1) << 10)) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

std::vector<KernelResult> bench_allocator(const BenchOptions& o, const Ceilings&) {
  mg::cuda::enable_backend();
  mg::cuda::DeviceGuard guard(o.device);
  const Device dev = Device::cuda(o.device);
  auto ok = [](cudaError_t e) { MG_CHECK(e == cudaSuccess, "bench allocator: ", cudaGetErrorString(e)); };
  ok(cudaDeviceSynchronize());
  std::vector<KernelResult> rows;
  for (size_t bytes : {size_t(512), size_t(64) << 10, size_t(1) << 20, size_t(64) << 20}) {
    if (o.check && bytes > (size_t(1) << 20)) continue;
    const bool huge = bytes >= (size_t(64) << 20);
    // cudaMalloc of 64 MiB maps pages (~100 us and up): fewer pairs there.
    const int raw_pairs = o.quick ? (huge ? 3 : 20) : (huge ? 10 : 100);
    const int cached_pairs = o.quick ? 200 : 2000;
    const double raw_us = median_us_per_pair(
        [&] {
          void* p = nullptr;
          ok(cudaMalloc(&p, bytes));
          ok(cudaFree(p));
        },
        raw_pairs, 1, o.repeats);

    const int64_t mallocs_before = mg::cuda::memory_stats(o.device).system_allocations;
    const double cached_us = median_us_per_pair([&] { device_free(device_allocate(bytes, dev), bytes, dev); },
                                                cached_pairs, 1, o.repeats);
    const int64_t elements = static_cast<int64_t>(bytes / sizeof(float));
    const double tensor_us = median_us_per_pair(
        [&] {
          const Tensor t = empty({elements}, TensorOptions{DType::f32, dev});
        },
        cached_pairs, 1, o.repeats);
    const int64_t mallocs_in_loops = mg::cuda::memory_stats(o.device).system_allocations - mallocs_before;

    for (int which = 0; which < 2; ++which) {
      KernelResult r;
      r.family = "allocator";
      r.kernel = which == 0 ? "caching alloc+free" : "Tensor empty+free";
      // At most one cudaMalloc is expected: the warm-up pair that fills the cache. More means the
      // steady state reached the driver, which the caching allocator exists to prevent.
      if (mallocs_in_loops > 1) {
        r.failed = true;
        r.note = std::to_string(mallocs_in_loops) +
                 " cudaMalloc calls during the timed loops (expected at most 1)";
      } else if (rows.empty()) {
        r.note = "host time per allocate+free pair (cudaFree also waits for the device, idle here)";
      }
      r.dtype = "-";
      r.shape = size_name(bytes);
      r.seconds = (which == 0 ? cached_us : tensor_us) * 1e-6;
      r.achieved = which == 0 ? cached_us : tensor_us;
      r.ceiling = raw_us;
      r.reference = "cudaMalloc/cudaFree";
      r.unit = "us";
      r.ratio = raw_us / r.achieved;
      rows.push_back(r);
    }
  }
  mg::cuda::empty_cache();
  return rows;
}

const RegisterFamily kRegistered("allocator", 40, bench_allocator);

}  // namespace
}  // namespace mg::bench
