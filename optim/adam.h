// Adam (Kingma & Ba, 2015) and AdamW (Loshchilov & Hutter, 2019), as PyTorch's
// torch.optim.Adam / AdamW, with optional AMSGrad.
//
// Both keep two running averages per parameter element, of the gradient (m) and
// of its square (v), and step each element by m / sqrt(v): a per-coordinate
// learning rate. Bias correction undoes the averages' start at zero:
//
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2           (amsgrad: v_max = max(v_max, v), used for v)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// They differ only in weight decay. Adam adds the L2 term to the gradient
// (g = g + wd * p), so it is rescaled by 1/sqrt(v) like the rest of g and
// parameters with large gradients barely decay. AdamW decays the weights
// directly, p *= 1 - lr * wd, before the step: "decoupled" weight decay.
//
// t is the PARAMETER's step count (state "step"), as in PyTorch: a parameter
// that got no gradient in some step() does not advance.
//
//   optim::AdamWOptions adamw;
//   adamw.lr = 1e-3;
//   adamw.weight_decay = 0.01;
//   optim::AdamW opt(params, adamw);
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace mg::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;

  Options to_map() const;  // {"lr", "beta1", "beta2", "eps", "weight_decay", "amsgrad"}
};

// Same fields; PyTorch's AdamW defaults to weight_decay = 0.01.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;

  Options to_map() const;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults = {});

  const char* name() const override { return decoupled_ ? "AdamW" : "Adam"; }

 protected:
  // For AdamW: the defaults and whether weight decay is decoupled; adds no groups.
  Adam(Options defaults, bool decoupled);

  void update(const ParamGroup& group, const std::vector<ParamUpdate>& batch) override;
  void validate(const Options& options) const override;
  // "step" (0-d), "exp_avg", "exp_avg_sq", and "max_exp_avg_sq" (required with amsgrad).
  std::vector<StateSpec> state_spec(const Options& options) const override;

 private:
  bool decoupled_ = false;
};

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});
  AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults = {});
};

}  // namespace mg::optim
