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

#include "core/dtype.h"

namespace mg::kernels::cpu {

struct Conv2dGeometry {
  int64_t channels = 0, height = 0, width = 0;  // input image C, H, W
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;

  // (H + 2p - d(k-1) - 1)/s + 1
  int64_t out_h() const { return (height + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h + 1; }
  int64_t out_w() const { return (width + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1; }
  int64_t column_rows() const { return channels * kernel_h * kernel_w; }  // C*kh*kw
  int64_t column_cols() const { return out_h() * out_w(); }               // out_h*out_w
};

// Throws mg::Error unless the geometry describes a valid convolution (positive
// kernel/stride/dilation, non-negative padding, at least one output pixel).
void check_conv2d_geometry(const Conv2dGeometry& g);

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
