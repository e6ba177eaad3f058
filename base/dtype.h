// DType: the element type of a tensor, and the small compile-time helpers that
// let one templated kernel body serve every dtype (visit_dtype below).
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>

#include "base/error.h"
#include "base/half.h"

namespace mg {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, boolean };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::boolean: return "bool";
  }
  return "?";
}

inline std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32:
    case DType::i32: return 4;
    case DType::f64:
    case DType::i64: return 8;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::boolean: return 1;
  }
  return 0;
}

inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
inline bool is_integral(DType t) { return t == DType::i32 || t == DType::i64; }

// NumPy/PyTorch-style type promotion for binary ops: bool < integers < floats,
// wider wins within a category; f16 with bf16 promotes to f32.
inline DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto rank = [](DType t) {
    switch (t) {
      case DType::boolean: return 0;
      case DType::i32: return 1;
      case DType::i64: return 2;
      case DType::f16:
      case DType::bf16: return 3;
      case DType::f32: return 4;
      case DType::f64: return 5;
    }
    return 0;
  };
  if ((a == DType::f16 && b == DType::bf16) || (a == DType::bf16 && b == DType::f16)) return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

// acc_t<T>: the type arithmetic on elements of type T happens, and accumulates, in -- float for the
// 16-bit floats (which are storage formats only), int for bool, T itself otherwise. The one name
// for it in the CPU and the CUDA kernels: a plain alias, so device code uses it too
// (kernels/cuda/common.cuh adds its device-side 16-bit types). Reductions that must not overflow
// widen integers further (to int64) on top of it.
template <class T>
struct AccType {
  using type = T;
};
template <>
struct AccType<f16> {
  using type = float;
};
template <>
struct AccType<bf16> {
  using type = float;
};
template <>
struct AccType<bool> {
  using type = int32_t;
};
template <class T>
using acc_t = typename AccType<T>::type;

template <class T>
struct type_tag {
  using type = T;
};

// Calls f(type_tag<T>{}) with T the C++ element type of `t`.
//   visit_dtype(t, [&](auto tag) { using T = typename decltype(tag)::type; ... });
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(type_tag<float>{});
    case DType::f64: return f(type_tag<double>{});
    case DType::f16: return f(type_tag<f16>{});
    case DType::bf16: return f(type_tag<bf16>{});
    case DType::i32: return f(type_tag<int32_t>{});
    case DType::i64: return f(type_tag<int64_t>{});
    case DType::boolean: return f(type_tag<bool>{});
  }
  throw Error("visit_dtype: unknown dtype");
}

// Same, restricted to floating dtypes; `what` names the op in the error.
template <class F>
decltype(auto) visit_floating(DType t, const char* what, F&& f) {
  switch (t) {
    case DType::f32: return f(type_tag<float>{});
    case DType::f64: return f(type_tag<double>{});
    case DType::f16: return f(type_tag<f16>{});
    case DType::bf16: return f(type_tag<bf16>{});
    default: break;
  }
  throw Error(str_cat(what, ": expected a floating dtype (f32, f64, f16, bf16), got ", dtype_name(t)));
}

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::boolean;
}

}  // namespace mg
