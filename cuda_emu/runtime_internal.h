// What the emulated libraries (cuBLAS, cuDNN, NCCL twins in this folder) need from the emulated
// CUDA runtime. Not installed, not seen by multigrad's own code: only cuda_emu/*.cpp include it.
//
// The model: every emulated device's memory is ordinary host memory in allocations the runtime
// tracks; every stream is an in-order queue executed by a thread of its own. A library call that
// takes a stream (cublasGemmEx, cudnnConvolutionForward, ncclAllReduce, ...) checks its arguments
// at once, on the caller's thread, and returns the library's error code as the real library would;
// the work itself is enqueued on the stream and runs there, in order with kernels and copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace mg_emu {

// Runs `work` on `stream` (nullptr: the current device's legacy default stream) after everything
// queued on it before, asynchronously, on the stream's own thread. `what` names the work in error
// messages ("cublasGemmEx", "ncclAllReduce"). `work` may throw std::exception: the message becomes
// the stream's pending error (cudaErrorLaunchFailure), reported by the next synchronising call.
void enqueue(cudaStream_t stream, const char* what, std::function<void()> work);

// The emulated device (0 .. count-1) a stream belongs to; for nullptr, the calling thread's
// current device. -1 for a stream that does not exist.
int stream_device(cudaStream_t stream);

// The calling thread's current device (cudaSetDevice / cudaGetDevice).
int current_device();

// True when [p, p + bytes) lies inside one live device allocation (of any emulated device).
bool is_device_range(const void* p, size_t bytes);
// Every live device allocation as [start, end) (guard bytes included: an overrun is still a
// global access), sorted by start: the profiler's snapshot at a launch.
std::vector<std::pair<uintptr_t, uintptr_t>> device_ranges();

// The device a live device allocation containing p belongs to, or -1 when p is not device memory.
int device_of_pointer(const void* p);

// The live allocation (device or pinned) whose requested bytes contain p: its start and size.
bool allocation_containing(const void* p, uintptr_t* start, size_t* bytes);
// True when [p, p + bytes) reaches past the requested bytes of a device allocation into the guard
// bytes behind it (an out-of-bounds access the memcheck reports): that allocation's start and size.
bool past_end_of_allocation(const void* p, size_t bytes, uintptr_t* start, size_t* size);
// Changes whenever an allocation is freed: what allocation_containing answered stays true until then.
uint64_t allocation_generation();

}  // namespace mg_emu

// ---- shared by the runtime's own files (runtime_*.cpp, streams.cpp, launch.cpp) ----------------
namespace mg_emu {

int device_count();     // MG_EMU_GPUS, default 2
size_t total_memory();  // per device, as an H200 reports it

// Sets the calling thread's last error (cudaGetLastError) and returns `err`; when `why` is given
// it is printed ("cuda_emu: cudaMemcpy: ...") so a user learns what the real runtime only codes.
cudaError_t fail(cudaError_t err, const char* api, const std::string& why = std::string());

// Waits until everything enqueued on `stream` so far has run. Returns (and clears) an error a
// task on it reported. Counts a host synchronisation when work was enqueued on the stream since
// the host last waited for it.
cudaError_t drain_stream(cudaStream_t stream);
// The same for every stream of `device`, including its legacy default stream.
cudaError_t drain_device(int device);
bool stream_exists(cudaStream_t stream);

// Counters (emulator.h); the runtime's files add to them.
void count_launch();
void count_host_sync();
void count_malloc();
void count_copy(cudaMemcpyKind direction, size_t bytes);
void record_fault(const std::string& message);
// cudaGetErrorString(cudaErrorLaunchFailure): the real runtime's text, followed after a fault by
// "; cuda_emu: <the most recent fault>" (a pointer that stays valid).
const char* launch_failure_text();

// Checks the guard bytes behind every device allocation of `device`; returns "" or what changed.
std::string check_guards(int device);

// Host memory registered with the runtime (cudaHostAlloc / cudaMallocHost): pinned.
bool is_pinned_range(const void* p, size_t bytes);

}  // namespace mg_emu
