// mg::cuda device queries behave on any machine: never throw, never negative,
// always explain themselves, and report no device in a CPU-only build.
#include <catch2/catch.hpp>

#include <string>

#include "core/cuda_runtime.h"

TEST_CASE("cuda device queries are safe without a GPU", "[core][cuda_runtime]") {
  const int n = mg::cuda::device_count();
  CHECK(n >= 0);
  CHECK(mg::cuda::device_count() == n);  // cached, stable
  CHECK(mg::cuda::is_available() == (n > 0));

  const std::string text = mg::cuda::describe_devices();
  INFO(text);
  CHECK_FALSE(text.empty());
  if (n == 0) {
    CHECK(text.rfind("no CUDA device (", 0) == 0);
  } else {
    CHECK(text.rfind("cuda:0 ", 0) == 0);
  }
  if (!mg::cuda::built_with_cuda()) CHECK(n == 0);
}

TEST_CASE("built_with_cuda matches the build's MG_HAS_CUDA", "[core][cuda_runtime]") {
#ifdef MG_HAS_CUDA
  CHECK(mg::cuda::built_with_cuda());
#else
  CHECK_FALSE(mg::cuda::built_with_cuda());
#endif
}
