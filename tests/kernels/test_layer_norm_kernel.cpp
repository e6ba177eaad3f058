// Tests for kernels/cpu/layer_norm: forward (y, mean, rstd) against a naive
// double reference, the backward's three gradients against central finite
// differences in f64 (with and without weight/bias), reduced-precision dtypes
// against f64, and the two-pass variance on rows with a large mean.
#include <catch2/catch.hpp>
#include <cmath>
#include <iomanip>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/layer_norm.h"
#include "tests/kernels/kernel_test_values.h"

using mg::DType;

using namespace mg::kernel_test;

namespace {

std::vector<double> random_values(int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

struct Forward {
  std::vector<double> y, mean, rstd;
};

Forward reference_forward(const std::vector<double>& x, const std::vector<double>* weight,
                          const std::vector<double>* bias, int64_t rows, int64_t cols, double eps) {
  Forward f{std::vector<double>(x.size()), std::vector<double>(static_cast<size_t>(rows)),
            std::vector<double>(static_cast<size_t>(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) mean += x[r * cols + c] / static_cast<double>(cols);
    for (int64_t c = 0; c < cols; ++c) var += std::pow(x[r * cols + c] - mean, 2) / static_cast<double>(cols);
    f.mean[r] = mean;
    f.rstd[r] = 1 / std::sqrt(var + eps);
    for (int64_t c = 0; c < cols; ++c)
      f.y[r * cols + c] =
          (x[r * cols + c] - mean) * f.rstd[r] * (weight ? (*weight)[c] : 1.0) + (bias ? (*bias)[c] : 0.0);
  }
  return f;
}

// T is the element type, S the statistics type (double for f64, float otherwise).
template <class T, class S>
Forward run_forward(DType dtype, const std::vector<double>& x, const std::vector<double>* weight,
                    const std::vector<double>* bias, int64_t rows, int64_t cols, double eps) {
  std::vector<T> xs = cast_to<T>(x), y(x.size());
  std::vector<T> w = weight ? cast_to<T>(*weight) : std::vector<T>(),
                 b = bias ? cast_to<T>(*bias) : std::vector<T>();
  std::vector<S> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  mg::kernels::cpu::layer_norm_forward(dtype, xs.data(), weight ? w.data() : nullptr,
                                       bias ? b.data() : nullptr, rows, cols, eps, y.data(), mean.data(),
                                       rstd.data());
  return {to_double(y), to_double(mean), to_double(rstd)};
}

struct Grads {
  std::vector<double> x, weight, bias;
};

template <class T, class S>
Grads run_backward(DType dtype, const std::vector<double>& x, const std::vector<double>* weight,
                   bool with_bias, int64_t rows, int64_t cols, double eps, const std::vector<double>& gy) {
  std::vector<T> xs = cast_to<T>(x), y(x.size()), g = cast_to<T>(gy), gx(x.size());
  std::vector<T> w = weight ? cast_to<T>(*weight) : std::vector<T>();
  std::vector<S> mean(static_cast<size_t>(rows)), rstd(static_cast<size_t>(rows));
  // Prefill the parameter grads with garbage: the kernel must overwrite, not accumulate.
  std::vector<T> gw(static_cast<size_t>(cols), static_cast<T>(7.0f)),
      gb(static_cast<size_t>(cols), static_cast<T>(7.0f));
  const T* wp = weight ? w.data() : nullptr;
  std::vector<T> b(static_cast<size_t>(cols), static_cast<T>(0.25f));
  mg::kernels::cpu::layer_norm_forward(dtype, xs.data(), wp, with_bias ? b.data() : nullptr, rows, cols, eps,
                                       y.data(), mean.data(), rstd.data());
  mg::kernels::cpu::layer_norm_backward(dtype, g.data(), xs.data(), mean.data(), rstd.data(), wp, rows, cols,
                                        gx.data(), weight ? gw.data() : nullptr,
                                        with_bias ? gb.data() : nullptr);
  return {to_double(gx), weight ? to_double(gw) : std::vector<double>(),
          with_bias ? to_double(gb) : std::vector<double>()};
}

constexpr double kEps = 1e-5;

}  // namespace

TEST_CASE("layer_norm forward matches the double reference", "[kernels]") {
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4, 10}, {3, 129}, {1, 1}, {300, 128}}) {
    std::vector<double> x = random_values(rows * cols, -3, 3, 21);
    std::vector<double> w = random_values(cols, 0.5, 1.5, 22), b = random_values(cols, -1, 1, 23);
    for (bool affine : {true, false}) {
      INFO("rows " << rows << ", cols " << cols << ", affine " << affine);
      const std::vector<double>* wp = affine ? &w : nullptr;
      const std::vector<double>* bp = affine ? &b : nullptr;
      Forward want = reference_forward(x, wp, bp, rows, cols, kEps);
      Forward f64 = run_forward<double, double>(DType::f64, x, wp, bp, rows, cols, kEps);
      require_close(f64.y, want.y, 1e-12, 1e-12);
      require_close(f64.mean, want.mean, 1e-14, 1e-12);
      require_close(f64.rstd, want.rstd, 1e-14, 1e-12);
      Forward f32 = run_forward<float, float>(DType::f32, x, wp, bp, rows, cols, kEps);
      require_close(f32.y, want.y, 1e-5, 1e-5);
      require_close(f32.mean, want.mean, 1e-6, 1e-5);
      require_close(f32.rstd, want.rstd, 1e-6, 1e-4);
      // bf16 rounds input, parameters and output to 8 significant bits.
      std::vector<double> xb = to_double(cast_to<mg::bf16>(x)), wb = to_double(cast_to<mg::bf16>(w)),
                          bb = to_double(cast_to<mg::bf16>(b));
      Forward b16 = run_forward<mg::bf16, float>(DType::bf16, xb, affine ? &wb : nullptr,
                                                 affine ? &bb : nullptr, rows, cols, kEps);
      Forward want_b =
          reference_forward(xb, affine ? &wb : nullptr, affine ? &bb : nullptr, rows, cols, kEps);
      require_close(b16.y, want_b.y, 2e-2, 1e-2);
      require_close(b16.mean, want_b.mean, 1e-5, 1e-5);
      Forward f16 = run_forward<mg::f16, float>(DType::f16, xb, affine ? &wb : nullptr,
                                                affine ? &bb : nullptr, rows, cols, kEps);
      require_close(f16.y, want_b.y, 4e-3, 2e-3);
    }
  }
}

