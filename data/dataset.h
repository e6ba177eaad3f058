// Dataset: "how many samples, and give me sample i" — the one thing a DataLoader needs.
//
// A dataset is random-access and read-only: get(i) may be called from several worker threads at
// once, so implementations must not mutate shared state in get()/get_batch() (read-only access to
// members is fine). Randomness (augmentation) does not live here: it lives in transforms, which the
// DataLoader seeds per sample from (seed, epoch, index), so a dataset stays a pure function of i.
//
// get_batch() is the fast path: the default stacks get(), but a dataset that keeps its samples in
// one array (FashionMNIST, TensorDataset, SyntheticClassification) fills the [B, ...] batch
// directly and skips B small tensors per batch.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace mg::data {

// One sample: its input and its label (or regression target).
struct Example {
  Tensor data;
  Tensor target;
};

// Several samples stacked along a new leading dim: data [B, ...], target [B, ...].
// An aggregate, so `auto& [x, y] = batch;` (and `for (auto& [x, y] : loader)`) work.
struct Batch {
  Tensor data;
  Tensor target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;

  // Number of samples; valid indices are [0, size()).
  virtual int64_t size() const = 0;
  // Sample `index`. Thread-safe; throws mg::Error for an index out of range.
  virtual Example get(int64_t index) const = 0;
  // The samples at `indices`, stacked. Thread-safe. The default calls get() for each index and
  // stacks the results (every sample must have the same shape and dtype).
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

// Throws mg::Error naming `who` unless 0 <= index < size.
void check_index(const char* who, int64_t index, int64_t size);

// Stacks examples into a batch; the error names the first sample whose shape/dtype differs.
Batch stack_examples(const std::vector<Example>& examples);

// A dataset over tensors already in memory: sample i is (data[i], targets[i]), both indexed along
// dim 0 (PyTorch's TensorDataset). The tensors are detached, so no autograd graph is recorded.
class TensorDataset : public Dataset {
 public:
  TensorDataset(Tensor data, Tensor targets);

  int64_t size() const override { return data_.size(0); }
  Example get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;  // one index_select each

  const Tensor& data() const { return data_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor data_;
  Tensor targets_;
};

}  // namespace mg::data
