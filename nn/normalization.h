// Normalisation layers.
//
// BatchNorm1d ([N, C] or [N, C, L]) and BatchNorm2d ([N, C, H, W]) normalise each
// channel c over every other dim:
//
//   y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c
//
//   train(): mean_c, var_c are the batch's (var biased, i.e. divided by n), and the
//            buffers follow them:  running = (1 - momentum) * running + momentum * batch
//            (running_var takes the *unbiased* batch variance, n / (n - 1) * var_c);
//            num_batches_tracked counts the updates.
//   eval():  mean_c, var_c are running_mean, running_var.
//
// SyncBatchNorm is a BatchNorm whose training statistics span a process group
// (set_statistics_all_reduce, parallel::convert_sync_batchnorm).
//
// Composed from mean / var / rsqrt ops, so autograd differentiates it (no fused kernel).
//
// LayerNorm normalises over the trailing `normalized_shape` dims of each sample
// (the fused mg::layer_norm kernel), with an elementwise affine weight and bias.
#pragma once

#include <functional>
#include <vector>

#include "nn/module.h"

namespace mg::nn {

struct BatchNormOptions {
  double eps = 1e-5;
  double momentum = 0.1;
  bool affine = true;  // learnable weight (ones) and bias (zeros)
};

// Sums a BatchNorm's per-channel statistics over the devices of a group, differentiably
// (forward: all-reduce; backward: all-reduce of the gradient). Installed by
// parallel::convert_sync_batchnorm (SyncBatchNorm); empty, the default: this device's batch alone.
using BatchStatisticsAllReduce = std::function<Tensor(const Tensor& local)>;

// The shared implementation; BatchNorm1d / BatchNorm2d only fix the accepted ranks.
class BatchNorm : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  // SyncBatchNorm: in train(), the batch statistics become those of every device's batch together
  // (count, sum and sum of squares per channel all-reduced in f64; the gradient's two reductions
  // come from the all-reduce's backward). eval() stays local: no collective, so an evaluation
  // loop over uneven shards cannot hang.
  void set_statistics_all_reduce(BatchStatisticsAllReduce all_reduce) { all_reduce_ = std::move(all_reduce); }
  bool synchronizes_statistics() const { return static_cast<bool>(all_reduce_); }

  const int64_t num_features;
  const BatchNormOptions options;
  Tensor weight, bias;                                    // [C] (when affine)
  Tensor running_mean, running_var, num_batches_tracked;  // [C], [C], [] i64

 protected:
  BatchNorm(int64_t num_features, BatchNormOptions options, int64_t min_dim, int64_t max_dim);

 private:
  void update_running_stats(const Tensor& batch_mean, const Tensor& batch_var, int64_t count);
  Tensor forward_synchronized(const Tensor& x, const std::vector<int64_t>& dims, const Shape& stat_shape);
  const int64_t min_dim_, max_dim_;
  BatchStatisticsAllReduce all_reduce_;
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, BatchNormOptions options = {})
      : BatchNorm(num_features, options, 2, 3) {}
  std::shared_ptr<Module> clone_empty() const override;
};

class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, BatchNormOptions options = {})
      : BatchNorm(num_features, options, 4, 4) {}
  std::shared_ptr<Module> clone_empty() const override;
};

class LayerNorm : public Module {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  explicit LayerNorm(int64_t normalized_size, double eps = 1e-5, bool elementwise_affine = true)
      : LayerNorm(Shape{normalized_size}, eps, elementwise_affine) {}
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;

  const Shape normalized_shape;
  const double eps;
  Tensor weight, bias;  // normalized_shape (when elementwise_affine)
};

}  // namespace mg::nn
