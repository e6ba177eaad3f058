// The deferred device checks of core/cuda_device_checks.h: a list of (pinned copy, event,
// verdict), drained at host synchronisation points.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "core/cuda_device_checks.h"

#include <memory>
#include <mutex>
#include <vector>

#include <cuda_runtime.h>

#include "base/cuda_check.cuh"
#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"

namespace mg::cuda {
namespace {

struct PendingCheck {
  void* host_words = nullptr;  // pinned: the device can write it while the host runs on
  size_t nbytes = 0;
  int device = 0;
  std::unique_ptr<Event> copied;
  DeviceCheckVerdict verdict;
};

std::mutex g_mutex;
std::vector<PendingCheck> g_pending;
// Events of finished checks, by device, for the next ones: a check per training step must not
// create and destroy a CUDA event every time (the pinned words come from the pinned pool).
std::vector<std::pair<int, std::unique_ptr<Event>>> g_spare_events;

std::unique_ptr<Event> spare_event(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (auto it = g_spare_events.begin(); it != g_spare_events.end(); ++it) {
    if (it->first != device) continue;
    std::unique_ptr<Event> event = std::move(it->second);
    g_spare_events.erase(it);
    return event;
  }
  return std::make_unique<Event>();
}

}  // namespace

void defer_device_check(int device, const void* device_words, size_t nbytes, DeviceCheckVerdict verdict) {
  PendingCheck check;
  check.host_words = pinned_allocate(nbytes);
  check.nbytes = nbytes;
  check.verdict = std::move(verdict);
  check.device = device;
  check.copied = spare_event(device);
  DeviceGuard guard(device);
  const Stream stream = current_stream(device);
  MG_CUDA_CHECK(cudaMemcpyAsync(check.host_words, device_words, nbytes, cudaMemcpyDeviceToHost,
                                static_cast<cudaStream_t>(stream.handle)));
  check.copied->record(stream);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_pending.push_back(std::move(check));
}

void raise_device_check_errors() {
  std::vector<PendingCheck> landed;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_pending.empty()) return;
    std::vector<PendingCheck> waiting;
    for (PendingCheck& check : g_pending)
      (check.copied->query() ? landed : waiting).push_back(std::move(check));
    g_pending = std::move(waiting);
  }
  std::string first_error;
  for (PendingCheck& check : landed) {
    std::string error = check.verdict(check.host_words);
    pinned_free(check.host_words, check.nbytes);
    if (first_error.empty()) first_error = std::move(error);
  }
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (PendingCheck& check : landed) g_spare_events.emplace_back(check.device, std::move(check.copied));
  }
  if (!first_error.empty()) throw Error(first_error);
}

size_t pending_device_checks() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_pending.size();
}

}  // namespace mg::cuda
