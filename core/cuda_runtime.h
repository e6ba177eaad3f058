// mg::cuda: is there a usable GPU, and which? The one place that asks the CUDA
// runtime that question, so tests, examples and scripts all get the same answer.
//
// Every function here is safe to call anywhere: in a build without CUDA, on a
// machine without the driver, without a GPU, or with a driver older than the
// runtime, device_count() is 0 and describe_devices() says why. Nothing throws.
#pragma once

#include <string>

namespace mg::cuda {

// Number of CUDA devices this process can use; 0 when built without CUDA, when
// there is no driver or no GPU, or when the driver is too old for the runtime.
// The first call initialises the CUDA runtime; the answer is cached.
int device_count() noexcept;

// device_count() > 0.
bool is_available() noexcept;

// One line per use: "cuda:0 NVIDIA H200, sm_90, 139 GiB" (devices joined by
// "; "), or "no CUDA device (<reason>)", e.g.
// "no CUDA device (cudaGetDeviceCount: CUDA driver version is insufficient ...)".
std::string describe_devices();

// Whether this library was compiled with the CUDA backend (MG_HAS_CUDA).
bool built_with_cuda() noexcept;

}  // namespace mg::cuda
