// Learning-rate schedulers: StepLR, CosineAnnealingLR, LinearWarmupCosine.
//
// A scheduler owns a step counter t (PyTorch's last_epoch) and sets every
// param group's "lr" to lr(t, base_lr), where base_lr is the group's lr when the
// scheduler was built. Constructing one sets t = 0 and applies lr(0) (as
// PyTorch's constructor does); each step() then does ++t and applies lr(t).
// Call it AFTER optimizer.step():
//
//   optim::CosineAnnealingLROptions cosine;
//   cosine.t_max = 100;
//   optim::CosineAnnealingLR sched(opt, cosine);
//   for (...) { loss.backward(); opt.step(); sched.step(); }
//
// Every schedule here is written in CLOSED FORM, a function of t only, instead
// of PyTorch's recursive "multiply last lr by a factor" form. The two agree to
// rounding (the tests check 1e-12 relative), and the closed form makes the
// state trivial: t and the base lrs are all there is to save. The flip side:
// an lr a user writes into a group by hand is overwritten at the next step().
//
// state_dict(): "last_epoch", "base_lrs.<g>", "last_lrs.<g>" and the schedule's
// own settings ("step_size", "gamma", ...), all 0-d f64 tensors.
// load_state_dict() also writes the restored last lrs into the optimizer's
// groups (PyTorch leaves that to the optimizer's state dict): constructing a
// scheduler sets lr(0) in the optimizer, so without this, resuming would
// depend on loading the two state dicts in the right order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/state_dict.h"
#include "optim/optimizer.h"

namespace mg::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances t by one and sets every group's lr.
  void step();
  // Jumps to step t >= 0 in O(1) (the schedules are closed forms of t) and sets every group's lr:
  // what t calls of step() after construction would do. For resuming at a saved step -- a loop of
  // step() calls spun "forever" on a checkpoint whose step was 10^15.
  void set_step(int64_t t);
  // The lrs step() (or the constructor) last set, one per param group.
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }

  // The learning rate at step t for a group whose base lr is base_lr.
  virtual double lr_at(int64_t t, double base_lr) const = 0;
  virtual const char* name() const = 0;

  StateDict state_dict() const;
  // Validates (missing / unexpected / mis-shaped keys, group count) before
  // changing anything; restores t, the base and last lrs and the settings, and
  // sets each optimizer group's lr to its restored last lr.
  void load_state_dict(const StateDict& state_dict);

 protected:
  // Captures each group's current lr as its base lr. Subclass constructors
  // validate their settings and then call start().
  explicit LRScheduler(Optimizer& optimizer);
  void start();  // t = 0, apply lr(0)

  // The schedule's own settings, by name, for state_dict; set_settings receives
  // every name settings() returned, already read from the state dict.
  virtual std::vector<std::pair<std::string, double>> settings() const = 0;
  virtual void set_settings(const std::vector<std::pair<std::string, double>>& values) = 0;

 private:
  void apply();
  Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lrs_;
  int64_t last_epoch_ = 0;
};

// lr = base_lr * gamma^floor(t / step_size): decay by gamma every step_size steps.
struct StepLROptions {
  int64_t step_size = 1;
  double gamma = 0.1;
};
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, const StepLROptions& options);
  double lr_at(int64_t t, double base_lr) const override;
  const char* name() const override { return "StepLR"; }

 protected:
  std::vector<std::pair<std::string, double>> settings() const override;
  void set_settings(const std::vector<std::pair<std::string, double>>& values) override;

 private:
  StepLROptions options_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * t / t_max)) / 2
// Half a cosine from base_lr down to eta_min over t_max steps (and, as in
// PyTorch, back up again if training runs past t_max).
struct CosineAnnealingLROptions {
  int64_t t_max = 1;
  double eta_min = 0.0;
};
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, const CosineAnnealingLROptions& options);
  double lr_at(int64_t t, double base_lr) const override;
  const char* name() const override { return "CosineAnnealingLR"; }

 protected:
  std::vector<std::pair<std::string, double>> settings() const override;
  void set_settings(const std::vector<std::pair<std::string, double>>& values) override;

 private:
  CosineAnnealingLROptions options_;
};

// Linear warmup, then cosine decay to min_lr, then constant (nanoGPT's schedule):
//   t <  warmup_steps:          lr = base_lr * (t + 1) / warmup_steps
//   warmup_steps <= t <= total: lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * r)) / 2,
//                               r = (t - warmup_steps) / (total_steps - warmup_steps)
//   t > total_steps:            lr = min_lr
// The first step already trains (at base_lr / warmup_steps, never at 0); the
// step at t = warmup_steps - 1 reaches base_lr, and the decay ends at
// t = total_steps. warmup_steps = 0 gives a plain cosine.
struct LinearWarmupCosineOptions {
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr = 0.0;
};
class LinearWarmupCosine : public LRScheduler {
 public:
  LinearWarmupCosine(Optimizer& optimizer, const LinearWarmupCosineOptions& options);
  double lr_at(int64_t t, double base_lr) const override;
  const char* name() const override { return "LinearWarmupCosine"; }

 protected:
  std::vector<std::pair<std::string, double>> settings() const override;
  void set_settings(const std::vector<std::pair<std::string, double>>& values) override;

 private:
  LinearWarmupCosineOptions options_;
};

}  // namespace mg::optim
