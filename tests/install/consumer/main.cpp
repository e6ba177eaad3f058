// Uses multigrad through its installed headers and library only.
// Prints "multigrad consumer: sum(ones(2,2)) = 4 (f32)" and exits 0 on success.
#include <cstdio>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "core/tensor.h"
#if __has_include("multigrad.h")
#include "multigrad.h"  // the umbrella header must be self-contained once installed
#endif

int main() {
  mg::Tensor t = mg::ones({2, 2});
  const float sum = t.sum().item<float>();
  std::printf("multigrad consumer: sum(ones(2,2)) = %g (%s)\n", sum, mg::dtype_name(t.dtype()));
  std::printf("multigrad consumer: %s\n", mg::cuda::describe_devices().c_str());
  return sum == 4.0f ? 0 : 1;
}
