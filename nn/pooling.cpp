// Pooling layers: thin wrappers over mg::max_pool2d / mg::avg_pool2d / mg::mean.
#include "nn/pooling.h"

#include "core/ops.h"

namespace mg::nn {

namespace {
Pool2dOptions square(int64_t kernel, int64_t stride, int64_t padding) {
  Pool2dOptions o{kernel, kernel};
  o.stride_h = o.stride_w = stride == 0 ? kernel : stride;
  o.pad_h = o.pad_w = padding;
  return o;
}
void check_pool(const char* name, int64_t kernel, int64_t stride, int64_t padding) {
  MG_CHECK(kernel > 0 && stride >= 0 && padding >= 0, name, ": kernel_size ", kernel,
           " must be positive, stride ", stride, " and padding ", padding, " non-negative");
}
}  // namespace

MaxPool2d::MaxPool2d(int64_t k, int64_t s, int64_t p) : kernel_size(k), stride(s == 0 ? k : s), padding(p) {
  check_pool("MaxPool2d", k, s, p);
}
Tensor MaxPool2d::forward(const Tensor& x) { return max_pool2d(x, square(kernel_size, stride, padding)); }
std::shared_ptr<Module> MaxPool2d::clone_empty() const {
  return std::make_shared<MaxPool2d>(kernel_size, stride, padding);
}
std::string MaxPool2d::extra_repr() const {
  return str_cat("kernel_size=", kernel_size, ", stride=", stride, ", padding=", padding);
}

AvgPool2d::AvgPool2d(int64_t k, int64_t s, int64_t p) : kernel_size(k), stride(s == 0 ? k : s), padding(p) {
  check_pool("AvgPool2d", k, s, p);
}
Tensor AvgPool2d::forward(const Tensor& x) { return avg_pool2d(x, square(kernel_size, stride, padding)); }
std::shared_ptr<Module> AvgPool2d::clone_empty() const {
  return std::make_shared<AvgPool2d>(kernel_size, stride, padding);
}
std::string AvgPool2d::extra_repr() const {
  return str_cat("kernel_size=", kernel_size, ", stride=", stride, ", padding=", padding);
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t oh, int64_t ow) : output_h(oh), output_w(ow) {
  MG_CHECK(oh > 0 && ow > 0, "AdaptiveAvgPool2d: output size must be positive, got (", oh, ", ", ow, ")");
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  MG_CHECK(x.defined() && x.dim() == 4, "AdaptiveAvgPool2d: input must be [N, C, H, W], got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  const int64_t h = x.size(2), w = x.size(3);
  if (output_h == 1 && output_w == 1) return mean(x, {2, 3}, /*keepdim=*/true);
  MG_CHECK(
      h % output_h == 0 && w % output_w == 0, "AdaptiveAvgPool2d: input ", shape_str(x.shape()),
      " cannot be pooled to (", output_h, ", ", output_w,
      ") with equal windows (H and W must be multiples of the output size); overlapping adaptive windows are "
      "not implemented");
  Pool2dOptions o{h / output_h, w / output_w};
  return avg_pool2d(x, o);
}

std::shared_ptr<Module> AdaptiveAvgPool2d::clone_empty() const {
  return std::make_shared<AdaptiveAvgPool2d>(output_h, output_w);
}
std::string AdaptiveAvgPool2d::extra_repr() const {
  return str_cat("output_size=(", output_h, ", ", output_w, ")");
}

}  // namespace mg::nn
