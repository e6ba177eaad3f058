// Layer normalisation over the last axis (CPU): x is [rows, cols], each row is
// normalised with its own mean and biased variance (PyTorch semantics), then
// scaled and shifted per column:
//   y = (x - mean) * rstd * weight + bias,   rstd = 1 / sqrt(var + eps)
// The forward saves mean and rstd per row ("statistics dtype": f64 when x is
// f64, f32 otherwise) so the backward need not recompute them.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mg::kernels::cpu {

// weight and bias are [cols] in `dtype` and may each be nullptr (meaning 1 and 0).
void layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias, int64_t rows,
                        int64_t cols, double eps, void* y, void* mean, void* rstd);

// grad_x [rows, cols] is always written. grad_weight and grad_bias [cols] are
// overwritten (not accumulated) when non-null. weight may be nullptr.
void layer_norm_backward(DType dtype, const void* grad_y, const void* x, const void* mean, const void* rstd,
                         const void* weight, int64_t rows, int64_t cols, void* grad_x, void* grad_weight,
                         void* grad_bias);

}  // namespace mg::kernels::cpu
