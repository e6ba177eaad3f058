// What a CUDA kernel entry point takes from its caller besides the data, as llm.c's launchers do:
// the stream to queue its work on and, for the few that need scratch device memory, an allocator
// to borrow it from. The kernels never look up a current stream, device or allocator themselves
// (they know nothing of core/'s runtime); the op layer passes them (core/cuda_scratch.h).
// No CUDA headers, so kernels.h stays includable by code the host compiler builds alone.
#pragma once

#include <cstddef>

// The CUDA runtime's stream type, declared exactly as <driver_types.h> does (the CUDA emulation
// compiles against the same header in host mode), so the two declarations agree.
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace mg::kernels::cuda {

// Scratch device memory for one call, on the device the caller made current. allocate() throws
// mg::Error when it cannot (conv_cudnn then tries an algorithm that needs less). deallocate() is
// stream-ordered: work queued on the call's stream before it may still use the memory, and only
// later work on that stream may get it again, so a kernel gives scratch back right after queueing
// the work that reads it, without waiting.
class ScratchAllocator {
 public:
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;

 protected:
  ~ScratchAllocator() = default;
};

}  // namespace mg::kernels::cuda
