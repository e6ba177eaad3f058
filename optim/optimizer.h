// Optimizer: the base class of SGD, Adam and AdamW, and the parameter groups
// they update.
//
// An optimizer holds a list of ParamGroups. Each group is a list of parameters
// plus the hyperparameters that apply to them (lr, weight_decay, momentum, ...),
// so one model can train its embeddings with a different learning rate than its
// body, or exclude biases from weight decay. Hyperparameters are a name -> double
// map, as PyTorch's `param_groups[0]["lr"]`: schedulers and user code can read
// and change them without knowing which optimizer they talk to, and state_dict()
// saves every one as a 0-d f64 tensor. A group's missing entries are filled from
// the optimizer's defaults (its options struct); unknown names are refused, so a
// typo ("momentun") is an error, not a silently ignored setting.
//
// step() is the same for every optimizer (the "template method" pattern): under
// NoGradGuard, for each group, for each parameter that HAS a gradient (others
// are skipped, their state untouched), check the gradient matches the
// parameter, then call the subclass's update() for that one parameter. The
// update is one fused multi-tensor kernel call per (device, dtype) of the group
// (kernels/cpu/optim.h): on the CPU a loop of one-pass updates, on CUDA one
// launch for all of them (kernels/cuda/optim.cu).
//
// Per-parameter state (momentum buffers, Adam's moments, step counts) lives in
// the optimizer, indexed by the parameter's GLOBAL index: parameters numbered
// 0, 1, 2, ... across groups in order. state_dict() layout:
//
//   state.<i>.<name>          per-parameter state tensor, e.g. state.3.exp_avg
//                             (same shape as parameter i; "step" is a 0-d f64)
//   param_groups.<g>.<name>   0-d f64 hyperparameter, e.g. param_groups.0.lr
//   param_groups.<g>.step     how many step() calls group g has taken
//   param_groups.<g>.params   1-d i64: the global indices of group g's parameters
//
// Like PyTorch, the state refers to parameters by position, not by name: load it
// into an optimizer built over the same parameters in the same order.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"

namespace mg::optim {

// Hyperparameters by name. Booleans (nesterov, amsgrad) are stored as 0 or 1.
using Options = std::map<std::string, double>;

// Parameters that share hyperparameters. An aggregate:
//   optim::ParamGroup{{fc.weight}, {{"lr", 0.1}, {"weight_decay", 0.01}}}
struct ParamGroup {
  std::vector<Tensor> params;
  Options options;  // entries missing here take the optimizer's defaults

  // The value of hyperparameter `name`; throws mg::Error naming it when absent.
  double get(const std::string& name) const;
  double lr() const { return get("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
};

// One parameter's state: named tensors ("momentum_buffer", "exp_avg", "step").
using ParamState = std::map<std::string, Tensor>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  void step();
  // Sets every parameter's gradient to undefined (PyTorch's set_to_none=True):
  // the next backward writes fresh gradients instead of adding to zeros, and the
  // memory is released in between.
  void zero_grad();

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Appends a group; its missing options come from the defaults. A parameter may
  // belong to one group only.
  void add_param_group(ParamGroup group);

  // The constructor's options as a map (what a group without overrides gets).
  const Options& defaults() const { return defaults_; }
  // Total number of parameters over all groups.
  int64_t num_params() const { return static_cast<int64_t>(state_.size()); }
  // State of the parameter with global index i (empty before its first update).
  const ParamState& state(int64_t i) const;

  // A snapshot (deep copy) in the layout described at the top of this file:
  // later steps do not change it.
  StateDict state_dict() const;
  // Validates everything first: each group must be present with all of its
  // hyperparameters and the same parameter indices; each state tensor must have
  // a known name and its parameter's shape. Any problem throws one mg::Error
  // listing every missing, unexpected and mis-shaped key, and leaves the
  // optimizer untouched. State tensors are copied to their parameter's device
  // and dtype (the "step" counters stay f64 on the CPU).
  void load_state_dict(const StateDict& state_dict);

  // "SGD", "Adam", "AdamW": used in error messages.
  virtual const char* name() const = 0;

 protected:
  explicit Optimizer(Options defaults);

  // One parameter of a group that has a gradient, ready to update: `grad` has
  // the parameter's shape, dtype and device and is contiguous; `state` is that
  // parameter's (possibly empty) state, which update() creates lazily.
  struct ParamUpdate {
    Tensor param;
    Tensor grad;
    ParamState* state;
    int64_t index;  // global parameter index (for error messages)
  };
  // Updates every parameter of `batch` (all from `group`) in place. A whole
  // group at a time, so a CUDA backend can launch one multi-tensor kernel for
  // it; the CPU path is one fused kernel call per parameter.
  virtual void update(const ParamGroup& group, const std::vector<ParamUpdate>& batch) = 0;
  // For update(): `batch` split into runs of parameters on the same device with
  // the same dtype (what one multi-tensor kernel call takes), each in the batch's
  // order, the runs ordered by their first parameter.
  static std::vector<std::vector<const ParamUpdate*>> split_by_device_and_dtype(
      const std::vector<ParamUpdate>& batch);
  // For update(): throws, before anything is modified, unless every parameter of
  // `batch` is f32 or f64 (what the kernels in kernels/cpu/optim.h and their CUDA twins take).
  void require_cpu_kernel_support(const std::vector<ParamUpdate>& batch) const;
  // Throws mg::Error when hyperparameters are out of range.
  virtual void validate(const Options& options) const = 0;
  // The state tensors a parameter may have. `scalar`: a 0-d f64 counter on the
  // CPU (not parameter-shaped); `required`: present in every parameter that has
  // any state, given the group's options (e.g. max_exp_avg_sq only with amsgrad).
  struct StateSpec {
    std::string name;
    bool scalar;
    bool required;
    bool count = false;  // a 0-d step count: load_state_dict requires a whole number >= 0
  };
  virtual std::vector<StateSpec> state_spec(const Options& options) const = 0;

 private:
  Options defaults_;
  std::vector<ParamGroup> groups_;
  std::vector<int64_t> group_steps_;  // step() calls taken by each group
  std::vector<ParamState> state_;     // by global parameter index
};

}  // namespace mg::optim
