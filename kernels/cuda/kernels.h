// The CUDA kernels' host entry points: twins of the CPU kernels in kernels/cpu/, with the same
// argument types (kernels/kernel_args.h) and the same argument lists after a leading stream, so an
// op dispatches with one `if` and a test can run both on the same inputs and compare. No CUDA
// headers: core/ops/*.cpp include this.
//
// Common contract:
//   - the first argument is the cudaStream_t the work is queued on (kernels/cuda/stream.h); the
//     functions return without waiting, except where a result must reach the host (the index
//     checks of embedding_forward/_backward and index_select/index_add, cross_entropy_forward's
//     count; the ops call the *_deferred / *_counted twins, which do not wait);
//   - the functions that need scratch device memory take a ScratchAllocator& second
//     (kernels/cuda/stream.h) and give it back, stream-ordered, before they return;
//   - every pointer / StridedView points to memory of the GPU the CALLER made the runtime's
//     current device (core/ops do that with mg::cuda::DeviceGuard, and pass that device's current
//     stream and the caching allocator: core/cuda_scratch.h). Nothing here reads core/'s runtime;
//   - errors in arguments throw mg::Error before anything is launched; a failed launch throws
//     mg::Error with file:line and CUDA's message.
// Each family lives in its own kernels/cuda/<family>.cu, whose opening comment explains the thread
// decomposition and what bounds it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/strided_view.h"
#include "kernels/cuda/stream.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cuda {

// ---- elementwise.cu (semantics: kernels/cpu/elementwise.h) ----
void unary(cudaStream_t stream, UnaryOp op, const StridedView& in, const StridedView& out,
           double scalar = 0.0);
void unary_backward(cudaStream_t stream, UnaryOp op, const StridedView& grad_out, const StridedView& input,
                    const StridedView& output, const StridedView& grad_in, double scalar = 0.0);
void binary(cudaStream_t stream, BinaryOp op, const StridedView& a, const StridedView& b,
            const StridedView& out);
void binary_scalar(cudaStream_t stream, BinaryOp op, const StridedView& a, double scalar,
                   const StridedView& out);
void axpby(cudaStream_t stream, const StridedView& a, double alpha, const StridedView& b,
           const StridedView& out);
void where(cudaStream_t stream, const StridedView& condition, const StridedView& a, const StridedView& b,
           const StridedView& out);
void clamp(cudaStream_t stream, const StridedView& in, const StridedView& out, double lo, double hi);
void fill(cudaStream_t stream, const StridedView& out, double value);
void arange(cudaStream_t stream, const StridedView& out, double start, double step);
// Strided, dtype-converting copy within one device (both views on it).
void copy(cudaStream_t stream, const StridedView& in, const StridedView& out);

// ---- reduce.cu (semantics: kernels/cpu/reduce.h) ----
void reduce(cudaStream_t stream, ScratchAllocator& scratch, ReduceOp op, const ReduceShape& shape,
            const void* input, DType in_dtype, void* output, DType out_dtype, int64_t correction = 1);

// ---- softmax.cu (semantics: kernels/cpu/softmax.h, kernels/cpu/cross_entropy.h) ----
void softmax_forward(cudaStream_t stream, DType dtype, const SoftmaxShape& s, const void* input, void* output,
                     bool log);
void softmax_backward(cudaStream_t stream, DType dtype, const SoftmaxShape& s, const void* grad_output,
                      const void* output, void* grad_input, bool log);
// `targets` is device memory. Waits for the kernel: it returns the number of
// rows not ignored, and throws (naming the row and value) for an out-of-range
// target, as the CPU kernel does. `row_stats` (optional, acc_t of dtype: f32, or f64 for f64)
// receives [rows, 2]: each counted row's max and log(sum(exp(x - max))), which the backward
// takes to read the logits once.
int64_t cross_entropy_forward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* logits,
                              const int64_t* targets, int64_t rows, int64_t classes, int64_t ignore_index,
                              double label_smoothing, void* losses, void* row_stats = nullptr);
