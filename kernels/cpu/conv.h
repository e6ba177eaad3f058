// im2col / col2im: Conv2d expressed as one GEMM per image, or per batch of images (NCHW).
//
// A 2-d convolution of an image x[C, H, W] with weights w[Cout, C, kh, kw] is
//   y[co, oh, ow] = sum_{c, i, j} w[co, c, i, j] * x[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
// (out-of-range x reads as 0). im2col copies, for every output position, the
// C*kh*kw input values it sees into one column of a matrix
//   columns[(c*kh + i)*kw + j, oh*out_w + ow],
// after which the convolution is a plain GEMM: y[Cout, out_h*out_w] =
// w[Cout, C*kh*kw] x columns. The backward passes are GEMMs too:
//   grad_w = grad_y x columns^T,   grad_columns = w^T x grad_y,
// and col2im folds grad_columns back onto the image, adding up the
// contributions of overlapping windows: col2im is the adjoint (transpose) of
// im2col, so <im2col(x), y> == <x, col2im(y)>.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// image [C, H, W] -> columns [C*kh*kw, out_h*out_w], row-major; padding reads as 0.
// With images = B: B consecutive images [B, C, H, W] -> columns [C*kh*kw, B*out_h*out_w],
// image b's columns at [b*out_h*out_w, (b+1)*out_h*out_w) of every row (so one GEMM
// convolves all B).
void im2col(const Conv2dGeometry& g, DType dtype, const void* image, void* columns, int64_t images = 1);

// columns [C*kh*kw, out_h*out_w] -> image [C, H, W]. ACCUMULATES into image
// (the caller zeroes it); entries that fall on padding are dropped. With images = B,
// the batched layout of im2col above: columns [C*kh*kw, B*out_h*out_w] -> [B, C, H, W].
void col2im(const Conv2dGeometry& g, DType dtype, const void* columns, void* image, int64_t images = 1);

}  // namespace mg::kernels::cpu
