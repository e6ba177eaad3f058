// GradScaler: dynamic loss scaling for f16 training.
//
// f16 has 5 exponent bits: gradients below ~6e-8 flush to zero. Multiplying the
// loss by a large factor S shifts every gradient up by S (backward is linear), so
// small gradients survive; before the optimizer step the gradients are divided by
// S again. If S was too large, some gradient overflowed to inf/NaN: the step is
// skipped and S halves. After `growth_interval` clean steps S doubles, probing for
// the largest safe scale. (bf16 has f32's exponent range and needs none of this.)
//
//   optim::GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(opt);     // unscales, then steps unless a gradient is inf/NaN
//   scaler.update();      // grows or backs off the scale
//
// Under DDP every rank must make the SAME skip decision, or the replicas diverge:
// set_found_inf_reducer installs a function (an all-reduce of the flag) that
// turns the local verdict into the global one.
#pragma once

#include <cstdint>
#include <functional>

#include "core/state_dict.h"
#include "core/tensor.h"
#include "optim/optimizer.h"

namespace mg::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale() and unscale_() are identities, step() always steps
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (a differentiable op, so backward produces scaled gradients).
  Tensor scale(const Tensor& loss) const;
  // Divides every gradient of `optimizer` by the scale, in place, once per
  // iteration, and records whether any of them is inf or NaN.
  void unscale_(Optimizer& optimizer);
  // Unscales if not yet done, then calls optimizer.step() unless a gradient was
  // inf/NaN. Returns whether the step ran.
  bool step(Optimizer& optimizer);
  // Adjusts the scale from this iteration's verdict and starts the next iteration.
  void update();

  double get_scale() const { return scale_; }
  bool found_inf() const { return found_inf_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  // reducer(local_found_inf) -> global_found_inf; e.g. an all-reduce(max) over ranks.
  void set_found_inf_reducer(std::function<bool(bool)> reducer) { reducer_ = std::move(reducer); }

  // "scale", "growth_tracker" and the options, as 0-d f64 tensors.
  StateDict state_dict() const;
  void load_state_dict(const StateDict& state);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  bool unscaled_ = false;
  bool found_inf_ = false;
  std::function<bool(bool)> reducer_;
};

}  // namespace mg::optim
