// Pooling layers over [N, C, H, W] (square windows).
//
//   MaxPool2d(k, stride = k, padding = 0)      max over each k x k window
//   AvgPool2d(k, stride = k, padding = 0)      mean over each window (padding counted, as PyTorch)
//   AdaptiveAvgPool2d(out_h, out_w)            picks the window so the output is out_h x out_w:
//       (1, 1)                -> mean over H and W (global average pooling)
//       H % out_h == W % out_w == 0 -> avg_pool2d with kernel = stride = (H/out_h, W/out_w)
//       anything else         -> an error (PyTorch's overlapping windows are not implemented)
#pragma once

#include "nn/module.h"

namespace mg::nn {

class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;
  const int64_t kernel_size, stride, padding;  // stride 0 means kernel_size
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;
  const int64_t kernel_size, stride, padding;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(int64_t output_h, int64_t output_w);
  explicit AdaptiveAvgPool2d(int64_t output_size) : AdaptiveAvgPool2d(output_size, output_size) {}
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;
  const int64_t output_h, output_w;
};

}  // namespace mg::nn
