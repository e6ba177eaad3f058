// The emulated twins of kernels/cuda/native.cuh (the inline PTX): the same names, with the same signatures,
// in the same namespace, as calls into the emulator. Included by cuda_emu/cuda_emulated.h (forced in first in
// the emulation build), which then defines native.cuh's include guard, so that when a kernel file includes
// native.cuh the compiler skips it and the kernels call these instead. The kernel sources have no #if for the
// emulator: this header is the emulated branch.
//
// The twins that can fault take the caller's file and line as defaulted arguments, so a fault
// names the kernel's line (gemm_tensor_core.cu:243), not this header's.
#pragma once

#include <cuda_fp16.h>  // the host-side conversions stand in for the cvt instructions
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "cuda_emu/emulator.h"

namespace mg::kernels::cuda {

struct bf16_t;  // kernels/cuda/common.cuh

// ---- cvt: 16-bit float conversions ---------------------------------------------------------------
inline float cvt_f32_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }        // exact
inline uint16_t cvt_rn_f16_f32(float f) { return __half_as_ushort(__float2half_rn(f)); }  // nearest even

// ---- cp.async, ldmatrix, mma (cuda_emu/block_scheduler.cpp, cuda_emu/ptx.cpp) ----------------------
// The copy is recorded (its 16 source bytes read now) and lands at a cp_async_wait that covers it.
inline void cp_async_16(void* shared_dst, const void* global_src, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
  mg_emu::cp_async_16(shared_dst, global_src, file, line);
}
inline void cp_async_commit() { mg_emu::cp_async_commit(); }
template <int N>
void cp_async_wait() {
  mg_emu::cp_async_wait(N);
}
template <bool kTrans>
void ldmatrix_x4(uint32_t (&r)[4], uint32_t address, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  mg_emu::ldmatrix_x4(r, address, kTrans, file, line);
}
template <class T>
void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
               const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  mg_emu::mma_m16n8k16(d, a, b0, b1, std::is_same<T, bf16_t>::value, file, line);
}

}  // namespace mg::kernels::cuda

// kernels/cuda/native.cuh's include guard: the twins above stand in for that file's definitions.
#define MG_KERNELS_CUDA_NATIVE_CUH
