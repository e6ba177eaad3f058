// MG_TEST_DEVICE=cuda runs a CPU test's cases on CUDA devices instead (the CUDA emulation build
// registers such runs in ctest: DDP and the ring over NCCL, DataParallel over emulated GPUs).
#pragma once

#include <cstdlib>
#include <string>

#include "base/device.h"
#include "core/cuda_allocator.h"

namespace mg::testing {

inline bool test_on_cuda() {
  static const bool cuda = [] {
    const char* v = std::getenv("MG_TEST_DEVICE");
    if (v == nullptr || std::string(v) != "cuda") return false;
    cuda::enable_backend();
    return true;
  }();
  return cuda;
}

// cuda:<index> when MG_TEST_DEVICE=cuda, else the CPU.
inline Device test_device(int index) { return test_on_cuda() ? Device::cuda(index) : Device::cpu(); }

}  // namespace mg::testing
