// The CUDA backend's memory side: the caching allocator's statistics and cache,
// and switching the backend on. No CUDA headers here (see core/cuda_allocator.cu).
//
// Switching on. Registering the backend (core/allocator.h's DeviceBackend) is
// what makes Device::cuda(i) tensors possible, and what makes
// parallel::init_process_group() and the examples choose cuda:<local rank>.
// It happens automatically whenever a usable GPU is present (as in every
// framework), the first time anything asks for the backend (a CUDA tensor, a
// device count through it, a process group), not at library load: CUDA is
// initialised lazily. MG_CUDA_BACKEND=0 in the environment opts out, and
// mg::cuda::enable_backend() registers it by hand (a no-op when registered).
// An op without a CUDA kernel fails with an error naming the op.
#pragma once

#include "core/allocator.h"
#include "core/cuda_stream.h"

namespace mg {
class Tensor;
}

namespace mg::cuda {

// Registers the CUDA backend (idempotent). Throws mg::Error when this build has
// no CUDA or no device is usable.
void enable_backend();
// Whether the CUDA backend is registered.
bool backend_enabled();

// Caching-allocator statistics of logical device cuda:<device>: bytes held by
// live tensors, bytes reserved from cudaMalloc (live + cached, including freed
// blocks still waiting for another stream), the peak of the former, the number
// of cudaMalloc calls and of requests served from the cache.
AllocatorStats memory_stats(int device);
// Sets the peak back to the bytes allocated now.
void reset_peak_memory_stats(int device);
// Returns every cached (free) block of every device to the driver (cudaFree).
// Blocks held by tensors stay. Freed blocks still used by another stream
// (record_stream) are waited for first, so this may block the host.
void empty_cache();

// Tells the caching allocator that work queued on `stream` uses `t`'s memory,
// `stream` not being the one the memory was allocated on (the current stream of
// t's device when t was created). Without it, freeing t hands its block to the
// next allocation on the allocating stream at once, and that new tensor may be
// written while `stream` still reads or writes the old one. With it, the block
// is reused only after the work `stream` has queued by the time t is freed has
// finished (an event per noted stream; nothing waits on the host). Like
// torch.Tensor.record_stream. Views share their storage's block, so recording
// any view covers them all. Throws mg::Error for an undefined or non-CUDA
// tensor and for a stream of another GPU.
void record_stream(const Tensor& t, Stream stream);

}  // namespace mg::cuda
