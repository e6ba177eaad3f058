// The autograd graph.
//
// Every op that produces a tensor requiring grad creates a Node: the recipe for
// turning the gradient w.r.t. its outputs into gradients w.r.t. its inputs.
// A Node's `next_edges[i]` points at the Node that produced input i (or at the
// AccumulateGrad of a leaf), so the graph is walked from the loss backwards.
//
//   x (leaf) ──▶ mul ──▶ exp ──▶ sum ──▶ loss          forward (ops)
//   AccumulateGrad(x) ◀── MulBackward ◀── ExpBackward ◀── SumBackward   backward (nodes)
//
// See docs/autograd.md for a traced example.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg::autograd {

class Node;

// Where a gradient goes: input `input_nr` of `node`. An edge without a node means
// "this input does not need a gradient".
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool is_valid() const { return node != nullptr; }
};

// What a gradient flowing into a Node must look like (used to make zeros for
// outputs that received no gradient, and to check formulas' results).
struct TensorMeta {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  Node();
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Gradients w.r.t. outputs in, gradients w.r.t. inputs out (one per next edge;
  // an undefined Tensor means "no gradient for this input").
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Frees saved tensors after a backward that did not ask to retain the graph.
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  std::vector<TensorMeta> input_meta;   // shape/dtype/device of each input (same order as next_edges)
  std::vector<TensorMeta> output_meta;  // shape/dtype/device of each output
  // Hooks on the gradient of output `output_nr` (registered through Tensor::register_hook).
  std::vector<std::pair<uint32_t, Tensor::GradHook>> pre_hooks;
  // Creation order; backward runs later-created nodes first, so gradients reach
  // parameters in roughly reverse forward order (what DDP's buckets expect).
  uint64_t sequence_nr;
};

// Ends the graph at a leaf: adds the incoming gradient into leaf.grad, then runs
// the leaf's post-accumulate hooks.
class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return "AccumulateGrad"; }
  Tensor leaf() const { return Tensor(leaf_); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// A tensor saved for backward, with the storage version at the time it was saved.
// unpack() refuses if an in-place op has written to the memory since.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& tensor, std::string saved_by);
  Tensor unpack() const;
  bool defined() const { return data_.defined(); }
  void reset() { data_ = Tensor(); }

 private:
  Tensor data_;  // detached alias: saving must not keep a reference cycle through grad_fn
  uint64_t version_ = 0;
  std::string saved_by_;
};

// The Node most ops use: the backward formula is a function of the output
// gradients; it captures the SavedTensors it needs.
class FunctionNode : public Node {
 public:
  using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;
  FunctionNode(std::string name, Backward backward)
      : name_(std::move(name)), backward_(std::move(backward)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::string name() const override { return name_; }
  void release_saved() override { backward_ = nullptr; }

 private:
  std::string name_;
  Backward backward_;
};

// ---- helpers ops use to record history ----

// True when grad mode is on and any input requires grad.
bool any_requires_grad(const std::vector<Tensor>& inputs);
// The edge a gradient for `t` should follow: its grad_fn, or its leaf accumulator.
Edge gradient_edge(const Tensor& t);
// Returns the leaf's AccumulateGrad (creating and caching it weakly).
std::shared_ptr<Node> grad_accumulator(const Tensor& leaf);
// Creates a FunctionNode named `name` over `inputs` and makes it the grad_fn of
// every tensor in `outputs` (which become non-leaves that require grad).
std::shared_ptr<Node> record(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, FunctionNode::Backward backward);

// ---- the engine ----

// Runs backward from `roots` seeded with `grads` (same length; an undefined grad is
// allowed only for one-element roots and means 1).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph = false);
// Whether the formula now running must compute the gradient of its input `input`. Always true,
// except inside the zero-bubble split (split_backward.h), which asks a node for its input
// gradients and its weight gradients at different times: a formula with an expensive gradient
// per input (a matmul's two GEMMs) asks this and skips what is not wanted; one that does not ask
// computes everything and the engine drops what was not wanted.
bool needs_input_grad(size_t input);
// Queues `callback` to run once the current backward pass has finished every node.
// Only valid while a backward is running (e.g. from a hook); DDP's finalize uses it.
void queue_callback(std::function<void()> callback);
// True while this thread is inside backward().
bool in_backward();

}  // namespace mg::autograd