// The same without waiting: the count of rows not ignored goes to `counted` (one f32 on the
// device), and the target check's findings to `check_words` (kCrossEntropyCheckWords 64-bit words
// of device memory). The caller copies those words to the host when it likes (core/ops registers
// them with core/cuda_device_checks.h, so a bad target is an error at the next synchronisation)
// and reads them with cross_entropy_target_error. `row_stats` as above (may be null).
constexpr int kCrossEntropyCheckWords = 3;
void cross_entropy_forward_counted(cudaStream_t stream, DType dtype, const void* logits,
                                   const int64_t* targets, int64_t rows, int64_t classes,
                                   int64_t ignore_index, double label_smoothing, void* losses,
                                   void* row_stats, float* counted, void* check_words);
// "" when the check words (on the host) of a cross_entropy_forward_counted call with these
// arguments report every target valid, else the error message naming the row and the value.
std::string cross_entropy_target_error(const void* host_check_words, int64_t rows, int64_t classes,
                                       int64_t ignore_index);
// With the forward's `row_stats`: one read of the logits and one write of the gradient. Without
// (null): the stats are recomputed first, in the same kernel (one more read of each row). Rows
// with an ignored (or out-of-range) target get zeros; no target check, no wait.
void cross_entropy_backward(cudaStream_t stream, DType dtype, const void* logits, const int64_t* targets,
                            int64_t rows, int64_t classes, int64_t ignore_index, double label_smoothing,
                            const void* grad_losses, void* grad_logits, const void* row_stats = nullptr);

// ---- optim.cu (semantics: kernels/cpu/optim.h) ----
void sgd_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad,
              void* momentum_buffer, bool first_step, const SgdHyper& h);
void adam_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* exp_avg,
               void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h);
void adamw_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* exp_avg,
                void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h);
// One launch for the whole list (plus one small host->device copy of its table);
// bit for bit the per-tensor results. Every tensor on the current device.
void sgd_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                    const std::vector<SgdTensor>& tensors, const SgdHyper& h);
void adam_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                     const std::vector<AdamTensor>& tensors, const AdamHyper& h);
void adamw_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                      const std::vector<AdamTensor>& tensors, const AdamHyper& h);

// ---- gemm.cu: cuBLAS (semantics: kernels/cpu/gemm.h) ----
// f32 and f64 in their own precision (f32 without TF32, to match the CPU, unless
// gemm_ladder.h's set_allow_tf32(true)), f16 and bf16 with f32 accumulation.
// Batch strides of 0 broadcast an operand. gemm_ladder.h's set_matmul_kernel
// routes it to a hand-written step instead.
void gemm(cudaStream_t stream, ScratchAllocator& scratch, const GemmArgs& args);

// ---- conv.cu (semantics: kernels/cpu/conv.h) ----
void im2col(cudaStream_t stream, const Conv2dGeometry& g, DType dtype, const void* image, void* columns,
            int64_t images = 1);
// Accumulates into `image`, as on the CPU.
void col2im(cudaStream_t stream, const Conv2dGeometry& g, DType dtype, const void* columns, void* image,
            int64_t images = 1);

// ---- pool.cu (semantics: kernels/cpu/pool.h) ----
void max_pool2d_forward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* input,
                        void* output, int64_t* argmax);
// Unlike the CPU, argmax is not validated (that would need a copy back to the
// host): an entry outside its window contributes nothing.
void max_pool2d_backward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* grad_output,
                         const int64_t* argmax, void* grad_input);
void avg_pool2d_forward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* input,
                        void* output, bool count_include_pad);
void avg_pool2d_backward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* grad_output,
                         void* grad_input, bool count_include_pad);

// ---- layer_norm.cu (semantics: kernels/cpu/layer_norm.h) ----
void layer_norm_forward(cudaStream_t stream, DType dtype, const void* x, const void* weight, const void* bias,
                        int64_t rows, int64_t cols, double eps, void* y, void* mean, void* rstd);
void layer_norm_backward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* grad_y,
                         const void* x, const void* mean, const void* rstd, const void* weight, int64_t rows,
                         int64_t cols, void* grad_x, void* grad_weight, void* grad_bias);

