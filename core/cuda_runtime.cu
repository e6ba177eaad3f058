// mg::cuda device queries, CUDA build. See core/cuda_runtime.h.
//
// cudaGetDeviceCount returns an error *and leaves its argument untouched* when
// there is no driver (cudaErrorInsufficientDriver, cudaErrorNoDevice, ...), so
// the count starts at 0. We only use the runtime API: libcuda is loaded by
// libcudart at run time, never linked, so this file's binary still starts on a
// machine without the driver.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

namespace mg::cuda {
namespace {

struct Probe {
  int count = 0;
  std::string description;
};

std::string version_string(int v) {  // 12040 -> "12.4"
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

Probe run_probe() {
  Probe p;
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess || n <= 0) {
    cudaGetLastError();  // clear the error so later runtime calls don't report it
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver is installed
    cudaRuntimeGetVersion(&runtime);
    std::string reason = err != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(err)
                                            : std::string("cudaGetDeviceCount found 0 devices");
    reason += driver ? "; driver supports CUDA " + version_string(driver) : "; no CUDA driver";
    reason += ", runtime is CUDA " + version_string(runtime);
    p.description = "no CUDA device (" + reason + ")";
    return p;
  }
  p.count = n;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (!p.description.empty()) p.description += "; ";
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      cudaGetLastError();
      p.description += "cuda:" + std::to_string(i) + " (properties unavailable)";
      continue;
    }
    char line[512];
    std::snprintf(line, sizeof(line), "cuda:%d %s, sm_%d%d, %llu GiB", i, prop.name, prop.major, prop.minor,
                  static_cast<unsigned long long>(prop.totalGlobalMem >> 30));
    p.description += line;
  }
  return p;
}

const Probe& probe() {
  static const Probe p = [] {
    try {
      return run_probe();
    } catch (...) {  // std::bad_alloc from the strings: report no device rather than throw
      return Probe{};
    }
  }();
  return p;
}

}  // namespace

int device_count() noexcept {
  try {
    // MG_VIRTUAL_GPUS=K: K logical devices on physical GPU 0 (core/cuda_stream.h).
    const int physical = probe().count;
    return physical > 0 && virtual_gpus() > 0 ? virtual_gpus() : physical;
  } catch (...) {
    return 0;
  }
}

bool is_available() noexcept { return device_count() > 0; }

std::string describe_devices() {
  const Probe& p = probe();
  if (p.description.empty()) return "no CUDA device (probe failed)";
  if (p.count > 0 && virtual_gpus() > 0)
    return p.description + " (MG_VIRTUAL_GPUS=" + std::to_string(virtual_gpus()) +
           ": cuda:0..cuda:" + std::to_string(virtual_gpus() - 1) + " share physical GPU 0)";
  return p.description;
}

bool built_with_cuda() noexcept { return true; }

}  // namespace mg::cuda
