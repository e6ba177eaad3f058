// Gradient clipping by global norm (torch.nn.utils.clip_grad_norm_).
//
// The norm is taken over ALL gradients as if they were one long vector:
//   total = ( sum over params, sum over elements |g|^p )^(1/p)     (p = inf: max |g|)
// and when total > max_norm every gradient is scaled by the same factor
//   coef = max_norm / (total + 1e-6)
// so the direction of the update is kept and only its length shrinks. One
// global factor (not one per tensor) is what keeps the direction.
//
// Non-finite norms. With error_if_nonfinite, an inf or NaN total throws
// mg::Error (naming the first parameter whose gradient is non-finite) before any
// gradient is touched. Without it we do exactly what PyTorch does, so a
// training loop behaves the same in both: coef = max_norm / (total + 1e-6)
// is applied whenever it is not >= 1, which means
//   total = NaN -> coef = NaN -> every gradient becomes NaN;
//   total = inf -> coef = 0   -> finite gradient elements become 0, and
//                                 inf elements become NaN (inf * 0).
// Either way the returned total tells the caller (or a GradScaler) to skip the
// step.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mg::optim {

// Returns the total norm of the gradients (before clipping). Parameters without
// a gradient are ignored. norm_type: any p > 0, or INFINITY for the max norm.
// All gradients must be on one device. Runs under NoGradGuard.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

}  // namespace mg::optim