TEST_CASE("layer_norm variance survives a large mean in f32", "[kernels]") {
  // x = 10000 + small noise: E[x^2] - E[x]^2 would lose every digit of the
  // variance (1e8 vs ~0.3); the two-pass formula keeps it.
  const int64_t rows = 2, cols = 256;
  std::vector<double> noise = random_values(rows * cols, -1, 1, 24), x(noise.size());
  for (size_t k = 0; k < x.size(); ++k) x[k] = 10000.0 + noise[k];
  std::vector<double> xf = to_double(cast_to<float>(x));  // the values the kernel actually sees
  Forward want = reference_forward(xf, nullptr, nullptr, rows, cols, kEps);
  Forward got = run_forward<float, float>(DType::f32, xf, nullptr, nullptr, rows, cols, kEps);
  require_close(got.rstd, want.rstd, 0, 1e-3);
  require_close(got.y, want.y, 2e-3, 1e-3);
}

TEST_CASE("layer_norm backward matches finite differences in f64", "[kernels][gradcheck]") {
  const int64_t rows = 3, cols = 6;
  std::vector<double> x = random_values(rows * cols, -2, 2, 25);
  std::vector<double> w = random_values(cols, 0.5, 1.5, 26), b = random_values(cols, -1, 1, 27);
  std::vector<double> gy = random_values(rows * cols, -1, 1, 28);  // L = sum(gy * y)
  for (bool affine : {true, false}) {
    INFO("affine " << affine);
    const std::vector<double>* wp = affine ? &w : nullptr;
    std::vector<double> bias_used(static_cast<size_t>(cols), 0.25);  // the bias run_backward passes
    Grads g = run_backward<double, double>(DType::f64, x, wp, affine, rows, cols, kEps, gy);
    auto loss = [&](const std::vector<double>& xs, const std::vector<double>* ws,
                    const std::vector<double>* bs) {
      std::vector<double> y = run_forward<double, double>(DType::f64, xs, ws, bs, rows, cols, kEps).y;
      double total = 0;
      for (size_t k = 0; k < y.size(); ++k) total += gy[k] * y[k];
      return total;
    };
    const double h = 1e-6;
    const std::vector<double>* bp = affine ? &bias_used : nullptr;
    for (size_t k = 0; k < x.size(); ++k) {
      std::vector<double> plus = x, minus = x;
      plus[k] += h;
      minus[k] -= h;
      INFO("x element " << k);
      REQUIRE(g.x[k] ==
              Approx((loss(plus, wp, bp) - loss(minus, wp, bp)) / (2 * h)).margin(1e-8).epsilon(1e-6));
    }
    if (!affine) continue;
    for (int64_t c = 0; c < cols; ++c) {
      std::vector<double> wplus = w, wminus = w, bplus = bias_used, bminus = bias_used;
      wplus[c] += h;
      wminus[c] -= h;
      bplus[c] += h;
      bminus[c] -= h;
      INFO("column " << c);
      REQUIRE(g.weight[c] ==
              Approx((loss(x, &wplus, bp) - loss(x, &wminus, bp)) / (2 * h)).margin(1e-8).epsilon(1e-6));
      REQUIRE(g.bias[c] ==
              Approx((loss(x, wp, &bplus) - loss(x, wp, &bminus)) / (2 * h)).margin(1e-8).epsilon(1e-6));
    }
  }
}

