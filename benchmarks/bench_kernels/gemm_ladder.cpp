// bench_kernels family "gemm": each step of the hand-written GEMM ladder (kernels/cuda/gemm_ladder.cu)
// against cuBLAS on the same square problem, same dtype, same buffers.
//
// Rows, per size (1024^3, 2048^3, 4096^3; --quick: 1024^3 and 4096^3, without the naive step at
// 4096^3, which alone would take seconds):
//   "ladder/naive", "ladder/smem_tiled", "ladder/register_tiled"  f32, against cuBLAS f32 GEMM with
//       CUBLAS_COMPUTE_32F (cublasSgemm's arithmetic: no TF32, whatever allow_tf32 says)
//   "ladder/mma_tiled", "ladder/tensor_core"  bf16 in and out, f32 accumulation, against cuBLAS with
//       the same types
// achieved and ceiling are TFLOP/s = 2 m n k / median seconds; ratio = ladder / cuBLAS. The issue's
// floors (register_tiled >= 0.5 and tensor_core >= 0.5 of cuBLAS at 4096^3) are set on those rows.
// max_rel_error: max |ladder - cuBLAS| / max |cuBLAS| over all of C, copied back to the host.
//
// Row-major C = A B with A m x k, B k x n (no transposes, tight leading dimensions, 16-byte
// aligned: the fast paths). Inputs are uniform in [-1, 1). Raw cudaMalloc buffers; the ladder is
// called through kernels::cuda::gemm_ladder, cuBLAS through its own handle, both on the current
// stream of o.device.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/half.h"
#include "bench_kernels.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cuda/gemm_ladder.h"

