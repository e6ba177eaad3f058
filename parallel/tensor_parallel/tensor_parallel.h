// Tensor parallelism (Megatron-LM's): one layer's weight split across the ranks of a group, each
// rank computing its slice of the layer, with exactly one all-reduce per pair of layers.
//
//   ColumnParallelLinear  W [out, in] split by rows (output features): rank r holds W_r
//                         [out/N, in] and b_r; y_r = x W_r^T + b_r is rank r's slice of y.
//   RowParallelLinear     W [out, in] split by columns (input features): rank r holds W_r
//                         [out, in/N]; y = sum_r x_r W_r^T + b, the sum an all-reduce.
//
//   A tensor-parallel MLP: x ─▶ f ─▶ Column(d → h) ─▶ ReLU ─▶ Row(h → d) ─▶ g ─▶ y
//                                    (h/N features per rank, no communication in between)
//
// The two conjugate functions make autograd do the right communication:
//   f = copy_to_tensor_parallel(x)       forward: identity     backward: all-reduce of dL/dx
//   g = reduce_from_tensor_parallel(y)   forward: all-reduce   backward: identity
// f's backward sums the input gradients each rank's slice contributes; g sums the partial
// products. Per MLP block and step: one all-reduce of the activations forward, one backward.
//
// Initialisation: every rank draws the FULL weight with the same seed (as a single-device
// nn::Linear would) and keeps its slice, so a tensor-parallel model built after manual_seed(s)
// equals the single-device model built after manual_seed(s):
// tests/parallel/tensor_parallel/test_tensor_parallel.cpp compares forward, gradients and 10 AdamW steps at 2
// and 4 ranks. Both layers can also be cut out of an existing nn::Linear (how the tensor-parallel GPT is
// built from a TinyGPT). Out/in features must divide by the group size. The collectives block (wait) inside
// forward and backward.
#pragma once

#include <cstdint>
#include <memory>

#include "nn/linear.h"
#include "nn/module.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// forward: x; backward: the gradient all-reduced (sum) over `group`.
Tensor copy_to_tensor_parallel(const Tensor& x, const ProcessGroup& group);
// forward: x all-reduced (sum) over `group`; backward: the gradient as it is.
Tensor reduce_from_tensor_parallel(const Tensor& x, const ProcessGroup& group);
// forward: every rank's x concatenated along the last dimension (rank order); backward: this
// rank's slice of the gradient.
Tensor gather_from_tensor_parallel(const Tensor& x, const ProcessGroup& group);

class ColumnParallelLinear : public nn::Module {
 public:
  // gather_output: all-gather y's slices into the full y (else each rank returns its slice,
  // ready for a RowParallelLinear).
  ColumnParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup group, bool bias = true,
                       bool gather_output = false);
  // This rank's rows of `full`. blocks > 1: the output features are that many stacked blocks
  // (3 for attention's q, k, v projection) and each rank keeps its slice of every block, so the
  // local output is [q_r, k_r, v_r]; each block must divide by the group size.
  ColumnParallelLinear(const nn::Linear& full, ProcessGroup group, bool gather_output = false,
                       int64_t blocks = 1);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Module> clone_empty() const override;
  std::string extra_repr() const override;

  const int64_t in_features, out_features, out_per_rank;
  const bool gather_output;
  const int64_t blocks;
  Tensor weight, bias;  // [out/N, in], [out/N]: this rank's rows

 private:
  ProcessGroup group_;
};

class RowParallelLinear : public nn::Module {
 public:
  // input_is_parallel: x is already this rank's slice of the input features (the output of a
  // ColumnParallelLinear); else each rank takes its slice of the full x.
  RowParallelLinear(int64_t in_features, int64_t out_features, ProcessGroup group, bool bias = true,
                    bool input_is_parallel = true);
  // This rank's columns of `full` (and its whole bias).
  RowParallelLinear(const nn::Linear& full, ProcessGroup group, bool input_is_parallel = true);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Module> clone_empty() const override;
  std::string extra_repr() const override;

  const int64_t in_features, out_features, in_per_rank;
  const bool input_is_parallel;
  Tensor weight, bias;  // [out, in/N]: this rank's columns; bias [out], whole, added after the sum

 private:
  ProcessGroup group_;
};

// Linear(d, hidden) -> ReLU -> Linear(hidden, d), split Megatron-style: hidden/N per rank.
// Equals nn::MLP(d, {hidden}, d) built after the same manual_seed.
class TensorParallelMLP : public nn::Module {
 public:
  TensorParallelMLP(int64_t features, int64_t hidden, ProcessGroup group);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Module> clone_empty() const override;

  const int64_t features, hidden;
  std::shared_ptr<ColumnParallelLinear> up;
  std::shared_ptr<RowParallelLinear> down;

 private:
  ProcessGroup group_;
};

}  // namespace mg::parallel
