// mg::cuda device queries for builds without CUDA (see core/cuda_runtime.h).
// CMake leaves this file out of CUDA builds; the guard keeps it harmless if a
// build compiles it anyway.
#ifndef MG_HAS_CUDA

#include "core/cuda_runtime.h"

namespace mg::cuda {

int device_count() noexcept { return 0; }

bool is_available() noexcept { return false; }

std::string describe_devices() { return "no CUDA device (multigrad was built without CUDA)"; }

bool built_with_cuda() noexcept { return false; }

}  // namespace mg::cuda

#endif  // MG_HAS_CUDA
