// PyTorch-like printing: tensor([[1.0000, 2.0000], ...], dtype=f32, device=cpu:0).
// Large tensors show the first and last three entries of each dim.
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/tensor.h"

namespace mg {
namespace {

constexpr int64_t kSummarizeAbove = 1000;
constexpr int64_t kEdgeItems = 3;

void print_value(std::ostringstream& os, double v, bool floating) {
  char buffer[32];
  if (!floating) {
    std::snprintf(buffer, sizeof buffer, "%lld", static_cast<long long>(v));
  } else if (std::isnan(v) || std::isinf(v)) {
    std::snprintf(buffer, sizeof buffer, "%s", std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf"));
  } else if (v != 0 && (std::fabs(v) >= 1e6 || std::fabs(v) < 1e-4)) {
    std::snprintf(buffer, sizeof buffer, "%.4e", v);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.4f", v);
  }
  os << buffer;
}

void print_dim(std::ostringstream& os, const std::vector<double>& values, const Shape& shape, size_t d,
               int64_t base, bool floating, bool summarize, int indent) {
  if (d == shape.size()) {
    print_value(os, values[base], floating);
    return;
  }
  int64_t inner = 1;
  for (size_t i = d + 1; i < shape.size(); ++i) inner *= shape[i];
  os << "[";
  for (int64_t i = 0; i < shape[d]; ++i) {
    if (summarize && shape[d] > 2 * kEdgeItems && i == kEdgeItems) {
      os << "...";
      i = shape[d] - kEdgeItems - 1;
      os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
      continue;
    }
    print_dim(os, values, shape, d + 1, base + i * inner, floating, summarize, indent + 1);
    if (i + 1 < shape[d]) os << (d + 1 == shape.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << "]";
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  os << "tensor(";
  const std::vector<double> values = to_vector<double>();
  print_dim(os, values, shape(), 0, 0, is_floating(dtype()), numel() > kSummarizeAbove, 7);
  os << ", shape=" << shape_str(shape()) << ", dtype=" << dtype() << ", device=" << device();
  if (requires_grad()) os << ", requires_grad=true";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace mg
