// The emulated runtime's memory: device allocations, pinned host memory, copies and fills.
//
// Device memory is host memory in allocations of its own (256-byte aligned, as cudaMalloc's are,
// filled with 0xff bytes -- a NaN in every float format -- so a read of memory nobody wrote shows).
// Behind the last requested byte of every device allocation lie at least 256 guard bytes of a
// known pattern; after each kernel the runtime checks them, so a kernel that writes past the end
// of an allocation (an off-by-one tail) is reported, naming the kernel. Reads past the end and
// writes into a neighbouring block the caching allocator carved from the same allocation are not
// seen.
// The runtime keeps every live allocation in an ordered map, so it can answer what the real one
// answers through cudaPointerGetAttributes: is this pointer device memory, of which device, or
// pinned host memory, or neither. Copies check their direction against that: a host pointer
// where the runtime expects device memory is cudaErrorInvalidValue, as on the real runtime.
//
// Asynchrony follows the documented rules: copies between device memory and pinned host memory
// are queued on the stream; a copy from pageable host memory is staged (the source is read at
// the call, the device side written in stream order); a copy to pageable host memory waits for
// the stream first, and so is a host synchronisation.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu/runtime_internal.h"

namespace mg_emu {
namespace {

enum class Kind { device, pinned };

struct Allocation {
  size_t bytes;
  int device;
  Kind kind;
};

std::mutex g_mutex;
std::map<uintptr_t, Allocation> g_allocations;  // by start address
std::atomic<uint64_t> g_generation{0};          // bumped by every release
std::vector<size_t> g_used;                     // device bytes in use, per device

// The allocation holding [p, p + bytes), or nullptr. Caller holds g_mutex.
const Allocation* find(const void* p, size_t bytes, uintptr_t* start = nullptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return nullptr;
  --it;
  if (a < it->first || a + bytes > it->first + std::max<size_t>(it->second.bytes, 1)) return nullptr;
  if (start) *start = it->first;
  return &it->second;
}

constexpr unsigned char kGuard = 0xa5;
constexpr size_t kGuardBytes = 256;

size_t padded(size_t bytes) { return (std::max<size_t>(bytes, 1) + 255) / 256 * 256 + kGuardBytes; }

void* allocate(size_t bytes, int device, Kind kind) {
  const size_t total = padded(bytes);
  void* p = std::aligned_alloc(256, total);
  if (p == nullptr) return nullptr;
  std::memset(p, 0xff, bytes);
  std::memset(static_cast<unsigned char*>(p) + bytes, kGuard, total - bytes);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, device, kind};
  if (kind == Kind::device) {
    if (g_used.size() < static_cast<size_t>(device_count()))
      g_used.resize(static_cast<size_t>(device_count()));
    g_used[static_cast<size_t>(device)] += bytes;
  }
  return p;
}

// Removes p from the map; returns false if it was not the start of an allocation of `kind`.
bool release(void* p, Kind kind) {
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.find(reinterpret_cast<uintptr_t>(p));
  if (it == g_allocations.end() || it->second.kind != kind) return false;
  if (kind == Kind::device) g_used[static_cast<size_t>(it->second.device)] -= it->second.bytes;
  g_allocations.erase(it);
  g_generation.fetch_add(1, std::memory_order_release);
  std::free(p);
  return true;
}

std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

// Resolves cudaMemcpyDefault and checks the two sides against the direction.
cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind& kind, const char* api) {
  if (bytes == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue, api, "null pointer");
  const bool dst_dev = is_device_range(dst, bytes), src_dev = is_device_range(src, bytes);
  if (kind == cudaMemcpyDefault) {
    kind = dst_dev ? (src_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
                   : (src_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool want_dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool want_src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind != cudaMemcpyHostToHost && kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost &&
      kind != cudaMemcpyDeviceToDevice)
    return fail(cudaErrorInvalidMemcpyDirection, api, "unknown cudaMemcpyKind");
  if (want_dst_dev != dst_dev || want_src_dev != src_dev) {
    auto side = [](bool want, bool is, const void* p, size_t n, const char* name) -> std::string {
      if (want == is) return "";
      if (want)
        return std::string(name) + " " + hex(p) + " (+" + std::to_string(n) +
               " bytes) is not inside a device allocation; ";
      return std::string(name) + " " + hex(p) + " is device memory; ";
    };
    return fail(cudaErrorInvalidValue, api,
                side(want_dst_dev, dst_dev, dst, bytes, "destination") +
                    side(want_src_dev, src_dev, src, bytes, "source") +
                    "the copy's direction says otherwise");
  }
  return cudaSuccess;
}

// The copy proper, in stream order (pageable host sources staged, pageable destinations waited).
cudaError_t copy_async(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                       const char* api) {
  if (!stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, api, "unknown stream");
  cudaError_t err = check_copy(dst, src, bytes, kind, api);
  if (err != cudaSuccess || bytes == 0) return err;
  count_copy(kind, bytes);
  if (kind == cudaMemcpyHostToDevice && !is_pinned_range(src, bytes)) {
    auto staged = std::make_shared<std::vector<unsigned char>>(
        static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    enqueue(stream, api, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
    return cudaSuccess;
  }
  if ((kind == cudaMemcpyDeviceToHost && !is_pinned_range(dst, bytes)) || kind == cudaMemcpyHostToHost) {
    err = drain_stream(stream);
    if (err != cudaSuccess) return fail(err, api);
    std::memcpy(dst, src, bytes);
    return cudaSuccess;
  }
  enqueue(stream, api, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

}  // namespace

std::string check_guards(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (const auto& [start, a] : g_allocations) {
    if (a.kind != Kind::device || a.device != device) continue;
    unsigned char* guard = reinterpret_cast<unsigned char*>(start) + a.bytes;
    const size_t n = padded(a.bytes) - a.bytes;
    for (size_t i = 0; i < n; ++i) {
      if (guard[i] != kGuard) {
        std::memset(guard, kGuard, n);  // re-armed: report each overflow once
        return "wrote past the end of a " + std::to_string(a.bytes) + "-byte device allocation at " +
               hex(reinterpret_cast<void*>(start)) + " (byte " + std::to_string(a.bytes + i) + " changed)";
      }
    }
  }
  return "";
}

bool is_device_range(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Allocation* a = find(p, bytes);
  return a != nullptr && a->kind == Kind::device;
}

std::vector<std::pair<uintptr_t, uintptr_t>> device_ranges() {
  std::lock_guard<std::mutex> lock(g_mutex);
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (const auto& [start, a] : g_allocations)  // a std::map: sorted by start
    if (a.kind == Kind::device) ranges.emplace_back(start, start + a.bytes + kGuardBytes);
  return ranges;
}

bool is_pinned_range(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Allocation* a = find(p, bytes);
  return a != nullptr && a->kind == Kind::pinned;
}

bool allocation_containing(const void* p, uintptr_t* start, size_t* bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Allocation* a = find(p, 1, start);
  if (a == nullptr) return false;
  *bytes = a->bytes;
  return true;
}

bool past_end_of_allocation(const void* p, size_t bytes, uintptr_t* start, size_t* size) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_allocations.upper_bound(a);
  if (it == g_allocations.begin()) return false;
  --it;
  if (it->second.kind != Kind::device || a >= it->first + padded(it->second.bytes)) return false;
  if (a + bytes <= it->first + it->second.bytes) return false;  // inside: fine
  *start = it->first;
  *size = it->second.bytes;
  return true;
}

uint64_t allocation_generation() { return g_generation.load(std::memory_order_acquire); }

int device_of_pointer(const void* p) {
  std::lock_guard<std::mutex> lock(g_mutex);
  const Allocation* a = find(p, 1);
  return a != nullptr && a->kind == Kind::device ? a->device : -1;
}

}  // namespace mg_emu

using mg_emu::fail;

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue, "cudaMalloc");
  mg_emu::count_malloc();
  const int dev = mg_emu::current_device();
  size_t used = 0;
  {
    std::lock_guard<std::mutex> lock(mg_emu::g_mutex);
    if (static_cast<size_t>(dev) < mg_emu::g_used.size()) used = mg_emu::g_used[static_cast<size_t>(dev)];
  }
  *p = nullptr;
  if (bytes > mg_emu::total_memory() - used) return fail(cudaErrorMemoryAllocation, "cudaMalloc");
  *p = mg_emu::allocate(bytes, dev, mg_emu::Kind::device);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaMalloc", "the host is out of memory");
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  const int dev = mg_emu::device_of_pointer(p);
  if (dev < 0) return fail(cudaErrorInvalidValue, "cudaFree", "not the start of a device allocation");
  // cudaFree waits for the device, so memory a queued kernel still uses is never pulled away.
  mg_emu::drain_device(dev);
  if (!mg_emu::release(p, mg_emu::Kind::device))
    return fail(cudaErrorInvalidValue, "cudaFree", "not the start of a device allocation");
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  if (!mg_emu::stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMallocAsync");
  return cudaMalloc(p, bytes);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (p == nullptr) return cudaSuccess;
  if (!mg_emu::stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaFreeAsync");
  if (mg_emu::device_of_pointer(p) < 0)
    return fail(cudaErrorInvalidValue, "cudaFreeAsync", "not the start of a device allocation");
  mg_emu::enqueue(stream, "cudaFreeAsync", [p] { mg_emu::release(p, mg_emu::Kind::device); });
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  if (p == nullptr) return fail(cudaErrorInvalidValue, "cudaHostAlloc");
  *p = mg_emu::allocate(bytes, mg_emu::current_device(), mg_emu::Kind::pinned);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaHostAlloc");
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  if (!mg_emu::release(p, mg_emu::Kind::pinned))
    return fail(cudaErrorInvalidValue, "cudaFreeHost", "not memory from cudaHostAlloc/cudaMallocHost");
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  if (attr == nullptr) return fail(cudaErrorInvalidValue, "cudaPointerGetAttributes");
  std::memset(attr, 0, sizeof(*attr));
  std::lock_guard<std::mutex> lock(mg_emu::g_mutex);
  const mg_emu::Allocation* a = mg_emu::find(p, 1);
  attr->device = a ? a->device : -2;
  if (a == nullptr) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->hostPointer = const_cast<void*>(p);
  } else if (a->kind == mg_emu::Kind::device) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(p);
  } else {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(p);
    attr->devicePointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return fail(cudaErrorInvalidValue, "cudaMemGetInfo");
  std::lock_guard<std::mutex> lock(mg_emu::g_mutex);
  const size_t dev = static_cast<size_t>(mg_emu::current_device());
  const size_t used = dev < mg_emu::g_used.size() ? mg_emu::g_used[dev] : 0;
  *total_bytes = mg_emu::total_memory();
  *free_bytes = mg_emu::total_memory() - used;
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  cudaError_t err = mg_emu::copy_async(dst, src, bytes, kind, nullptr, "cudaMemcpy");
  if (err != cudaSuccess) return err;
  err = mg_emu::drain_stream(nullptr);
  return err == cudaSuccess ? err : fail(err, "cudaMemcpy");
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return mg_emu::copy_async(dst, src, bytes, kind, stream, "cudaMemcpyAsync");
}

cudaError_t cudaMemcpyPeerAsync(void* dst, int dst_device, const void* src, int src_device, size_t bytes,
                                cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (mg_emu::device_of_pointer(dst) != dst_device || mg_emu::device_of_pointer(src) != src_device)
    return fail(cudaErrorInvalidValue, "cudaMemcpyPeerAsync",
                "a pointer is not memory of the device named for it");
  return mg_emu::copy_async(dst, src, bytes, cudaMemcpyDeviceToDevice, stream, "cudaMemcpyPeerAsync");
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  if (!mg_emu::stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync");
  if (!mg_emu::is_device_range(p, bytes))
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync", "the range is not inside a device allocation");
  mg_emu::enqueue(stream, "cudaMemsetAsync", [p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  cudaError_t err = cudaMemsetAsync(p, value, bytes, nullptr);
  if (err != cudaSuccess) return err;
  return mg_emu::drain_stream(nullptr);
}

}  // extern "C"
