// DDP communication hooks: the bucket future and the built-in hooks (see comm_hooks.h).
#include "parallel/data_parallel/comm_hooks.h"

#include "core/base/error.h"
#include "core/grad_mode.h"

namespace mg::parallel {

Tensor GradBucket::gradient(size_t i) const {
  MG_CHECK(i < parameters.size(), "GradBucket::gradient: member ", i, " of a bucket of ", parameters.size());
  const Tensor& param = parameters[i];
  return buffer.narrow(0, offsets[i], param.numel()).view(param.shape());
}

// ---- BucketFuture ---------------------------------------------------------------------------------

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

// ---- the built-in hooks ---------------------------------------------------------------------------

BucketFuture allreduce_future(ProcessGroup& group, Tensor& tensor) {
  WorkPtr work = group.allreduce(tensor, ReduceOp::Sum);
  return BucketFuture::after({work}, tensor, static_cast<int64_t>(tensor.nbytes()));
}

BucketFuture allreduce_hook(ProcessGroup& group, GradBucket& bucket) {
  {
    NoGradGuard no_grad;
    bucket.buffer.mul_(1.0 / group.size());  // the sum of the pre-divided buffers is the mean
  }
  return allreduce_future(group, bucket.buffer);
}

namespace {

BucketFuture compress_hook(ProcessGroup& group, GradBucket& bucket, DType wire) {
  const DType own = bucket.buffer.dtype();
  MG_CHECK(is_floating(own), "communication hook: a ", dtype_name(wire),
           " compression hook needs floating "
           "gradients, bucket ",
           bucket.index, " holds ", dtype_name(own));
  if (own == DType::f16 || own == DType::bf16) return allreduce_hook(group, bucket);  // nothing to gain
  Tensor compressed;
  {
    NoGradGuard no_grad;
    // Divide first, in full precision: the half-precision sum of N pre-divided values cannot
    // overflow where each value did not.
    bucket.buffer.mul_(1.0 / group.size());
    compressed = bucket.buffer.to(wire);
  }
  Tensor buffer = bucket.buffer;
  return allreduce_future(group, compressed).then([buffer](const Tensor& reduced) mutable {
    buffer.copy_(reduced);  // cast back into the bucket
    return BucketFuture::ready(buffer);
  });
}

}  // namespace

BucketFuture fp16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, DType::f16);
}

BucketFuture bf16_compress_hook(ProcessGroup& group, GradBucket& bucket) {
  return compress_hook(group, bucket, DType::bf16);
}

}  // namespace mg::parallel
