// Helpers for the CUDA-vs-CPU tests: random inputs, poisoned outputs, and the
// comparison every result is judged by (MG_REQUIRE_CLOSE): the relative error
// ||out - ref|| / ||ref|| over the whole tensor AND over every tile of it.
//
// Why tiles: one norm over a 1024 x 768 output cannot see one wrong 8 x 8 tile
// (64 of 786432 elements: a zeroed tile is 0.9 % of the norm, under a bf16
// tolerance), yet a wrong tile is exactly what a tiled kernel's indexing bug
// produces. compare() also takes ||out - ref|| / ||ref|| over each 16 x 16 tile
// of the tensor seen as [numel / last dim, last dim] (tensors of rank < 2, and
// those with a last dim under 16, in tiles of 256 consecutive elements), with
// ||ref|| of a tile floored at the tile's share of the whole norm
// (sqrt(tile elements / all elements) * ||ref||), so a tile of near-zero
// reference values is judged against the tensor's scale, not its own. Both
// must be within the tolerance; a failure names the worst tile and its worst
// element (index, both values).
//
// Poisoning: an output is filled with NaN (floating) or a sentinel (integers)
// before the kernel runs, so an element the kernel forgets to write shows up
// as a NaN or a wrong value and fails the comparison. (A bool output cannot be
// poisoned with a value outside {0, 1}; those are compared exactly instead,
// after poisoning with the complement of the reference where it matters.)
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"

