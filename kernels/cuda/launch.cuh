// The one launch helper of multigrad's kernels: the `<<<>>>` launch and its error check.
//
//   launch_kernel<softmax_rows_kernel<T>>(grid, block, shared_bytes, stream, args...);
//
// is `softmax_rows_kernel<T><<<grid, block, shared_bytes, stream>>>(args...)` followed by
// MG_CUDA_CHECK_LAUNCH(), which turns a refused launch (a bad configuration, too much shared
// memory) into an exception. A launch site then reads as one line and can never forget the check.
// The kernel is a template argument so that the emulator's messages name the instantiation
// (`mg::kernels::cuda::{anonymous}::softmax_rows_kernel<float>`, from __PRETTY_FUNCTION__).
//
// In the emulation build (-DMG_CUDA=EMULATE) the `<<<>>>` line below is rewritten by the build's
// CUDA front end (cuda_emu/cu_rewrite/) into a call of the emulator's launch, as is any `<<<>>>` a
// user writes; nothing here differs between nvcc and the emulator.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>

#include "base/cuda_check.cuh"

namespace mg::kernels::cuda {

template <auto Kernel, class... Args>
void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, const Args&... args) {
  // clang-format off
  Kernel<<<grid, block, shared_bytes, stream>>>(args...);
  // clang-format on
  MG_CUDA_CHECK_LAUNCH();
}

// A kernel that wants more than 48 KiB of dynamic shared memory must say so first, once per
// device: cudaFuncSetAttribute(MaxDynamicSharedMemorySize), and the largest carveout of the unified
// L1/shared array for shared memory. Call before launch_kernel with the same `bytes`; a kernel
// whose size depends on its arguments is raised again when a call needs more than before.
inline void allow_dynamic_smem(const void* kernel, int bytes) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> allowed;  // (kernel, device) -> bytes
  int device = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  int& current = allowed[{kernel, device}];
  if (bytes <= current) return;
  MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  MG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     cudaSharedmemCarveoutMaxShared));
  current = bytes;
}

}  // namespace mg::kernels::cuda
