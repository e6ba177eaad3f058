// Where tensor memory comes from.
//
// CPU: 64-byte aligned blocks (one cache line, one AVX-512 vector) handed out by
// a caching allocator. On our machines the first touch of a fresh 4 KiB page
// costs ~11 us, so giving large buffers back to the OS after every op and
// faulting them in again the next step is ruinous (docs/architecture.md: libtorch
// measured 3.7x slower that way). Freed blocks go to a size-keyed free list instead and
// are reused by the next request of a similar size.
//
// CUDA: the CUDA backend registers its own allocator and copy routine through
// DeviceBackend (the seam keeps core/ free of CUDA headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "base/device.h"

namespace mg {

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // held by live tensors
  int64_t reserved_bytes = 0;   // allocated + cached in free lists
  int64_t peak_allocated_bytes = 0;
  int64_t system_allocations = 0;  // calls that reached the OS (aligned_alloc / cudaMalloc)
  int64_t cache_hits = 0;
};

// The CPU caching allocator (one per process; thread-safe).
void* cpu_allocate(size_t nbytes);
void cpu_free(void* ptr, size_t nbytes);
AllocatorStats cpu_allocator_stats();
void cpu_empty_cache();  // returns every cached block to the OS

// Hooks a GPU backend installs. Without them, creating a CUDA tensor is an error
// that says the build has no CUDA backend.
struct DeviceBackend {
  std::function<void*(size_t nbytes, Device device)> allocate;
  std::function<void(void* ptr, size_t nbytes, Device device)> free;
  // Copies nbytes between any two devices (host<->device, device<->device).
  // A host->device copy from pinned memory (below) is asynchronous: it is queued
  // on the destination's current stream, and the pinned block is not handed out
  // again until the copy has finished, even if its tensor is freed before.
  std::function<void(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes)> copy;
  // Page-locked ("pinned") host memory from a caching pool (cudaHostAlloc): the
  // GPU can read it by DMA, so copies from it need no staging and can overlap
  // kernels. Host memory like any other for the CPU.
  std::function<void*(size_t nbytes)> allocate_pinned;
  std::function<void(void* ptr, size_t nbytes)> free_pinned;
};
void register_cuda_backend(const DeviceBackend& backend);
// A CUDA build registers, at library load, a finder that registers the backend when a GPU is usable;
// the first call of cuda_backend() runs it, once. So CUDA is initialised when a CUDA tensor, device
// or process group is first asked for, not when the library loads (PyTorch's lazy init): a tool
// that attaches when CUDA initialises (compute-sanitizer) and a CUDA_VISIBLE_DEVICES set in main()
// both see the process before CUDA does.
void register_cuda_backend_finder(void (*finder)());
const DeviceBackend* cuda_backend();  // nullptr when none is registered (after running the finder)

// Bytes held by tensors on one logical CPU device (cpu:N) now, and the most since the last reset.
struct DeviceMemoryUsage {
  int64_t live_bytes = 0;
  int64_t peak_bytes = 0;
};
DeviceMemoryUsage cpu_device_memory(int index);
void reset_cpu_device_peak(int index);

// Bytes Tensor::copy_ (hence Tensor::to) has copied from one device to another, summed over the
// process's lifetime: the source bytes of every copy whose source and destination devices differ
// (logical CPU devices included, where the copy is a memcpy within host memory). A measurement of
// what DataParallel's scatter, replicate, gather and reduce-add move (bench_parallelism reads it).
int64_t cross_device_copy_bytes();
void count_cross_device_copy(int64_t bytes);  // called by Tensor::copy_

// Allocation/copy by device, used by Storage and Tensor::to.
void* device_allocate(size_t nbytes, Device device);
void device_free(void* ptr, size_t nbytes, Device device);
void device_copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes);
// Pinned host memory through the CUDA backend; pinned_allocate throws mg::Error
// when no CUDA backend is registered (a CPU-only run has no use for it).
bool pinned_memory_available();
void* pinned_allocate(size_t nbytes);
void pinned_free(void* ptr, size_t nbytes);

}  // namespace mg
