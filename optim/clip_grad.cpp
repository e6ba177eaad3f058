// clip_grad_norm_: per-gradient partial sums with tensor ops (so any device the
// ops support works), combined in double on the host, then one in-place scale.
//
// For p = 2 each gradient contributes sum(g * g); for p = inf, max(|g|); for
// any other p, sum(|g|^p). Partial results come back as doubles and are summed
// (or maxed) here, then the p-th root is taken once. PyTorch instead takes each
// tensor's p-norm and then the p-norm of those norms, the same value up to
// rounding.
#include "optim/clip_grad.h"

#include <cmath>
#include <limits>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  NoGradGuard no_grad;
  MG_CHECK(norm_type > 0.0, "clip_grad_norm_: norm_type must be > 0 (or INFINITY), got ", norm_type);
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  for (const Tensor& g : grads)
    MG_CHECK(g.device() == grads[0].device(), "clip_grad_norm_: gradients on ", grads[0].device(), " and ",
             g.device(), "; all gradients must be on one device");

  const bool inf_norm = std::isinf(norm_type);
  double acc = 0.0;
  for (const Tensor& g : grads) {
    double part;
    if (inf_norm) {
      part = g.numel() == 0 ? 0.0 : max(abs(g)).item<double>();
      acc = (part > acc || std::isnan(part)) ? part : acc;  // NaN propagates
    } else {
      part = norm_type == 2.0 ? sum(square(g)).item<double>() : sum(pow(abs(g), norm_type)).item<double>();
      acc += part;
    }
  }
  const double total = inf_norm ? acc : (norm_type == 1.0 ? acc : std::pow(acc, 1.0 / norm_type));

  if (!std::isfinite(total) && error_if_nonfinite) {
    size_t bad = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& g = params[i].defined() ? params[i].grad() : Tensor();
      if (!g.defined()) continue;
      const double m = g.numel() == 0 ? 0.0 : max(abs(g)).item<double>();
      if (!std::isfinite(m)) {
        bad = i;
        break;
      }
    }
    throw Error(str_cat("clip_grad_norm_: the total norm of order ", norm_type, " of the gradients is ",
                        total, " (first non-finite gradient: parameter ", bad,
                        "). Pass error_if_nonfinite=false to clip anyway, or skip this step."));
  }
  const double coef = max_norm / (total + 1e-6);
  if (!(coef >= 1.0))  // also true for NaN: scale by NaN, as PyTorch does
    for (Tensor& g : grads) g.mul_(coef);
  return total;
}

}  // namespace mg::optim
