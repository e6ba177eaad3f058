// Tests for kernels/cpu/dropout: the keep rate on 1M elements, the mask as a
// pure function of (seed, call_offset, element) via philox_uniform, scaling,
// the p == 0 / p == 1 edges, and a backward that applies the saved mask.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/dtype.h"
#include "base/philox.h"
#include "kernels/cpu/dropout.h"

using mg::DType;

namespace {

struct Dropped {
  std::vector<float> y;
  std::vector<bool> mask;  // copied out of the kernel's bool bytes
};

Dropped run_forward(const std::vector<float>& x, double p, uint64_t seed, uint64_t offset) {
  std::vector<float> y(x.size(), -1.0f);
  std::unique_ptr<bool[]> mask(new bool[x.size()]);
  mg::kernels::cpu::dropout_forward(DType::f32, x.data(), y.data(), mask.get(),
                                    static_cast<int64_t>(x.size()), p, seed, offset);
  return {y, std::vector<bool>(mask.get(), mask.get() + x.size())};
}

}  // namespace

TEST_CASE("dropout keeps a 1-p fraction of 1M elements", "[kernels]") {
  const int64_t n = 1 << 20;
  std::vector<float> x(static_cast<size_t>(n), 2.0f);
  for (double p : {0.1, 0.5, 0.9}) {
    INFO("p " << p);
    Dropped d = run_forward(x, p, 1234, 0);
    int64_t kept = 0, wrong = 0;
    const float scaled = static_cast<float>(2.0 / (1.0 - p));
    for (int64_t i = 0; i < n; ++i) {
      kept += d.mask[i];
      wrong += d.y[i] != (d.mask[i] ? scaled : 0.0f);
    }
    CHECK(wrong == 0);
    const double sigma = std::sqrt(p * (1 - p) / static_cast<double>(n));
    CHECK(std::abs(static_cast<double>(kept) / static_cast<double>(n) - (1 - p)) <= 3 * sigma);
  }
}

TEST_CASE("dropout mask is a pure function of seed, offset and element", "[kernels]") {
  const int64_t n = 100000;
  std::vector<float> x(static_cast<size_t>(n), 1.0f);
  const double p = 0.5;
  Dropped a = run_forward(x, p, 42, 7), again = run_forward(x, p, 42, 7);
  Dropped other_offset = run_forward(x, p, 42, 8), other_seed = run_forward(x, p, 43, 7);
  CHECK(a.mask == again.mask);
  CHECK(a.y == again.y);
  int64_t differ_offset = 0, differ_seed = 0, mismatches = 0;
  for (int64_t i = 0; i < n; ++i) {
    differ_offset += a.mask[i] != other_offset.mask[i];
    differ_seed += a.mask[i] != other_seed.mask[i];
    // Exactly what any other implementation (e.g. the CUDA kernel) computes per element.
    mismatches +=
        a.mask[i] != (mg::philox_dropout_uniform(42, static_cast<uint64_t>(i), 7) >= static_cast<float>(p));
    // ... which is word i % 4 of Philox block i / 4: all four words used.
    mismatches += mg::philox_dropout_uniform(42, static_cast<uint64_t>(i), 7) !=
                  mg::philox_word_uniform(mg::philox4x32_10(42, static_cast<uint64_t>(i) / 4, 7).word[i % 4]);
  }
  CHECK(mismatches == 0);
  // Independent masks disagree on about half the elements.
  CHECK(differ_offset > n / 2 - n / 20);
  CHECK(differ_offset < n / 2 + n / 20);
  CHECK(differ_seed > n / 2 - n / 20);
}

TEST_CASE("dropout handles p == 0 and p == 1", "[kernels]") {
  std::vector<float> x = {1.0f, -2.0f, 3.5f, 0.25f};
  Dropped none = run_forward(x, 0.0, 9, 0);
  CHECK(none.y == x);
  for (bool m : none.mask) CHECK(m);
  Dropped all = run_forward(x, 1.0, 9, 0);
  for (size_t i = 0; i < x.size(); ++i) {
    CHECK(all.y[i] == 0.0f);  // 0, not NaN from 0 * inf
    CHECK_FALSE(all.mask[i]);
  }
  std::vector<float> gy = {1, 1, 1, 1}, gx(4, -1.0f);
  std::unique_ptr<bool[]> mask(new bool[4]{false, false, false, false});
  mg::kernels::cpu::dropout_backward(DType::f32, gy.data(), mask.get(), gx.data(), 4, 1.0);
  for (float g : gx) CHECK(g == 0.0f);
  REQUIRE_THROWS_WITH(run_forward(x, 1.5, 9, 0), Catch::Contains("1.5"));
  REQUIRE_THROWS_WITH(run_forward(x, -0.1, 9, 0), Catch::Contains("-0.1"));
}

TEST_CASE("dropout backward applies the saved mask and scale", "[kernels][gradcheck]") {
  const int64_t n = 64;
  const double p = 0.3;
  std::vector<double> x(static_cast<size_t>(n)), y(x.size()), gy(x.size()), gx(x.size());
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.37 * static_cast<double>(i));
    gy[i] = std::cos(0.11 * static_cast<double>(i));
  }
  std::unique_ptr<bool[]> mask(new bool[n]);
  mg::kernels::cpu::dropout_forward(DType::f64, x.data(), y.data(), mask.get(), n, p, 5, 3);
  mg::kernels::cpu::dropout_backward(DType::f64, gy.data(), mask.get(), gx.data(), n, p);
  // Central differences of L = sum(gy * dropout(x)) with the same (seed, offset):
  // the mask is fixed, so this is the exact derivative up to rounding.
  auto loss = [&](const std::vector<double>& xs) {
    std::vector<double> out(xs.size());
    std::unique_ptr<bool[]> m(new bool[n]);
    mg::kernels::cpu::dropout_forward(DType::f64, xs.data(), out.data(), m.get(), n, p, 5, 3);
    double total = 0;
    for (int64_t i = 0; i < n; ++i) total += gy[i] * out[i];
    return total;
  };
  const double h = 1e-6;
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::vector<double> plus = x, minus = x;
    plus[i] += h;
    minus[i] -= h;
    INFO("element " << i);
    REQUIRE(gx[i] == Approx((loss(plus) - loss(minus)) / (2 * h)).margin(1e-8));
    REQUIRE(gx[i] == Approx(mask[i] ? gy[i] / (1 - p) : 0.0).epsilon(1e-15));  // scale applied as a multiply
    kept += mask[i];
  }
  CHECK(kept > 0);
  CHECK(kept < n);

  // bf16: the same mask (it depends only on (seed, offset, i)), values rounded.
  std::vector<mg::bf16> xb, yb(static_cast<size_t>(n)), gyb, gxb(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    xb.push_back(mg::bf16(static_cast<float>(x[i])));
    gyb.push_back(mg::bf16(static_cast<float>(gy[i])));
  }
  std::unique_ptr<bool[]> mask_b(new bool[n]);
  mg::kernels::cpu::dropout_forward(DType::bf16, xb.data(), yb.data(), mask_b.get(), n, p, 5, 3);
  mg::kernels::cpu::dropout_backward(DType::bf16, gyb.data(), mask_b.get(), gxb.data(), n, p);
  for (int64_t i = 0; i < n; ++i) {
    REQUIRE(mask_b[i] == mask[i]);
    CHECK(static_cast<float>(yb[i]) == Approx(mask[i] ? x[i] / (1 - p) : 0.0).margin(1e-2).epsilon(1e-2));
    CHECK(static_cast<float>(gxb[i]) == Approx(gx[i]).margin(1e-2).epsilon(1e-2));
  }
}
