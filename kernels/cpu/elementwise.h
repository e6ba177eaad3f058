// Elementwise CPU kernels: unary math and its fused backward, binary arithmetic
// and comparisons, where, clamp, fill, arange, and the dtype-converting copy.
//
// Contract shared by every function here: each StridedView already has the
// OUTPUT's shape. Broadcasting is the caller's job (a broadcast input dim has
// stride 0), and so is type promotion (binary ops see one input dtype). Any
// strides are accepted, including negative and 0; the kernels find the fast
// contiguous loops on their own (see elementwise.cpp).
//
// The output may alias an input exactly (same data pointer and strides, e.g.
// x.add_(y) or axpby with out == a): every element is read before it is
// written at the same position. Partial overlaps are not supported.
#pragma once

#include "base/strided_view.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// out = op(in). `in` and `out` have the same shape and dtype: floating for
// every op, and also i32/i64 for Neg/Abs/Relu/Square/Sign. `scalar` is the
// exponent of PowScalar. Halves compute in float.
void unary(UnaryOp op, const StridedView& in, const StridedView& out, double scalar = 0.0);

// grad_in = grad_out * d op(x)/dx, in one fused pass. Floating dtypes, all
// operands the same dtype and shape. Which saved tensor each op reads:
//
//   op          reads              gradient
//   Neg         nothing            -g
//   Sign        nothing            0
//   Exp         output y (*)       g * y
//   Sqrt        output y (*)       g / (2 y)
//   Rsqrt       output y (*)       -0.5 g y^3
//   Tanh        output y (*)       g (1 - y^2)
//   Sigmoid     output y (*)       g y (1 - y)
//   Reciprocal  output y (*)       -g y^2
//   Log         input x            g / x
//   Abs         input x            g sign(x), 0 at x == 0 (like PyTorch)
//   Relu        input x            g where x > 0, else 0 (0 at x == 0)
//   GeluTanh    input x            g d/dx gelu_tanh(x)
//   PowScalar   input x            g p x^(p-1); 0 everywhere when p == 0
//   Square      input x            2 g x
//
// (*) when `output.data` is null these recompute y from the input, so a
// caller may pass either tensor. A view that is not needed may be left
// default-constructed (data == nullptr).
void unary_backward(UnaryOp op, const StridedView& grad_out, const StridedView& input,
                    const StridedView& output, const StridedView& grad_in, double scalar = 0.0);

// out = a op b. a and b share a dtype and are already broadcast to out's
// shape. out.dtype is a.dtype for arithmetic and bool for comparisons/logical.
// Integer (and bool) Div throws mg::Error: the caller promotes to float first.
// bool supports Add (or), Mul (and), Maximum, Minimum and the bool-output ops.
// Maximum/Minimum propagate NaN like PyTorch. Integer Pow wraps on overflow;
// a negative integer exponent gives 1 / x^|y| truncated (0 unless |x| == 1).
void binary(BinaryOp op, const StridedView& a, const StridedView& b, const StridedView& out);

// out = a op scalar (scalar on the right); same ops and dtype rules as binary().
// Floating a: the scalar is rounded to the compute type (float for f32/f16/bf16).
// Integer a: arithmetic needs a scalar representable in a's dtype (else
// mg::Error: promote first); comparisons with any scalar are exact.
void binary_scalar(BinaryOp op, const StridedView& a, double scalar, const StridedView& out);

// out = a + alpha * b (optimizers, grad accumulation). Floating dtypes, all
// operands the same dtype and shape; out may alias a.
void axpby(const StridedView& a, double alpha, const StridedView& b, const StridedView& out);

// out = condition ? a : b. condition is bool; a, b, out share a dtype (any).
void where(const StridedView& condition, const StridedView& a, const StridedView& b, const StridedView& out);

// out = min(max(in, lo), hi), NaN stays NaN; pass -inf / +inf for a missing
// bound. If lo > hi every element becomes hi (PyTorch's rule). Numeric
// dtypes (not bool); integer bounds are rounded inward and saturated.
void clamp(const StridedView& in, const StridedView& out, double lo, double hi);

// Every element of out = value converted to out.dtype (bool: value != 0).
void fill(const StridedView& out, double value);

// out[i] = start + i * step for a 1-d out of any non-bool dtype, computed in
// double and then converted (integers truncate).
void arange(const StridedView& out, double start, double step);

// out = in converted to out.dtype. Same shape, any strides, any of the 49
// dtype pairs: to bool is `!= 0` (NaN -> true), float -> int truncates toward
// zero like static_cast (out-of-range values are unspecified, as in C++),
// to f16/bf16 rounds to nearest even (from f64 via float). Serves
// contiguous(), to(dtype) and copy_().
void copy(const StridedView& in, const StridedView& out);

}  // namespace mg::kernels::cpu
