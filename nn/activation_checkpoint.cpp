#include "nn/activation_checkpoint.h"

#include <utility>

#include "core/autocast.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/random.h"

namespace mg::nn {
namespace {

// What the backward needs to run the segment again: the function, its inputs as they were,
// and the random and autocast state its forward saw.
struct Segment {
  CheckpointFunction fn;
  // The inputs as saved tensors: detached (no reference cycle through grad_fn), and refused at
  // recompute time if an in-place op has written to them since (the recompute would differ).
  std::vector<autograd::SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  GeneratorState rng;
  AutocastState autocast;
};

// The backward of a checkpointed segment: recompute with history, then backpropagate the
// incoming gradients through the recomputed graph. Parameters receive theirs through their
// own AccumulateGrad; the segment's inputs are leaves of the inner graph, and their .grad
// becomes this node's result.
std::vector<Tensor> recompute_and_backward(const Segment& segment, const std::vector<Tensor>& grad_outputs) {
  std::vector<Tensor> leaves;
  leaves.reserve(segment.inputs.size());
  for (size_t i = 0; i < segment.inputs.size(); ++i) {
    Tensor leaf = segment.inputs[i].defined() ? segment.inputs[i].unpack().detach() : Tensor();
    if (leaf.defined() && segment.input_requires_grad[i]) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }
  std::vector<Tensor> outputs;
  {
    AutoGradMode record(true);
    AutocastGuard autocast(segment.autocast.dtype, segment.autocast.enabled);
    GeneratorReplayGuard replay(segment.rng);
    outputs = segment.fn(leaves);
  }
  MG_CHECK(outputs.size() == grad_outputs.size(), "checkpoint: the recomputed forward returned ",
           outputs.size(), " tensors, the original ", grad_outputs.size(),
           " (a segment must be deterministic in its structure)");
  std::vector<Tensor> roots, grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined() || !outputs[i].requires_grad() || !grad_outputs[i].defined()) continue;
    roots.push_back(outputs[i]);
    grads.push_back(grad_outputs[i]);
  }
  if (!roots.empty()) autograd::backward(roots, grads);
  std::vector<Tensor> input_grads;
  input_grads.reserve(leaves.size());
  for (size_t i = 0; i < leaves.size(); ++i) {
    input_grads.push_back(leaves[i].defined() && segment.input_requires_grad[i] ? leaves[i].grad()
                                                                                : Tensor());
  }
  return input_grads;
}

}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs) {
  MG_CHECK(static_cast<bool>(fn), "checkpoint: the function is empty");
  if (!GradMode::is_enabled()) return fn(inputs);

  auto segment = std::make_shared<Segment>();
  segment->fn = fn;
  segment->rng = generator_state();
  segment->autocast = autocast_state();
  for (const Tensor& input : inputs) {
    segment->inputs.push_back(input.defined() ? autograd::SavedTensor(input, "checkpoint")
                                              : autograd::SavedTensor());
    segment->input_requires_grad.push_back(input.defined() && input.requires_grad());
  }

  std::vector<Tensor> outputs;
  {
    NoGradGuard no_history;  // the segment's intermediates die as soon as they are read
    outputs = fn(inputs);
  }
  // Fresh aliases, so recording below never rewrites the history of a tensor fn returned
  // unchanged (an input, or a tensor fn keeps elsewhere). Only floating outputs can carry a
  // gradient back.
  for (Tensor& output : outputs) {
    MG_CHECK(output.defined(), "checkpoint: the segment returned an undefined tensor");
    MG_CHECK(is_floating(output.dtype()),
             "checkpoint: every output of a checkpointed segment must be floating "
             "point, got ",
             dtype_name(output.dtype()));
    output = output.detach();
  }
  autograd::record("CheckpointBackward", inputs, outputs, [segment](const std::vector<Tensor>& grad_outputs) {
    return recompute_and_backward(*segment, grad_outputs);
  });
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  MG_CHECK(static_cast<bool>(fn), "checkpoint: the function is empty");
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    std::vector<Tensor>{input})[0];
}

CheckpointWrapper::CheckpointWrapper(std::shared_ptr<Module> module) : module_(std::move(module)) {
  MG_CHECK(module_ != nullptr, "CheckpointWrapper: the module is null");
  register_module("module", module_);
}

Tensor checkpoint_module(Module& module, const Tensor& x) {
  Module* inner = &module;
  return checkpoint(
      [inner](const Tensor& input) {
        // Through operator(), so forward hooks run (FSDP gathers the unit for the recompute).
        if (!autograd::in_backward()) return (*inner)(input);
        // The recompute: run with the buffers' values saved, then put them back.
        std::vector<std::pair<Tensor*, Tensor>> saved;
        for (const auto& [name, slot] : inner->named_buffer_slots()) saved.emplace_back(slot, slot->clone());
        Tensor out = (*inner)(input);
        NoGradGuard no_history;
        for (auto& [slot, value] : saved) slot->copy_(value);
        return out;
      },
      x);
}

Tensor CheckpointWrapper::forward(const Tensor& x) { return checkpoint_module(*module_, x); }

std::shared_ptr<Module> CheckpointWrapper::clone_empty() const {
  return std::make_shared<CheckpointWrapper>(module_->clone_empty());
}

std::shared_ptr<CheckpointWrapper> checkpoint_wrapper(std::shared_ptr<Module> module) {
  return std::make_shared<CheckpointWrapper>(std::move(module));
}

}  // namespace mg::nn
