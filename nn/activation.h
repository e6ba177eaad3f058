// Activation layers, so a nonlinearity can sit in a Sequential.
//
//   ReLU   max(x, 0)
//   GELU   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  -- the tanh approximation
//          (GPT-2's; PyTorch's nn.GELU(approximate="tanh")), not the exact erf form
//   Tanh   tanh(x)
#pragma once

#include "nn/module.h"

namespace mg::nn {

class ReLU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override { return std::make_shared<ReLU>(); }
};

class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override { return std::make_shared<GELU>(); }
};

class Tanh : public Module {
 public:
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override { return std::make_shared<Tanh>(); }
};

}  // namespace mg::nn
