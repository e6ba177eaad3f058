// The emulator's own interface (the emulation build only): what multigrad's launch helper calls,
// and what tests and readers use to look inside -- counters, the last kernel fault, options.
// The CUDA runtime, cuBLAS, cuDNN and NCCL entry points themselves are the real libraries'
// functions, declared by their real headers and defined in this folder.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <string>

namespace mg_emu {

// One launch as a `<<<>>>` launch describes it (cuda_launch, cuda_emu/cuda_syntax.h). `body` runs one CUDA
// thread: it calls the kernel with the launch's (already converted, by-value) arguments; it is called once
// per thread, from fibers, so it must not modify what it captured.
struct Launch {
  const char* kernel_name = "";  // "mg::kernels::cuda::{anonymous}::softmax_rows_kernel<float>"
  const void* kernel = nullptr;  // the __global__ function's address (cudaFuncSetAttribute's key)
  dim3 grid, block;
  size_t dynamic_shared_bytes = 0;
  bool shared_opt_in =
      false;  // cudaFuncSetAttribute(MaxDynamicSharedMemorySize) was called (set by launch())
  cudaStream_t stream = nullptr;
  std::function<void()> body;
};

// Checks the configuration as the runtime does (block size, grid limits, shared memory against
// the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize) and, if it is valid, enqueues the
// grid on the stream. A rejected launch returns its error, leaves it for cudaGetLastError (as a
// <<<>>> launch does) and prints why, naming the kernel.
//
// Static shared memory is not part of a Launch: a __shared__ array (cuda_syntax.h) is poisoned at
// each block's first use and counted then, with the dynamic bytes, against the per-block limit (a
// fault of the grid if over). What a kernel's blocks claimed is remembered, so a later launch of it
// that cannot fit is refused here, with cudaErrorLaunchOutOfResources, as a GPU refuses it.
cudaError_t launch(Launch launch);

struct Counters {
  uint64_t kernel_launches = 0;  // grids enqueued
  uint64_t host_syncs = 0;       // the host waited for the device: stream/event/device synchronise,
                                 // blocking cudaMemcpy, cudaMemcpyAsync to or from pageable memory
  uint64_t device_mallocs = 0;   // cudaMalloc / cudaMallocAsync calls
  uint64_t bytes_host_to_device = 0;
  uint64_t bytes_device_to_host = 0;
};
Counters counters();  // totals since the process started, over every emulated device

// The message of the most recent kernel fault ("kernel K, block (1,0,0), thread (37,0,0): ..."),
// or "" when no kernel has faulted. Faults also go to stderr and fail the next synchronising call
// on the stream with cudaErrorLaunchFailure.
std::string last_fault();

// How threads of a block are ordered between barriers in the next launches: 0 forward, 1 reverse,
// 2 a new shuffle for every phase (the stretch between two barrier openings); -1 (the default, or
// MG_EMU_ORDER=vary) forward, reverse or a shuffle, drawn anew for every phase of every block.
// Shuffles and draws derive from the seed, the launch number and the block. Tests pin the order.
void set_thread_order(int order);
// The seed of the thread orders (MG_EMU_SEED, default 0); kernel faults name it and the launch number.
void set_thread_order_seed(uint64_t seed);
uint64_t thread_order_seed();

}  // namespace mg_emu
