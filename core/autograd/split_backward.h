// The zero-bubble split of a backward pass (Qi et al., 2023, "Zero Bubble Pipeline Parallelism").
//
// A pipeline stage's backward does two jobs: the gradient w.r.t. the stage's input (B), which the
// previous stage is waiting for, and the gradients w.r.t. its weights (W), which nothing needs
// before the optimizer step. Run together, the previous stage waits for both. Split, B runs at
// once and W later, in time the stage would otherwise spend idle.
//
//   loss ◀─ Matmul2 ◀─ ReLU ◀─ Matmul1 ◀─ x          x: the stage's input (a leaf)
//             │                   │
//             ▼                   ▼
//             W2                  W1
//
//   backward_input(loss, x):   Matmul2 (dX only) → ReLU → Matmul1 (dX only) → x.grad
//   DeferredWeightGrad::run(): Matmul2 (dW only) → W2.grad, Matmul1 (dW only) → W1.grad
//
// backward_input walks only the nodes on a path from the roots to `inputs` (the B path). A node
// on it whose other edges lead elsewhere (a matmul's weight, an add's bias) is asked for the B
// path's gradients only (needs_input_grad) and remembered with its incoming gradients; so is
// every root the path does not reach. DeferredWeightGrad::run() later asks each remembered node
// for the rest and walks on from there to the leaves, as backward() would, hooks included.
// Together they accumulate what one backward() accumulates (tests/core/test_split_backward.cpp).
// The saved tensors W needs stay alive until run(); the others are freed by B.
#pragma once

#include <memory>
#include <vector>

#include "core/tensor.h"

namespace mg::autograd {

class Node;

// The weight-gradient half of a split backward: run() it once, later.
class DeferredWeightGrad {
 public:
  DeferredWeightGrad();
  ~DeferredWeightGrad();
  DeferredWeightGrad(DeferredWeightGrad&&) noexcept;
  DeferredWeightGrad& operator=(DeferredWeightGrad&&) noexcept;
  DeferredWeightGrad(const DeferredWeightGrad&) = delete;
  DeferredWeightGrad& operator=(const DeferredWeightGrad&) = delete;

  // Computes the deferred gradients and accumulates them into their leaves' .grad, running the
  // tensor, leaf and post-accumulate hooks and the callbacks they queue, as backward() would.
  // Once: a second call is an error. Dropping a DeferredWeightGrad without run() drops the
  // weight gradients (as never calling backward would).
  void run();
  bool pending() const { return state_ != nullptr; }
  // The nodes W starts from: those on the B path that also lead elsewhere, and the roots B never
  // reached.
  size_t num_deferred() const;

 private:
  friend DeferredWeightGrad backward_input(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                           const std::vector<Tensor>&, bool);
  struct State;
  std::unique_ptr<State> state_;
  bool ran_ = false;  // run() empties state_: this tells "already ran" from "never made"
};

// B: runs backward from `roots` seeded with `grads` (as backward()) along the paths that reach
// `inputs` only, accumulating their gradients into inputs[i].grad(). Every input must be a leaf
// that requires grad and that the roots' graph uses. `inputs` may be empty (a first pipeline stage,
// whose input is data): then everything waits for W. The graph must lie on one device.
DeferredWeightGrad backward_input(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor>& inputs, bool retain_graph = false);

}  // namespace mg::autograd
