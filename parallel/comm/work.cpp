// Work: completion, errors and callbacks of one asynchronous communication op (see work.h).
#include "parallel/comm/work.h"

#include <atomic>

#include "base/error.h"
#include "parallel/comm/flight_recorder.h"

namespace mg::parallel {

namespace {
std::atomic<int64_t> g_host_waits_for_device_ops{0};
}  // namespace

int64_t Work::host_waits_for_device_ops() { return g_host_waits_for_device_ops.load(); }

void Work::wait() {
  if (wait_hook_) g_host_waits_for_device_ops.fetch_add(1, std::memory_order_relaxed);
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [this] { return done_; });
    if (!error_.empty()) throw Error(error_);
  }
  if (wait_hook_) wait_hook_();
}

void Work::wait_on_device() {
  if (!wait_hook_) return wait();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_ && !error_.empty()) throw Error(error_);
  }
  wait_hook_();
}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool Work::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ && !error_.empty();
}

bool Work::failed_by_mismatch() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_ && mismatch_;
}

void Work::then(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_) {
      callbacks_.push_back(std::move(fn));
      return;
    }
    if (!error_.empty()) return;  // a failed op runs no callbacks; wait() reports the error
  }
  fn();
}

void Work::mark_completed() {
  // Callbacks run before waiters wake, so whatever they write is visible after wait(). A then()
  // that arrives while callbacks are running appends to the (emptied) list, so loop until the
  // list is empty under the lock, and only then publish done_.
  std::string callback_error;
  for (;;) {
    std::vector<std::function<void()>> callbacks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_) return;
      if (callbacks_.empty()) {
        done_ = true;
        error_ = callback_error;
        finished_ns_ = detail::flight_now_ns();
        detail::flight_finished(flight_id_, error_.empty(), finished_ns_, error_);
        break;
      }
      callbacks.swap(callbacks_);
    }
    for (auto& fn : callbacks) {
      try {
        fn();
      } catch (const std::exception& e) {
        if (callback_error.empty())
          callback_error = str_cat(description_, ": completion callback failed: ", e.what());
      }
    }
  }
  done_cv_.notify_all();
}

void Work::mark_failed(const std::string& message) { fail(message, /*mismatch=*/false); }

void Work::mark_mismatched(const std::string& message) { fail(message, /*mismatch=*/true); }

void Work::fail(const std::string& message, bool mismatch) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    done_ = true;
    mismatch_ = mismatch;
    error_ = message.empty() ? description_ + ": failed" : message;
    callbacks_.clear();
    finished_ns_ = detail::flight_now_ns();
    detail::flight_finished(flight_id_, false, finished_ns_, error_);
  }
  done_cv_.notify_all();
}

void Work::mark_started() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (started_ns_ != 0 || done_) return;
  started_ns_ = detail::flight_now_ns();
  detail::flight_started(flight_id_, started_ns_);
}

void Work::attach_flight_record(int64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  flight_id_ = id;
  if (id < 0) return;
  // An op that finished without a start of its own (a world of one, a refused call) started when it finished.
  if (started_ns_ != 0 || done_) detail::flight_started(id, started_ns_ != 0 ? started_ns_ : finished_ns_);
  if (done_) detail::flight_finished(id, error_.empty(), finished_ns_, error_);
}

WorkPtr completed_work(const std::string& description) {
  auto work = std::make_shared<Work>(description);
  work->mark_completed();
  return work;
}

}  // namespace mg::parallel
