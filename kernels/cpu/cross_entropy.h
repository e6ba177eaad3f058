// Cross-entropy fused with log-softmax (CPU): logits [rows, classes] and one
// int64 class index per row. Fusing means the [rows, classes] log-probabilities
// are never written to memory: the forward keeps one logsumexp per row and the
// backward recomputes the softmax from the logits.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mg::kernels::cpu {

// Per-row loss, written to `losses` [rows] in `dtype`:
//   losses[i] = (1 - eps) * (logsumexp(x_i) - x_i[t_i]) + eps * mean_c(logsumexp(x_i) - x_i[c])
// with eps = label_smoothing in [0, 1) (PyTorch semantics), and losses[i] = 0
// where t_i == ignore_index. Returns the number of rows not ignored (the
// divisor of a "mean" reduction). Throws mg::Error naming the row and the value
// when a target lies outside [0, classes) and is not ignore_index; nothing is
// written in that case.
int64_t cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                              int64_t classes, int64_t ignore_index, double label_smoothing, void* losses);

// The same, with the count written to `counted` (one f32): the twin of the CUDA kernel that
// leaves the count on the device, so that a training step need not wait for it.
void cross_entropy_forward_counted(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                                   int64_t classes, int64_t ignore_index, double label_smoothing,
                                   void* losses, float* counted);

// grad_logits[i, c] = grad_losses[i] * (softmax(x_i)[c] - (1 - eps) * [c == t_i] - eps / classes),
// and an all-zero row where t_i == ignore_index. Same target checks as the forward.
void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                            int64_t classes, int64_t ignore_index, double label_smoothing,
                            const void* grad_losses, void* grad_logits);

}  // namespace mg::kernels::cpu
