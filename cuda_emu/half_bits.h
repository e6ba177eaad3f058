// 16-bit floats as raw bits, for the emulated libraries (cuBLAS, cuDNN): the CUDA toolkit's own
// host-side conversions (cuda_fp16.h, cuda_bf16.h), round to nearest even, NaN kept a NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace mg_emu {

inline float half_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
inline uint16_t float_to_half(float f) { return __half_as_ushort(__float2half_rn(f)); }
inline float bf16_to_float(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
inline uint16_t float_to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

}  // namespace mg_emu
