// The few definitions of the CUDA kernels whose bodies are inline PTX (cvt, cp.async, ldmatrix,
// mma), which only nvcc compiles. Everything else in kernels/cuda/ is plain CUDA on top of them.
//
// The emulation build (-DMG_CUDA=EMULATE) compiles the kernels with g++ and forces
// cuda_emu/cuda_emulated.h in first. That header defines every name below itself, with the same
// signatures, as a call into the emulator (the emulated twin of the instruction), and then defines
// this file's include guard, so the compiler skips this file there. This is why the guard is a
// classic #ifndef and not #pragma once: the names here and in cuda_emu/native_twins.h must stay
// the same, and a change of signature here is made there too.
#ifndef MG_KERNELS_CUDA_NATIVE_CUH
#define MG_KERNELS_CUDA_NATIVE_CUH

#include <cuda_runtime.h>

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace mg::kernels::cuda {

struct bf16_t;  // kernels/cuda/common.cuh

// ---- cvt: 16-bit float conversions ---------------------------------------------------------------
__device__ __forceinline__ float cvt_f32_f16(uint16_t h) {  // exact
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ uint16_t cvt_rn_f16_f32(float f) {  // to nearest even
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}

// ---- cp.async, ldmatrix, mma (sm_80+) ------------------------------------------------------------
// 16 bytes global -> shared without passing through registers; completes at cp_async_wait. On the
// host (a host program replaying a block's index arithmetic) it is a checked memcpy.
__host__ __device__ __forceinline__ void cp_async_16(void* shared_dst, const void* global_src) {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst))),
               "l"(global_src));
#else
  assert(reinterpret_cast<uintptr_t>(shared_dst) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(global_src) % 16 == 0);
  std::memcpy(shared_dst, global_src, 16);  // host replay
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16: four 8x8 matrices of 16-bit elements.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  if (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
  }
}
// d += a (16x16) * b (16x8), 16-bit inputs (T is bf16_t or f16_t), f32 accumulators.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same<T, bf16_t>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

}  // namespace mg::kernels::cuda

#endif  // MG_KERNELS_CUDA_NATIVE_CUH
