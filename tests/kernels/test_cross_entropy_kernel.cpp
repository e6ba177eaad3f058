// Tests for kernels/cpu/cross_entropy: per-row losses against a naive double
// reference (log_softmax then pick, PyTorch's label-smoothing formula), the
// backward against central finite differences in f64, ignore_index handling,
// and the error raised for an out-of-range target.
#include <catch2/catch.hpp>
#include <cmath>
#include <iomanip>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/cross_entropy.h"
#include "tests/kernels/kernel_test_values.h"

using mg::DType;

using namespace mg::kernel_test;

namespace {

std::vector<double> random_values(int64_t n, double scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-scale, scale);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// The textbook path: full log_softmax in double, then combine per PyTorch's docs.
std::vector<double> reference_losses(const std::vector<double>& x, const std::vector<int64_t>& targets,
                                     int64_t classes, int64_t ignore_index, double eps) {
  const int64_t rows = static_cast<int64_t>(targets.size());
  std::vector<double> losses(static_cast<size_t>(rows), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    if (targets[i] == ignore_index) continue;
    double max = -INFINITY, sum = 0;
    for (int64_t c = 0; c < classes; ++c) max = std::max(max, x[i * classes + c]);
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(x[i * classes + c] - max);
    std::vector<double> logp(static_cast<size_t>(classes));
    double mean_neg_logp = 0;
    for (int64_t c = 0; c < classes; ++c) {
      logp[c] = x[i * classes + c] - max - std::log(sum);
      mean_neg_logp -= logp[c] / static_cast<double>(classes);
    }
    losses[i] = (1 - eps) * -logp[targets[i]] + eps * mean_neg_logp;
  }
  return losses;
}

struct Result {
  std::vector<double> losses;
  int64_t counted;
};

template <class T>
Result run_forward(DType dtype, const std::vector<double>& x, const std::vector<int64_t>& targets,
                   int64_t classes, int64_t ignore_index, double eps) {
  std::vector<T> logits = cast_to<T>(x), losses(targets.size());
  int64_t counted = mg::kernels::cpu::cross_entropy_forward(dtype, logits.data(), targets.data(),
                                                            static_cast<int64_t>(targets.size()), classes,
                                                            ignore_index, eps, losses.data());
  return {to_double(losses), counted};
}

template <class T>
std::vector<double> run_backward(DType dtype, const std::vector<double>& x,
                                 const std::vector<int64_t>& targets, int64_t classes, int64_t ignore_index,
                                 double eps, const std::vector<double>& grad_losses) {
  std::vector<T> logits = cast_to<T>(x), gl = cast_to<T>(grad_losses), gx(x.size());
  mg::kernels::cpu::cross_entropy_backward(dtype, logits.data(), targets.data(),
                                           static_cast<int64_t>(targets.size()), classes, ignore_index, eps,
                                           gl.data(), gx.data());
  return to_double(gx);
}

constexpr int64_t kIgnore = -100;
const std::vector<int64_t> kTargets = {3, 0, kIgnore, 6, 6, 1};  // 6 rows, one ignored
constexpr int64_t kClasses = 7;

}  // namespace

TEST_CASE("cross_entropy forward matches the double reference", "[kernels]") {
  std::vector<double> x = random_values(static_cast<int64_t>(kTargets.size()) * kClasses, 4.0, 11);
  for (double eps : {0.0, 0.1, 0.5}) {
    INFO("label_smoothing " << eps);
    std::vector<double> want = reference_losses(x, kTargets, kClasses, kIgnore, eps);
    Result f64 = run_forward<double>(DType::f64, x, kTargets, kClasses, kIgnore, eps);
    CHECK(f64.counted == 5);
    CHECK(f64.losses[2] == 0.0);
    require_close(f64.losses, want, 1e-13, 1e-12);
    Result f32 = run_forward<float>(DType::f32, x, kTargets, kClasses, kIgnore, eps);
    CHECK(f32.counted == 5);
    require_close(f32.losses, want, 1e-6, 1e-5);
    std::vector<double> xb = to_double(cast_to<mg::bf16>(x));
    Result b16 = run_forward<mg::bf16>(DType::bf16, xb, kTargets, kClasses, kIgnore, eps);
    require_close(b16.losses, reference_losses(xb, kTargets, kClasses, kIgnore, eps), 1e-2, 1e-2);
  }
}

TEST_CASE("cross_entropy forward stays finite for huge logits", "[kernels]") {
  std::vector<double> x = {1000.0, 999.0, -1000.0, -1000.0, 0.0, 1000.0};
  std::vector<int64_t> targets = {1, 0};
  Result r = run_forward<float>(DType::f32, x, targets, 3, kIgnore, 0.0);
  CHECK(r.losses[0] == Approx(1.0 + std::log1p(std::exp(-1.0))));
  CHECK(r.losses[1] == Approx(2000.0));
}

TEST_CASE("cross_entropy ignore_index may name a real class", "[kernels]") {
  std::vector<double> x = random_values(3 * 4, 1.0, 12);
  // ignore_index = 2 is a real class: rows labelled 2 are skipped, the rest count.
  Result r = run_forward<double>(DType::f64, x, {2, 1, 2}, 4, 2, 0.0);
  CHECK(r.counted == 1);
  CHECK(r.losses[0] == 0.0);
  CHECK(r.losses[2] == 0.0);
  CHECK(r.losses[1] > 0.0);
}

