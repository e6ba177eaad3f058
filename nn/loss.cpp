// Losses. nll_loss has no kernel of its own: it picks each row's target entry
// with a one-hot mask (targets == arange(C)), which autograd differentiates as a
// where(), so the gradient is -1 (scaled by the reduction) at the target and 0
// elsewhere, exactly PyTorch's.
#include "nn/loss.h"

namespace mg::nn {

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options) {
  return mg::cross_entropy(logits, targets, options);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& targets_in, const NLLLossOptions& options) {
  MG_CHECK(log_probs.defined() && targets_in.defined(), "nll_loss: undefined input");
  MG_CHECK(is_floating(log_probs.dtype()), "nll_loss: log_probs must be floating, got ", log_probs.dtype());
  MG_CHECK(is_integral(targets_in.dtype()), "nll_loss: targets must be class indices (i64 or i32), got ",
           targets_in.dtype());
  MG_CHECK(log_probs.dim() >= 2, "nll_loss: log_probs must be [N, C] or [N, C, d1, ...], got ",
           shape_str(log_probs.shape()));
  Shape expected = log_probs.shape();
  expected.erase(expected.begin() + 1);
  MG_CHECK(targets_in.shape() == expected, "nll_loss: log_probs of shape ", shape_str(log_probs.shape()),
           " need targets of shape ", shape_str(expected), ", got ", shape_str(targets_in.shape()));
  const Tensor targets = targets_in.to(DType::i64);
  const int64_t C = log_probs.size(1);
  const Tensor valid = ne(targets, static_cast<double>(options.ignore_index));  // [N, d...]
  const int64_t out_of_range =
      sum(logical_and(valid, logical_or(lt(targets, 0.0), ge(targets, static_cast<double>(C)))))
          .item<int64_t>();
  MG_CHECK(out_of_range == 0, "nll_loss: ", out_of_range, " target(s) outside [0, ", C,
           ") (and not ignore_index ", options.ignore_index, ")");

  // one_hot[n, c, ...] = (targets[n, ...] == c)
  Shape class_shape(log_probs.dim(), 1);
  class_shape[1] = C;
  const Tensor classes = arange(C, TensorOptions{DType::i64, log_probs.device()}).reshape(class_shape);
  const Tensor one_hot = logical_and(eq(targets.unsqueeze(1), classes), valid.unsqueeze(1));
  const Tensor zero = zeros({}, TensorOptions{log_probs.dtype(), log_probs.device()});
  const Tensor losses = neg(sum(where(one_hot, log_probs, zero), {1}));  // [N, d...], 0 where ignored

  switch (options.reduction) {
    case Reduction::None: return losses;
    case Reduction::Sum: return sum(losses);
    case Reduction::Mean: {
      // Like PyTorch: divide by the number of counted rows (0/0 = NaN when every row is ignored).
      return div(sum(losses), static_cast<double>(sum(valid).item<int64_t>()));
    }
  }
  return losses;
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  MG_CHECK(input.defined() && target.defined(), "mse_loss: undefined input");
  MG_CHECK(input.shape() == target.shape(), "mse_loss: input of shape ", shape_str(input.shape()),
           " and target of shape ", shape_str(target.shape()), " must have the same shape");
  const Tensor squared = square(sub(input, target));
  switch (reduction) {
    case Reduction::None: return squared;
    case Reduction::Sum: return sum(squared);
    case Reduction::Mean: return mean(squared);
  }
  return squared;
}

}  // namespace mg::nn
