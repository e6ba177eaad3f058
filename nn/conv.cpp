// Conv2d: mg::conv2d (im2col + GEMM on the CPU) with the layer's geometry.
#include "nn/conv.h"

#include <cmath>

#include "core/ops.h"
#include "nn/init.h"

namespace mg::nn {

Conv2d::Conv2d(int64_t in, int64_t out, int64_t k, Conv2dOptions opts)
    : in_channels(in), out_channels(out), kernel_size(k), options(opts) {
  MG_CHECK(in > 0 && out > 0 && k > 0,
           "Conv2d: in_channels, out_channels and kernel_size must be positive, got ", in, ", ", out, ", ",
           k);
  MG_CHECK(opts.stride > 0 && opts.dilation > 0 && opts.padding >= 0, "Conv2d: stride ", opts.stride,
           ", dilation ", opts.dilation, " must be positive and padding ", opts.padding, " non-negative");
  weight = empty({out, in, k, k});
  register_parameter("weight", weight);
  if (opts.bias) {
    bias = empty({out});
    register_parameter("bias", bias);
  }
  reset_parameters();
}

void Conv2d::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const double bound =
        1.0 / std::sqrt(static_cast<double>(init::calculate_fan_in_and_fan_out(weight).first));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& x) {
  mg::Conv2dOptions geometry;
  geometry.stride_h = geometry.stride_w = options.stride;
  geometry.pad_h = geometry.pad_w = options.padding;
  geometry.dilation_h = geometry.dilation_w = options.dilation;
  return conv2d(x, weight, bias, geometry);
}

std::shared_ptr<Module> Conv2d::clone_empty() const {
  return std::make_shared<Conv2d>(in_channels, out_channels, kernel_size, options);
}

std::string Conv2d::extra_repr() const {
  return str_cat(in_channels, ", ", out_channels, ", kernel_size=", kernel_size, ", stride=", options.stride,
                 ", padding=", options.padding,
                 options.dilation != 1 ? str_cat(", dilation=", options.dilation) : "",
                 options.bias ? "" : ", bias=false");
}

}  // namespace mg::nn
