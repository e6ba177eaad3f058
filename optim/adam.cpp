// Adam and AdamW: options, range checks, lazy state creation, and the call
// into the fused multi-tensor kernel (kernels/cpu/optim.cpp).
#include "optim/adam.h"

#include "base/checked_size.h"

#include "base/error.h"
#include "core/ops/op_common.h"  // MG_KERNEL
#include "kernels/cpu/optim.h"

namespace mg::optim {

namespace {

Options adam_map(double lr, double beta1, double beta2, double eps, double weight_decay, bool amsgrad) {
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0}};
}

}  // namespace

Options AdamOptions::to_map() const { return adam_map(lr, beta1, beta2, eps, weight_decay, amsgrad); }
Options AdamWOptions::to_map() const { return adam_map(lr, beta1, beta2, eps, weight_decay, amsgrad); }

Adam::Adam(Options defaults, bool decoupled) : Optimizer(std::move(defaults)), decoupled_(decoupled) {}

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options) : Adam(options.to_map(), false) {
  MG_CHECK(!params.empty(), "Adam: got an empty parameter list");
  add_param_group(ParamGroup{std::move(params), {}});
}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults) : Adam(defaults.to_map(), false) {
  MG_CHECK(!groups.empty(), "Adam: got an empty list of parameter groups");
  for (ParamGroup& group : groups) add_param_group(std::move(group));
}

AdamW::AdamW(std::vector<Tensor> params, const AdamWOptions& options) : Adam(options.to_map(), true) {
  MG_CHECK(!params.empty(), "AdamW: got an empty parameter list");
  add_param_group(ParamGroup{std::move(params), {}});
}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamWOptions& defaults) : Adam(defaults.to_map(), true) {
  MG_CHECK(!groups.empty(), "AdamW: got an empty list of parameter groups");
  for (ParamGroup& group : groups) add_param_group(std::move(group));
}

void Adam::validate(const Options& o) const {
  const double beta1 = o.at("beta1"), beta2 = o.at("beta2");
  MG_CHECK(o.at("lr") >= 0.0, name(), ": invalid learning rate ", o.at("lr"), " (must be >= 0)");
  MG_CHECK(o.at("eps") >= 0.0, name(), ": invalid eps ", o.at("eps"), " (must be >= 0)");
  MG_CHECK(beta1 >= 0.0 && beta1 < 1.0, name(), ": invalid beta1 ", beta1, " (must be in [0, 1))");
  MG_CHECK(beta2 >= 0.0 && beta2 < 1.0, name(), ": invalid beta2 ", beta2, " (must be in [0, 1))");
  MG_CHECK(o.at("weight_decay") >= 0.0, name(), ": invalid weight_decay ", o.at("weight_decay"),
           " (must be >= 0)");
}

std::vector<Optimizer::StateSpec> Adam::state_spec(const Options& o) const {
  return {{"step", true, true, true},
          {"exp_avg", false, true},
          {"exp_avg_sq", false, true},
          {"max_exp_avg_sq", false, o.at("amsgrad") != 0.0}};
}

void Adam::update(const ParamGroup& group, const std::vector<ParamUpdate>& batch) {
  kernels::AdamHyper h;
  h.lr = group.get("lr");
  h.beta1 = group.get("beta1");
  h.beta2 = group.get("beta2");
  h.eps = group.get("eps");
  h.weight_decay = group.get("weight_decay");
  h.amsgrad = group.get("amsgrad") != 0.0;
  require_cpu_kernel_support(batch);
  // One multi-tensor call per (device, dtype): one kernel launch per group on CUDA.
  for (const std::vector<const ParamUpdate*>& same : split_by_device_and_dtype(batch)) {
    std::vector<kernels::AdamTensor> tensors;
    for (const ParamUpdate* u : same) {
      ParamState& s = *u->state;
      // Lazy state: zeros on the first update (max_exp_avg_sq also if amsgrad is
      // switched on later); the step counter is a 0-d f64 on the CPU, per parameter.
      if (!s["step"].defined()) s["step"] = scalar_tensor(0.0, TensorOptions{DType::f64});
      for (const char* key : {"exp_avg", "exp_avg_sq"})
        if (!s[key].defined()) s[key] = zeros_like(u->param);
      kernels::AdamTensor t;
      if (h.amsgrad) {
        Tensor& m = s["max_exp_avg_sq"];
        if (!m.defined()) m = zeros_like(u->param);
        t.max_exp_avg_sq = m.data_ptr();
      }
      double& step = *s["step"].data<double>();
      step += 1.0;
      const std::optional<int64_t> whole_step = try_whole_int64(step);  // a loaded state may hold anything
      MG_CHECK(whole_step && *whole_step > 0, name(),
               ": a parameter's step must be a whole number that fits in int64, got ", step,
               " (a corrupt state dict?)");
      t.step = *whole_step;
      t.param = u->param.data_ptr();
      t.grad = u->grad.data_ptr();
      t.exp_avg = s["exp_avg"].data_ptr();
      t.exp_avg_sq = s["exp_avg_sq"].data_ptr();
      t.n = u->param.numel();
      tensors.push_back(t);
    }
    const Tensor& first = same.front()->param;
    if (decoupled_) {
      MG_KERNEL_SCRATCH(first.device(), adamw_step_multi, first.dtype(), tensors, h);
    } else {
      MG_KERNEL_SCRATCH(first.device(), adam_step_multi, first.dtype(), tensors, h);
    }
  }
}

}  // namespace mg::optim
