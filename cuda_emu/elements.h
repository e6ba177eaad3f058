// The element types the emulated libraries (cuBLAS, cuDNN) compute on, as raw memory: the
// toolkit's own host-side 16-bit conversions (cuda_fp16.h, cuda_bf16.h; round to nearest even,
// NaN kept a NaN), TF32 rounding, and loads/stores of element i as an accumulation type.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace mg_emu {

inline float half_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
inline uint16_t float_to_half(float f) { return __half_as_ushort(__float2half_rn(f)); }
inline float bf16_to_float(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }
inline uint16_t float_to_bf16(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

// 10 mantissa bits, to nearest with ties away (cvt.rna.tf32.f32): what tensor cores see of f32.
inline float to_tf32(float v) {
  uint32_t x;
  std::memcpy(&x, &v, sizeof x);
  if ((x & 0x7f800000u) == 0x7f800000u) return v;  // inf, NaN
  x = (x + 0x1000u) & 0xffffe000u;
  float r;
  std::memcpy(&r, &x, sizeof r);
  return r;
}

enum class Elem { f32, f64, f16, bf16 };

inline size_t elem_bytes(Elem e) { return e == Elem::f64 ? 8 : e == Elem::f32 ? 4 : 2; }

// Element i of an array of type e, as the accumulation type.
template <class Acc>
Acc load(Elem e, const void* base, long long i) {
  switch (e) {
    case Elem::f32: return Acc(static_cast<const float*>(base)[i]);
    case Elem::f64: return Acc(static_cast<const double*>(base)[i]);
    case Elem::f16: return Acc(half_to_float(static_cast<const uint16_t*>(base)[i]));
    case Elem::bf16: return Acc(bf16_to_float(static_cast<const uint16_t*>(base)[i]));
  }
  return Acc(0);
}

// v rounded to type e (to nearest even) into element i.
template <class Acc>
void store(Elem e, void* base, long long i, Acc v) {
  switch (e) {
    case Elem::f32: static_cast<float*>(base)[i] = float(v); return;
    case Elem::f64: static_cast<double*>(base)[i] = double(v); return;
    case Elem::f16: static_cast<uint16_t*>(base)[i] = float_to_half(float(v)); return;
    case Elem::bf16: static_cast<uint16_t*>(base)[i] = float_to_bf16(float(v)); return;
  }
}

}  // namespace mg_emu
