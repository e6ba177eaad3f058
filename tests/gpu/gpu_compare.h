// Helpers for the CUDA-vs-CPU tests: random inputs, poisoned outputs, and the
// relative error ||out - ref|| / ||ref|| that every comparison is judged by.
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

// Tolerance of a result computed in `dtype` (float accumulation for halves).
inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-12;
    case DType::f32: return 2e-6;
    case DType::f16: return 2e-3;
    case DType::bf16: return 1.6e-2;
    default: return 0.0;  // integers and bool: exact
  }
}

#define MG_REQUIRE_CLOSE(out, ref, tol)                                   \
  do {                                                                    \
    const double mg_err_ = ::mg::gpu_test::rel_error((out), (ref));       \
    INFO("relative error " << mg_err_ << " (tolerance " << (tol) << ")"); \
    CHECK(mg_err_ <= (tol));                                              \
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
