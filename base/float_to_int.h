// Float -> integer conversion with a defined result for every input, the same on CPU and GPU.
//
// C++ leaves static_cast<int>(x) undefined when x is NaN or outside the integer's range (UBSan's
// float-cast-overflow), and compilers really do return anything there. The GPU does not: PTX's
// cvt.rzi.s32.f32 / cvt.rzi.s64.f64 truncate toward zero, SATURATE out-of-range values to the
// type's minimum or maximum, and give 0 for NaN. saturating_cast does exactly that on the host,
// so a copy or .to() of a corrupt or huge float tensor into an integer dtype gives the same,
// defined values on the CPU, on a GPU and under the emulator (which runs device code on the host).
#pragma once

#include <limits>
#include <type_traits>

#if defined(__CUDACC__)
#define MG_FLOAT_TO_INT_HD __host__ __device__ __forceinline__
#else
#define MG_FLOAT_TO_INT_HD inline
#endif

namespace mg {

template <class Int, class Float>
MG_FLOAT_TO_INT_HD Int saturating_cast(Float v) {
  static_assert(std::is_integral<Int>::value && std::is_floating_point<Float>::value,
                "float -> integer only");
  // Both bounds are exact in Float or round to a power of two beyond the range (INT64_MAX -> 2^63),
  // so "v below lo" and "v at or above hi" are decided without any rounding doubt.
  constexpr Float lo = static_cast<Float>(std::numeric_limits<Int>::min());
  constexpr Float hi = static_cast<Float>(std::numeric_limits<Int>::max());
  if (!(v == v)) return Int(0);  // NaN
  if (v <= lo) return std::numeric_limits<Int>::min();
  if (v >= hi) return std::numeric_limits<Int>::max();
  return static_cast<Int>(v);  // in range: truncates toward zero
}

}  // namespace mg
