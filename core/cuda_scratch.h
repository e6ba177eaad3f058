// The runtime side of kernels/cuda/stream.h: what the op layer (and tests, benchmarks) hand a CUDA
// kernel entry point. The stream is the logical device's current stream on this thread
// (core/cuda_stream.h); scratch memory comes from the caching allocator (core/allocator.h) and goes
// back to that stream's free list, so a steady-state step never calls cudaMalloc for it.
//
//   mg::cuda::DeviceGuard guard(device);
//   mg::cuda::DeviceScratch scratch(device);
//   kernels::cuda::reduce(mg::cuda::kernel_stream(device), scratch, op, shape, ...);
#pragma once

#include <cstddef>

#include "base/device.h"
#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "kernels/cuda/stream.h"

namespace mg::cuda {

// The current stream of logical device `device`, as the CUDA kernels take it.
inline cudaStream_t kernel_stream(int device) {
  return static_cast<cudaStream_t>(current_stream(device).handle);
}

// Scratch memory of logical device `device` from the caching allocator.
class DeviceScratch final : public kernels::cuda::ScratchAllocator {
 public:
  explicit DeviceScratch(int device) : device_(device) {}
  void* allocate(size_t bytes) override { return device_allocate(bytes, Device::cuda(device_)); }
  void deallocate(void* ptr, size_t bytes) override { device_free(ptr, bytes, Device::cuda(device_)); }

 private:
  int device_;
};

// For callers that made the device current themselves and call a kernel directly (tests,
// benchmarks): the current stream and scratch of the logical device current on this thread
// (mg::cuda::current_device(), looked up at each use).
inline cudaStream_t current_kernel_stream() { return kernel_stream(current_device()); }
inline kernels::cuda::ScratchAllocator& current_scratch() {
  struct Current final : kernels::cuda::ScratchAllocator {
    void* allocate(size_t bytes) override { return device_allocate(bytes, Device::cuda(current_device())); }
    void deallocate(void* ptr, size_t bytes) override {
      device_free(ptr, bytes, Device::cuda(current_device()));
    }
  };
  static Current scratch;
  return scratch;
}

}  // namespace mg::cuda
