// Checks a kernel answers on the device, whose verdict reaches the host without the host waiting
// for it -- PyTorch's device-side asserts, with a message instead of an abort.
//
//   kernel writes its findings into device words  ──▶  defer_device_check: an async copy of the
//   words into pinned memory on the same stream, and an event after it  ──▶  at the next host
//   synchronisation multigrad makes anyway (a copy to the host such as loss.item(), synchronize(),
//   synchronize_device()), raise_device_check_errors() runs the verdict of every check whose copy
//   has landed; a verdict that finds an error throws mg::Error there.
//
// So a training step pays no extra host wait for, say, cross_entropy's target check; a bad target
// is reported at the loss read of the same step, naming the row and the value. The error says it
// was found by an earlier call. Internal to the CUDA backend (no CUDA types in this header).
#pragma once

#include <cstddef>
#include <functional>
#include <string>

namespace mg::cuda {

// `verdict(host_words)` returns "" when the words report no error, else the error message.
using DeviceCheckVerdict = std::function<std::string(const void* host_words)>;

// Queues the copy of `nbytes` at `device_words` (device memory of `device`, written by work already
// queued on that device's current stream) and remembers `verdict` for it. Does not wait.
void defer_device_check(int device, const void* device_words, size_t nbytes, DeviceCheckVerdict verdict);

// Runs the verdicts of the deferred checks whose copies have completed (without waiting for the
// others) and throws the first error found. Called by the host synchronisation points.
void raise_device_check_errors();

// Deferred checks not run yet (tests).
size_t pending_device_checks();

}  // namespace mg::cuda