TEST_CASE("layer_norm backward in f32 and bf16 tracks f64", "[kernels]") {
  // More than one column block for grad_weight / grad_bias, and enough rows to split across threads.
  const int64_t rows = 300, cols = 150;
  std::vector<double> x = random_values(rows * cols, -2, 2, 29), w = random_values(cols, 0.5, 1.5, 30);
  std::vector<double> gy = random_values(rows * cols, -1, 1, 31);
  Grads want = run_backward<double, double>(DType::f64, x, &w, true, rows, cols, kEps, gy);
  Grads f32 = run_backward<float, float>(DType::f32, x, &w, true, rows, cols, kEps, gy);
  require_close(f32.x, want.x, 1e-5, 1e-4);
  require_close(f32.weight, want.weight, 1e-5, 1e-4);
  require_close(f32.bias, want.bias, 1e-5, 1e-4);
  std::vector<double> xb = to_double(cast_to<mg::bf16>(x)), wb = to_double(cast_to<mg::bf16>(w)),
                      gb = to_double(cast_to<mg::bf16>(gy));
  Grads want_b = run_backward<double, double>(DType::f64, xb, &wb, true, rows, cols, kEps, gb);
  Grads b16 = run_backward<mg::bf16, float>(DType::bf16, xb, &wb, true, rows, cols, kEps, gb);
  require_close(b16.x, want_b.x, 2e-2, 1e-2);
  require_close(b16.weight, want_b.weight, 2e-2, 1e-2);
  require_close(b16.bias, want_b.bias, 2e-2, 1e-2);
  // Only one of the parameter grads requested: the other pointer stays untouched (nullptr).
  Grads no_bias = run_backward<double, double>(DType::f64, x, &w, false, rows, cols, kEps, gy);
  require_close(no_bias.weight, want.weight, 1e-12, 1e-12);
}
