// 16-bit floating point storage types. CPU kernels never compute in 16 bits:
// they load an f16/bf16, widen it to float, compute, and round back on store.
// That is also what the GPU does for "fp32 accumulation".
//   f16  (IEEE binary16): 1 sign, 5 exponent, 10 mantissa bits.
//   bf16 (bfloat16):      1 sign, 8 exponent,  7 mantissa bits (float's top half).
#pragma once

#include <cstdint>
#include <cstring>

namespace mg {

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  bf16(float value) {  // round to nearest even; NaN stays a (quiet) NaN
    uint32_t u;
    std::memcpy(&u, &value, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x0040u);
    } else {
      uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>((u + rounding_bias) >> 16);
    }
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  f16(float value) { bits = float_to_half_bits(value); }
  operator float() const { return half_bits_to_float(bits); }

  static uint16_t float_to_half_bits(float value) {
    uint32_t u;
    std::memcpy(&u, &value, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
    if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (abs < 0x38800000u) {  // result is subnormal or zero: shift mantissa, round to even
      if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
      uint32_t exponent = abs >> 23;
      uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
      uint32_t shift = 126u - exponent;  // 14..24
      uint32_t half_mantissa = mantissa >> shift;
      uint32_t remainder = mantissa & ((1u << shift) - 1u);
      uint32_t halfway = 1u << (shift - 1u);
      if (remainder > halfway || (remainder == halfway && (half_mantissa & 1u))) ++half_mantissa;
      return static_cast<uint16_t>(sign | half_mantissa);
    }
    // normal: rebias exponent (127 -> 15) and round the 13 dropped bits to even
    uint32_t rebased = abs - 0x38000000u;
    uint32_t rounded = rebased + 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | (rounded >> 13));
  }

  static float half_bits_to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t u;
    if (exponent == 0x1fu) {
      u = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
      u = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
      u = sign;
    } else {  // subnormal half -> normal float
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      u = sign | ((112u - static_cast<uint32_t>(e)) << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

}  // namespace mg
