// The argument types the CPU kernels (kernels/cpu/) and their CUDA twins (kernels/cuda/kernels.h)
// share: op enums, the [outer, axis, inner] shapes, GEMM arguments, convolution and pooling
// geometry, the attention problem, optimizer hyperparameters. Defined once here, in mg::kernels, so that one
// value dispatches to either device and a test can hand both the same arguments. Host-only, no CUDA.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mg::kernels {

// ---- elementwise (semantics: kernels/cpu/elementwise.h) ----
enum class UnaryOp {
  Neg,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Abs,
  Tanh,
  Sigmoid,
  Relu,
  GeluTanh,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GELU's tanh approximation
  PowScalar,
  Square,
  Reciprocal,
  Sign,  // -1, 0 or +1; NaN stays NaN
};

enum class BinaryOp {
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  Pow,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr
};

// ---- reductions (kernels/cpu/reduce.h): the reduced axis is the middle of [outer, reduce, inner] ----
enum class ReduceOp { Sum, Mean, Max, Min, Argmax, Argmin, Var, Prod };

struct ReduceShape {
  int64_t outer, reduce, inner;
};

// ---- softmax (kernels/cpu/softmax.h): the softmax axis is the middle of [outer, dim, inner] ----
struct SoftmaxShape {
  int64_t outer, dim, inner;
};

// ---- index_select / index_add (kernels/cpu/index.h) ----
struct IndexShape {
  int64_t outer, size, inner;  // input viewed as [outer, size, inner]
};

// ---- GEMM (kernels/cpu/gemm.h): row-major C = alpha op(A) op(B) + beta C over a batch ----
struct GemmArgs {
  DType dtype = DType::f32;               // f32, f64, f16, bf16 (halves: fp32 accumulation)
  bool trans_a = false, trans_b = false;  // op(A) is A or A^T
  int64_t m = 0, n = 0, k = 0;            // op(A) is m x k, op(B) is k x n, C is m x n; all row-major
  const void* a = nullptr;                // elements; batch_stride 0 = broadcast over batch
  int64_t lda = 0;
  int64_t batch_stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  int64_t batch_stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t batch_stride_c = 0;
  int64_t batch = 1;
  // C = alpha*op(A)op(B) + beta*C. As in BLAS, beta == 0 does not read C (it may hold NaN garbage)
  // and alpha == 0 does not read A or B.
  double alpha = 1.0, beta = 0.0;
};

// A GemmArgs for one (unbatched) product C = op(A) op(B) + beta C with alpha 1, argument by
// argument in BLAS order: what the convolution code builds per image or per chunk.
inline GemmArgs gemm_args(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                          const void* a, int64_t lda, const void* b, int64_t ldb, void* c, int64_t ldc,
                          double beta) {
  GemmArgs args;
  args.dtype = dtype;
  args.trans_a = trans_a;
  args.trans_b = trans_b;
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = a;
  args.lda = lda;
  args.b = b;
  args.ldb = ldb;
  args.c = c;
  args.ldc = ldc;
  args.beta = beta;
  return args;
}

// ---- im2col / col2im (kernels/cpu/conv.h): one NCHW image's convolution geometry ----
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

// ---- pooling (kernels/cpu/pool.h) ----
struct Pool2dGeometry {
  int64_t planes = 0, height = 0, width = 0;  // planes = N*C, input contiguous [planes, H, W]
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;

  // floor mode, (H + 2p - k)/s + 1
  int64_t out_h() const { return (height + 2 * pad_h - kernel_h) / stride_h + 1; }
  int64_t out_w() const { return (width + 2 * pad_w - kernel_w) / stride_w + 1; }
};

// ---- optimizers (kernels/cpu/optim.h) ----
struct SgdHyper {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

struct AdamHyper {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  int64_t step = 1;  // the step being taken, counting from 1 (for bias correction)
};

// One tensor of a multi-tensor step: the fields that can differ between the tensors of a group.
struct SgdTensor {
  void* param = nullptr;
  const void* grad = nullptr;
  void* momentum_buffer = nullptr;  // may be nullptr when momentum == 0
  int64_t n = 0;
  bool first_step = false;
};
struct AdamTensor {
  void* param = nullptr;
  const void* grad = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  void* max_exp_avg_sq = nullptr;  // may be nullptr unless amsgrad
  int64_t n = 0;
  int64_t step = 1;  // replaces AdamHyper::step for this tensor
};

// ---- the checks and names both devices share (kernel_args.cpp) ----
// Every entry point of either device checks its arguments with these first, so a bad call gets
// the same error on a CPU and on a GPU.

const char* unary_op_name(UnaryOp op);
const char* binary_op_name(BinaryOp op);
// True for comparisons and logical ops, whose output dtype is bool.
bool binary_op_returns_bool(BinaryOp op);
// True for the unary ops that also accept i32/i64 (Neg, Abs, Relu, Square, Sign).
bool unary_op_accepts_integers(UnaryOp op);

const char* reduce_op_name(ReduceOp op);

// Throws mg::Error, prefixed with `what`, unless the arguments describe a valid product: a
// floating dtype, non-negative sizes, leading dimensions covering their rows, batch entries of C
// that do not overlap, and non-null buffers where they are read or written.
void check_gemm_args(const GemmArgs& args, const char* what);

// Throws mg::Error unless the geometry describes a valid convolution (positive
// kernel/stride/dilation, non-negative padding, at least one output pixel).
void check_conv2d_geometry(const Conv2dGeometry& g);

// Throws mg::Error unless the geometry is valid (positive kernel and stride,
// 0 <= pad <= kernel/2, the padded input at least one kernel large).
void check_pool2d_geometry(const Pool2dGeometry& g);

// ---- attention (semantics: kernels/cpu/attention.h) ----
// Element (b, h, t, d) of an operand is at b * batch + h * head + t * row + d: the last dim must
// be contiguous (stride 1), every other stride is free (e.g. a transpose(1, 2) of [B, T, H, D]).
struct AttentionStrides {
  int64_t batch = 0, head = 0, row = 0;
};

struct AttentionProblem {
  int64_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0;
  double scale = 1.0;
  bool causal = false;
  double dropout_p = 0.0;  // in [0, 1]; 0 draws nothing
  uint64_t seed = 0, offset = 0;
};

// The dtype of LSE and of the backward's row workspace: f64 for f64 inputs, f32 otherwise.
inline DType attention_stats_dtype(DType dtype) { return dtype == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace mg::kernels
