// The CUDA kernels' host entry points: twins of the CPU kernels in kernels/cpu/,
// with the same argument lists and the same enum/shape structs (included from
// the CPU headers), so an op dispatches with one `if` and a test can run both
// on the same inputs and compare. No CUDA headers: core/ops/*.cpp include this.
//
// Common contract:
//   - every pointer / StridedView points to memory of the logical device the
//     CALLER made current with mg::cuda::DeviceGuard (core/ops do that);
//   - work is queued on that device's current stream (core/cuda_stream.h) and
//     the functions return without waiting, except where a result must reach
//     the host (cross_entropy_forward returns a count: it waits for it);
//   - errors in arguments throw mg::Error before anything is launched; a failed
//     launch throws mg::Error with file:line and CUDA's message.
// Each family lives in its own kernels/cuda/<family>.cu, whose opening comment
// explains the thread decomposition and what bounds it.
#pragma once

#include <cstdint>

#include "core/strided_view.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/softmax.h"

namespace mg::kernels::cuda {

using cpu::AdamHyper;
using cpu::BinaryOp;
using cpu::GemmArgs;
using cpu::ReduceOp;
using cpu::ReduceShape;
using cpu::SgdHyper;
using cpu::SoftmaxShape;
using cpu::UnaryOp;

// ---- elementwise.cu (semantics: kernels/cpu/elementwise.h) ----
void unary(UnaryOp op, const StridedView& in, const StridedView& out, double scalar = 0.0);
void unary_backward(UnaryOp op, const StridedView& grad_out, const StridedView& input,
                    const StridedView& output, const StridedView& grad_in, double scalar = 0.0);
void binary(BinaryOp op, const StridedView& a, const StridedView& b, const StridedView& out);
void binary_scalar(BinaryOp op, const StridedView& a, double scalar, const StridedView& out);
void axpby(const StridedView& a, double alpha, const StridedView& b, const StridedView& out);
void where(const StridedView& condition, const StridedView& a, const StridedView& b, const StridedView& out);
void clamp(const StridedView& in, const StridedView& out, double lo, double hi);
void fill(const StridedView& out, double value);
void arange(const StridedView& out, double start, double step);
// Strided, dtype-converting copy within one device (both views on it).
void copy(const StridedView& in, const StridedView& out);

// ---- reduce.cu (semantics: kernels/cpu/reduce.h) ----
void reduce(ReduceOp op, const ReduceShape& shape, const void* input, DType in_dtype, void* output,
            DType out_dtype, int64_t correction = 1);

// ---- softmax.cu (semantics: kernels/cpu/softmax.h, kernels/cpu/cross_entropy.h) ----
void softmax_forward(DType dtype, const SoftmaxShape& s, const void* input, void* output, bool log);
void softmax_backward(DType dtype, const SoftmaxShape& s, const void* grad_output, const void* output,
                      void* grad_input, bool log);
// `targets` is device memory. Waits for the kernel: it returns the number of
// rows not ignored, and throws (naming the row and value) for an out-of-range
// target, as the CPU kernel does.
int64_t cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                              int64_t classes, int64_t ignore_index, double label_smoothing, void* losses);
void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                            int64_t classes, int64_t ignore_index, double label_smoothing,
                            const void* grad_losses, void* grad_logits);

// ---- optim.cu (semantics: kernels/cpu/optim.h) ----
void sgd_step(DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer, bool first_step,
              const SgdHyper& h);
void adam_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
               void* max_exp_avg_sq, const AdamHyper& h);
void adamw_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
                void* max_exp_avg_sq, const AdamHyper& h);

// ---- gemm.cu: cuBLAS (semantics: kernels/cpu/gemm.h) ----
// f32 and f64 in their own precision (f32 without TF32, to match the CPU), f16
// and bf16 with f32 accumulation. Batch strides of 0 broadcast an operand.
void gemm(const GemmArgs& args);

}  // namespace mg::kernels::cuda
