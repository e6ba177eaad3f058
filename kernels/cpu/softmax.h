// Softmax and log-softmax over one axis of a contiguous tensor (CPU).
//
// Any axis of a contiguous tensor can be seen as the middle axis of a 3-d shape
// [outer, dim, inner]: `outer` is the product of the sizes before it, `inner`
// the product of the sizes after it. Element (o, d, i) sits at
// o * dim * inner + d * inner + i, so the kernel needs no transpose for any axis.
// inner == 1 (softmax over the last axis, as in attention and classifiers) is
// the common case and gets the plain row-by-row loop.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// y = softmax(x) (or log_softmax(x) when `log`) along the `dim` axis.
void softmax_forward(DType dtype, const SoftmaxShape& s, const void* input, void* output, bool log);

// Given y = forward(x) and gy = dL/dy, writes gx = dL/dx:
//   softmax:      gx = y * (gy - sum(gy * y))
//   log_softmax:  gx = gy - exp(y) * sum(gy)
// where each sum runs over the `dim` axis. Only the output is needed, never x.
void softmax_backward(DType dtype, const SoftmaxShape& s, const void* grad_output, const void* output,
                      void* grad_input, bool log);

}  // namespace mg::kernels::cpu
