// Batched matrix multiply on the CPU: C = alpha * op(A) * op(B) + beta * C.
//
// Everything is row-major, as a Tensor's last two dims are. op(X) is X or X^T,
// chosen by trans_a / trans_b, so a transposed view of a contiguous matrix can
// be multiplied without a copy: the kernel just walks it with the other stride.
// A batch of independent products shares one call; a batch stride of 0 for A
// or B reuses the same matrix for every batch entry (e.g. one weight matrix
// applied to every sample of a [batch, m, k] input).
//
// A GEMM moves (m*k + k*n + 2*m*n) * sizeof(T) bytes and does 2*m*n*k flops,
// so for anything but tiny or skinny shapes it is compute bound: the job of a
// good implementation is to reuse each loaded element many times from cache
// and registers. See gemm.cpp for how the hand-written version does that.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace mg::kernels::cpu {

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

// Throws mg::Error, prefixed with `what`, unless the arguments describe a valid product: a
// floating dtype, non-negative sizes, leading dimensions covering their rows, batch entries of C
// that do not overlap, and non-null buffers where they are read or written. Every gemm (CPU and
// CUDA) checks this first.
void check_gemm_args(const GemmArgs& args, const char* what);

// The production entry point. f32/f64 call OpenBLAS (cblas_sgemm/cblas_dgemm,
// row-major) when the build defines MG_HAS_OPENBLAS; otherwise, and always for
// f16/bf16, they run gemm_blocked. Throws mg::Error on inconsistent arguments.
void gemm(const GemmArgs& args);

// The hand-written cache-blocked GEMM (gemm.cpp), available whether or not
// OpenBLAS is: benchmarks compare it with the library and tests cover it on
// every build. Accumulates in compute_t<T> (float for f32 and halves).
void gemm_blocked(const GemmArgs& args);

// Plain triple loop accumulating in double. Slow and obviously correct: the
// yardstick the tests compare gemm and gemm_blocked against.
void gemm_reference(const GemmArgs& args);

}  // namespace mg::kernels::cpu
