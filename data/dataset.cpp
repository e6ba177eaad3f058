// Dataset's default batch path (stack get()) and TensorDataset.
#include "data/dataset.h"

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::data {

void check_index(const char* who, int64_t index, int64_t size) {
  MG_CHECK(index >= 0 && index < size, who, ": index ", index, " is out of range [0, ", size, ")");
}

Batch stack_examples(const std::vector<Example>& examples) {
  MG_CHECK(!examples.empty(), "stack_examples: no examples (a batch needs at least one sample)");
  std::vector<Tensor> data, targets;
  data.reserve(examples.size());
  targets.reserve(examples.size());
  const Example& first = examples.front();
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    MG_CHECK(e.data.defined() && e.target.defined(), "stack_examples: sample ", i, " of the batch is empty");
    MG_CHECK(e.data.shape() == first.data.shape() && e.data.dtype() == first.data.dtype(),
             "stack_examples: sample ", i, " of the batch has data ", shape_str(e.data.shape()), " ",
             e.data.dtype(), " but sample 0 has ", shape_str(first.data.shape()), " ", first.data.dtype(),
             " (samples of a batch must match)");
    MG_CHECK(e.target.shape() == first.target.shape() && e.target.dtype() == first.target.dtype(),
             "stack_examples: sample ", i, " of the batch has target ", shape_str(e.target.shape()), " ",
             e.target.dtype(), " but sample 0 has ", shape_str(first.target.shape()), " ",
             first.target.dtype());
    data.push_back(e.data);
    targets.push_back(e.target);
  }
  NoGradGuard no_grad;  // batching is data movement, never part of a model's graph
  return Batch{stack(data, 0), stack(targets, 0)};
}

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<Example> examples;
  examples.reserve(indices.size());
  for (int64_t index : indices) examples.push_back(get(index));
  return stack_examples(examples);
}

TensorDataset::TensorDataset(Tensor data, Tensor targets) : data_(data.detach()), targets_(targets.detach()) {
  MG_CHECK(data_.defined() && targets_.defined(), "TensorDataset: data and targets must be defined tensors");
  MG_CHECK(data_.dim() >= 1 && targets_.dim() >= 1, "TensorDataset: data ", shape_str(data_.shape()),
           " and targets ", shape_str(targets_.shape()), " both need a leading sample dim");
  MG_CHECK(data_.size(0) == targets_.size(0), "TensorDataset: data has ", data_.size(0), " samples (shape ",
           shape_str(data_.shape()), ") but targets has ", targets_.size(0), " (shape ",
           shape_str(targets_.shape()), ")");
}

Example TensorDataset::get(int64_t index) const {
  check_index("TensorDataset::get", index, size());
  return Example{data_.select(0, index), targets_.select(0, index)};
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  for (int64_t index : indices) check_index("TensorDataset::get_batch", index, size());
  NoGradGuard no_grad;
  Tensor idx = tensor<int64_t>(indices, TensorOptions{DType::i64, data_.device()});
  Tensor target_idx = targets_.device() == data_.device() ? idx : idx.to(targets_.device());
  return Batch{index_select(data_, 0, idx), index_select(targets_, 0, target_idx)};
}

}  // namespace mg::data
