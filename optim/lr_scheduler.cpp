// LR schedulers: the shared step/apply/state_dict machinery and the three
// closed-form schedules.
#include "optim/lr_scheduler.h"

#include "base/checked_size.h"

#include <cmath>
#include <sstream>

#include "base/error.h"

namespace mg::optim {

namespace {

constexpr double kPi = 3.14159265358979323846;

// settings are doubles in the state dict; integer ones must come back whole.
int64_t whole(double v, const char* scheduler, const char* what) {
  const std::optional<int64_t> n = try_whole_int64(v);
  MG_CHECK(n.has_value(), scheduler, ": ", what, " must be a whole number that fits in int64, got ", v);
  return *n;
}

double setting(const std::vector<std::pair<std::string, double>>& values, const std::string& name) {
  for (const auto& [k, v] : values)
    if (k == name) return v;
  throw Error("LRScheduler: setting '" + name + "' not provided");  // unreachable via load_state_dict
}

}  // namespace

// ---- LRScheduler ----------------------------------------------------------------------------

LRScheduler::LRScheduler(Optimizer& optimizer) : optimizer_(optimizer) {
  MG_CHECK(!optimizer.param_groups().empty(), "LRScheduler: the optimizer has no parameter groups");
  for (const ParamGroup& group : optimizer.param_groups()) base_lrs_.push_back(group.lr());
}

void LRScheduler::start() {
  last_epoch_ = 0;
  apply();
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

void LRScheduler::set_step(int64_t t) {
  MG_CHECK(t >= 0, name(), ".set_step: the step must be >= 0, got ", t);
  last_epoch_ = t;
  apply();
}

void LRScheduler::apply() {
  auto& groups = optimizer_.param_groups();
  MG_CHECK(groups.size() == base_lrs_.size(), name(), ": the optimizer has ", groups.size(),
           " param groups but the scheduler was built for ", base_lrs_.size(),
           " (build the scheduler after the last add_param_group)");
  last_lrs_.clear();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double lr = lr_at(last_epoch_, base_lrs_[g]);
    groups[g].set_lr(lr);
    last_lrs_.push_back(lr);
  }
}

StateDict LRScheduler::state_dict() const {
  const TensorOptions f64{DType::f64, Device::cpu(), false};
  StateDict out;
  out["last_epoch"] = scalar_tensor(static_cast<double>(last_epoch_), f64);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    out[str_cat("base_lrs.", g)] = scalar_tensor(base_lrs_[g], f64);
    out[str_cat("last_lrs.", g)] = scalar_tensor(last_lrs_[g], f64);
  }
  for (const auto& [name, value] : settings()) out[name] = scalar_tensor(value, f64);
  return out;
}

void LRScheduler::load_state_dict(const StateDict& sd) {
  std::vector<std::string> missing, unexpected, misshaped;
  size_t found = 0;
  auto read = [&](const std::string& key, double& value) {
    auto it = sd.find(key);
    if (it == sd.end()) {
      missing.push_back(key);
      return;
    }
    ++found;
    const Tensor& t = it->second;
    if (!t.defined() || t.dim() != 0 || !is_floating(t.dtype())) {
      misshaped.push_back(key +
                          (t.defined() ? " " + shape_str(t.shape()) + " " + dtype_name(t.dtype()) : ""));
      return;
    }
    value = t.item<double>();
  };
  double last_epoch = 0;
  read("last_epoch", last_epoch);
  std::vector<double> base(base_lrs_.size()), last(base_lrs_.size());
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    read(str_cat("base_lrs.", g), base[g]);
    read(str_cat("last_lrs.", g), last[g]);
  }
  auto values = settings();
  for (auto& [name, value] : values) read(name, value);
  if (found != sd.size()) {
    // Anything we did not ask for: another scheduler's settings, or more groups.
    for (const auto& [key, t] : sd) {
      bool known = key == "last_epoch";
      for (size_t g = 0; g < base_lrs_.size() && !known; ++g)
        known = key == str_cat("base_lrs.", g) || key == str_cat("last_lrs.", g);
      for (const auto& [name, v] : values) known = known || key == name;
      if (!known) unexpected.push_back(key);
    }
  }
  if (!missing.empty() || !unexpected.empty() || !misshaped.empty()) {
    std::ostringstream msg;
    msg << name() << ".load_state_dict: the state dict does not fit this scheduler (" << base_lrs_.size()
        << " param group(s)); nothing was loaded.";
    auto list = [&](const char* what, const std::vector<std::string>& keys) {
      if (keys.empty()) return;
      msg << "\n  " << what << ":";
      for (size_t i = 0; i < keys.size(); ++i) msg << (i ? ", " : " ") << keys[i];
    };
    list("missing keys", missing);
    list("unexpected keys", unexpected);
    list("mis-shaped keys", misshaped);
    throw Error(msg.str());
  }
  const int64_t t = whole(last_epoch, name(), "last_epoch");
  MG_CHECK(t >= 0, name(), ".load_state_dict: last_epoch ", t, " is negative");
  MG_CHECK(optimizer_.param_groups().size() == base.size(), name(), ".load_state_dict: the optimizer has ",
           optimizer_.param_groups().size(), " param groups but the scheduler has ", base.size());
  set_settings(values);  // validates; throws before changing anything
  last_epoch_ = t;
  base_lrs_ = base;
  last_lrs_ = last;
  // Put the restored lrs into the optimizer too, so resuming works whether the
  // optimizer's or the scheduler's state is loaded first (a scheduler built
  // after the optimizer was loaded has just overwritten them with lr(0)).
  for (size_t g = 0; g < last_lrs_.size(); ++g) optimizer_.param_groups()[g].set_lr(last_lrs_[g]);
}

