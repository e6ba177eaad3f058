// Initialisers: draw with rand/randn (Philox), scale, copy_ into the tensor.
#include "nn/init.h"

#include <cmath>

#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::nn::init {

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Conv2d:
    case Nonlinearity::Sigmoid: return 1.0;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::ReLU: return std::sqrt(2.0);
    case Nonlinearity::LeakyReLU: return std::sqrt(2.0 / (1.0 + param * param));
  }
  return 1.0;
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  MG_CHECK(t.defined() && t.dim() >= 2, "init: fan in and fan out need a tensor with at least 2 dims, got ",
           t.defined() ? shape_str(t.shape()) : std::string("an undefined tensor"));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

namespace {
TensorOptions like(const Tensor& t) { return TensorOptions{t.dtype(), t.device(), false}; }

void require_floating(const Tensor& t, const char* name) {
  MG_CHECK(t.defined(), "init::", name, ": undefined tensor");
  MG_CHECK(is_floating(t.dtype()), "init::", name, ": expected a floating tensor, got ", t.dtype());
}

int64_t fan(const Tensor& t, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return mode == FanMode::FanIn ? fan_in : fan_out;
}
}  // namespace

Tensor uniform_(Tensor t, double a, double b) {
  require_floating(t, "uniform_");
  MG_CHECK(a <= b, "init::uniform_: a (", a, ") must not exceed b (", b, ")");
  NoGradGuard no_grad;
  t.copy_(add(mul(rand(t.shape(), like(t)), b - a), a));
  return t;
}

Tensor normal_(Tensor t, double mean, double std) {
  require_floating(t, "normal_");
  MG_CHECK(std >= 0, "init::normal_: std must be >= 0, got ", std);
  NoGradGuard no_grad;
  t.copy_(add(mul(randn(t.shape(), like(t)), std), mean));
  return t;
}

Tensor constant_(Tensor t, double value) {
  MG_CHECK(t.defined(), "init::constant_: undefined tensor");
  NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor zeros_(Tensor t) { return constant_(std::move(t), 0.0); }
Tensor ones_(Tensor t) { return constant_(std::move(t), 1.0); }

Tensor xavier_uniform_(Tensor t, double gain) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(std::move(t), -bound, bound);
}

Tensor xavier_normal_(Tensor t, double gain) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(std::move(t), 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)));
}

Tensor kaiming_uniform_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode)));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(std::move(t), -bound, bound);
}

Tensor kaiming_normal_(Tensor t, double a, FanMode mode, Nonlinearity nonlinearity) {
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan(t, mode)));
  return normal_(std::move(t), 0.0, std);
}

}  // namespace mg::nn::init
