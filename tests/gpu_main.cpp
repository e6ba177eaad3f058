// Runner for tests/gpu/*: exits 77 (ctest SKIP_RETURN_CODE) when this process
// has no usable CUDA device, and says why; otherwise runs the Catch2 session.
//
// With a device it registers the CUDA backend (mg::cuda::enable_backend) before
// running the tests, so they can create CUDA tensors.
//
// MG_REQUIRE_GPU=1 (set by scripts/gpu-check) turns "no device" into a failure,
// so a GPU machine that lost its GPU cannot pass by skipping everything.

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "base/error.h"
#include "core/cuda_allocator.h"
#include "core/cuda_runtime.h"
#include "tests/catch_session.h"

int main(int argc, char** argv) {
  const std::string devices = mg::cuda::describe_devices();
  if (mg::cuda::device_count() == 0) {
    const char* require = std::getenv("MG_REQUIRE_GPU");
    if (require && std::strcmp(require, "0") != 0 && *require) {
      std::fprintf(stderr, "FAIL: MG_REQUIRE_GPU is set but there is %s\n", devices.c_str());
      return 1;
    }
    std::printf("SKIPPED: %s\n", devices.c_str());
    return 77;
  }
  std::printf("GPU tests on %s\n", devices.c_str());
  // CUDA tensors need the backend; enable_backend() registers it now and says why when it cannot
  // (core/cuda_allocator.h).
  try {
    mg::cuda::enable_backend();
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "FAIL: could not enable the CUDA backend: %s\n", e.what());
    return 1;
  }
  const int failures = mg::testing::run_catch_session(argc, argv);
  // Catch returns the number of failed assertions (capped at 255): never let
  // exactly 77 failures read as "skipped".
  return failures == 77 ? 1 : failures;
}
