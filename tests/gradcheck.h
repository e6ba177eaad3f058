// Finite-difference gradient checking, the test every differentiable op passes.
//
// For f: inputs -> output, autograd computes d<w, f(x)>/dx for a fixed random
// weighting w (a vector-Jacobian product, exactly what backward does). The
// check compares it, element by element, with the central difference
//   (<w, f(x + h e_i)> - <w, f(x - h e_i)>) / 2h
// in f64, where the truncation error O(h^2) and rounding O(eps/h) are both
// far below the tolerance.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "multigrad.h"

namespace mg::testing {

struct GradcheckResult {
  bool ok = true;
  std::string message;  // first mismatch, for the test log
};

using TensorFunction = std::function<Tensor(const std::vector<Tensor>&)>;

// `inputs` must be f64; those with requires_grad are checked.
inline GradcheckResult gradcheck(const TensorFunction& f, std::vector<Tensor> inputs, double h = 1e-6,
                                 double atol = 1e-5, double rtol = 1e-4) {
  GradcheckResult result;
  // Autograd side.
  Tensor out = f(inputs);
  manual_seed(977);
  Tensor weights = randn(out.shape(), TensorOptions{DType::f64});
  auto weighted = [&](const Tensor& y) {
    NoGradGuard no_grad;
    return sum(mul(y, weights)).item<double>();
  };
  for (Tensor& x : inputs)
    if (x.requires_grad()) x.set_grad(Tensor());
  sum(mul(out, weights)).backward();

  for (size_t k = 0; k < inputs.size(); ++k) {
    Tensor& x = inputs[k];
    if (!x.requires_grad()) continue;
    if (x.grad().defined() && (x.grad().shape() != x.shape() || x.grad().dtype() != x.dtype())) {
      result.ok = false;
      result.message = "input " + std::to_string(k) + ": grad has shape " + shape_str(x.grad().shape()) +
                       " and dtype " + dtype_name(x.grad().dtype()) + ", the input " + shape_str(x.shape()) +
                       " and " + dtype_name(x.dtype());
      return result;
    }
    std::vector<double> analytic = x.grad().defined()
                                       ? x.grad().to_vector<double>()
                                       : std::vector<double>(static_cast<size_t>(x.numel()), 0.0);
    // Numeric side: perturb one element at a time through a contiguous alias.
    Tensor flat = x.detach();
    MG_CHECK(flat.is_contiguous(), "gradcheck: inputs must be contiguous");
    double* data = flat.data<double>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double saved = data[i];
      data[i] = saved + h;
      const double plus = weighted(f(inputs));
      data[i] = saved - h;
      const double minus = weighted(f(inputs));
      data[i] = saved;
      const double numeric = (plus - minus) / (2 * h);
      const double a = analytic[static_cast<size_t>(i)];
      if (!(std::fabs(a - numeric) <= atol + rtol * std::fabs(numeric))) {
        std::ostringstream os;
        os << "input " << k << " element " << i << ": autograd " << a << " vs numeric " << numeric;
        result.ok = false;
        result.message = os.str();
        return result;
      }
    }
  }
  return result;
}

// An f64 leaf with values in [lo, hi) that requires grad.
inline const TensorOptions kF64{DType::f64};

inline Tensor random_input(const Shape& shape, double lo = -1.0, double hi = 1.0, bool requires_grad = true) {
  Tensor t = add(mul(rand(shape, TensorOptions{DType::f64}), hi - lo), lo);
  t.set_requires_grad(requires_grad);
  return t;
}

// Shuffled values start, start + step, start + 2 step, ...: all distinct and spaced
// by `step`, so non-smooth ops (max, relu, abs, clamp, pooling) never sit on a tie
// or a kink within the finite-difference step. An f64 leaf that requires grad.
inline Tensor grid_input(const Shape& shape, double start, double step, uint32_t seed = 1) {
  const int64_t n = shape_numel(shape);
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) values[static_cast<size_t>(i)] = start + step * static_cast<double>(i);
  std::mt19937 rng(seed);
  std::shuffle(values.begin(), values.end(), rng);
  Tensor t = tensor<double>(values, shape, TensorOptions{DType::f64});
  t.set_requires_grad(true);
  return t;
}

// max |a - b| / max(max |b|, floor): the error relative to the reference b's scale (elementwise
// ratios blow up near 0); `floor` keeps an all-zero reference from dividing by zero.
inline double relative_error(const Tensor& a, const Tensor& b, double floor = 1e-30) {
  MG_CHECK(a.shape() == b.shape(), "relative_error: shapes ", shape_str(a.shape()), " and ",
           shape_str(b.shape()), " differ");
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return diff / std::max(scale, floor);
}

// A fresh leaf with t's values that requires grad (a detached copy: t's graph and storage are left
// alone).
inline Tensor leaf(const Tensor& t) {
  Tensor r = t.detach().clone();
  r.set_requires_grad(true);
  return r;
}

}  // namespace mg::testing

// CHECK-style assertion that prints the first mismatch.
#define MG_REQUIRE_GRADCHECK(result)   \
  do {                                 \
    const auto& gc_result_ = (result); \
    INFO(gc_result_.message);          \
    REQUIRE(gc_result_.ok);            \
  } while (0)
