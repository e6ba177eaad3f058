#include "core/allocator.h"

#include <atomic>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>

#include "base/error.h"

namespace mg {
namespace {

constexpr size_t kAlignment = 64;
// Cached bytes above this go back to the OS instead of the free list.
constexpr size_t kMaxCachedBytes = size_t(4) << 30;

size_t round_up(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  return (nbytes + kAlignment - 1) / kAlignment * kAlignment;
}

class CpuCachingAllocator {
 public:
  void* allocate(size_t nbytes) {
    const size_t size = round_up(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    // Best fit among cached blocks no more than twice the request: reuse without
    // letting a tiny tensor pin a huge block.
    auto it = free_blocks_.lower_bound(size);
    if (it != free_blocks_.end() && it->first <= 2 * size) {
      void* ptr = it->second;
      const size_t block = it->first;
      free_blocks_.erase(it);
      cached_bytes_ -= block;
      block_sizes_[ptr] = block;
      note_allocated(block);
      ++stats_.cache_hits;
      return ptr;
    }
    void* ptr = std::aligned_alloc(kAlignment, size);
    MG_CHECK(ptr != nullptr, "CPU out of memory: asked for ", nbytes, " bytes; ", stats_.allocated_bytes,
             " bytes held by tensors and ", cached_bytes_, " bytes cached");
    ++stats_.system_allocations;
    block_sizes_[ptr] = size;
    note_allocated(size);
    return ptr;
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = block_sizes_.find(ptr);
    if (found == block_sizes_.end()) return;
    const size_t block = found->second;
    block_sizes_.erase(found);
    stats_.allocated_bytes -= static_cast<int64_t>(block);
    if (cached_bytes_ + block > kMaxCachedBytes) {
      std::free(ptr);
      return;
    }
    free_blocks_.emplace(block, ptr);
    cached_bytes_ += block;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& entry : free_blocks_) std::free(entry.second);
    free_blocks_.clear();
    cached_bytes_ = 0;
  }

  AllocatorStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    AllocatorStats s = stats_;
    s.reserved_bytes = s.allocated_bytes + static_cast<int64_t>(cached_bytes_);
    return s;
  }

 private:
  void note_allocated(size_t block) {
    stats_.allocated_bytes += static_cast<int64_t>(block);
    if (stats_.allocated_bytes > stats_.peak_allocated_bytes)
      stats_.peak_allocated_bytes = stats_.allocated_bytes;
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;
  std::map<void*, size_t> block_sizes_;
  size_t cached_bytes_ = 0;
  AllocatorStats stats_;
};

CpuCachingAllocator& cpu_allocator() {
  // Leaked on purpose: tensors in static objects may be freed after main returns.
  static CpuCachingAllocator* instance = new CpuCachingAllocator();
  return *instance;
}

std::unique_ptr<DeviceBackend>& cuda_backend_slot() {
  static std::unique_ptr<DeviceBackend> slot;
  return slot;
}

const DeviceBackend& require_cuda_backend(Device device) {
  const DeviceBackend* backend = cuda_backend();
  MG_CHECK(backend != nullptr, "cannot use ", device,
           ": this multigrad has no CUDA backend registered (built without CUDA, or no GPU was found)");
  return *backend;
}

}  // namespace

void* cpu_allocate(size_t nbytes) { return cpu_allocator().allocate(nbytes); }
void cpu_free(void* ptr, size_t) { cpu_allocator().free(ptr); }
AllocatorStats cpu_allocator_stats() { return cpu_allocator().stats(); }
void cpu_empty_cache() { cpu_allocator().empty_cache(); }

void register_cuda_backend(const DeviceBackend& backend) {
  cuda_backend_slot() = std::make_unique<DeviceBackend>(backend);
}

namespace {
std::atomic<void (*)()> g_cuda_backend_finder{nullptr};
std::once_flag g_cuda_backend_found;
}  // namespace

void register_cuda_backend_finder(void (*finder)()) { g_cuda_backend_finder.store(finder); }

const DeviceBackend* cuda_backend() {
  // Every allocation asks: after the first call this is one atomic load and a pointer read.
  if (void (*finder)() = g_cuda_backend_finder.load(std::memory_order_acquire)) {
    std::call_once(g_cuda_backend_found, finder);
  }
  return cuda_backend_slot().get();
}

// Live and peak bytes per logical CPU device (cpu:0, cpu:1, ...): they share one allocator, but
// DataParallel's benchmark must show how much each "device" holds (device 0's imbalance).
namespace {
struct LogicalDeviceUsage {
  std::atomic<int64_t> live{0};
  std::atomic<int64_t> peak{0};
};
constexpr int kMaxLogicalCpuDevices = 64;
LogicalDeviceUsage& logical_usage(int index) {
  static LogicalDeviceUsage usage[kMaxLogicalCpuDevices];
  return usage[index >= 0 && index < kMaxLogicalCpuDevices ? index : kMaxLogicalCpuDevices - 1];
}
void account(Device device, int64_t delta) {
  LogicalDeviceUsage& usage = logical_usage(device.index);
  int64_t now = usage.live.fetch_add(delta) + delta;
  int64_t peak = usage.peak.load();
  while (now > peak && !usage.peak.compare_exchange_weak(peak, now)) {
  }
}
}  // namespace

DeviceMemoryUsage cpu_device_memory(int index) {
  LogicalDeviceUsage& usage = logical_usage(index);
  return {usage.live.load(), usage.peak.load()};
}

void reset_cpu_device_peak(int index) {
  LogicalDeviceUsage& usage = logical_usage(index);
  usage.peak.store(usage.live.load());
}

namespace {
std::atomic<int64_t> g_cross_device_copy_bytes{0};
}  // namespace

int64_t cross_device_copy_bytes() { return g_cross_device_copy_bytes.load(std::memory_order_relaxed); }
void count_cross_device_copy(int64_t bytes) {
  g_cross_device_copy_bytes.fetch_add(bytes, std::memory_order_relaxed);
}

void* device_allocate(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    void* ptr = cpu_allocate(nbytes);
    account(device, static_cast<int64_t>(nbytes));
    return ptr;
  }
  return require_cuda_backend(device).allocate(nbytes, device);
}

void device_free(void* ptr, size_t nbytes, Device device) {
  if (device.is_cpu()) {
    account(device, -static_cast<int64_t>(nbytes));
    return cpu_free(ptr, nbytes);
  }
  if (const DeviceBackend* backend = cuda_backend()) backend->free(ptr, nbytes, device);
}

void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, nbytes);
    return;
  }
  require_cuda_backend(dst_device.is_cuda() ? dst_device : src_device)
      .copy(dst, dst_device, src, src_device, nbytes);
}

bool pinned_memory_available() {
  const DeviceBackend* backend = cuda_backend();
  return backend != nullptr && backend->allocate_pinned != nullptr;
}

void* pinned_allocate(size_t nbytes) {
  MG_CHECK(pinned_memory_available(),
           "pin_memory: pinned (page-locked) host memory needs the CUDA backend, and ",
           cuda_backend()
               ? "the registered backend has no pinned allocator"
               : "none is registered (built without CUDA, no GPU, or mg::cuda::enable_backend() not called)");
  return cuda_backend()->allocate_pinned(nbytes);
}

void pinned_free(void* ptr, size_t nbytes) {
  if (const DeviceBackend* backend = cuda_backend()) backend->free_pinned(ptr, nbytes);
}

}  // namespace mg
