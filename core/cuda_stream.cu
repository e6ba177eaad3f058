// Streams, events, the current device and the error helpers (see core/cuda_stream.h
// and base/cuda_check.cuh).
//
// State: which logical device this thread works on (thread-local, set by
// DeviceGuard) and, per thread and logical device, its current stream. The
// default streams of virtual devices are created once per process.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <string>

#include "base/cuda_check.cuh"
#include "base/env.h"
#include "base/error.h"
#include "core/cuda_device_checks.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"

namespace mg::cuda {

// ---- errors ------------------------------------------------------------------------------------
namespace {
// "core/cuda_stream.cu" rather than the build machine's absolute path.
const char* short_file(const char* file) {
  std::string f(file);
  for (const char* root : {"/core/", "/kernels/", "/tests/", "/nn/", "/optim/", "/parallel/"}) {
    const size_t at = f.rfind(root);
    if (at != std::string::npos) return file + at + 1;
  }
  return file;
}

}  // namespace

void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear the sticky error so the next call starts clean
  // (Under emulation the runtime's message of a kernel fault also names the kernel, block and
  // thread that faulted, and why: cuda_emu/runtime_device.cpp.)
  throw Error(str_cat(short_file(file), ":", line, ": ", expr, " failed: ", cudaGetErrorName(err), " (",
                      cudaGetErrorString(err), ")"));
}

void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  throw Error(str_cat(short_file(file), ":", line, ": ", expr, " failed: ", cublasGetStatusName(status), " (",
                      cublasGetStatusString(status), ")"));
}

// ---- devices -----------------------------------------------------------------------------------
namespace {
constexpr int kMaxDevices = 64;

thread_local int t_current_device = 0;  // logical
thread_local std::array<void*, kMaxDevices> t_current_stream{};
thread_local std::array<bool, kMaxDevices> t_stream_set{};

void check_device(int device) {
  const int n = device_count();
  MG_CHECK(n > 0, "cuda:", device, ": no usable CUDA device (", describe_devices(), ")");
  MG_CHECK(device >= 0 && device < n && device < kMaxDevices, "cuda:", device,
           ": no such device (this process has ", n, " CUDA device", n == 1 ? "" : "s",
           virtual_gpus() ? ", virtual" : "", ")");
}
}  // namespace

int virtual_gpus() {
  static const int k = [] {
    // base/env.h: a bad value is an error naming the variable, not silently "off".
    return static_cast<int>(env::integer("MG_VIRTUAL_GPUS", 1, kMaxDevices, "logical GPUs").value_or(0));
  }();
  return k;
}

int physical_device(int device) {
  check_device(device);
  return virtual_gpus() ? 0 : device;
}

Stream default_stream(int device) {
  check_device(device);
  if (!virtual_gpus()) return Stream{nullptr, device};
  // One stream per virtual device, created once; non-blocking so that virtual
  // devices overlap like real ones would.
  static std::mutex mutex;
  static std::array<void*, kMaxDevices> streams{};
  std::lock_guard<std::mutex> lock(mutex);
  if (streams[device] == nullptr) {
    DeviceGuard guard(device);
    cudaStream_t s = nullptr;
    MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams[device] = s;
  }
  return Stream{streams[device], device};
}

Stream create_stream(int device) {
  DeviceGuard guard(device);
  cudaStream_t s = nullptr;
  MG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream{s, device};
}

Stream current_stream(int device) {
  check_device(device);
  if (!t_stream_set[device]) return default_stream(device);
  return Stream{t_current_stream[device], device};
}

void set_current_stream(Stream stream) {
  check_device(stream.device);
  t_current_stream[stream.device] = stream.handle;
  t_stream_set[stream.device] = true;
}

void synchronize(Stream stream) {
  DeviceGuard guard(stream.device);
  MG_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
  raise_device_check_errors();
}

void synchronize_device(int device) {
  DeviceGuard guard(device);
  MG_CUDA_CHECK(cudaDeviceSynchronize());
  raise_device_check_errors();
}

int current_device() { return t_current_device; }

DeviceGuard::DeviceGuard(int device) {
  const int physical = physical_device(device);
  int previous = 0;
  MG_CUDA_CHECK(cudaGetDevice(&previous));
  if (previous != physical) MG_CUDA_CHECK(cudaSetDevice(physical));
  previous_physical_ = previous;
  previous_logical_ = t_current_device;
  t_current_device = device;
}

DeviceGuard::~DeviceGuard() {
  t_current_device = previous_logical_;
  int now = 0;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_physical_) cudaSetDevice(previous_physical_);
}

StreamGuard::StreamGuard(Stream stream) : previous_(current_stream(stream.device)), device_(stream.device) {
  set_current_stream(stream);
}

StreamGuard::~StreamGuard() {
  t_current_stream[previous_.device] = previous_.handle;
  t_stream_set[previous_.device] = true;
}

// ---- events ------------------------------------------------------------------------------------
Event::Event(bool timing) : timing_(timing) {}

Event::~Event() {
  if (handle_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

void Event::record(Stream stream) {
  DeviceGuard guard(stream.device);
  if (handle_ == nullptr) {
    cudaEvent_t e = nullptr;
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing_ ? cudaEventDefault : cudaEventDisableTiming));
    handle_ = e;
    device_ = stream.device;
  }
  MG_CHECK(physical_device(stream.device) == physical_device(device_),
           "Event::record: the event belongs to cuda:", device_, " but the stream to cuda:", stream.device);
  MG_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(stream.handle)));
}

void Event::wait(Stream stream) const {
  if (handle_ == nullptr) return;  // never recorded: nothing to wait for (as in PyTorch)
  DeviceGuard guard(stream.device);
  MG_CUDA_CHECK(
      cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle), static_cast<cudaEvent_t>(handle_), 0));
}

bool Event::query() const {
  if (handle_ == nullptr) return true;
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  MG_CUDA_CHECK(err);
  return true;
}

void Event::synchronize() const {
  if (handle_ != nullptr) MG_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(handle_)));
}

float Event::elapsed_ms(const Event& end) const {
  MG_CHECK(timing_ && end.timing_, "Event::elapsed_ms: both events must be created with timing = true");
  MG_CHECK(handle_ != nullptr && end.handle_ != nullptr,
           "Event::elapsed_ms: both events must be recorded first");
  float ms = 0.0f;
  MG_CUDA_CHECK(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

}  // namespace mg::cuda
