// Work: the handle an asynchronous collective returns (c10d's Work).
//
//   auto work = pg.allreduce(grad);   // posted; returns at once
//   ...                               // compute overlaps the communication
//   work->wait();                     // blocks until done; throws the op's error, if any
//
// A Work is completed exactly once, by the backend's progress thread, either with success or
// with an error message (a peer failed, the op timed out, the ranks' calls did not match).
// wait() rethrows that message as an mg::Error on the waiting thread. Callbacks registered with
// then() run on the progress thread right after completion: DDP uses one to time a bucket.
//
// Ops that finish on a GPU (the NCCL backend) also set a wait hook: after a successful wait()
// it runs on the waiting thread and makes that thread's current CUDA stream wait for the op,
// so kernels queued after wait() are ordered after the communication on the device too.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace mg::parallel {

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)) {}

  // Blocks until the op has completed; throws mg::Error with the op's failure.
  void wait();
  // For ops that finish on a GPU (the NCCL backend): orders the calling thread's current CUDA
  // stream after the op and returns without blocking the host -- what PyTorch's Work.wait() does
  // for NCCL. A failure already known is thrown; a later one (a timeout) reaches the backend's
  // watchdog, which fails the group's next calls. Ops that finish on the host: wait().
  void wait_on_device();
  bool completes_on_device() const { return static_cast<bool>(wait_hook_); }
  // How many times, in this process, a host thread blocked in wait() for an op that finishes on
  // a GPU (tests check that a DDP step makes none).
  static int64_t host_waits_for_device_ops();
  // Non-blocking: true once the op has finished (successfully or not).
  bool is_completed() const;
  // True when the op finished with an error (only meaningful once completed).
  bool failed() const;
  // True when it failed because the ranks' calls did not match (verify_collectives): every rank
  // failed the same op without running it, so the group is still in step and usable.
  bool failed_by_mismatch() const;
  // "allreduce(sum) f32[1048576] #17": what this op is, for error messages.
  const std::string& description() const { return description_; }
  // Runs fn(*this) once the op has completed successfully (at once if it already has); fn runs
  // on the progress thread, so it must be short and must not call back into the group.
  void then(std::function<void()> fn);

  // ---- for ProcessGroup: the flight recorder's entry for this op (flight_recorder.h) ----
  // Its transitions so far are replayed into the entry; later ones update it as they happen.
  void attach_flight_record(int64_t id);

  // ---- for backends ----
  // Runs on the waiting thread at the end of every successful wait(); set it before handing the
  // Work out (it is not synchronised with a concurrent wait()).
  void set_wait_hook(std::function<void()> hook) { wait_hook_ = std::move(hook); }
  // The op has begun to talk to its peers (for the flight recorder: queued -> started).
  void mark_started();
  void mark_completed();
  void mark_failed(const std::string& message);
  // Fails it as a mismatch of the ranks' calls (failed_by_mismatch()), not a broken group.
  void mark_mismatched(const std::string& message);

 private:
  void fail(const std::string& message, bool mismatch);

  std::string description_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::string error_;
  bool mismatch_ = false;
  std::vector<std::function<void()>> callbacks_;
  std::function<void()> wait_hook_;
  int64_t flight_id_ = -1;  // the flight recorder's entry (-1: none)
  int64_t started_ns_ = 0;  // when mark_started ran (the recorder's clock; 0: not yet)
  int64_t finished_ns_ = 0;
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that is already complete (world size 1, zero elements).
WorkPtr completed_work(const std::string& description);

}  // namespace mg::parallel
