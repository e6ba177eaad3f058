// The argument checks and op names the CPU kernels and their CUDA twins share
// (kernel_args.h), so both reject the same arguments with the same message.
#include "kernels/kernel_args.h"

#include "base/error.h"

namespace mg::kernels {
namespace {

// Shape of op(X) as stored: the row length lda must cover.
int64_t stored_row_length(bool trans, int64_t rows, int64_t cols) { return trans ? rows : cols; }

}  // namespace

// ---- elementwise ----

const char* unary_op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Rsqrt: return "rsqrt";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Tanh: return "tanh";
    case UnaryOp::Sigmoid: return "sigmoid";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::GeluTanh: return "gelu_tanh";
    case UnaryOp::PowScalar: return "pow";
    case UnaryOp::Square: return "square";
    case UnaryOp::Reciprocal: return "reciprocal";
    case UnaryOp::Sign: return "sign";
  }
  return "?";
}

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Eq: return "eq";
    case BinaryOp::Ne: return "ne";
    case BinaryOp::Lt: return "lt";
    case BinaryOp::Le: return "le";
    case BinaryOp::Gt: return "gt";
    case BinaryOp::Ge: return "ge";
    case BinaryOp::LogicalAnd: return "logical_and";
    case BinaryOp::LogicalOr: return "logical_or";
  }
  return "?";
}

bool binary_op_returns_bool(BinaryOp op) {
  switch (op) {
    case BinaryOp::Eq:
    case BinaryOp::Ne:
    case BinaryOp::Lt:
    case BinaryOp::Le:
    case BinaryOp::Gt:
    case BinaryOp::Ge:
    case BinaryOp::LogicalAnd:
    case BinaryOp::LogicalOr: return true;
    default: return false;
  }
}

bool unary_op_accepts_integers(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Relu || op == UnaryOp::Square ||
         op == UnaryOp::Sign;
}

// ---- reductions ----

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Mean: return "mean";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Argmax: return "argmax";
    case ReduceOp::Argmin: return "argmin";
    case ReduceOp::Var: return "var";
    case ReduceOp::Prod: return "prod";
  }
  return "?";
}

// ---- GEMM ----

void check_gemm_args(const GemmArgs& g, const char* what) {
  MG_CHECK(is_floating(g.dtype), what, ": expected a floating dtype (f32, f64, f16, bf16), got ",
           dtype_name(g.dtype));
  MG_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, what, ": sizes must be non-negative, got m=", g.m, " n=", g.n,
           " k=", g.k);
  MG_CHECK(g.batch >= 0, what, ": batch must be non-negative, got ", g.batch);
  const int64_t a_row = stored_row_length(g.trans_a, g.m, g.k);
  const int64_t b_row = stored_row_length(g.trans_b, g.k, g.n);
  MG_CHECK(g.lda >= a_row, what, ": lda=", g.lda, " is smaller than the row length ", a_row, " of ",
           g.trans_a ? "A (stored k x m, trans_a)" : "A (stored m x k)");
  MG_CHECK(g.ldb >= b_row, what, ": ldb=", g.ldb, " is smaller than the row length ", b_row, " of ",
           g.trans_b ? "B (stored n x k, trans_b)" : "B (stored k x n)");
  MG_CHECK(g.ldc >= g.n, what, ": ldc=", g.ldc, " is smaller than the row length n=", g.n, " of C");
  MG_CHECK(g.batch_stride_a >= 0 && g.batch_stride_b >= 0 && g.batch_stride_c >= 0, what,
           ": batch strides must be non-negative, got a=", g.batch_stride_a, " b=", g.batch_stride_b,
           " c=", g.batch_stride_c);
  const bool c_written = g.batch > 0 && g.m > 0 && g.n > 0;
  if (c_written && g.batch > 1) {
    // Every batch entry writes its own C; broadcasting C would race and overwrite.
    const int64_t c_extent = (g.m - 1) * g.ldc + g.n;
    MG_CHECK(g.batch_stride_c >= c_extent, what, ": batch_stride_c=", g.batch_stride_c,
             " makes the batch entries of C overlap (each spans ", c_extent, " elements)");
  }
  MG_CHECK(!c_written || g.c != nullptr, what, ": C is null");
  // alpha == 0 does not read A or B (BLAS semantics), so they may be null then.
  MG_CHECK(!c_written || g.k == 0 || g.alpha == 0.0 || (g.a != nullptr && g.b != nullptr), what,
           ": A or B is null");
}

// ---- convolution and pooling geometry ----

void check_conv2d_geometry(const Conv2dGeometry& g) {
  MG_CHECK(g.channels >= 0 && g.height >= 0 && g.width >= 0,
           "conv2d: image sizes must be non-negative, got C=", g.channels, " H=", g.height, " W=", g.width);
  MG_CHECK(g.kernel_h >= 1 && g.kernel_w >= 1, "conv2d: kernel size must be positive, got ", g.kernel_h, "x",
           g.kernel_w);
  MG_CHECK(g.stride_h >= 1 && g.stride_w >= 1, "conv2d: stride must be positive, got ", g.stride_h, "x",
           g.stride_w);
  MG_CHECK(g.dilation_h >= 1 && g.dilation_w >= 1, "conv2d: dilation must be positive, got ", g.dilation_h,
           "x", g.dilation_w);
  MG_CHECK(g.pad_h >= 0 && g.pad_w >= 0, "conv2d: padding must be non-negative, got ", g.pad_h, "x", g.pad_w);
  const int64_t span_h = g.dilation_h * (g.kernel_h - 1) + 1;  // extent of the dilated kernel
  const int64_t span_w = g.dilation_w * (g.kernel_w - 1) + 1;
  MG_CHECK(g.height + 2 * g.pad_h >= span_h && g.width + 2 * g.pad_w >= span_w, "conv2d: padded input ",
           g.height + 2 * g.pad_h, "x", g.width + 2 * g.pad_w, " is smaller than the dilated kernel ", span_h,
           "x", span_w, " (input ", g.height, "x", g.width, ", padding ", g.pad_h, "x", g.pad_w, ")");
}

void check_pool2d_geometry(const Pool2dGeometry& g) {
  MG_CHECK(g.planes >= 0 && g.height >= 0 && g.width >= 0,
           "pool2d: input sizes must be non-negative, got planes=", g.planes, " H=", g.height,
           " W=", g.width);
  MG_CHECK(g.kernel_h >= 1 && g.kernel_w >= 1, "pool2d: kernel size must be positive, got ", g.kernel_h, "x",
           g.kernel_w);
  MG_CHECK(g.stride_h >= 1 && g.stride_w >= 1, "pool2d: stride must be positive, got ", g.stride_h, "x",
           g.stride_w);
  MG_CHECK(g.pad_h >= 0 && g.pad_w >= 0 && 2 * g.pad_h <= g.kernel_h && 2 * g.pad_w <= g.kernel_w,
           "pool2d: padding must be between 0 and half the kernel size, got padding ", g.pad_h, "x", g.pad_w,
           " for kernel ", g.kernel_h, "x", g.kernel_w);
  MG_CHECK(g.height >= 1 && g.width >= 1, "pool2d: input planes must be non-empty, got ", g.height, "x",
           g.width);
  MG_CHECK(g.height + 2 * g.pad_h >= g.kernel_h && g.width + 2 * g.pad_w >= g.kernel_w,
           "pool2d: padded input ", g.height + 2 * g.pad_h, "x", g.width + 2 * g.pad_w,
           " is smaller than the kernel ", g.kernel_h, "x", g.kernel_w);
}

}  // namespace mg::kernels
