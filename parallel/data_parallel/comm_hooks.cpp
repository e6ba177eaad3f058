// DDP communication hooks: the built-in hooks (see comm_hooks.h).
#include "parallel/data_parallel/comm_hooks.h"

#include "base/error.h"
#include "core/grad_mode.h"

namespace mg::parallel {

Tensor GradBucket::gradient(size_t i) const {
  MG_CHECK(i < parameters.size(), "GradBucket::gradient: member ", i, " of a bucket of ", parameters.size());
  const Tensor& param = parameters[i];
  return buffer.narrow(0, offsets[i], param.numel()).view(param.shape());
}

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
