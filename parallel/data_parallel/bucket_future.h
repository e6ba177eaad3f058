// BucketFuture: a gradient bucket being averaged -- the collectives launched for it, the tensor
// that holds the result once they finish, and what to run after them. DDP's Reducer keeps one per
// bucket between launching it (during backward) and waiting for it (at the end of backward); a
// communication hook (comm_hooks.h) returns one, chaining continuations with then() when it needs
// collectives in sequence (PowerSGD: P, then Q). Waiting runs them in order on the waiting
// thread; on a GPU the wait is the stream's (Work::wait_on_device), so the host does not block.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/work.h"

namespace mg::parallel {

// The averaged bucket, once the collectives a hook launched have finished.
class BucketFuture {
 public:
  BucketFuture() = default;
  // Complete now: `value` is the result.
  static BucketFuture ready(Tensor value);
  // `value` is the result once every op in `works` has completed; `bytes` is what they
  // all-reduced (the size of the tensors sent, as ReducerStats::bytes counts).
  static BucketFuture after(std::vector<WorkPtr> works, Tensor value, int64_t bytes);
  // Runs `next` with this future's value once its ops have completed (on the waiting thread);
  // the future `next` returns (it may launch more collectives) continues the chain.
  // Returns this future (copies share one chain).
  BucketFuture& then(std::function<BucketFuture(const Tensor&)> next);

  // Waits for every op (on a GPU: orders the current stream after them) and runs the
  // continuations; returns the final value. Throws the first failed op's error.
  Tensor wait();
  bool defined() const { return state_ != nullptr; }
  // Every op launched so far, in launch order (grows while wait() runs continuations).
  const std::vector<WorkPtr>& works() const;
  // Bytes all-reduced so far (complete after wait()).
  int64_t bytes() const;

 private:
  struct State {
    std::vector<WorkPtr> works;
    size_t waited = 0;  // works[0, waited) already waited for
    Tensor value;
    int64_t bytes = 0;
    std::deque<std::function<BucketFuture(const Tensor&)>> continuations;
  };
  std::shared_ptr<State> state_;
};

}  // namespace mg::parallel
