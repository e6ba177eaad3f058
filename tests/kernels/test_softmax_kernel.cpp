// Tests for kernels/cpu/softmax: forward against a naive double-precision
// reference, backward against central finite differences of the forward (f64),
// and the reduced-precision dtypes against f64 with dtype-sized tolerances.
#include <catch2/catch.hpp>
#include <cmath>
#include <iomanip>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/softmax.h"
#include "tests/kernels/kernel_test_values.h"

using mg::DType;
using mg::kernels::SoftmaxShape;

using namespace mg::kernel_test;

namespace {

std::vector<double> random_values(int64_t n, double scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

int64_t numel(const SoftmaxShape& s) { return s.outer * s.dim * s.inner; }

// Straight from the definition, one (outer, inner) column at a time, in double.
std::vector<double> reference_softmax(const SoftmaxShape& s, const std::vector<double>& x, bool log) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      auto at = [&](int64_t d) { return static_cast<size_t>((o * s.dim + d) * s.inner + i); };
      double max = -INFINITY;
      for (int64_t d = 0; d < s.dim; ++d) max = std::max(max, x[at(d)]);
      double sum = 0;
      for (int64_t d = 0; d < s.dim; ++d) sum += std::exp(x[at(d)] - max);
      for (int64_t d = 0; d < s.dim; ++d)
        y[at(d)] = log ? x[at(d)] - max - std::log(sum) : std::exp(x[at(d)] - max) / sum;
    }
  return y;
}

template <class T>
std::vector<double> run_forward(DType dtype, const SoftmaxShape& s, const std::vector<double>& x, bool log) {
  std::vector<T> in = cast_to<T>(x), out(x.size());
  mg::kernels::cpu::softmax_forward(dtype, s, in.data(), out.data(), log);
  return to_double(out);
}

template <class T>
std::vector<double> run_backward(DType dtype, const SoftmaxShape& s, const std::vector<double>& x,
                                 const std::vector<double>& gy, bool log) {
  std::vector<T> in = cast_to<T>(x), out(x.size()), g = cast_to<T>(gy), gx(x.size());
  mg::kernels::cpu::softmax_forward(dtype, s, in.data(), out.data(), log);
  mg::kernels::cpu::softmax_backward(dtype, s, g.data(), out.data(), gx.data(), log);
  return to_double(gx);
}

const std::vector<SoftmaxShape> kSoftmaxShapes = {
    {3, 7, 1}, {1, 1, 1}, {2, 5, 3}, {2, 3, 70}, {1, 4, 130}, {5, 33, 1},
};

}  // namespace

TEST_CASE("softmax forward matches the double reference", "[kernels]") {
  for (bool log : {false, true}) {
    for (const SoftmaxShape& s : kSoftmaxShapes) {
      INFO("log " << log << ", shape [" << s.outer << ", " << s.dim << ", " << s.inner << "]");
      std::vector<double> x = random_values(numel(s), 5.0, 1);
      std::vector<double> want = reference_softmax(s, x, log);
      require_close(run_forward<double>(DType::f64, s, x, log), want, 1e-14, 1e-12);
      require_close(run_forward<float>(DType::f32, s, x, log), want, 1e-6, 1e-5);
      // Halves: the input itself is rounded, so compare with the reference of the rounded input.
      std::vector<double> xb = to_double(cast_to<mg::bf16>(x));
      require_close(run_forward<mg::bf16>(DType::bf16, s, xb, log), reference_softmax(s, xb, log), 1e-3,
                    1e-2);
      std::vector<double> xh = to_double(cast_to<mg::f16>(x));
      require_close(run_forward<mg::f16>(DType::f16, s, xh, log), reference_softmax(s, xh, log), 1e-3, 2e-3);
    }
  }
}

TEST_CASE("softmax forward is stable for huge logits", "[kernels]") {
  SoftmaxShape s{1, 3, 1};
  std::vector<double> x = {1000.0, 999.0, -1000.0};
  std::vector<double> y = run_forward<float>(DType::f32, s, x, false);
  std::vector<double> ly = run_forward<float>(DType::f32, s, x, true);
  const double e = std::exp(-1.0);
  CHECK(y[0] == Approx(1 / (1 + e)));
  CHECK(y[1] == Approx(e / (1 + e)));
  CHECK(y[2] == 0.0);
  CHECK(ly[0] == Approx(-std::log1p(e)));
  CHECK(ly[2] == Approx(-2000.0 - std::log1p(e)));
  for (double v : y) CHECK(std::isfinite(v));
}

