// mg::cuda device queries for builds without CUDA (see core/cuda_runtime.h).
// CMake leaves this file out of CUDA builds; the guard keeps it harmless if a
// build compiles it anyway.
#ifndef MG_HAS_CUDA

#include "base/error.h"
#include "core/cuda_allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"

namespace mg::cuda {

int device_count() noexcept { return 0; }

bool is_available() noexcept { return false; }

std::string describe_devices() { return "no CUDA device (multigrad was built without CUDA)"; }

bool built_with_cuda() noexcept { return false; }

// The rest of the CUDA runtime API: every call that would need a GPU says why it can't.
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(str_cat(what, ": multigrad was built without CUDA (configure with -DMG_CUDA=ON)"));
}
}  // namespace

void enable_backend() { no_cuda("mg::cuda::enable_backend"); }
bool backend_enabled() { return false; }
AllocatorStats memory_stats(int) { no_cuda("mg::cuda::memory_stats"); }
void reset_peak_memory_stats(int) { no_cuda("mg::cuda::reset_peak_memory_stats"); }
void empty_cache() {}
void record_stream(const Tensor&, Stream) { no_cuda("mg::cuda::record_stream"); }

int physical_device(int) { no_cuda("mg::cuda::physical_device"); }
int virtual_gpus() { return 0; }
int current_device() { return 0; }
Stream current_stream(int) { no_cuda("mg::cuda::current_stream"); }
Stream default_stream(int) { no_cuda("mg::cuda::default_stream"); }
Stream create_stream(int) { no_cuda("mg::cuda::create_stream"); }
void set_current_stream(Stream) { no_cuda("mg::cuda::set_current_stream"); }
void synchronize(Stream) { no_cuda("mg::cuda::synchronize"); }
void synchronize_device(int) { no_cuda("mg::cuda::synchronize_device"); }
DeviceGuard::DeviceGuard(int) { no_cuda("mg::cuda::DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;
StreamGuard::StreamGuard(Stream stream) : device_(stream.device) {}
StreamGuard::~StreamGuard() = default;
Event::Event(bool timing) : timing_(timing) {}
Event::~Event() = default;
void Event::record(Stream) { no_cuda("mg::cuda::Event::record"); }
void Event::wait(Stream) const { no_cuda("mg::cuda::Event::wait"); }
bool Event::query() const { return true; }
void Event::synchronize() const {}
float Event::elapsed_ms(const Event&) const { no_cuda("mg::cuda::Event::elapsed_ms"); }

}  // namespace mg::cuda

#endif  // MG_HAS_CUDA
