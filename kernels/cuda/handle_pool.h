// Library handles (cuBLAS, cuDNN) per (host thread, physical GPU), recycled through a pool.
//
// Why: a cuBLAS or cuDNN handle must not be used by two host threads at once, so each thread
// needs its own; but creating one costs milliseconds and some memory (cuBLAS allocates a
// workspace per handle). DataParallel starts fresh threads every step (parallel_apply's workers,
// the autograd engine's device threads), so "create on first use, keep forever" would create and
// leak a few handles per step. Here a thread borrows a handle the first time it needs one for a
// GPU and gives it back to the pool when the thread exits; the next thread takes it from there.
// Host-only: no CUDA headers, so it serves any handle type.
#pragma once

#include <array>
#include <mutex>
#include <vector>

#include "base/error.h"

namespace mg::kernels::cuda {

constexpr int kMaxPooledDevices = 64;

// This thread's handle for physical GPU `physical` (which the caller has made the runtime's current
// device: handles belong to the device that was current when they were created). `Create` makes a
// new handle on the current device and throws mg::Error when it cannot. The handle stays this
// thread's until the thread exits.
template <class Handle, Handle (*Create)()>
Handle pooled_handle(int physical) {
  MG_CHECK(physical >= 0 && physical < kMaxPooledDevices, "pooled_handle: GPU ", physical, " out of range");
  struct Pool {
    std::mutex mutex;
    std::array<std::vector<Handle>, kMaxPooledDevices> spare;
  };
  // Leaked on purpose: threads may hand their handles back after main() has returned.
  static Pool* pool = new Pool();
  struct ThreadHandles {
    std::array<Handle, kMaxPooledDevices> handles{};
    ~ThreadHandles() {
      std::lock_guard<std::mutex> lock(pool->mutex);
      for (int d = 0; d < kMaxPooledDevices; ++d)
        if (handles[d] != nullptr) pool->spare[d].push_back(handles[d]);
    }
  };
  thread_local ThreadHandles mine;
  Handle& handle = mine.handles[physical];
  if (handle == nullptr) {
    {
      std::lock_guard<std::mutex> lock(pool->mutex);
      std::vector<Handle>& spare = pool->spare[physical];
      if (!spare.empty()) {
        handle = spare.back();
        spare.pop_back();
      }
    }
    if (handle == nullptr) handle = Create();
  }
  return handle;
}

}  // namespace mg::kernels::cuda
