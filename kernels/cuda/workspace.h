// Scratch device memory for one call, borrowed from the caller's ScratchAllocator
// (kernels/cuda/stream.h) at construction and given back at scope exit. Work that uses it must be
// queued on the call's stream before the scope ends.
#pragma once

#include <cstddef>

#include "kernels/cuda/stream.h"

namespace mg::kernels::cuda {

class Workspace {
 public:
  Workspace(ScratchAllocator& scratch, size_t bytes) : scratch_(scratch), bytes_(bytes) {
    if (bytes_ > 0) ptr_ = scratch_.allocate(bytes_);
  }
  ~Workspace() {
    if (ptr_ != nullptr) scratch_.deallocate(ptr_, bytes_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }

 private:
  ScratchAllocator& scratch_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

}  // namespace mg::kernels::cuda
