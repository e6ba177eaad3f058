// Activation checkpointing: trade compute for memory (PyTorch's torch.utils.checkpoint).
//
// A forward normally keeps every intermediate a backward formula will need: a linear's input, a
// GELU's input, a dropout's mask. For a deep model those activations, not the parameters, fill
// the device. A checkpointed segment runs its forward without recording history -- its
// intermediates are freed as soon as the next op has read them -- and keeps only its inputs.
// When backward reaches the segment, it runs the forward again, this time recording, and
// backpropagates through that fresh graph:
//
//   forward    x ──▶ [segment, no graph] ──▶ y          kept: x (and y, the next segment's input)
//   backward   dy ──▶ recompute y = segment(x) with graph ──▶ backward(y, dy) ──▶ dx, d(params)
//
// Cost: one more forward of the segment per step (about +1/3 of the step's FLOPs when every
// block is checkpointed). Saving: the segment's intermediates, for every segment but the one
// being recomputed.
//
// What makes the recompute equal the original:
//  * the random generator: the state at the original forward is saved and replayed on the
//    recomputing thread (GeneratorReplayGuard), so dropout draws the same masks, and the default
//    generator is left exactly where the original forward left it;
//  * autocast: the recompute runs under the autocast state of the original forward;
//  * grad mode: the recompute records even though backward formulas otherwise run without it.
// Gradients are therefore bitwise those of the model without checkpointing.
//
// Parameters inside the segment get their gradients from the inner backward, through their own
// AccumulateGrad and hooks -- so DDP's per-parameter hooks fire once per parameter per step, as
// without checkpointing, and the segment's inputs need not require grad (the first block of a
// model). Callbacks queued during the inner backward (DDP's finalize) run when the outer backward
// ends (core/autograd/engine.cpp).
//
// Not supported: a segment that modifies its inputs in place, and exact RNG replay when several
// threads draw from the default generator during the same forward (DataParallel's replicas with
// dropout): the replayed state is the one this thread saw at the segment's start.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace mg::nn {

using CheckpointFunction = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Runs fn(inputs) keeping only `inputs`; backward recomputes fn. Outside grad mode (evaluation
// under NoGradGuard) it is just fn(inputs).
std::vector<Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs);
// The one-tensor form: checkpoint([&](const Tensor& x) { return block(x); }, x).
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

// module.forward(x), checkpointed. The recompute leaves the module's buffers as the original
// forward left them, so BatchNorm's running statistics are updated once per step, not twice.
Tensor checkpoint_module(Module& module, const Tensor& x);

// A module whose forward is checkpointed: wrap a transformer block or a residual stage. Its
// parameters appear under "module." (as in PyTorch's checkpoint_wrapper before its state-dict
// hook strips the prefix); models that want their plain names call nn::checkpoint in forward
// instead (TinyGPT and ResNet do, with their checkpoint_activations option).
class CheckpointWrapper : public Module {
 public:
  explicit CheckpointWrapper(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;
  Module& wrapped() const { return *module_; }

 private:
  std::shared_ptr<Module> module_;
};

std::shared_ptr<CheckpointWrapper> checkpoint_wrapper(std::shared_ptr<Module> module);

}  // namespace mg::nn
