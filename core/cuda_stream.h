// mg::cuda streams, events and the current device: the runtime pieces every CUDA
// op needs, behind an interface with no CUDA headers (a stream is an opaque
// handle), so code that is not compiled by nvcc can include it.
//
// Devices. cuda:N is a *logical* device. Normally it is physical GPU N. With
// MG_VIRTUAL_GPUS=K (K >= 1) in the environment, cuda:0..K-1 all live on
// physical GPU 0, each with its own stream, so DataParallel's multi-device path
// can be exercised on one card. device_count() in core/cuda_runtime.h reports
// the logical count.
//
// Streams. Every logical device has a *current stream* per host thread; kernels
// and copies of a CUDA op are queued on the current stream of the tensor's
// device. It starts as the device's default stream (the legacy default stream
// on a physical device; a dedicated stream per virtual device) and is changed
// with StreamGuard. Ordering between streams is by Events (record on one,
// wait on the other), never by device-wide synchronisation.
//
// In a build without CUDA (or on a machine without a GPU) every function that
// would need the runtime throws mg::Error saying so.
#pragma once

#include <cstdint>

namespace mg::cuda {

// A CUDA stream of one logical device. `handle` is a cudaStream_t; nullptr is
// the legacy default stream.
struct Stream {
  void* handle = nullptr;
  int device = 0;  // logical index

  friend bool operator==(const Stream& a, const Stream& b) {
    return a.handle == b.handle && a.device == b.device;
  }
  friend bool operator!=(const Stream& a, const Stream& b) { return !(a == b); }
};

// The physical GPU that logical device `device` runs on (checks the index).
int physical_device(int device);
// The logical device this thread works on (the innermost DeviceGuard's; 0 by default).
int current_device();
// MG_VIRTUAL_GPUS, or 0 when the variable is unset.
int virtual_gpus();

// The stream new work for `device` goes to on this thread.
Stream current_stream(int device);
// The stream a device starts with (see the top of this file).
Stream default_stream(int device);
// A new non-blocking stream on `device`, owned by the process (never destroyed).
Stream create_stream(int device);
// Makes `stream` current for its device on this thread.
void set_current_stream(Stream stream);
// Waits until all work queued on `stream` has finished.
void synchronize(Stream stream);
// Waits until all work on the physical GPU behind `device` has finished.
void synchronize_device(int device);

// Makes `device` the CUDA runtime's current device for the scope (cudaSetDevice),
// and restores the previous one afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_physical_ = -1;
  int previous_logical_ = 0;
};

// Makes `stream` current for its device (and its device the runtime's current
// device) for the scope.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  DeviceGuard device_;
};

// A cudaEvent_t. record() marks a point in a stream; wait() makes another stream
// wait for that point without blocking the host. With `timing`, elapsed_ms
// between two recorded events is available.
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(Stream stream);
  void wait(Stream stream) const;  // `stream` waits for the last record()
  bool query() const;              // has the recorded work finished?
  void synchronize() const;        // host waits for the recorded work
  float elapsed_ms(const Event& end) const;

 private:
  void* handle_ = nullptr;  // cudaEvent_t, created lazily on first record()
  int device_ = -1;
  bool timing_ = false;
};

}  // namespace mg::cuda
