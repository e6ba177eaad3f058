// Batch normalisation over the channel dim (CPU): x is [n, c, hw] (an [N, C, H, W] tensor
// viewed with H·W flattened, or [N, C] with hw = 1). Channel k is normalised with the mean and
// biased variance of its n·hw values (training) or with given statistics (eval), then scaled and
// shifted:  y = (x - mean[k]) * rstd[k] * weight[k] + bias[k],  rstd = 1 / sqrt(var + eps).
// Statistics are f64 for f64 data and f32 otherwise, like layer_norm. f32 and f64 only: other
// dtypes go through the composed ops (nn/normalization.cpp).
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mg::kernels::cpu {

// mean and var ([c], statistics dtype) of each channel; var is biased (divided by n·hw).
void batch_norm_stats(DType dtype, const void* x, int64_t n, int64_t c, int64_t hw, void* mean, void* var);

// y = (x - mean) * rstd * weight + bias per channel. weight/bias may be nullptr (1 and 0).
void batch_norm_apply(DType dtype, const void* x, const void* mean, const void* rstd, const void* weight,
                      const void* bias, int64_t n, int64_t c, int64_t hw, void* y);

// Gradients of batch_norm_apply. With `batch_stats` the mean and rstd are functions of x (training)
// and grad_x includes their derivative:
//   gx = weight * rstd / M * (M * gy - sum(gy) - xhat * sum(gy * xhat)),   M = n·hw
// otherwise (eval) gx = gy * weight * rstd. grad_x, grad_weight, grad_bias may each be nullptr;
// grad_weight = sum(gy * xhat) and grad_bias = sum(gy) per channel are overwritten.
void batch_norm_backward(DType dtype, const void* grad_y, const void* x, const void* mean, const void* rstd,
                         const void* weight, int64_t n, int64_t c, int64_t hw, bool batch_stats, void* grad_x,
                         void* grad_weight, void* grad_bias);

}  // namespace mg::kernels::cpu
