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

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// The production entry point. f32/f64 call OpenBLAS (cblas_sgemm/cblas_dgemm,
// row-major) when the build defines MG_HAS_OPENBLAS; otherwise, and always for
// f16/bf16, they run gemm_blocked. Throws mg::Error on inconsistent arguments.
void gemm(const GemmArgs& args);

// The hand-written cache-blocked GEMM (gemm.cpp), available whether or not
// OpenBLAS is: benchmarks compare it with the library and tests cover it on
// every build. Accumulates in acc_t<T> (float for f32 and halves).
void gemm_blocked(const GemmArgs& args);

// Plain triple loop accumulating in double. Slow and obviously correct: the
// yardstick the tests compare gemm and gemm_blocked against.
void gemm_reference(const GemmArgs& args);

}  // namespace mg::kernels::cpu