TEST_CASE("softmax rows sum to one along the chosen axis", "[kernels]") {
  SoftmaxShape s{3, 6, 5};
  std::vector<double> y = run_forward<float>(DType::f32, s, random_values(numel(s), 3.0, 2), false);
  for (int64_t o = 0; o < s.outer; ++o)
    for (int64_t i = 0; i < s.inner; ++i) {
      double sum = 0;
      for (int64_t d = 0; d < s.dim; ++d) sum += y[static_cast<size_t>((o * s.dim + d) * s.inner + i)];
      CHECK(sum == Approx(1.0).epsilon(1e-6));
    }
}

TEST_CASE("softmax on shapes large enough to split across threads", "[kernels]") {
  for (const SoftmaxShape& s :
       {SoftmaxShape{400, 100, 1}, SoftmaxShape{8, 50, 100}, SoftmaxShape{1, 40, 1000}}) {
    for (bool log : {false, true}) {
      INFO("log " << log << ", shape [" << s.outer << ", " << s.dim << ", " << s.inner << "]");
      std::vector<double> x = random_values(numel(s), 5.0, 7), gy = random_values(numel(s), 1.0, 8);
      require_close(run_forward<float>(DType::f32, s, x, log), reference_softmax(s, x, log), 1e-6, 1e-5);
      require_close(run_backward<float>(DType::f32, s, x, gy, log),
                    run_backward<double>(DType::f64, s, x, gy, log), 1e-6, 1e-4);
    }
  }
}

TEST_CASE("softmax backward matches finite differences in f64", "[kernels][gradcheck]") {
  for (bool log : {false, true}) {
    for (const SoftmaxShape& s : {SoftmaxShape{2, 5, 1}, SoftmaxShape{2, 4, 3}, SoftmaxShape{1, 3, 67}}) {
      INFO("log " << log << ", shape [" << s.outer << ", " << s.dim << ", " << s.inner << "]");
      std::vector<double> x = random_values(numel(s), 2.0, 3);
      std::vector<double> gy = random_values(numel(s), 1.0, 4);  // L = sum(gy * y)
      std::vector<double> analytic = run_backward<double>(DType::f64, s, x, gy, log);
      auto loss = [&](const std::vector<double>& xs) {
        std::vector<double> y = run_forward<double>(DType::f64, s, xs, log);
        double l = 0;
        for (size_t k = 0; k < y.size(); ++k) l += gy[k] * y[k];
        return l;
      };
      const double h = 1e-6;
      for (size_t k = 0; k < x.size(); ++k) {
        std::vector<double> plus = x, minus = x;
        plus[k] += h;
        minus[k] -= h;
        const double numeric = (loss(plus) - loss(minus)) / (2 * h);
        INFO("element " << k);
        REQUIRE(analytic[k] == Approx(numeric).margin(1e-8).epsilon(1e-6));
      }
    }
  }
}

TEST_CASE("softmax backward in f32 and bf16 tracks f64", "[kernels]") {
  for (bool log : {false, true}) {
    for (const SoftmaxShape& s : kSoftmaxShapes) {
      INFO("log " << log << ", shape [" << s.outer << ", " << s.dim << ", " << s.inner << "]");
      std::vector<double> x = random_values(numel(s), 3.0, 5), gy = random_values(numel(s), 1.0, 6);
      require_close(run_backward<float>(DType::f32, s, x, gy, log),
                    run_backward<double>(DType::f64, s, x, gy, log), 1e-6, 1e-5);
      std::vector<double> xb = to_double(cast_to<mg::bf16>(x)), gb = to_double(cast_to<mg::bf16>(gy));
      // bf16 also rounds the saved output y (8 bits), which feeds the gradient.
      require_close(run_backward<mg::bf16>(DType::bf16, s, xb, gb, log),
                    run_backward<double>(DType::f64, s, xb, gb, log), 3e-2, 3e-2);
    }
  }
}

TEST_CASE("softmax rejects non-floating dtypes", "[kernels]") {
  std::vector<int32_t> x(4), y(4);
  REQUIRE_THROWS_WITH(mg::kernels::cpu::softmax_forward(DType::i32, {1, 4, 1}, x.data(), y.data(), false),
                      Catch::Contains("i32"));
}
