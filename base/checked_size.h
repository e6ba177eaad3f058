// Overflow-checked size arithmetic, in one place, for every size that comes from outside: a shape a
// user passes to a factory or a view, a shape read from a safetensors header, the dims of an IDX
// file. Unchecked, `numel * element_size` wraps: a header saying [2^62] F32 computes 0 bytes, passes
// every size check, and the first read of the "2^62-element" tensor is a segfault.
//
// The rules (the same everywhere):
//   - every dim is >= 0;
//   - the product of the dims, counting a 0 dim as 1, fits in int64 -- so numel fits, and so does
//     every contiguous stride (core/tensor.cpp's contiguous_strides multiplies exactly those);
//   - numel * element size fits in int64 (and so in size_t).
// The try_* forms return std::nullopt instead of throwing, for callers that name the culprit
// themselves (a file and a tensor) in an MG_CHECK; the checked_* forms throw mg::Error naming
// `what` (a literal or a view: nothing is built on the passing path).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace mg {

inline std::optional<int64_t> try_mul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

inline std::optional<int64_t> try_add(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// A count stored as a double (an optimizer's step, a scheduler's t_max, a scaler's growth tracker:
// state dicts hold them as f64 scalars) as int64, or nullopt when it is not finite, not whole, or
// outside int64 -- casting such a double to int64_t is undefined behaviour, so a crafted checkpoint
// must be refused before the cast.
inline std::optional<int64_t> try_whole_int64(double v) {
  if (!std::isfinite(v) || v != std::floor(v) || v < -9223372036854775808.0 || v >= 9223372036854775808.0) {
    return std::nullopt;
  }
  return static_cast<int64_t>(v);
}

// The number of elements of `shape`, or nullopt when a dim is negative or the rule above is broken.
inline std::optional<int64_t> try_numel(const std::vector<int64_t>& shape) {
  int64_t product_of_nonzero = 1;
  bool has_zero = false;
  for (int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    if (dim == 0) {
      has_zero = true;
      continue;
    }
    if (__builtin_mul_overflow(product_of_nonzero, dim, &product_of_nonzero)) return std::nullopt;
  }
  return has_zero ? 0 : product_of_nonzero;
}

// numel * element_size, or nullopt when it does not fit in int64.
inline std::optional<int64_t> try_nbytes(int64_t numel, size_t element_size) {
  if (numel < 0 || element_size > static_cast<size_t>(INT64_MAX)) return std::nullopt;
  return try_mul(numel, static_cast<int64_t>(element_size));
}

namespace detail {
inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}
}  // namespace detail

inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  const std::optional<int64_t> out = try_mul(a, b);
  MG_CHECK(out, what, ": size overflow: ", a, " * ", b, " does not fit in 64 bits");
  return *out;
}

inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  const std::optional<int64_t> out = try_add(a, b);
  MG_CHECK(out, what, ": size overflow: ", a, " + ", b, " does not fit in 64 bits");
  return *out;
}

// numel of `shape`; throws naming `what` and the shape on a negative dim or an overflow.
inline int64_t checked_numel(const std::vector<int64_t>& shape, std::string_view what) {
  const std::optional<int64_t> out = try_numel(shape);
  if (!out) {
    for (int64_t dim : shape)
      MG_CHECK(dim >= 0, what, ": shape ", detail::shape_text(shape), " has a negative dimension");
    detail::throw_error(what, ": shape ", detail::shape_text(shape),
                        " has too many elements: the product of its dimensions does not fit in 64 bits");
  }
  return *out;
}

// numel * element_size in bytes; throws naming `what` when it does not fit.
inline int64_t checked_nbytes(int64_t numel, size_t element_size, std::string_view what) {
  const std::optional<int64_t> out = try_nbytes(numel, element_size);
  MG_CHECK(out, what, ": ", numel, " elements of ", element_size, " bytes do not fit in 64 bits of bytes");
  return *out;
}

}  // namespace mg
