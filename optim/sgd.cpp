// SGD: the options <-> map conversion, range checks, and the call into the fused
// multi-tensor kernel (kernels/cpu/optim.cpp does the arithmetic).
#include "optim/sgd.h"

#include "base/error.h"
#include "core/ops/op_common.h"  // MG_KERNEL
#include "kernels/cpu/optim.h"

namespace mg::optim {

Options SGDOptions::to_map() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0}};
}

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options) : Optimizer(options.to_map()) {
  MG_CHECK(!params.empty(), "SGD: got an empty parameter list");
  add_param_group(ParamGroup{std::move(params), {}});
}

SGD::SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults) : Optimizer(defaults.to_map()) {
  MG_CHECK(!groups.empty(), "SGD: got an empty list of parameter groups");
  for (ParamGroup& group : groups) add_param_group(std::move(group));
}

void SGD::validate(const Options& o) const {
  const double lr = o.at("lr"), momentum = o.at("momentum"), dampening = o.at("dampening");
  MG_CHECK(lr >= 0.0, "SGD: invalid learning rate ", lr, " (must be >= 0)");
  MG_CHECK(momentum >= 0.0, "SGD: invalid momentum ", momentum, " (must be >= 0)");
  MG_CHECK(o.at("weight_decay") >= 0.0, "SGD: invalid weight_decay ", o.at("weight_decay"),
           " (must be >= 0)");
  MG_CHECK(o.at("nesterov") == 0.0 || (momentum > 0.0 && dampening == 0.0),
           "SGD: nesterov momentum requires momentum > 0 and dampening == 0 (got momentum ", momentum,
           ", dampening ", dampening, ")");
}

std::vector<Optimizer::StateSpec> SGD::state_spec(const Options& o) const {
  return {{"momentum_buffer", false, o.at("momentum") != 0.0}};
}

void SGD::update(const ParamGroup& group, const std::vector<ParamUpdate>& batch) {
  kernels::SgdHyper h;
  h.lr = group.get("lr");
  h.momentum = group.get("momentum");
  h.dampening = group.get("dampening");
  h.weight_decay = group.get("weight_decay");
  h.nesterov = group.get("nesterov") != 0.0;
  require_cpu_kernel_support(batch);
  // One multi-tensor call per (device, dtype): one kernel launch per group on CUDA.
  for (const std::vector<const ParamUpdate*>& same : split_by_device_and_dtype(batch)) {
    std::vector<kernels::SgdTensor> tensors;
    for (const ParamUpdate* u : same) {
      kernels::SgdTensor t;
      t.param = u->param.data_ptr();
      t.grad = u->grad.data_ptr();
      t.n = u->param.numel();
      if (h.momentum != 0.0) {
        Tensor& buf = (*u->state)["momentum_buffer"];
        t.first_step = !buf.defined();
        if (t.first_step) buf = empty_like(u->param);  // the kernel initialises it to d
        t.momentum_buffer = buf.data_ptr();
      }
      tensors.push_back(t);
    }
    const Tensor& first = same.front()->param;
    MG_KERNEL_SCRATCH(first.device(), sgd_step_multi, first.dtype(), tensors, h);
  }
}

}  // namespace mg::optim
