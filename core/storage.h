// Storage: one reference-counted allocation on one device. Tensors are views
// into a Storage (shape + strides + offset); views of the same storage share it.
//
// The version counter lives here, so every view of the memory sees the same
// count: an in-place write through any view bumps it, and autograd compares it
// with the version it recorded when it saved a tensor for backward.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/device.h"

namespace mg {

class Storage {
 public:
  // pinned: page-locked host memory from the CUDA backend (device must be a CPU);
  // throws mg::Error without a CUDA backend (core/allocator.h).
  Storage(size_t nbytes, Device device, bool pinned = false);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  bool pinned() const { return pinned_; }

  // Fully sharded data parallel's resharding (parallel/fsdp/flat_param.h): frees the memory but
  // keeps this Storage, so every tensor viewing it -- parameters saved for backward included --
  // stays a valid handle; reallocate_memory() gives them memory again (same size, new address,
  // contents undefined until written). The version is left alone: the caller writes back the
  // same values. Between the two, data() is null and the tensors must not be read.
  void release_memory();
  void reallocate_memory();
  bool has_memory() const { return data_ != nullptr || nbytes_ == 0; }

  uint64_t version() const { return version_.load(std::memory_order_relaxed); }
  void bump_version() { version_.fetch_add(1, std::memory_order_relaxed); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_;
  bool pinned_ = false;
  std::atomic<uint64_t> version_{0};
};

}  // namespace mg