// ---- embedding.cu (semantics: kernels/cpu/embedding.h, kernels/cpu/index.h) ----
// `indices` is device memory. These wait for the stream to check the indices
// (one copy back of the first bad position) and throw naming position and value.
// The backward passes add with atomics: the order of the additions, and so
// the last bits of a row that several positions share, vary from run to run.
void embedding_forward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* weight,
                       int64_t num_embeddings, int64_t embedding_dim, const int64_t* indices, int64_t count,
                       void* out);
void embedding_backward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* grad_out,
                        const int64_t* indices, int64_t count, int64_t embedding_dim, int64_t num_embeddings,
                        int64_t padding_idx, void* grad_weight);
// The forward without waiting: the gather checks the indices itself (a bad one gets a row of
// zeros, never a read out of bounds) and leaves its findings in `check_words`
// (kEmbeddingCheckWords 64-bit words of device memory: the first bad position, its value). The
// caller copies them to the host when it likes (core/ops registers them with
// core/cuda_device_checks.h, as for cross_entropy's targets) and reads them with
// embedding_index_error.
constexpr int kEmbeddingCheckWords = 2;
void embedding_forward_deferred(cudaStream_t stream, DType dtype, const void* weight, int64_t num_embeddings,
                                int64_t embedding_dim, const int64_t* indices, int64_t count, void* out,
                                void* check_words);
// "" when the check words (on the host) of an embedding_forward_deferred call with these arguments
// report every index valid, else the error message naming the position and the value.
std::string embedding_index_error(const void* host_check_words, int64_t count, int64_t num_embeddings);
// The backward of indices the forward already checked: no check and no wait; an out-of-range
// index adds nothing.
void embedding_backward_unchecked(cudaStream_t stream, DType dtype, const void* grad_out,
                                  const int64_t* indices, int64_t count, int64_t embedding_dim,
                                  int64_t num_embeddings, int64_t padding_idx, void* grad_weight);
void index_select(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const IndexShape& shape,
                  const void* input, const int64_t* indices, int64_t count, void* out);
void index_add(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const IndexShape& shape,
               const void* grad_out, const int64_t* indices, int64_t count, void* grad_input);

// ---- dropout.cu (semantics: kernels/cpu/dropout.h): the CPU's mask, bit for bit ----
void dropout_forward(cudaStream_t stream, DType dtype, const void* x, void* y, bool* mask, int64_t count,
                     double p, uint64_t seed, uint64_t call_offset);
void dropout_backward(cudaStream_t stream, DType dtype, const void* grad_y, const bool* mask, void* grad_x,
                      int64_t count, double p);

// ---- attention.cu, attention_tensor_core.cu (semantics: kernels/cpu/attention.h) ----
// Which kernels: `automatic` takes tensor cores for bf16/f16 with D = 64 or 128 on sm_80+, CUDA
// cores otherwise; the other two force one (the tests and the kernel lab compare them).
enum class AttentionKernel { automatic, cuda_cores, tensor_cores };
// o and lse contiguous ([B, H, Tq, D] and [B, H, Tq] of attention_stats_dtype); D <= 256.
void attention_forward(cudaStream_t stream, DType dtype, const AttentionProblem& p, const void* q,
                       AttentionStrides q_strides, const void* k, AttentionStrides k_strides, const void* v,
                       AttentionStrides v_strides, void* o, void* lse,
                       AttentionKernel kernel = AttentionKernel::automatic);
// Deterministic (no atomics): dK and dV by key block, then dQ by query block.
void attention_backward(cudaStream_t stream, DType dtype, const AttentionProblem& p, const void* q,
                        AttentionStrides q_strides, const void* k, AttentionStrides k_strides, const void* v,
                        AttentionStrides v_strides, const void* o, const void* lse, const void* dout,
                        AttentionStrides dout_strides, void* delta, void* dq, void* dk, void* dv,
                        AttentionKernel kernel = AttentionKernel::automatic);

}  // namespace mg::kernels::cuda