// ---- StepLR ---------------------------------------------------------------------------------

namespace {
void check_step(const StepLROptions& o) {
  MG_CHECK(o.step_size >= 1, "StepLR: step_size must be >= 1, got ", o.step_size);
  MG_CHECK(o.gamma >= 0.0, "StepLR: gamma must be >= 0, got ", o.gamma);
}
}  // namespace

StepLR::StepLR(Optimizer& optimizer, const StepLROptions& options)
    : LRScheduler(optimizer), options_(options) {
  check_step(options_);
  start();
}

double StepLR::lr_at(int64_t t, double base_lr) const {
  return base_lr * std::pow(options_.gamma, static_cast<double>(t / options_.step_size));
}

std::vector<std::pair<std::string, double>> StepLR::settings() const {
  return {{"step_size", static_cast<double>(options_.step_size)}, {"gamma", options_.gamma}};
}

void StepLR::set_settings(const std::vector<std::pair<std::string, double>>& values) {
  StepLROptions o;
  o.step_size = whole(setting(values, "step_size"), "StepLR", "step_size");
  o.gamma = setting(values, "gamma");
  check_step(o);
  options_ = o;
}

// ---- CosineAnnealingLR ----------------------------------------------------------------------

namespace {
void check_cosine(const CosineAnnealingLROptions& o) {
  MG_CHECK(o.t_max >= 1, "CosineAnnealingLR: t_max must be >= 1, got ", o.t_max);
}
}  // namespace

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, const CosineAnnealingLROptions& options)
    : LRScheduler(optimizer), options_(options) {
  check_cosine(options_);
  start();
}

double CosineAnnealingLR::lr_at(int64_t t, double base_lr) const {
  const double eta_min = options_.eta_min;
  return eta_min + (base_lr - eta_min) *
                       (1.0 + std::cos(kPi * static_cast<double>(t) / static_cast<double>(options_.t_max))) /
                       2.0;
}

std::vector<std::pair<std::string, double>> CosineAnnealingLR::settings() const {
  return {{"t_max", static_cast<double>(options_.t_max)}, {"eta_min", options_.eta_min}};
}

void CosineAnnealingLR::set_settings(const std::vector<std::pair<std::string, double>>& values) {
  CosineAnnealingLROptions o;
  o.t_max = whole(setting(values, "t_max"), "CosineAnnealingLR", "t_max");
  o.eta_min = setting(values, "eta_min");
  check_cosine(o);
  options_ = o;
}

// ---- LinearWarmupCosine ---------------------------------------------------------------------

namespace {
void check_warmup(const LinearWarmupCosineOptions& o) {
  MG_CHECK(o.warmup_steps >= 0, "LinearWarmupCosine: warmup_steps must be >= 0, got ", o.warmup_steps);
  MG_CHECK(o.total_steps > o.warmup_steps, "LinearWarmupCosine: total_steps (", o.total_steps,
           ") must be greater than warmup_steps (", o.warmup_steps, ")");
  MG_CHECK(o.min_lr >= 0.0, "LinearWarmupCosine: min_lr must be >= 0, got ", o.min_lr);
}
}  // namespace

LinearWarmupCosine::LinearWarmupCosine(Optimizer& optimizer, const LinearWarmupCosineOptions& options)
    : LRScheduler(optimizer), options_(options) {
  check_warmup(options_);
  start();
}

double LinearWarmupCosine::lr_at(int64_t t, double base_lr) const {
  const auto& o = options_;
  if (t < o.warmup_steps) return base_lr * static_cast<double>(t + 1) / static_cast<double>(o.warmup_steps);
  if (t > o.total_steps) return o.min_lr;
  const double r =
      static_cast<double>(t - o.warmup_steps) / static_cast<double>(o.total_steps - o.warmup_steps);
  return o.min_lr + (base_lr - o.min_lr) * (1.0 + std::cos(kPi * r)) / 2.0;
}

std::vector<std::pair<std::string, double>> LinearWarmupCosine::settings() const {
  return {{"warmup_steps", static_cast<double>(options_.warmup_steps)},
          {"total_steps", static_cast<double>(options_.total_steps)},
          {"min_lr", options_.min_lr}};
}

void LinearWarmupCosine::set_settings(const std::vector<std::pair<std::string, double>>& values) {
  LinearWarmupCosineOptions o;
  o.warmup_steps = whole(setting(values, "warmup_steps"), "LinearWarmupCosine", "warmup_steps");
  o.total_steps = whole(setting(values, "total_steps"), "LinearWarmupCosine", "total_steps");
  o.min_lr = setting(values, "min_lr");
  check_warmup(o);
  options_ = o;
}

}  // namespace mg::optim
