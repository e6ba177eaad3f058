// Linear: mg::linear (one GEMM against W^T, plus a broadcast bias add).
#include "nn/linear.h"

#include <cmath>

#include "core/ops.h"
#include "nn/init.h"

namespace mg::nn {

Linear::Linear(int64_t in, int64_t out, bool has_bias) : in_features(in), out_features(out) {
  MG_CHECK(in > 0 && out > 0, "Linear: in_features and out_features must be positive, got ", in, " and ",
           out);
  weight = empty({out, in});
  register_parameter("weight", weight);
  if (has_bias) {
    bias = empty({out});
    register_parameter("bias", bias);
  }
  reset_parameters();
}

void Linear::reset_parameters() {
  init::kaiming_uniform_(weight, std::sqrt(5.0));  // bound = 1/sqrt(in_features)
  if (bias.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
    init::uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

std::shared_ptr<Module> Linear::clone_empty() const {
  return std::make_shared<Linear>(in_features, out_features, bias.defined());
}

std::string Linear::extra_repr() const {
  return str_cat("in_features=", in_features, ", out_features=", out_features,
                 ", bias=", bias.defined() ? "true" : "false");
}

}  // namespace mg::nn
