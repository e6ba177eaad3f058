// Turning CUDA and cuBLAS return codes into mg::Error. For .cu files only (it
// includes the CUDA runtime header); code compiled by the host compiler alone
// uses core/cuda_stream.h and core/cuda_allocator.h.
//
//   MG_CUDA_CHECK(cudaMemcpyAsync(...));   // throws "file.cu:42: cudaMemcpyAsync(...) failed:
//                                          //   cudaErrorInvalidValue (invalid argument)"
//   MG_CUDA_CHECK_LAUNCH();                // after a <<<...>>> launch
//   MG_CUBLAS_CHECK(cublasGemmEx(...));
//
// The macros only capture the expression text, __FILE__ and __LINE__; the work
// is done by ordinary functions.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

namespace mg::cuda {

// Throws mg::Error naming the call site, the expression, the error's name and
// the runtime's own message. Clears the runtime's sticky "last error" first,
// so one failure is reported once.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line);

inline void cuda_check(cudaError_t err, const char* expr, const char* file, int line) {
  if (err != cudaSuccess) throw_cuda_error(err, expr, file, line);
}
inline void cublas_check(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status != CUBLAS_STATUS_SUCCESS) throw_cublas_error(status, expr, file, line);
}

}  // namespace mg::cuda

#define MG_CUDA_CHECK(expr) ::mg::cuda::cuda_check((expr), #expr, __FILE__, __LINE__)
#define MG_CUDA_CHECK_LAUNCH() ::mg::cuda::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
#define MG_CUBLAS_CHECK(expr) ::mg::cuda::cublas_check((expr), #expr, __FILE__, __LINE__)
