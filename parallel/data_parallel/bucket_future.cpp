// The bucket future (see bucket_future.h).
#include "parallel/data_parallel/bucket_future.h"

#include "base/error.h"
#include "core/grad_mode.h"

namespace mg::parallel {

BucketFuture BucketFuture::ready(Tensor value) { return after({}, std::move(value), 0); }

BucketFuture BucketFuture::after(std::vector<WorkPtr> works, Tensor value, int64_t bytes) {
  BucketFuture future;
  future.state_ = std::make_shared<State>();
  future.state_->works = std::move(works);
  future.state_->value = std::move(value);
  future.state_->bytes = bytes;
  return future;
}

BucketFuture& BucketFuture::then(std::function<BucketFuture(const Tensor&)> next) {
  MG_CHECK(state_ != nullptr, "BucketFuture::then on an empty future");
  state_->continuations.push_back(std::move(next));
  return *this;
}

Tensor BucketFuture::wait() {
  MG_CHECK(state_ != nullptr,
           "BucketFuture::wait on an empty future (a communication hook returned nothing)");
  State& s = *state_;
  NoGradGuard no_grad;  // continuations compute on gradients: nothing to record
  for (;;) {
    for (; s.waited < s.works.size(); ++s.waited) s.works[s.waited]->wait_on_device();
    if (s.continuations.empty()) return s.value;
    auto next = std::move(s.continuations.front());
    s.continuations.pop_front();
    BucketFuture step = next(s.value);
    MG_CHECK(step.defined(), "BucketFuture: a continuation returned an empty future");
    State& n = *step.state_;
    s.works.insert(s.works.end(), n.works.begin(), n.works.end());
    s.bytes += n.bytes;
    s.value = n.value;
    s.continuations.insert(s.continuations.begin(), n.continuations.begin(), n.continuations.end());
  }
}

const std::vector<WorkPtr>& BucketFuture::works() const {
  MG_CHECK(state_ != nullptr, "BucketFuture::works on an empty future");
  return state_->works;
}

int64_t BucketFuture::bytes() const { return state_ ? state_->bytes : 0; }

}  // namespace mg::parallel
