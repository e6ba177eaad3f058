// Optimizer base: parameter groups, the shared step() loop, zero_grad, and the
// state_dict()/load_state_dict() pair (see optimizer.h for the layout).
//
// load_state_dict works in two phases so that a bad file can never leave an
// optimizer half-loaded: phase 1 reads every key, collects every problem into
// three lists (missing, unexpected, mis-shaped) and builds the new groups and
// state on the side; only when all lists are empty does phase 2 swap them in.
#include "optim/optimizer.h"

#include "base/checked_size.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "base/error.h"
#include "core/grad_mode.h"

namespace mg::optim {

namespace {

// "12" -> 12; anything else (empty, sign, letters) -> -1.
int64_t parse_index(const std::string& text) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    return -1;
  return std::stoll(text);
}

// Splits "state.3.exp_avg" into {"state", "3", "exp_avg"}; false unless there are
// exactly two dots with text between them (state names never contain a dot).
bool split_key(const std::string& key, std::string& head, std::string& index, std::string& name) {
  const auto a = key.find('.');
  if (a == std::string::npos) return false;
  const auto b = key.find('.', a + 1);
  if (b == std::string::npos || key.find('.', b + 1) != std::string::npos) return false;
  head = key.substr(0, a);
  index = key.substr(a + 1, b - a - 1);
  name = key.substr(b + 1);
  return !name.empty();
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string index_list(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

// A fresh tensor with `src`'s values on `device` in `dtype` (never aliases src).
Tensor copy_to(const Tensor& src, Device device, DType dtype) {
  Tensor out = empty(src.shape(), TensorOptions{dtype, device, false});
  out.copy_(src);
  return out;
}

}  // namespace

double ParamGroup::get(const std::string& name) const {
  auto it = options.find(name);
  if (it == options.end()) {
    std::vector<std::string> known;
    for (const auto& [k, v] : options) known.push_back(k);
    throw Error(str_cat("ParamGroup: no hyperparameter '", name, "' (it has: ", join(known), ")"));
  }
  return it->second;
}

Optimizer::Optimizer(Options defaults) : defaults_(std::move(defaults)) {}

const ParamState& Optimizer::state(int64_t i) const {
  MG_CHECK(i >= 0 && i < num_params(), name(), ".state: parameter index ", i, " out of range (", num_params(),
           " parameters)");
  return state_[static_cast<size_t>(i)];
}

void Optimizer::add_param_group(ParamGroup group) {
  for (const auto& [key, value] : group.options) {
    if (defaults_.count(key)) continue;
    std::vector<std::string> known;
    for (const auto& [k, v] : defaults_) known.push_back(k);
    throw Error(
        str_cat(name(), ": unknown option '", key, "' in a parameter group (known: ", join(known), ")"));
  }
  for (const auto& [key, value] : defaults_) group.options.emplace(key, value);  // keeps overrides
  validate(group.options);
  for (size_t j = 0; j < group.params.size(); ++j) {
    const Tensor& p = group.params[j];
    MG_CHECK(p.defined(), name(), ": parameter ", j, " of the new group is an undefined tensor");
    MG_CHECK(is_floating(p.dtype()), name(), ": can only optimize floating-point tensors, got ", p.dtype(),
             " (parameter ", j, " of the new group)");
    MG_CHECK(p.is_leaf(), name(), ": can't optimize a non-leaf tensor (parameter ", j,
             " of the new group has a grad_fn); optimize the leaf it was computed from");
    for (size_t k = 0; k < j; ++k)
      MG_CHECK(!group.params[k].is_same(p), name(), ": parameter ", j, " of the new group repeats parameter ",
               k);
    for (size_t g = 0; g < groups_.size(); ++g)
      for (const Tensor& q : groups_[g].params)
        MG_CHECK(!q.is_same(p), name(), ": parameter ", j, " of the new group is already in group ", g,
                 " (a parameter may belong to one group only)");
  }
  state_.resize(state_.size() + group.params.size());
  group_steps_.push_back(0);
  groups_.push_back(std::move(group));
}

void Optimizer::step() {
  NoGradGuard no_grad;
  // Check every gradient before touching any parameter: a bad one throws with
  // all parameters and state still as they were.
  std::vector<std::vector<ParamUpdate>> batches(groups_.size());
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (Tensor& p : groups_[g].params) {
      const int64_t i = index++;
      const Tensor& grad = p.grad();
      if (!grad.defined()) continue;  // no gradient this step: nothing changes, not even the state
      MG_CHECK(grad.device() == p.device() && grad.dtype() == p.dtype(), name(), ".step: parameter ", i,
               " is ", p.dtype(), " on ", p.device(), " but its gradient is ", grad.dtype(), " on ",
               grad.device(), "; they must match");
      MG_CHECK(grad.shape() == p.shape(), name(), ".step: parameter ", i, " has shape ", shape_str(p.shape()),
               " but its gradient has shape ", shape_str(grad.shape()));
      MG_CHECK(p.is_contiguous(), name(), ".step: parameter ", i, " (shape ", shape_str(p.shape()),
               ") is not contiguous; the fused update needs parameters that own contiguous memory");
      batches[g].push_back(ParamUpdate{p, grad.is_contiguous() ? grad : grad.contiguous(),
                                       &state_[static_cast<size_t>(i)], i});
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!batches[g].empty()) update(groups_[g], batches[g]);
    // The update wrote through raw pointers; bump the version counters so a graph
    // that saved a parameter before this step refuses to backward with new values.
    for (const ParamUpdate& u : batches[g]) u.param.storage()->bump_version();
    ++group_steps_[g];
  }
}

std::vector<std::vector<const Optimizer::ParamUpdate*>> Optimizer::split_by_device_and_dtype(
    const std::vector<ParamUpdate>& batch) {
  std::vector<std::vector<const ParamUpdate*>> runs;
  for (const ParamUpdate& u : batch) {
    auto same = std::find_if(runs.begin(), runs.end(), [&](const std::vector<const ParamUpdate*>& run) {
      return run.front()->param.device() == u.param.device() && run.front()->param.dtype() == u.param.dtype();
    });
    if (same == runs.end()) {
      runs.push_back({&u});
    } else {
      same->push_back(&u);
    }
  }
  return runs;
}

void Optimizer::require_cpu_kernel_support(const std::vector<ParamUpdate>& batch) const {
  for (const ParamUpdate& u : batch) {
    // Any device: CPU and CUDA both have the fused kernels (kernels/cpu/optim, kernels/cuda/optim.cu).
    MG_CHECK(u.param.dtype() == DType::f32 || u.param.dtype() == DType::f64, name(), ".step: parameter ",
             u.index, " is ", u.param.dtype(),
             "; the optimizer kernels take f32 or f64 (keep f32 master weights)");
  }
}

void Optimizer::zero_grad() {
  for (ParamGroup& group : groups_)
    for (Tensor& p : group.params)
      if (p.grad().defined()) p.set_grad(Tensor());
}

StateDict Optimizer::state_dict() const {
  NoGradGuard no_grad;
  const TensorOptions f64{DType::f64, Device::cpu(), false};
  StateDict out;
  int64_t index = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = str_cat("param_groups.", g, ".");
    for (const auto& [key, value] : groups_[g].options) out[prefix + key] = scalar_tensor(value, f64);
    out[prefix + "step"] = scalar_tensor(static_cast<double>(group_steps_[g]), f64);
    std::vector<int64_t> indices;
    for (size_t j = 0; j < groups_[g].params.size(); ++j) indices.push_back(index++);
    out[prefix + "params"] =
        tensor<int64_t>(indices, Shape{static_cast<int64_t>(indices.size())}, TensorOptions{DType::i64});
  }
  for (size_t i = 0; i < state_.size(); ++i)
    for (const auto& [key, t] : state_[i]) out[str_cat("state.", i, ".", key)] = t.detach().clone();
  return out;
}

