#include "optim/grad_scaler.h"

#include "base/checked_size.h"

#include <cmath>

#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::optim {

GradScaler::GradScaler(GradScalerOptions options) : options_(options), scale_(options.init_scale) {
  MG_CHECK(options.init_scale > 0 && std::isfinite(options.init_scale),
           "GradScaler: init_scale must be positive, got ", options.init_scale);
  MG_CHECK(options.growth_factor > 1, "GradScaler: growth_factor must be > 1, got ", options.growth_factor);
  MG_CHECK(options.backoff_factor > 0 && options.backoff_factor < 1,
           "GradScaler: backoff_factor must be in (0, 1), got ", options.backoff_factor);
  MG_CHECK(options.growth_interval > 0, "GradScaler: growth_interval must be positive, got ",
           options.growth_interval);
}

Tensor GradScaler::scale(const Tensor& loss) const {
  if (!options_.enabled) return loss;
  return mul(loss, scale_);
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!options_.enabled || unscaled_) return;
  NoGradGuard no_grad;
  const double inverse = 1.0 / scale_;
  bool local_inf = false;
  for (ParamGroup& group : optimizer.param_groups()) {
    for (Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      Tensor& g = p.mutable_grad();
      // max|g| is inf for an inf and NaN for a NaN (max propagates NaN), finite otherwise.
      if (!local_inf && g.numel() > 0 && !std::isfinite(max(abs(g)).item<double>())) local_inf = true;
      g.mul_(inverse);
    }
  }
  found_inf_ = reducer_ ? reducer_(local_inf) : local_inf;
  unscaled_ = true;
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  unscale_(optimizer);
  if (found_inf_) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  MG_CHECK(unscaled_, "GradScaler::update: call step() (or unscale_()) in this iteration first");
  if (found_inf_) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  unscaled_ = false;
  found_inf_ = false;
}

StateDict GradScaler::state_dict() const {
  auto value = [](double v) { return scalar_tensor(v, TensorOptions{DType::f64}); };
  return {{"scale", value(scale_)},
          {"growth_tracker", value(static_cast<double>(growth_tracker_))},
          {"growth_factor", value(options_.growth_factor)},
          {"backoff_factor", value(options_.backoff_factor)},
          {"growth_interval", value(static_cast<double>(options_.growth_interval))}};
}

void GradScaler::load_state_dict(const StateDict& state) {
  // Everything is read and checked first, then set: a refused state leaves the scaler as it was.
  for (const char* key : {"scale", "growth_tracker", "growth_factor", "backoff_factor", "growth_interval"})
    MG_CHECK(state.count(key) && state.at(key).numel() == 1,
             "GradScaler::load_state_dict: missing or non-scalar '", key, "'");
  const double scale = state.at("scale").item<double>();
  MG_CHECK(scale > 0 && std::isfinite(scale), "GradScaler::load_state_dict: bad scale ", scale);
  const double tracker = state.at("growth_tracker").item<double>();
  const double interval = state.at("growth_interval").item<double>();
  const std::optional<int64_t> whole_tracker = try_whole_int64(tracker),
                               whole_interval = try_whole_int64(interval);
  MG_CHECK(whole_tracker && *whole_tracker >= 0, "GradScaler::load_state_dict: bad growth_tracker ", tracker);
  MG_CHECK(whole_interval && *whole_interval > 0, "GradScaler::load_state_dict: bad growth_interval ",
           interval);
  // As the constructor requires (and PyTorch): growth above 1, backoff in (0, 1), both finite.
  const double growth = state.at("growth_factor").item<double>();
  const double backoff = state.at("backoff_factor").item<double>();
  MG_CHECK(growth > 1.0 && std::isfinite(growth), "GradScaler::load_state_dict: bad growth_factor ", growth,
           " (must be finite and above 1)");
  MG_CHECK(backoff > 0.0 && backoff < 1.0, "GradScaler::load_state_dict: bad backoff_factor ", backoff,
           " (must be in (0, 1))");
  scale_ = scale;
  growth_tracker_ = *whole_tracker;
  options_.growth_factor = growth;
  options_.backoff_factor = backoff;
  options_.growth_interval = *whole_interval;
}

}  // namespace mg::optim