namespace mg::gpu_test {

inline Device gpu() { return Device::cuda(0); }

// Standard-normal values (Philox, so the same on every run) as `dtype`, on the CPU.
inline Tensor random_cpu(const Shape& shape, DType dtype = DType::f32, double scale = 1.0,
                         double shift = 0.0) {
  Tensor t = randn(shape, TensorOptions{DType::f64});
  if (scale != 1.0) t = mul(t, scale);
  if (shift != 0.0) t = add(t, shift);
  return t.to(dtype);
}

inline double poison_value(DType dtype) { return is_floating(dtype) ? NAN : -12345.0; }

// An uninitialised-looking output: every element NaN / the sentinel.
inline Tensor poisoned(const Shape& shape, DType dtype, Device device) {
  return full(shape, dtype == DType::boolean ? 0.0 : poison_value(dtype),
              TensorOptions{dtype, device, false});
}

// ||out - ref||_2 / ||ref||_2 over all elements, in double on the CPU. A NaN
// in `out` where `ref` has none gives +inf; NaN at the same place in both is
// treated as equal (0 difference). ||ref|| == 0 falls back to ||out - ref||.
inline double rel_error(const Tensor& out, const Tensor& ref) {
  REQUIRE(out.shape() == ref.shape());
  const std::vector<double> o = out.to_vector<double>(), r = ref.to_vector<double>();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < o.size(); ++i) {
    const bool on = std::isnan(o[i]), rn = std::isnan(r[i]);
    if (on || rn) {
      if (on != rn) return INFINITY;
      continue;
    }
    if (std::isinf(o[i]) || std::isinf(r[i])) {
      if (o[i] != r[i]) return INFINITY;
      continue;
    }
    diff += (o[i] - r[i]) * (o[i] - r[i]);
    norm += r[i] * r[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Tolerance of a result computed in `dtype` (float accumulation for halves), as a relative 2-norm
// error, over the whole tensor and over every tile alike. Each is ~10x the rounding a right kernel
// shows: f64 and f32 a few ulp of accumulated rounding (u = 1.1e-16, 6e-8); f16 and bf16 the final
// rounding to 16 bits, at most 2^-11 / 2^-9 per element (4.9e-4 / 2e-3), about half that in norm.
// Tests multiply it where a kernel legitimately rounds more (long sums, exp/log, backward passes),
// each saying why. A wrong tile, a missing term or a stale element is far above all of them.
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 2e-6;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 0.0;  // integers and bool: exact
  }
}

// The whole-tensor and per-tile relative errors of `out` against `ref` (see the top of this file).
struct Comparison {
  double whole = 0.0;                                   // rel_error(out, ref)
  double worst_tile = 0.0;                              // the largest tile error
  size_t tile_first = 0;                                // flat index of the worst tile's first element
  size_t tile_rows = 0, tile_cols = 0, row_length = 1;  // its extent, and the [rows, cols] view's cols
  size_t worst_index = 0;                               // flat index of the largest |out - ref| in that tile
  double out_value = 0.0, ref_value = 0.0;
  bool within(double tol) const { return whole <= tol && worst_tile <= tol; }
  std::string describe(double tol) const {
    std::ostringstream s;
    s << "relative error " << whole << " over the whole tensor, worst tile " << worst_tile << " (tolerance "
      << tol << ") at flat index " << tile_first << " (row " << tile_first / row_length << ", column "
      << tile_first % row_length << ", " << tile_rows << " x " << tile_cols
      << "); its worst element: flat index " << worst_index << ", out " << out_value << ", ref " << ref_value;
    return s.str();
  }
};

// One element's squared difference: +inf where exactly one is NaN or an infinity differs, 0 where
// both are the same NaN/infinity (as rel_error).
inline double squared_difference(double o, double r) {
  const bool on = std::isnan(o), rn = std::isnan(r);
  if (on || rn) return on == rn ? 0.0 : INFINITY;
  if (std::isinf(o) || std::isinf(r)) return o == r ? 0.0 : INFINITY;
  return (o - r) * (o - r);
}

inline Comparison compare(const Tensor& out, const Tensor& ref) {
  REQUIRE(out.shape() == ref.shape());
  const std::vector<double> o = out.to_vector<double>(), r = ref.to_vector<double>();
  Comparison c;
  c.whole = rel_error(out, ref);
  const size_t n = o.size();
  if (n == 0) return c;
  const Shape& shape = ref.shape();
  const size_t last = shape.empty() ? 1 : static_cast<size_t>(shape.back());
  const bool flat = shape.size() < 2 || last < 16;
  c.row_length = flat ? n : last;
  const size_t rows = n / c.row_length, tile_rows = flat ? 1 : 16, tile_cols = flat ? 256 : 16;
  double mean_square = 0.0;
  for (double v : r)
    if (std::isfinite(v)) mean_square += v * v / static_cast<double>(n);
  for (size_t row0 = 0; row0 < rows; row0 += tile_rows) {
    for (size_t col0 = 0; col0 < c.row_length; col0 += tile_cols) {
      const size_t row1 = std::min(rows, row0 + tile_rows), col1 = std::min(c.row_length, col0 + tile_cols);
      double diff = 0.0, norm = 0.0, worst = -1.0;
      size_t worst_at = row0 * c.row_length + col0;
      for (size_t row = row0; row < row1; ++row) {
        for (size_t col = col0; col < col1; ++col) {
          const size_t i = row * c.row_length + col;
          const double d = squared_difference(o[i], r[i]);
          diff += d;
          if (std::isfinite(r[i])) norm += r[i] * r[i];
          if (d > worst) {
            worst = d;
            worst_at = i;
          }
        }
      }
      const double floor = mean_square * static_cast<double>((row1 - row0) * (col1 - col0));
      const double scale = std::max(norm, floor);
      const double err = scale > 0 ? std::sqrt(diff / scale) : std::sqrt(diff);
      if (err > c.worst_tile || (row0 == 0 && col0 == 0)) {
        c.worst_tile = err;
        c.tile_first = row0 * c.row_length + col0;
        c.tile_rows = row1 - row0;
        c.tile_cols = col1 - col0;
        c.worst_index = worst_at;
        c.out_value = o[worst_at];
        c.ref_value = r[worst_at];
      }
    }
  }
  return c;
}

// Tolerances are relative 2-norm errors, judged over the whole tensor and over every tile
// (compare(), top of this file): a result must be as close everywhere as it is on average.
#define MG_REQUIRE_CLOSE(out, ref, tol)                                               \
  do {                                                                                \
    const ::mg::gpu_test::Comparison mg_cmp_ = ::mg::gpu_test::compare((out), (ref)); \
    INFO(mg_cmp_.describe(tol));                                                      \
    CHECK(mg_cmp_.within(tol));                                                       \
  } while (0)

// Element by element: the largest |out[i] - ref[i]| / max(|ref[i]|, rms(ref)) (the rms keeps a sum
// that happens to be near 0 from failing on an error that is small next to its neighbours), with
// `worst` set to its index; +inf where exactly one of the two is NaN, or an infinity differs.
inline double max_elementwise_error(const Tensor& out, const Tensor& ref, size_t* worst = nullptr) {
  REQUIRE(out.shape() == ref.shape());
  const std::vector<double> o = out.to_vector<double>(), r = ref.to_vector<double>();
  double sum_squares = 0.0;
  for (double v : r)
    if (std::isfinite(v)) sum_squares += v * v;
  const double rms = r.empty() ? 0.0 : std::sqrt(sum_squares / static_cast<double>(r.size()));
  double max_err = 0.0;
  if (worst) *worst = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    const bool on = std::isnan(o[i]), rn = std::isnan(r[i]);
    double err = 0.0;
    if (on || rn) {
      err = on == rn ? 0.0 : INFINITY;
    } else if (std::isinf(o[i]) || std::isinf(r[i])) {
      err = o[i] == r[i] ? 0.0 : INFINITY;
    } else {
      const double scale = std::max(std::fabs(r[i]), rms);
      err = scale > 0 ? std::fabs(o[i] - r[i]) / scale : std::fabs(o[i] - r[i]);
    }
    if (err > max_err) {
      max_err = err;
      if (worst) *worst = i;
    }
  }
  return max_err;
}

#define MG_REQUIRE_EACH_CLOSE(out, ref, tol)                                                              \
  do {                                                                                                    \
    size_t mg_worst_ = 0;                                                                                 \
    const double mg_err_ = ::mg::gpu_test::max_elementwise_error((out), (ref), &mg_worst_);               \
    INFO("largest element error " << mg_err_ << " at flat index " << mg_worst_ << " (tolerance " << (tol) \
                                  << ")");                                                                \
    CHECK(mg_err_ <= (tol));                                                                              \
  } while (0)

}  // namespace mg::gpu_test
