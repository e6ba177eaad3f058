// Gradient accumulation: train with a batch k times larger than fits in memory.
//
// Split the batch of B samples into k micro-batches of B/k and run forward and
// backward on each in turn WITHOUT zeroing gradients in between; the autograd
// engine adds each backward's gradient into .grad (AccumulateGrad). If each
// micro-batch's loss is its MEAN over B/k samples, scale it by 1/k:
//
//   grad of L_full = grad of (1/B) sum_{all samples} l_i
//                  = sum_{j=1..k} grad of ( (1/k) * (k/B) sum_{i in micro-batch j} l_i )
//                  = sum_{j=1..k} grad of ( L_j / k )        (L_j = mean loss of micro-batch j)
//
// so after k backward passes of L_j / k, .grad holds exactly the full-batch
// gradient (up to floating-point summation order), and one optimizer step on it
// is the full-batch step. Micro-batches of unequal size need weights
// n_j / B instead of 1 / k. Layers whose forward depends on the batch
// (BatchNorm's batch statistics) see micro-batches, so they are the one thing
// accumulation does not reproduce.
//
// GradAccumulator is the bookkeeping: it scales, calls backward, counts, and
// says when the k-th micro-batch is done. Clipping (on the summed gradient),
// step and zero_grad stay visible in the user's loop:
//
//   optim::GradAccumulator acc(4);                   // 4 micro-batches per step
//   for (auto& [x, y] : loader) {                   // loader yields micro-batches
//     // with DDP: skip the all-reduce until the last micro-batch (ddp.no_sync()
//     // while !acc.is_last_micro_batch())
//     if (acc.backward(nn::cross_entropy(net(x), y))) {
//       optim::clip_grad_norm_(net.parameters(), 1.0);
//       opt.step();
//       opt.zero_grad();
//     }
//   }
//
// tests/optim/test_grad_accumulation.cpp checks the identity above: k
// micro-batch backwards of L_j / k give the full-batch gradient.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace mg::optim {

class GradAccumulator {
 public:
  explicit GradAccumulator(int64_t micro_batches);

  // (loss / k).backward(); returns true when this was the k-th micro-batch of
  // the current step (then: clip, step, zero_grad), false otherwise.
  bool backward(const Tensor& loss);
  // Whether the NEXT backward() completes a step (DDP syncs only then).
  bool is_last_micro_batch() const { return count_ + 1 == micro_batches_; }
  int64_t micro_batches() const { return micro_batches_; }
  // Micro-batches already accumulated towards the current step (0..k-1).
  int64_t count() const { return count_; }

 private:
  int64_t micro_batches_;
  int64_t count_ = 0;
};

}  // namespace mg::optim
