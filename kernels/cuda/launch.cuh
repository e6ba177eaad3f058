// One way to launch a kernel, for nvcc and for the CUDA emulation alike.
//
//   launch_kernel<softmax_rows_kernel<T>>(grid, block, shared_bytes, stream, args...);
//
// It is `kernel<<<grid, block, shared_bytes, stream>>>(args...)` (launch_grid, native.cuh)
// followed by the launch error check. In the emulation build (-DMG_CUDA=EMULATE) launch_grid is
// the emulator's (cuda_emu/native_twins.h): it converts the arguments to the kernel's parameter
// types, as a launch does, and hands the grid to the emulator, which checks the configuration as
// the runtime would and enqueues it on the stream. The kernel is a template argument so the
// emulator can name it in its errors.
//
// dynamic_shared_memory() (native.cuh) is the block's dynamic shared memory (the launch's
// shared_bytes), the one `extern __shared__` array every kernel that needs it shares.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "core/base/cuda_check.cuh"
#include "kernels/cuda/native.cuh"

namespace mg::kernels::cuda {

template <auto Kernel, class... Args>
void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, const Args&... args) {
  launch_grid<Kernel>(grid, block, shared_bytes, stream, args...);
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::kernels::cuda
