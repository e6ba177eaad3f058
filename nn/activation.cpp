// Activations: each forward is one core op (with its own backward formula).
#include "nn/activation.h"

#include "core/ops.h"

namespace mg::nn {

Tensor ReLU::forward(const Tensor& x) { return relu(x); }
Tensor GELU::forward(const Tensor& x) { return gelu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

}  // namespace mg::nn
