// BatchNorm (composed from ops) and LayerNorm (the fused kernel).
#include "nn/normalization.h"

#include <cmath>

#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::nn {

// ---- BatchNorm ----
BatchNorm::BatchNorm(int64_t c, BatchNormOptions opts, int64_t min_dim, int64_t max_dim)
    : num_features(c), options(opts), min_dim_(min_dim), max_dim_(max_dim) {
  MG_CHECK(c > 0, type_name(), ": num_features must be positive, got ", c);
  MG_CHECK(opts.eps > 0 && opts.momentum >= 0 && opts.momentum <= 1, type_name(), ": eps ", opts.eps,
           " must be positive and momentum ", opts.momentum, " in [0, 1]");
  if (opts.affine) {
    weight = ones({c});
    bias = zeros({c});
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
  running_mean = zeros({c});
  running_var = ones({c});
  num_batches_tracked = zeros({}, TensorOptions{DType::i64});
  register_buffer("running_mean", running_mean);
  register_buffer("running_var", running_var);
  register_buffer("num_batches_tracked", num_batches_tracked);
}

Tensor BatchNorm::forward(const Tensor& x) {
  MG_CHECK(x.defined() && x.dim() >= min_dim_ && x.dim() <= max_dim_, type_name(), ": expected ",
           min_dim_ == max_dim_ ? str_cat(min_dim_, "-d") : str_cat(min_dim_, "-d or ", max_dim_, "-d"),
           " input [N, C, ...], got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  MG_CHECK(x.size(1) == num_features, type_name(), ": input ", shape_str(x.shape()), " has ", x.size(1),
           " channels, expected ", num_features);
  // Reduce over every dim but the channel dim; statistics broadcast as [1, C, 1, ...].
  std::vector<int64_t> dims{0};
  Shape stat_shape(x.dim(), 1);
  stat_shape[1] = num_features;
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);

  if (is_training() && all_reduce_) return forward_synchronized(x, dims, stat_shape);

  // f32/f64 on the CPU: one fused kernel (2 memory passes forward, 2 backward, against ~6 and ~12
  // for the composed ops below, which serve every other dtype and device).
  if (x.device().is_cpu() && (x.dtype() == DType::f32 || x.dtype() == DType::f64)) {
    Tensor batch_mean, batch_var;
    Tensor y = batch_norm(x, options.affine ? weight : Tensor(), options.affine ? bias : Tensor(),
                          running_mean, running_var, is_training(), options.eps, &batch_mean, &batch_var);
    if (is_training()) update_running_stats(batch_mean, batch_var, x.numel() / num_features);
    return y;
  }

  Tensor mu, variance;
  if (is_training()) {
    const int64_t n = x.numel() / num_features;
    MG_CHECK(n > 1, type_name(), ": training needs more than one value per channel, got input ",
             shape_str(x.shape()));
    mu = mean(x, dims, /*keepdim=*/true);
    variance = var(x, dims, /*correction=*/0, /*keepdim=*/true);
    update_running_stats(mu.reshape({num_features}), variance.reshape({num_features}), n);
  } else {
    mu = running_mean.reshape(stat_shape);
    variance = running_var.reshape(stat_shape);
  }
  Tensor y = mul(sub(x, mu), rsqrt(add(variance, options.eps)));
  if (options.affine) y = add(mul(y, weight.reshape(stat_shape)), bias.reshape(stat_shape));
  return y;
}

// Every device's batch normalised with the statistics of all of them. Per channel, this device's
// sum and sum of squares (in f64: var = E[x^2] - mean^2 cancels badly in f32) and its count go
// into one [2C + 1] vector, all-reduced. The all-reduce is differentiable, so autograd produces
// SyncBatchNorm's backward: the gradients of the global sums -- the two per-channel reductions
// of the gradient -- are all-reduced in the all-reduce's backward.
Tensor BatchNorm::forward_synchronized(const Tensor& x, const std::vector<int64_t>& dims,
                                       const Shape& stat_shape) {
  const int64_t c = num_features;
  const Tensor xd = x.to(DType::f64);
  const Tensor local =
      cat({sum(xd, dims), sum(mul(xd, xd), dims),
           full({1}, static_cast<double>(x.numel() / c), TensorOptions{DType::f64, x.device()})},
          0);
  const Tensor global = all_reduce_(local);
  const int64_t n = static_cast<int64_t>(std::llround(global.narrow(0, 2 * c, 1).detach().item<double>()));
  MG_CHECK(n > 1, type_name(),
           " (synchronised): training needs more than one value per channel over the group, got ", n);
  const Tensor mean_c = mul(global.narrow(0, 0, c), 1.0 / static_cast<double>(n));
  const Tensor var_c = sub(mul(global.narrow(0, c, c), 1.0 / static_cast<double>(n)), mul(mean_c, mean_c));
  update_running_stats(mean_c, var_c, n);
  const Tensor mu = mean_c.reshape(stat_shape).to(x.dtype());
  const Tensor variance = var_c.reshape(stat_shape).to(x.dtype());
  Tensor y = mul(sub(x, mu), rsqrt(add(variance, options.eps)));
  if (options.affine) y = add(mul(y, weight.reshape(stat_shape)), bias.reshape(stat_shape));
  return y;
}

// running = (1 - momentum) * running + momentum * batch, with the unbiased variance (PyTorch).
void BatchNorm::update_running_stats(const Tensor& batch_mean, const Tensor& batch_var, int64_t count) {
  NoGradGuard no_grad;
  const double m = options.momentum;
  const double unbias = static_cast<double>(count) / static_cast<double>(count - 1);
  running_mean.mul_(1.0 - m).add_(batch_mean.detach().to(running_mean.dtype()), m);
  running_var.mul_(1.0 - m).add_(mul(batch_var.detach(), unbias).to(running_var.dtype()), m);
  num_batches_tracked.add_(1.0);
}

std::string BatchNorm::extra_repr() const {
  return str_cat(num_features, ", eps=", options.eps, ", momentum=", options.momentum,
                 options.affine ? "" : ", affine=false");
}

std::shared_ptr<Module> BatchNorm1d::clone_empty() const {
  return std::make_shared<BatchNorm1d>(num_features, options);
}
std::shared_ptr<Module> BatchNorm2d::clone_empty() const {
  return std::make_shared<BatchNorm2d>(num_features, options);
}

// ---- LayerNorm ----
LayerNorm::LayerNorm(Shape shape, double e, bool affine) : normalized_shape(std::move(shape)), eps(e) {
  MG_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape must not be empty");
  for (int64_t s : normalized_shape)
    MG_CHECK(s > 0, "LayerNorm: normalized_shape ", shape_str(normalized_shape), " must be positive");
  if (affine) {
    weight = ones(normalized_shape);
    bias = zeros(normalized_shape);
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
}

Tensor LayerNorm::forward(const Tensor& x) { return layer_norm(x, normalized_shape, weight, bias, eps); }

std::shared_ptr<Module> LayerNorm::clone_empty() const {
  return std::make_shared<LayerNorm>(normalized_shape, eps, weight.defined());
}

std::string LayerNorm::extra_repr() const {
  return str_cat(shape_str(normalized_shape), ", eps=", eps,
                 weight.defined() ? "" : ", elementwise_affine=false");
}

}  // namespace mg::nn
