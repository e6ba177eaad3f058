// Parameter initialisers (PyTorch's torch.nn.init), in place and without history.
//
// Every random initialiser draws from the global Philox generator (manual_seed),
// so the same seed gives the same weights on every rank and every device.
//
//   uniform_(t, a, b)          U(a, b)
//   normal_(t, mean, std)      N(mean, std^2)
//   xavier_uniform_(t, gain)   U(-bound, bound),  bound = gain * sqrt(6 / (fan_in + fan_out))
//   xavier_normal_(t, gain)    N(0, std^2),       std   = gain * sqrt(2 / (fan_in + fan_out))
//   kaiming_uniform_(t, a)     U(-bound, bound),  bound = gain * sqrt(3 / fan)
//   kaiming_normal_(t, a)      N(0, std^2),       std   = gain / sqrt(fan)
//
// where for a weight [out, in, k...] fan_in = in * prod(k), fan_out = out * prod(k),
// and gain = calculate_gain(nonlinearity, a) (sqrt(2) for ReLU, sqrt(2/(1+a^2)) for
// leaky ReLU with slope a). Linear and Conv2d use kaiming_uniform_(w, sqrt(5)), whose
// bound works out to 1/sqrt(fan_in), exactly as PyTorch's layers do.
#pragma once

#include <utility>

#include "core/tensor.h"

namespace mg::nn::init {

enum class Nonlinearity { Linear, Conv2d, Sigmoid, Tanh, ReLU, LeakyReLU };
enum class FanMode { FanIn, FanOut };

// The recommended gain for a nonlinearity (param: the negative slope of LeakyReLU).
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);
// {fan_in, fan_out} of a weight with at least 2 dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

// Each fills `t` in place (under NoGradGuard) and returns it.
Tensor uniform_(Tensor t, double a = 0.0, double b = 1.0);
Tensor normal_(Tensor t, double mean = 0.0, double std = 1.0);
Tensor constant_(Tensor t, double value);
Tensor zeros_(Tensor t);
Tensor ones_(Tensor t);
Tensor xavier_uniform_(Tensor t, double gain = 1.0);
Tensor xavier_normal_(Tensor t, double gain = 1.0);
Tensor kaiming_uniform_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                        Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);
Tensor kaiming_normal_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn,
                       Nonlinearity nonlinearity = Nonlinearity::LeakyReLU);

}  // namespace mg::nn::init
