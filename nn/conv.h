// Conv2d: 2-d convolution over [N, C, H, W] images (square kernels).
//
//   weight [out_channels, in_channels, k, k], bias [out_channels]
//   output size per spatial dim: (H + 2*padding - dilation*(k-1) - 1) / stride + 1
//
// Initialised like PyTorch's nn.Conv2d: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with
// fan_in = in_channels * k * k, for weight and bias.
#pragma once

#include "nn/module.h"

namespace mg::nn {

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, Conv2dOptions options = {});
  Tensor forward(const Tensor& x) override;
  void reset_parameters();
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;

  const int64_t in_channels, out_channels, kernel_size;
  const Conv2dOptions options;
  Tensor weight, bias;  // bias undefined when options.bias = false
};

}  // namespace mg::nn
