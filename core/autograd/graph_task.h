// What one backward pass keeps while it runs, and the steps every pass takes at a node.
//
// Shared by the engine (engine.cpp: backward) and the zero-bubble split (split_backward.cpp:
// backward_input and DeferredWeightGrad::run). Not part of the public API: the engine's two files
// include it, nothing else.
#pragma once

#include <functional>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <vector>

#include "core/autograd/node.h"

namespace mg::autograd::detail {

struct GraphTask {
  std::unordered_map<Node*, int> dependencies;
  std::unordered_map<Node*, std::vector<Tensor>> input_buffers;
  std::vector<std::function<void()>> callbacks;
  std::mutex callbacks_mutex;  // hooks on several device threads may queue callbacks
};

// The pass this thread is running (nullptr outside backward); queue_callback appends to it.
GraphTask*& current_task();

// Makes `task` this thread's current pass for its lifetime. At the end, a pass nested in
// another (a checkpointed block's recompute) hands its callbacks to the outer pass; the outermost
// runs them (finish()).
class RunningTask {
 public:
  explicit RunningTask(GraphTask& task);
  ~RunningTask();
  RunningTask(const RunningTask&) = delete;
  RunningTask& operator=(const RunningTask&) = delete;
  // Runs the queued callbacks, or hands them to the outer pass.
  void finish();

 private:
  GraphTask& task_;
  GraphTask* outer_;
};

struct LaterFirst {
  bool operator()(const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) const {
    return a->sequence_nr < b->sequence_nr;
  }
};
using ReadyQueue = std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, LaterFirst>;

// Sums `grad` into slot `slot` of a node's input buffer.
void accumulate_into(std::vector<Tensor>& buffer, size_t slot, const Tensor& grad);
// The tensor hooks registered on the node's outputs (Tensor::register_hook).
void run_pre_hooks(Node& node, std::vector<Tensor>& grads);
// Fills the output gradients that did not arrive with zeros; false if none arrived at all.
bool materialize_missing_grads(const Node& node, std::vector<Tensor>& grads);
// Refuses a gradient whose shape or device is not its input's.
void check_gradient(const Node& node, size_t input, const Tensor& grad);
// The device whose thread runs `node`: where its incoming gradients live.
Device node_device(const Node& node);
// Seeds a pass: the root's edge, with its gradient (ones for a one-element root given none).
Edge seed_root(const Tensor& root, const Tensor& grad, size_t index, GraphTask& task, const char* who);

// Runs node.apply with only the inputs marked in `mask` wanted: needs_input_grad(i) answers from
// it while the formula runs (its size is the node's number of inputs). nullptr wants every input,
// also for a pass nested in a masked formula (a checkpointed block's recompute).
std::vector<Tensor> apply_masked(Node& node, std::vector<Tensor>&& grads, const std::vector<bool>* mask);

}  // namespace mg::autograd::detail