TEST_CASE("cross_entropy backward matches finite differences in f64", "[kernels][gradcheck]") {
  std::vector<double> x = random_values(static_cast<int64_t>(kTargets.size()) * kClasses, 2.0, 13);
  std::vector<double> gl =
      random_values(static_cast<int64_t>(kTargets.size()), 1.0, 14);  // L = sum(gl * loss)
  for (double eps : {0.0, 0.2}) {
    INFO("label_smoothing " << eps);
    std::vector<double> analytic = run_backward<double>(DType::f64, x, kTargets, kClasses, kIgnore, eps, gl);
    auto loss = [&](const std::vector<double>& xs) {
      std::vector<double> l = run_forward<double>(DType::f64, xs, kTargets, kClasses, kIgnore, eps).losses;
      double total = 0;
      for (size_t i = 0; i < l.size(); ++i) total += gl[i] * l[i];
      return total;
    };
    const double h = 1e-6;
    for (size_t k = 0; k < x.size(); ++k) {
      std::vector<double> plus = x, minus = x;
      plus[k] += h;
      minus[k] -= h;
      INFO("element " << k);
      REQUIRE(analytic[k] == Approx((loss(plus) - loss(minus)) / (2 * h)).margin(1e-8).epsilon(1e-6));
    }
    for (int64_t c = 0; c < kClasses; ++c) CHECK(analytic[2 * kClasses + c] == 0.0);  // the ignored row
  }
}

TEST_CASE("cross_entropy backward in f32 and bf16 tracks f64", "[kernels]") {
  std::vector<double> x = random_values(static_cast<int64_t>(kTargets.size()) * kClasses, 3.0, 15);
  std::vector<double> gl = random_values(static_cast<int64_t>(kTargets.size()), 1.0, 16);
  for (double eps : {0.0, 0.1}) {
    std::vector<double> want = run_backward<double>(DType::f64, x, kTargets, kClasses, kIgnore, eps, gl);
    require_close(run_backward<float>(DType::f32, x, kTargets, kClasses, kIgnore, eps, gl), want, 1e-6, 1e-5);
    std::vector<double> xb = to_double(cast_to<mg::bf16>(x)), gb = to_double(cast_to<mg::bf16>(gl));
    require_close(run_backward<mg::bf16>(DType::bf16, xb, kTargets, kClasses, kIgnore, eps, gb),
                  run_backward<double>(DType::f64, xb, kTargets, kClasses, kIgnore, eps, gb), 1e-2, 1e-2);
  }
}

TEST_CASE("cross_entropy on a batch large enough to split across threads", "[kernels]") {
  const int64_t rows = 500, classes = 100;
  std::vector<double> x = random_values(rows * classes, 5.0, 17), gl = random_values(rows, 1.0, 18);
  std::vector<int64_t> targets(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) targets[i] = i % 10 == 0 ? kIgnore : (i * 37) % classes;
  Result r = run_forward<float>(DType::f32, x, targets, classes, kIgnore, 0.1);
  CHECK(r.counted == rows - rows / 10);
  require_close(r.losses, reference_losses(x, targets, classes, kIgnore, 0.1), 1e-5, 1e-5);
  require_close(run_backward<float>(DType::f32, x, targets, classes, kIgnore, 0.1, gl),
                run_backward<double>(DType::f64, x, targets, classes, kIgnore, 0.1, gl), 1e-6, 1e-5);
}

TEST_CASE("cross_entropy rejects out-of-range targets, naming row and value", "[kernels]") {
  std::vector<float> logits(3 * 4, 0.0f), losses(3, -1.0f), grads(3 * 4, -1.0f), gl(3, 1.0f);
  std::vector<int64_t> too_big = {1, 2, 7};
  REQUIRE_THROWS_AS(mg::kernels::cpu::cross_entropy_forward(DType::f32, logits.data(), too_big.data(), 3, 4,
                                                            kIgnore, 0.0, losses.data()),
                    mg::Error);
  REQUIRE_THROWS_WITH(mg::kernels::cpu::cross_entropy_forward(DType::f32, logits.data(), too_big.data(), 3, 4,
                                                              kIgnore, 0.0, losses.data()),
                      Catch::Contains("target 7") && Catch::Contains("row 2"));
  for (float l : losses) CHECK(l == -1.0f);  // nothing written

  std::vector<int64_t> negative = {-3, 0, 0};  // negative but not the ignore_index
  REQUIRE_THROWS_WITH(mg::kernels::cpu::cross_entropy_backward(DType::f32, logits.data(), negative.data(), 3,
                                                               4, kIgnore, 0.0, gl.data(), grads.data()),
                      Catch::Contains("target -3") && Catch::Contains("row 0"));
  for (float g : grads) CHECK(g == -1.0f);

  std::vector<int64_t> ok = {0, 1, 2};
  REQUIRE_THROWS_WITH(mg::kernels::cpu::cross_entropy_forward(DType::f32, logits.data(), ok.data(), 3, 4,
                                                              kIgnore, 1.0, losses.data()),
                      Catch::Contains("label_smoothing"));
}
