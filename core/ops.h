// Every tensor operation multigrad offers. Each entry point checks its inputs
// (shapes, dtypes, devices; the error names both sides), runs the kernel for the
// tensors' device, and, when an input requires grad, records a backward Node.
//
// The backward formulas are written with these same ops (under NoGradGuard), so
// each formula reads like the math in a textbook.
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"

namespace mg {

// ---- unary ----
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh approximation (GPT-2's)
Tensor pow(const Tensor& x, double exponent);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor sign(const Tensor& x);  // no gradient (piecewise constant)

// ---- binary, NumPy broadcasting and type promotion ----
Tensor add(const Tensor& a, const Tensor& b, double alpha = 1.0);  // a + alpha*b
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor rdiv(const Tensor& a, double b);  // b / a
Tensor maximum(const Tensor& a, double b);
Tensor minimum(const Tensor& a, double b);

// ---- comparisons -> bool (no gradient) ----
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);

Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b);
Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi);

// ---- reductions: over `dims` (empty = all), keepdim keeps them as size 1 ----
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor min(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1,
           bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64, no gradient
Tensor argmax(const Tensor& x);                                     // over all elements (flattened index)
// Sums `x` down to `shape` (the inverse of broadcasting), used by backward formulas.
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ----
// 1-d·1-d dot, 2-d matmul, batched matmul with broadcasting of batch dims (NumPy matmul rules).
Tensor matmul(const Tensor& a, const Tensor& b);
// The plain-loop reference (no BLAS), same semantics; tests compare against it.
Tensor matmul_reference(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());  // x @ W^T + b

// ---- neural-network ops ----
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
enum class Reduction { None, Mean, Sum };
struct CrossEntropyOptions {
  Reduction reduction = Reduction::Mean;
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};
// logits [N, C] (or [N, C, d1, ...] with targets [N, d1, ...]), integer class targets.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {});
// Batch normalisation of x [N, C, ...] over every dim but 1, as one fused CPU kernel (f32/f64;
// nn::BatchNorm uses the composed ops for other dtypes and devices). training: the batch's own
// statistics (biased variance), handed back detached in *batch_mean / *batch_var ([C]) for the
// running averages; otherwise running_mean / running_var. weight and bias ([C]) may be undefined.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double eps, Tensor* batch_mean = nullptr,
                  Tensor* batch_var = nullptr);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor embedding(const Tensor& weight, const Tensor& indices, int64_t padding_idx = -1);
Tensor dropout(const Tensor& x, double p, bool training = true);

struct Conv2dOptions {
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
};
// x [N, C, H, W], weight [O, C, kh, kw], bias [O] optional -> [N, O, OH, OW]
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
              const Conv2dOptions& options = {});
struct Pool2dOptions {
  int64_t kernel_h, kernel_w;
  int64_t stride_h = 0, stride_w = 0;  // 0 = kernel size
  int64_t pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // avg pool only
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor max_pool2d(const Tensor& x, int64_t kernel);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& options);
Tensor avg_pool2d(const Tensor& x, int64_t kernel);

// ---- joining, splitting, indexing ----
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);  // last chunk may be smaller
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

// ---- casts and copies ----
Tensor cast(const Tensor& x, DType dtype);  // same as x.to(dtype)

// ---- operators ----
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// ---- checks shared by ops (exposed for nn/ and tests) ----
// Throws unless every defined tensor is on the same device; names the op and both devices.
void check_same_device(const char* op, const std::vector<Tensor>& tensors);
// Broadcast shape of a and b (NumPy rules); the error names both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Throws unless every tensor lives on the CPU (the CUDA backend adds GPU kernels).
void require_cpu(const char* op, const std::vector<Tensor>& tensors);

}  // namespace mg