void Optimizer::load_state_dict(const StateDict& sd) {
  NoGradGuard no_grad;
  std::vector<std::string> missing, unexpected, misshaped;
  std::set<std::string> used;  // keys phase 1 consumed

  // ---- phase 1a: groups and their hyperparameters ----
  std::vector<Options> new_options(groups_.size());
  std::vector<int64_t> new_steps(groups_.size(), 0);
  std::vector<const Tensor*> params;  // global index -> parameter
  for (const ParamGroup& group : groups_)
    for (const Tensor& p : group.params) params.push_back(&p);
  int64_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = str_cat("param_groups.", g, ".");
    // Reads the 0-d hyperparameter prefix + name into `value`, or records why not.
    auto scalar = [&](const std::string& name, double& value) {
      auto it = sd.find(prefix + name);
      if (it == sd.end()) {
        missing.push_back(prefix + name);
        return;
      }
      used.insert(it->first);
      const Tensor& t = it->second;
      if (!t.defined() || t.dim() != 0 || !is_floating(t.dtype())) {
        const std::string got = t.defined() ? str_cat(shape_str(t.shape()), " ", dtype_name(t.dtype()))
                                            : std::string("undefined");
        misshaped.push_back(str_cat(it->first, " (expected a 0-d float tensor, got ", got, ")"));
        return;
      }
      value = t.item<double>();
    };
    for (const auto& [key, current] : groups_[g].options) {
      double value = current;
      scalar(key, value);
      new_options[g][key] = value;
    }
    double steps = 0;
    scalar("step", steps);
    const std::optional<int64_t> whole_steps = try_whole_int64(steps);
    MG_CHECK(whole_steps && *whole_steps >= 0, name(), ".load_state_dict: group ", g,
             "'s step must be a whole number >= 0 that fits in int64, got ", steps);
    new_steps[g] = *whole_steps;
    // The group must cover the same parameters (by global index) as ours.
    std::vector<int64_t> expected;
    for (size_t j = 0; j < groups_[g].params.size(); ++j) expected.push_back(first + static_cast<int64_t>(j));
    first += static_cast<int64_t>(groups_[g].params.size());
    auto it = sd.find(prefix + "params");
    if (it == sd.end()) {
      missing.push_back(prefix + "params");
    } else {
      used.insert(it->first);
      const Tensor& t = it->second;
      const bool valid = t.defined() && t.dim() == 1 && is_integral(t.dtype());
      const std::vector<int64_t> got = valid ? t.to_vector<int64_t>() : std::vector<int64_t>{};
      if (!valid || got != expected)
        misshaped.push_back(str_cat(it->first, " (the state's group ", g, " has parameters ",
                                    valid ? index_list(got) : "<not a 1-d int tensor>",
                                    ", this optimizer's has ", index_list(expected), ")"));
    }
  }
  // Validate the loaded hyperparameters only when all were readable.
  if (missing.empty() && misshaped.empty()) {
    for (size_t g = 0; g < new_options.size(); ++g) {
      try {
        validate(new_options[g]);
      } catch (const Error& e) {
        misshaped.push_back(str_cat("param_groups.", g, ".* (", e.what(), ")"));
      }
    }
  }

  // ---- phase 1b: per-parameter state ----
  // Which group each parameter belongs to decides which state names are required.
  std::vector<size_t> group_of;
  for (size_t g = 0; g < groups_.size(); ++g) group_of.insert(group_of.end(), groups_[g].params.size(), g);
  std::vector<ParamState> new_state(state_.size());
  std::vector<bool> has_state(state_.size(), false);  // any "state.<i>.*" key at all
  for (const auto& [key, t] : sd) {
    if (used.count(key)) continue;
    std::string head, index_text, field;
    if (!split_key(key, head, index_text, field) || head != "state") {
      unexpected.push_back(key);
      continue;
    }
    const int64_t i = parse_index(index_text);
    if (i < 0 || i >= num_params()) {
      unexpected.push_back(key);
      continue;
    }
    has_state[static_cast<size_t>(i)] = true;
    const Tensor& p = *params[static_cast<size_t>(i)];
    const auto specs = state_spec(new_options[group_of[static_cast<size_t>(i)]]);
    auto spec = std::find_if(specs.begin(), specs.end(), [&](const StateSpec& s) { return s.name == field; });
    if (spec == specs.end()) {
      unexpected.push_back(key);
      continue;
    }
    const Shape want = spec->scalar ? Shape{} : p.shape();
    if (!t.defined() || t.shape() != want || !is_floating(t.dtype())) {
      misshaped.push_back(str_cat(
          key, " (",
          t.defined() ? str_cat(shape_str(t.shape()), " ", dtype_name(t.dtype())) : std::string("undefined"),
          ", expected ", shape_str(want), " float", spec->scalar ? "" : " like the parameter", ")"));
      continue;
    }
    if (spec->count) {
      const double value = t.item<double>();
      const std::optional<int64_t> whole = try_whole_int64(value);
      if (!whole || *whole < 0) {
        misshaped.push_back(str_cat(key, " (", value, ", expected a whole number >= 0 below 2^63)"));
        continue;
      }
    }
    new_state[static_cast<size_t>(i)][field] =
        spec->scalar ? copy_to(t, Device::cpu(), DType::f64) : copy_to(t, p.device(), p.dtype());
  }
  // A parameter has no state (never updated) or all of its required state.
  for (size_t i = 0; i < new_state.size(); ++i) {
    if (!has_state[i]) continue;
    for (const StateSpec& spec : state_spec(new_options[group_of[i]]))
      if (spec.required && !sd.count(str_cat("state.", i, ".", spec.name)))
        missing.push_back(str_cat("state.", i, ".", spec.name));
  }

  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::ostringstream msg;
    msg << name() << ".load_state_dict: the state dict does not fit this optimizer (" << groups_.size()
        << " group(s), " << num_params() << " parameter(s)); nothing was loaded.";
    if (!missing.empty()) msg << "\n  missing keys: " << join(missing);
    if (!unexpected.empty()) msg << "\n  unexpected keys: " << join(unexpected);
    if (!misshaped.empty()) msg << "\n  mis-shaped or invalid keys: " << join(misshaped);
    throw Error(msg.str());
  }

  // ---- phase 2: commit (nothing below can throw on valid input) ----
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(new_options[g]);
  group_steps_ = std::move(new_steps);
  state_ = std::move(new_state);
}

}  // namespace mg::optim
