// 2-d max and average pooling over contiguous [planes, H, W] inputs (CPU).
//
// N and C play the same role for pooling -- every (n, c) plane is pooled on
// its own -- so the kernels see planes = N*C. Output sizes use floor mode,
//   out = (H + 2*pad - kernel) / stride + 1,
// and, as in PyTorch, padding may be at most half the kernel, so every window
// overlaps at least one real input element. Max pooling pads with -inf;
// average pooling pads with 0 and divides by kh*kw (count_include_pad) or by
// the number of real elements in the window.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// output [planes, out_h, out_w]; argmax (same shape) receives, for each output,
// the flat index ih*W + iw within its plane of the element that won. A NaN in
// a window wins (the output is NaN), as in PyTorch.
void max_pool2d_forward(const Pool2dGeometry& g, DType dtype, const void* input, void* output,
                        int64_t* argmax);

// grad_input [planes, H, W] is zeroed here, then each grad_output is added at
// its window's argmax (overlapping windows accumulate).
void max_pool2d_backward(const Pool2dGeometry& g, DType dtype, const void* grad_output, const int64_t* argmax,
                         void* grad_input);

void avg_pool2d_forward(const Pool2dGeometry& g, DType dtype, const void* input, void* output,
                        bool count_include_pad);

// grad_input is zeroed here; each grad_output is spread evenly over its window's real elements
// (divided by the same count the forward pass used).
void avg_pool2d_backward(const Pool2dGeometry& g, DType dtype, const void* grad_output, void* grad_input,
                         bool count_include_pad);

}  // namespace mg::kernels::cpu
