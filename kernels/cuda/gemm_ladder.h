// The hand-written GEMM ladder (kernels/cuda/gemm_ladder.cu) and how matmul picks a GEMM.
//
// Five kernels that compute what cuBLAS computes (GemmArgs of kernels/kernel_args.h, with the
// semantics of kernels/cpu/gemm.h: row-major, trans_a/trans_b, leading dimensions, batch strides
// with 0 = broadcast, alpha and beta, beta == 0 never reads C, alpha == 0 never reads A or B),
// each one step faster than the last:
//
//   naive           f32   one thread per element of C, operands straight from global memory
//   smem_tiled      f32   32 x 32 tiles of A and B staged in shared memory, one output per thread
//   register_tiled  f32   128 x 128 block tile, 8 x 8 outputs per thread, float4 loads,
//                         double-buffered shared memory
//   mma_tiled       bf16, f16 (f32 accumulation)  mma.sync m16n8k16 on 64 x 64 x 16 tiles, operands
//                         staged in padded shared memory as step 2 stages them, fragments read
//                         with plain 32-bit shared loads: tensor cores with nothing else
//   tensor_core     bf16, f16 (f32 accumulation)  mma.sync m16n8k16 on 128 x 128 x 32 tiles
//                         (128 x 256 for large problems) fed by ldmatrix from swizzled shared
//                         memory, 4-stage cp.async pipeline, C staged through shared memory
//
// gemm_ladder.cu explains each step and what it costs. They exist to be read and measured
// (benchmarks/bench_kernels/gemm_ladder.cpp prints each against cuBLAS); cuBLAS stays the default.
//
// Choosing the kernel behind matmul (kernels::cuda::gemm, so every Tensor matmul/linear on a GPU):
//   set_matmul_kernel(GemmKernel::register_tiled);  // or MG_CUDA_MATMUL=register_tiled
// When the chosen kernel does not take the call's dtype (an f32 step given f64 or bf16, tensor_core
// given f32 or f64) gemm() uses cuBLAS for that call, silently, so selecting a step never breaks a
// model that mixes dtypes. gemm_ladder() itself refuses an unsupported dtype with mg::Error.
//
// TF32: set_allow_tf32(true) (or MG_CUDA_ALLOW_TF32=1) lets cuBLAS run f32 GEMMs on tensor cores
// with inputs rounded to TF32 (10 mantissa bits), like torch.backends.cuda.matmul.allow_tf32.
// Default off, so f32 results match the CPU to rounding. The hand-written f32 steps never use TF32.
//
// Host-only header (no CUDA includes). The functions are defined in CUDA builds only
// (kernels/cuda/*.cu are compiled only when MG_HAS_CUDA); CPU-side code must not call them
// outside `#if defined(MG_HAS_CUDA)`.
#pragma once

#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cuda/stream.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cuda {

enum class GemmKernel { cublas, naive, smem_tiled, register_tiled, mma_tiled, tensor_core };

inline const char* gemm_kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::cublas: return "cublas";
    case GemmKernel::naive: return "naive";
    case GemmKernel::smem_tiled: return "smem_tiled";
    case GemmKernel::register_tiled: return "register_tiled";
    case GemmKernel::mma_tiled: return "mma_tiled";
    case GemmKernel::tensor_core: return "tensor_core";
  }
  return "unknown";
}

// Every kernel, in ladder order (cuBLAS first).
constexpr GemmKernel kAllGemmKernels[] = {GemmKernel::cublas,     GemmKernel::naive,
                                          GemmKernel::smem_tiled, GemmKernel::register_tiled,
                                          GemmKernel::mma_tiled,  GemmKernel::tensor_core};

// "cublas, naive, smem_tiled, register_tiled, mma_tiled, tensor_core": for error messages.
inline std::string gemm_kernel_choices() {
  std::string s;
  for (GemmKernel k : kAllGemmKernels) s += std::string(s.empty() ? "" : ", ") + gemm_kernel_name(k);
  return s;
}

// The kernel named `name` (exactly as gemm_kernel_name spells it); mg::Error naming the choices
// otherwise. `what` says where the name came from ("MG_CUDA_MATMUL", ...).
inline GemmKernel parse_gemm_kernel(const std::string& name, const char* what = "GEMM kernel") {
  for (GemmKernel k : kAllGemmKernels)
    if (name == gemm_kernel_name(k)) return k;
  throw Error(str_cat(what, ": unknown GEMM kernel '", name, "'; choose one of ", gemm_kernel_choices()));
}

// Whether `k` computes GEMMs of `dtype`: cuBLAS f32/f64/f16/bf16; naive, smem_tiled and
// register_tiled f32; mma_tiled and tensor_core bf16 and f16 (inputs and output in that dtype, f32
// accumulation).
inline bool gemm_kernel_supports(GemmKernel k, DType dtype) {
  switch (k) {
    case GemmKernel::cublas:
      return dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16;
    case GemmKernel::naive:
    case GemmKernel::smem_tiled:
    case GemmKernel::register_tiled: return dtype == DType::f32;
    case GemmKernel::mma_tiled:
    case GemmKernel::tensor_core: return dtype == DType::bf16 || dtype == DType::f16;
  }
  return false;
}

// Whether `k` runs on tensor cores (mma.sync: bf16/f16 in, f32 accumulation, sm_80 or newer).
inline bool uses_tensor_cores(GemmKernel k) {
  return k == GemmKernel::mma_tiled || k == GemmKernel::tensor_core;
}

// C = alpha op(A) op(B) + beta C with the chosen kernel, queued on `stream` of the runtime's
// current device (as kernels::cuda::gemm; `scratch` serves cuBLAS's workspace). Throws mg::Error for a dtype
// the kernel does not take, inconsistent arguments, sizes beyond 32-bit int, or mma_tiled / tensor_core
// on a GPU older than sm_80. GemmKernel::cublas is gemm_cublas().
void gemm_ladder(cudaStream_t stream, ScratchAllocator& scratch, GemmKernel kernel, const GemmArgs& args);

// The cuBLAS path of kernels::cuda::gemm, whatever matmul_kernel() says (gemm.cu). Honours
// allow_tf32() for f32.
void gemm_cublas(cudaStream_t stream, ScratchAllocator& scratch, const GemmArgs& args);

// The kernel kernels::cuda::gemm (and so matmul) uses. Default cublas, or MG_CUDA_MATMUL's value
// (cublas|naive|smem_tiled|register_tiled|mma_tiled|tensor_core), read on the first call; an unknown value
// makes that call (and every later one until set_matmul_kernel) throw mg::Error naming the choices.
// Process-wide; safe to call from any thread.
GemmKernel matmul_kernel();
void set_matmul_kernel(GemmKernel kernel);

// Whether cuBLAS may use TF32 tensor cores for f32 GEMMs. Default false, or MG_CUDA_ALLOW_TF32
// (1/true/on or 0/false/off) read on the first call. Process-wide; safe from any thread.
bool allow_tf32();
void set_allow_tf32(bool allow);

// The tensor_core step's block tile: 0 (the default) chooses per call, 128 x 256 when the grid is
// big enough that the wider tile costs no wave (it moves less through L2 per FLOP), else 128 x 128;
// 128 or 256 forces 128 x 128 or 128 x 256 (for tests and benchmarks). Anything else throws
// mg::Error. Process-wide; safe from any thread.
void set_tensor_core_tile_n(int tile_n);

}  // namespace mg::kernels::cuda
