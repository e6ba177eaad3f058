// Scratch device memory for one call, from the caching allocator (never a cudaMalloc in steady
// state): taken on the current device at construction, given back at scope exit to the current
// stream's free list, where later work queued on that stream may reuse it without a sync.
// Work that uses it must be queued on the current stream before the scope ends.
#pragma once

#include <cstddef>

#include "core/allocator.h"
#include "core/cuda_stream.h"
#include "core/device.h"

namespace mg::kernels::cuda {

class Workspace {
 public:
  explicit Workspace(size_t bytes) : bytes_(bytes), device_(mg::cuda::current_device()) {
    if (bytes_ > 0) ptr_ = device_allocate(bytes_, Device::cuda(device_));
  }
  ~Workspace() {
    if (ptr_ != nullptr) device_free(ptr_, bytes_, Device::cuda(device_));
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }

 private:
  size_t bytes_;
  int device_;
  void* ptr_ = nullptr;
};

}  // namespace mg::kernels::cuda
