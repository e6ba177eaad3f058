// SyncBatchNorm: BatchNorm whose training statistics span every rank of a process group
// (PyTorch's torch.nn.SyncBatchNorm and SyncBatchNorm.convert_sync_batchnorm).
//
// With DDP each rank normalises its own share of the global batch. When that share is small
// (a few images per GPU for detection or segmentation) its mean and variance are noisy, and the
// model trains worse than on one device with the whole batch. SyncBatchNorm computes them over
// the whole batch:
//
//   forward (train)   per channel: count, sum, sum of squares of this rank's share  ──all-reduce──▶
//                     mean = sum / count, var = sumsq / count - mean^2 of the global batch
//   backward          the gradients of the global sums all-reduced (the two per-channel
//                     reductions of dL/dy that BatchNorm's backward needs), by autograd
//   eval              running statistics, purely local: no collective, so an evaluation loop over
//                     uneven shards (one rank with a batch more) cannot hang
//
// One all-reduce of 2C + 1 f64 values per layer in forward and one in backward, blocking. Per-rank
// batches may differ in size (the counts are summed). The running statistics are updated from the
// global batch, so they stay equal on every rank.
//
//   parallel::convert_sync_batchnorm(model, pg);                // every BatchNorm in the model
//   parallel::DistributedDataParallel ddp(model, pg);
//
// Every rank must run the same BatchNorm layers in the same order in training (a collective per
// layer); the group's timeout and the heartbeat turn a rank that does not into an error.
#pragma once

#include "nn/module.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// Makes every nn::BatchNorm in `module` (itself included) synchronise its training statistics
// over `group`. Returns how many layers it converted. The module is changed in place; its
// parameters, buffers and state dict are those of the plain model.
int convert_sync_batchnorm(nn::Module& module, const ProcessGroup& group);

// forward: the sum over the group's ranks of `x`; backward: the sum over the ranks of the
// gradient (the derivative of a sum every rank uses). Blocking.
Tensor all_reduce_with_gradient(const Tensor& x, const ProcessGroup& group);

}  // namespace mg::parallel
