// Runs only where a CUDA device is usable (gpu_main.cpp skips it otherwise):
// the device query sees the GPU and describes it.
#include <catch2/catch.hpp>

#include <string>

#include "core/cuda_runtime.h"

TEST_CASE("a CUDA device is visible and described", "[gpu][cuda_runtime]") {
  REQUIRE(mg::cuda::built_with_cuda());
  REQUIRE(mg::cuda::device_count() > 0);
  REQUIRE(mg::cuda::is_available());
  const std::string text = mg::cuda::describe_devices();
  INFO(text);
  CHECK(text.rfind("cuda:0 ", 0) == 0);
  CHECK(text.find("sm_") != std::string::npos);
  CHECK(text.find("GiB") != std::string::npos);
}
