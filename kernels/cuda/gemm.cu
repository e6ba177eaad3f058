// Matrix multiply on the GPU through cuBLAS: C = alpha op(A) op(B) + beta C,
// batched, row-major, with the argument conventions of kernels/cpu/gemm.h.
//
// Row-major vs column-major. cuBLAS is column-major. A row-major m x n matrix C
// with leading dimension ldc is, byte for byte, the column-major n x m matrix
// C^T. Since C^T = op(B)^T op(A)^T, we ask cuBLAS for that product: its first
// operand is our B (transposed iff trans_b), its second our A (iff trans_a), and
// its m, n are our n, m. No data moves.
//
// Precision. f32: CUBLAS_COMPUTE_32F by default, which never uses TF32 (so
// results match the CPU's sgemm to rounding); with set_allow_tf32(true) or
// MG_CUDA_ALLOW_TF32=1 (gemm_ladder.h) CUBLAS_COMPUTE_32F_FAST_TF32, which runs
// on tensor cores with inputs rounded to 10 mantissa bits (several times faster,
// ~1e-3 relative error), like torch.backends.cuda.matmul.allow_tf32. f64:
// CUBLAS_COMPUTE_64F. f16 and bf16: 16-bit inputs and outputs with f32
// accumulation (CUBLAS_COMPUTE_32F) on tensor cores. One
// cublasGemmStridedBatchedEx call covers a whole batch; a batch stride of 0
// reuses one matrix for every batch entry.
//
// Cost: 2 m n k FLOPs over (m k + k n + 2 m n) s bytes: compute bound for all
// but skinny shapes.
//
// The hand-written ladder. gemm() runs cuBLAS unless matmul_kernel()
// (set_matmul_kernel or MG_CUDA_MATMUL, gemm_ladder.h) names a step of the
// hand-written ladder in gemm_ladder.cu (naive, smem_tiled, register_tiled,
// tensor_core) that takes this call's dtype: then that kernel runs instead. A
// step that does not take the dtype (the f32 steps given f64/f16/bf16,
// tensor_core given f32/f64) falls back to cuBLAS silently, so choosing a step
// never breaks a model with mixed dtypes. gemm_cublas() is the cuBLAS path alone.
//
// Handles: one cuBLAS handle per (host thread, physical GPU), borrowed from a
// pool on first use and returned when the thread exits (kernels/cuda/handle_pool.h:
// DataParallel starts new threads every step), bound to the current stream on
// every call (cuBLAS handles must not be shared by threads running concurrently).
// Workspace: cuBLAS keeps scratch memory per handle, and a pooled handle moves between streams, so
// two GEMMs in flight on different streams would share it. Each call therefore sets a workspace of
// its own (cublasSetWorkspace), borrowed from the caller's scratch allocator and given back,
// stream-ordered, once the GEMM is queued: the caching allocator hands the same block back on the
// next call on that stream, and no other stream can get it while the GEMM may still run.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <algorithm>
#include <array>
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm_ladder.h"
#include "kernels/cuda/handle_pool.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

cublasHandle_t create_cublas_handle() {
  cublasHandle_t handle = nullptr;
  MG_CUBLAS_CHECK(cublasCreate(&handle));
  return handle;
}

cublasHandle_t handle_for_current_device() {
  int device = 0;  // the physical GPU the runtime has current
  MG_CUDA_CHECK(cudaGetDevice(&device));
  return pooled_handle<cublasHandle_t, create_cublas_handle>(device);
}

// cuBLAS's recommended workspace on Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

int as_int(int64_t v, const char* what) {
  MG_CHECK(v >= 0 && v <= INT_MAX, "gemm (CUDA): ", what, " = ", v, " does not fit cuBLAS's 32-bit int");
  return static_cast<int>(v);
}

}  // namespace

void gemm(cudaStream_t stream, ScratchAllocator& scratch, const GemmArgs& a) {
  const GemmKernel kernel = matmul_kernel();
  if (kernel != GemmKernel::cublas && gemm_kernel_supports(kernel, a.dtype))
    return gemm_ladder(stream, scratch, kernel, a);
  gemm_cublas(stream, scratch, a);
}

void gemm_cublas(cudaStream_t stream, ScratchAllocator& scratch, const GemmArgs& a) {
  check_gemm_args(a, "gemm (CUDA, cuBLAS)");
  if (a.m == 0 || a.n == 0 || a.batch == 0) return;
  cudaDataType_t type;
  cublasComputeType_t compute;
  switch (a.dtype) {
    case DType::f32:
      type = CUDA_R_32F, compute = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case DType::f64: type = CUDA_R_64F, compute = CUBLAS_COMPUTE_64F; break;
    case DType::f16: type = CUDA_R_16F, compute = CUBLAS_COMPUTE_32F; break;
    case DType::bf16: type = CUDA_R_16BF, compute = CUBLAS_COMPUTE_32F; break;
    default: throw Error(str_cat("gemm (CUDA): expected f32, f64, f16 or bf16, got ", dtype_name(a.dtype)));
  }
  const double alpha_d = a.alpha, beta_d = a.beta;
  const float alpha_f = static_cast<float>(a.alpha), beta_f = static_cast<float>(a.beta);
  const void* alpha = a.dtype == DType::f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
  const void* beta = a.dtype == DType::f64 ? static_cast<const void*>(&beta_d) : &beta_f;
  // k == 0: cuBLAS computes C = beta C and reads neither A nor B (nor C when beta == 0), but still
  // wants leading dimensions of at least 1, which a k == 0 row-major operand need not have.
  // alpha == 0 is passed as k == 0: on an H200 (2026-12-04) cuBLAS's bf16 and f16 paths multiplied
  // alpha = 0 into A B, so a NaN or Inf in A or B reached C, where BLAS says neither is read.
  const int k = a.alpha == 0.0 ? 0 : as_int(a.k, "k");
  const int64_t lda = std::max<int64_t>(a.lda, 1), ldb = std::max<int64_t>(a.ldb, 1);
  cublasHandle_t handle = handle_for_current_device();
  MG_CUBLAS_CHECK(cublasSetStream(handle, stream));  // (which resets the handle's workspace)
  Workspace workspace(scratch, kCublasWorkspaceBytes);
  MG_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace.get(), kCublasWorkspaceBytes));
  // Column-major C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  MG_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      handle, a.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, a.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(a.n, "n"),
      as_int(a.m, "m"), k, alpha, a.b, type, as_int(ldb, "ldb"), a.batch_stride_b, a.a, type,
      as_int(lda, "lda"), a.batch_stride_a, beta, a.c, type, as_int(a.ldc, "ldc"), a.batch_stride_c,
      as_int(a.batch, "batch"), compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace mg::kernels::cuda
