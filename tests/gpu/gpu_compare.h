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

}  // namespace mg::gpu_test
