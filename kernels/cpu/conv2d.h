// conv2d on the CPU, forward and backward, one image per thread (f32 and f64).
//
// The batched im2col + one-GEMM formulation (conv.h, used on the GPU and for 16-bit floats)
// writes a [C*kh*kw, B*OH*OW] column matrix for the whole batch: 9x the input for a 3x3
// kernel, far larger than any cache, then permutes the GEMM's [O, B, OH*OW] result into
// [B, O, OH*OW] with another full copy (and the gradient back). Here each thread takes a
// contiguous share of the batch and, image by image, expands one image into a column buffer
// of its own (C*kh*kw x OH*OW: 225 KiB for FashionCNN's second layer, so it stays in L2 while
// the GEMM reads it) and multiplies:
//
//   forward:   y[b]      = W[O, CK] @ cols_b[CK, S]          written in place, no permute
//   backward:  gW_t     += gy[b][O, S] @ cols_b^T            one partial per thread
//              dcols     = W^T[CK, O] @ gy[b][O, S]
//              gx[b]     = col2im(dcols)
//   then       gW        = sum of the thread partials, in thread order
//
// (CK = C*kh*kw, S = OH*OW.) The GEMMs inside the parallel region run single-threaded
// (OpenMP-built OpenBLAS does that by itself inside a parallel region); with one image, or one
// thread, the region is skipped and the GEMM may use every thread instead.
//
// Results depend on the thread count only through gW's summation order (partials per thread);
// for a given count they are the same on every run.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/cpu/conv.h"

namespace mg::kernels::cpu {

// x [batch, C, H, W], w [out_channels, C, kh, kw], y [batch, out_channels, OH, OW]; all
// contiguous, all of `dtype` (f32 or f64). y is overwritten.
void conv2d_forward(const Conv2dGeometry& g, DType dtype, int64_t batch, int64_t out_channels, const void* x,
                    const void* w, void* y);

// gy [batch, out_channels, OH, OW]. Writes (overwrites) gx [batch, C, H, W] and gw
// [out_channels, C, kh, kw]; either may be null when that gradient is not wanted.
void conv2d_backward(const Conv2dGeometry& g, DType dtype, int64_t batch, int64_t out_channels, const void* x,
                     const void* w, const void* gy, void* gx, void* gw);

}  // namespace mg::kernels::cpu
