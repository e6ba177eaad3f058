// DDP communication hooks (PyTorch's register_comm_hook): the Reducer hands each ready gradient
// bucket to a hook, and the hook decides how the bucket is averaged across ranks -- a plain
// all-reduce (the default), a compressed one (fp16 / bf16: half the bytes), or a low-rank
// approximation (PowerSGD, powersgd.h: a small fraction of them). Why hooks? On a slow link the
// all-reduce of full-precision gradients is the step's cost; trading a little precision for
// bytes is the user's call, per model, so it is a function the user passes, not an option.
//
//   auto state = std::make_shared<ProcessGroup>(pg);
//   ddp.register_comm_hook(state, fp16_compress_hook);   // before the first backward, at most once
//
// A hook receives the bucket (its flat buffer holds this rank's gradients, NOT yet averaged) and
// returns a BucketFuture: the collectives it launched and the tensor that will hold the averaged
// bucket once they finish. A hook that needs several collectives in sequence (PowerSGD: P, then
// Q) chains continuations with then(); they run on the thread that waits for the bucket (DDP's
// end-of-backward callback), in bucket order on every rank, so every rank issues the same
// collectives in the same order. On a GPU the wait is the stream's (Work::wait_on_device): the
// continuation's kernels queue behind the collective and the host does not block.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/bucket_future.h"

namespace mg::parallel {

// One bucket as a hook sees it.
struct GradBucket {
  size_t index = 0;                // position in the launch order (0 = first reduced)
  bool is_last = false;            // the last bucket of this backward pass (hooks counting steps use it)
  Tensor buffer;                   // flat, contiguous, one dtype: this rank's gradients, not averaged
  std::vector<Tensor> parameters;  // the members, in the bucket's order
  std::vector<int64_t> offsets;    // element offset of each member in `buffer`

  // Member i's gradient: its slot of `buffer`, viewed with its parameter's shape (writes go to
  // the bucket).
  Tensor gradient(size_t i) const;
};

// The hook, its state bound: DistributedDataParallel::register_comm_hook(state, fn) makes one.
using CommHook = std::function<BucketFuture(GradBucket& bucket)>;

// `tensor` all-reduced (sum) over `group`, asynchronously, as a future of `tensor` itself.
BucketFuture allreduce_future(ProcessGroup& group, Tensor& tensor);

// The built-in hooks; their state is the process group.
// The default: divide by the world size, all-reduce (bitwise what DDP does without a hook).
BucketFuture allreduce_hook(ProcessGroup& group, GradBucket& bucket);
// Divide by the world size, cast to f16 (or bf16), all-reduce the half-size copy, cast back into
// the bucket. f16 keeps 11 significant bits but overflows above 65504 and flushes below 6e-8;
// bf16 keeps f32's range with 8 bits. A bucket already in 16 bits is all-reduced as it is.
BucketFuture fp16_compress_hook(ProcessGroup& group, GradBucket& bucket);
BucketFuture bf16_compress_hook(ProcessGroup& group, GradBucket& bucket);

}  // namespace mg::parallel
