// Dropout: mg::dropout with the module's train/eval mode.
#include "nn/dropout.h"

#include "core/ops.h"

namespace mg::nn {

Dropout::Dropout(double prob) : p(prob) {
  MG_CHECK(prob >= 0 && prob <= 1, "Dropout: probability must be in [0, 1], got ", prob);
}
Tensor Dropout::forward(const Tensor& x) { return dropout(x, p, is_training()); }
std::string Dropout::extra_repr() const { return str_cat("p=", p); }

}  // namespace mg::nn
