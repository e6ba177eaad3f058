// Linear: y = x W^T + b, the fully connected layer.
//
//   weight [out_features, in_features], bias [out_features]
//   x [..., in_features] -> y [..., out_features]
//
// Initialised like PyTorch's nn.Linear: weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
#pragma once

#include "nn/module.h"

namespace mg::nn {

class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  // Re-draws weight and bias with PyTorch's default initialisation.
  void reset_parameters();
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;

  const int64_t in_features, out_features;
  Tensor weight, bias;  // bias is undefined (and not registered) when bias = false
};

}  // namespace mg::nn
