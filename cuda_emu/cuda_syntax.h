// What plain CUDA's two pieces of syntax become in the emulation build: the functions the source
// rewrite (cuda_emu/cu_rewrite/cu_rewrite.h) puts in place of a `<<<>>>` launch and of a
// `__shared__` declaration. Included by cuda_emu/cuda_emulated.h, the header forced in first.
//
//   k<<<g, b, s, st>>>(x, y);        ::mg_emu::cuda_launch(k, "k", __PRETTY_FUNCTION__, g, b, s, st)(x, y);
//   __shared__ float t[32][33];      auto& t = ::mg_emu::block_shared<float[32][33], 16>([]{}, file, line);
//   extern __shared__ float s[];     auto const s = ::mg_emu::dynamic_shared<float[]>();
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_emu/emulator.h"

namespace mg_emu {

// ---- kernel<<<grid, block, shared_bytes, stream>>>(args...) -----------------------------------------
// The launch configuration with its kernel; calling it with the arguments converts them to the
// kernel's parameter types (as a launch does: by value, at the launch) and hands the grid to
// mg_emu::launch, which checks the configuration as the runtime would, leaves a refused launch's
// error for cudaGetLastError(), and enqueues the grid on the stream.
template <class... P>
class KernelLaunch {
 public:
  KernelLaunch(void (*kernel)(P...), const char* name, dim3 grid, dim3 block, size_t shared_bytes,
               cudaStream_t stream)
      : kernel_(kernel), name_(name), grid_(grid), block_(block), shared_(shared_bytes), stream_(stream) {}

  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P),
                  "the launch passes a different number of arguments than the "
                  "kernel has parameters");
    Launch launch;
    launch.kernel_name = name_;
    launch.kernel = reinterpret_cast<const void*>(kernel_);
    launch.grid = grid_;
    launch.block = block_;
    launch.dynamic_shared_bytes = shared_;
    launch.stream = stream_;
    launch.body = [kernel = kernel_, params = std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)] {
      std::apply(kernel, params);
    };
    mg_emu::launch(std::move(launch));
  }

 private:
  void (*kernel_)(P...);
  const char* name_;
  dim3 grid_, block_;
  size_t shared_;
  cudaStream_t stream_;
};

// The kernel's name in messages: the expression as written ("transpose<float>"), or, when that
// is a template parameter of the function making the launch (`Kernel` in launch_kernel,
// kernels/cuda/launch.cuh), what the enclosing function's __PRETTY_FUNCTION__ says it stands for
// ("mg::kernels::cuda::{anonymous}::softmax_rows_kernel<float>"). Interned: alive for the program.
const char* kernel_launch_name(const char* expression, const char* enclosing_function);

template <class... P>
KernelLaunch<P...> cuda_launch(void (*kernel)(P...), const char* expression, const char* enclosing_function,
                               dim3 grid, dim3 block, size_t shared_bytes = 0,
                               cudaStream_t stream = nullptr) {
  return KernelLaunch<P...>(kernel, kernel_launch_name(expression, enclosing_function), grid, block,
                            shared_bytes, stream);
}

// ---- __shared__ T name[...]; ----------------------------------------------------------------------
// One array per block: storage per OS thread (which runs one block at a time) and per declaration
// (Tag: the lambda or tag struct the rewrite passes, a type of its own). The block's first thread
// to reach the declaration poisons the array (0xff bytes: a NaN in every float format) and counts
// its bytes against the block's shared-memory limit; the profiler then sees its accesses as shared
// memory (claim_static_shared, block_scheduler.cpp).
void claim_static_shared(uint64_t* claimed_by, void* storage, size_t bytes, const char* file, int line);

template <class A, size_t Align, class Tag>
A& block_shared(Tag, const char* file, int line) {
  struct alignas(Align > alignof(A) ? Align : alignof(A)) Storage {
    A value;
  };
  static thread_local Storage storage __attribute__((tls_model("initial-exec")));
  static thread_local uint64_t claimed_by __attribute__((tls_model("initial-exec"))) = 0;
  claim_static_shared(&claimed_by, &storage, sizeof(A), file, line);
  return storage.value;
}

// ---- extern __shared__ T name[]; --------------------------------------------------------------------
// The launch's dynamic shared memory (its third <<<>>> argument), one arena per block, poisoned at
// the block's start; every extern __shared__ array of a kernel starts at its beginning, as on a GPU.
unsigned char* dynamic_shared_base();

template <class A>
std::remove_extent_t<A>* dynamic_shared() {
  static_assert(std::extent<A>::value == 0 && std::is_array<A>::value,
                "extern __shared__ declares an array of unknown size");
  return reinterpret_cast<std::remove_extent_t<A>*>(dynamic_shared_base());
}

}  // namespace mg_emu
