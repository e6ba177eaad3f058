// One way to launch a kernel, for nvcc and for the CUDA emulation alike.
//
//   launch_kernel<softmax_rows_kernel<T>>(grid, block, shared_bytes, stream, args...);
//
// With nvcc it is `kernel<<<grid, block, shared_bytes, stream>>>(args...)` followed by the launch
// error check. In the emulation build (-DMG_CUDA=EMULATE, cuda_emu/) the same call converts the
// arguments to the kernel's parameter types, as a launch does, and hands the grid to the
// emulator, which checks the configuration as the runtime would and enqueues it on the stream.
// The kernel is a template argument so the emulator can name it in its errors.
//
// dynamic_shared_memory() is the block's dynamic shared memory (the launch's shared_bytes), the
// one `extern __shared__` array every kernel that needs it shares.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/cuda_check.cuh"
#if defined(MG_CUDA_EMULATE)
#include "cuda_emu/emulator.h"
#endif

namespace mg::kernels::cuda {

#if defined(MG_CUDA_EMULATE)
namespace launch_detail {
template <class F>
struct Parameters;
template <class... P>
struct Parameters<void (*)(P...)> {
  using tuple = std::tuple<std::decay_t<P>...>;
};
// "void launch_kernel(...) [with auto Kernel = ns::name<float>; Args = {...}]" -> "ns::name<float>"
inline std::string kernel_name_from(const char* pretty) {
  std::string s(pretty);
  const std::string key = "Kernel = ";
  const size_t start = s.find(key);
  if (start == std::string::npos) return s;
  size_t end = start + key.size();
  int depth = 0;
  for (; end < s.size(); ++end) {
    const char c = s[end];
    if (c == '<' || c == '(') ++depth;
    if (c == '>' || c == ')') --depth;
    if (depth < 0 || (depth == 0 && (c == ';' || c == ']'))) break;
  }
  return s.substr(start + key.size(), end - start - key.size());
}
}  // namespace launch_detail
#endif

template <auto Kernel, class... Args>
void launch_kernel(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, const Args&... args) {
#if defined(MG_CUDA_EMULATE)
  using Params = typename launch_detail::Parameters<decltype(Kernel)>::tuple;
  static const std::string name = launch_detail::kernel_name_from(__PRETTY_FUNCTION__);
  mg_emu::Launch launch;
  launch.kernel_name = name.c_str();
  launch.kernel = reinterpret_cast<const void*>(Kernel);
  launch.grid = grid;
  launch.block = block;
  launch.dynamic_shared_bytes = shared_bytes;
  launch.stream = stream;
  launch.body = [params = Params(args...)] { std::apply(Kernel, params); };
  mg_emu::launch(std::move(launch));
#else
  // (clang-format would split the closing >>> apart)
  // clang-format off
  Kernel<<<grid, block, shared_bytes, stream>>>(args...);
  // clang-format on
#endif
  MG_CUDA_CHECK_LAUNCH();
}

#if defined(MG_CUDA_EMULATE)
inline unsigned char* dynamic_shared_memory() { return mg_emu::dynamic_shared_base(); }
#else
__device__ __forceinline__ unsigned char* dynamic_shared_memory() {
  extern __shared__ __align__(128) unsigned char mg_dynamic_shared[];
  return mg_dynamic_shared;
}
#endif

}  // namespace mg::kernels::cuda
