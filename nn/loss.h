// Loss functions (PyTorch's torch.nn.functional names and defaults).
//
//   cross_entropy(logits [N, C], targets [N] i64)   -log softmax(logits)[target], the fused
//       kernel of mg::cross_entropy; label smoothing mixes in the uniform distribution:
//       loss = (1 - s) * nll + s * mean_c(-log p_c)
//   nll_loss(log_probs [N, C], targets [N] i64)     -log_probs[n, target_n], composed from
//       ops; rows whose target == ignore_index count for nothing (not even in the mean)
//   mse_loss(input, target)                         (input - target)^2, same shapes
//
// Each reduces with Reduction::Mean (default), Sum or None (per element / per row).
#pragma once

#include "core/ops.h"

namespace mg::nn {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {});

struct NLLLossOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
};
// log_probs [N, C] or [N, C, d1, ...] with targets [N] or [N, d1, ...].
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, const NLLLossOptions& options = {});

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::Mean);

}  // namespace mg::nn