namespace mg::bench {
namespace {

namespace kc = kernels::cuda;

void cuda_ok(cudaError_t e) { MG_CHECK(e == cudaSuccess, "bench gemm: ", cudaGetErrorString(e)); }
void cublas_ok(cublasStatus_t s) {
  MG_CHECK(s == CUBLAS_STATUS_SUCCESS, "bench gemm: cuBLAS status ", int(s));
}

// A cudaMalloc'ed buffer, freed on scope exit.
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { cuda_ok(cudaMalloc(&ptr, bytes)); }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// n values uniform in [-1, 1), as f32 or bf16 bits, copied to the device.
void fill_random(void* device, int64_t n, bool bf16_values, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  if (bf16_values) {
    std::vector<uint16_t> host(n);
    for (auto& v : host) v = bf16(uniform(rng)).bits;
    cuda_ok(cudaMemcpy(device, host.data(), n * 2, cudaMemcpyHostToDevice));
  } else {
    std::vector<float> host(n);
    for (auto& v : host) v = uniform(rng);
    cuda_ok(cudaMemcpy(device, host.data(), n * 4, cudaMemcpyHostToDevice));
  }
}

// C (n elements on the device) as floats on the host.
std::vector<float> to_host(const void* device, int64_t n, bool bf16_values) {
  std::vector<float> out(n);
  if (bf16_values) {
    std::vector<uint16_t> bits(n);
    cuda_ok(cudaMemcpy(bits.data(), device, n * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < n; ++i) {
      bf16 h;
      h.bits = bits[i];
      out[i] = h;
    }
  } else {
    cuda_ok(cudaMemcpy(out.data(), device, n * 4, cudaMemcpyDeviceToHost));
  }
  return out;
}

// Row-major C = A B through cuBLAS (column-major C^T = B^T A^T), f32 without TF32 or bf16 with
// f32 accumulation.
void cublas_gemm(cublasHandle_t handle, bool bf16_values, int m, int n, int k, const void* a, const void* b,
                 void* c) {
  const float alpha = 1.f, beta = 0.f;
  const cudaDataType_t type = bf16_values ? CUDA_R_16BF : CUDA_R_32F;
  cublas_ok(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b, type, n, a, type, k, &beta, c,
                         type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

std::vector<KernelResult> bench_gemm_ladder(const BenchOptions& o, const Ceilings&) {
  mg::cuda::DeviceGuard guard(o.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(mg::cuda::current_stream(o.device).handle);
  cublasHandle_t handle = nullptr;
  cublas_ok(cublasCreate(&handle));
  cublas_ok(cublasSetStream(handle, stream));
  // --profile: every step at 1024^3, and the tensor-core step at 4096^3 too (tracing the f32 steps'
  // shared-memory loads at 4096^3 would take minutes); no cuBLAS (a library call, not traced).
  const std::vector<int> sizes = o.profile ? std::vector<int>{1024, 4096}
                                 : o.check ? std::vector<int>{128, 264}
                                 : o.quick ? std::vector<int>{1024, 4096}
                                           : std::vector<int>{1024, 2048, 4096};
  std::vector<KernelResult> rows;
  try {
    for (int size : sizes) {
      const int m = size, n = size, k = size;
      const double flops = 2.0 * m * n * k;
      const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
      for (bool bf16_values : {false, true}) {
        const size_t elem = bf16_values ? 2 : 4;
        DeviceBuffer a(size_t(m) * k * elem), b(size_t(k) * n * elem), c_ref(size_t(m) * n * elem),
            c(size_t(m) * n * elem);
        fill_random(a.ptr, int64_t(m) * k, bf16_values, 1);
        fill_random(b.ptr, int64_t(k) * n, bf16_values, 2);
        if (o.profile && size > 1024 && !bf16_values) continue;
        const double cublas_s =
            o.profile
                ? 0
                : median_seconds([&] { cublas_gemm(handle, bf16_values, m, n, k, a.ptr, b.ptr, c_ref.ptr); },
                                 o, stream);
        const std::vector<float> ref =
            o.profile ? std::vector<float>{} : to_host(c_ref.ptr, int64_t(m) * n, bf16_values);

        const std::vector<kc::GemmKernel> steps =
            bf16_values ? std::vector<kc::GemmKernel>{kc::GemmKernel::mma_tiled, kc::GemmKernel::tensor_core}
                        : std::vector<kc::GemmKernel>{kc::GemmKernel::naive, kc::GemmKernel::smem_tiled,
                                                      kc::GemmKernel::register_tiled};
        for (kc::GemmKernel step : steps) {
          if (o.quick && step == kc::GemmKernel::naive && size >= 4096) continue;
          KernelResult r;
          r.family = "gemm";
          r.kernel = std::string("ladder/") + kc::gemm_kernel_name(step);
          r.dtype = bf16_values ? "bf16" : "f32";
          r.shape = shape;
          r.unit = "TFLOP/s";
          r.reference = bf16_values ? "cuBLAS bf16 (f32 accumulate)" : "cuBLAS f32 (no TF32)";
          r.ceiling = flops / cublas_s * 1e-12;
          // f32: both sides round each of k terms (~u sqrt(k) of the largest output); bf16: the final
          // rounding to 8 significant bits (2^-9) on either side, plus where they round differently.
          r.tolerance = bf16_values ? 1e-2 : 1e-4;
          if (size == 4096 && (step == kc::GemmKernel::register_tiled || step == kc::GemmKernel::tensor_core))
            r.floor = 0.5;
          if (rows.empty())
            r.note =
                "gemm: ladder steps vs cuBLAS on row-major C = A B (tight, aligned); max_rel_error = "
                "max|ladder - cuBLAS| / max|cuBLAS|";
          mg::kernels::GemmArgs g;
          g.dtype = bf16_values ? DType::bf16 : DType::f32;
          g.m = m, g.n = n, g.k = k;
          g.a = a.ptr, g.lda = k;
          g.b = b.ptr, g.ldb = n;
          g.c = c.ptr, g.ldc = n;
          try {
            cuda_ok(cudaMemsetAsync(c.ptr, 0xff, size_t(m) * n * elem, stream));  // NaN: unwritten shows
            BenchOptions step_options = o;
            // The naive step at 4096^3 takes tens of milliseconds a call: a few calls give its median.
            if (step == kc::GemmKernel::naive && size >= 2048) step_options.repeats = std::min(o.repeats, 5);
            const double s = median_seconds(
                [&] {
                  kc::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), step, g);
                },
                step_options, stream);
            r.seconds = s;
            r.achieved = flops / s * 1e-12;
            r.ratio = r.achieved / r.ceiling;
            if (o.profile) {  // only the traced blocks ran: C is not checked
              const double ideal_bytes = double(elem) * (double(m) * k + double(k) * n + double(m) * n);
              r.profile = take_profile(ideal_bytes, kc::uses_tensor_cores(step) ? 0 : flops);
              r.tolerance = -1;
            } else {
              r.max_rel_error = max_rel_error(to_host(c.ptr, int64_t(m) * n, bf16_values), ref);
              r.failed = !(r.max_rel_error <= r.tolerance);
            }
          } catch (const Error& e) {
            r.failed = true;
            r.note = std::string("failed: ") + e.what();
          }
          rows.push_back(r);
        }
      }
    }
  } catch (...) {
    cublasDestroy(handle);
    throw;
  }
  cublasDestroy(handle);
  return rows;
}

const RegisterFamily kRegistered("gemm", 20, bench_gemm_ladder);

}  // namespace
}  // namespace mg::bench
