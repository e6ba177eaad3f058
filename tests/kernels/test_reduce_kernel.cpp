// Tests for kernels/cpu/reduce: every op against naive double loops over many
// [outer, reduce, inner] shapes (1s, 0s, sizes that cross the kernel's block,
// tile and chunk boundaries), var with correction 0 and 1, argmax/argmin ties
// and NaNs, integer/bool/half dtypes, and the accuracy of 16M-element f32 sums.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/reduce.h"

using mg::bf16;
using mg::DType;
using mg::f16;
using mg::kernels::ReduceOp;
using mg::kernels::ReduceShape;
using mg::kernels::cpu::reduce;

namespace {

std::vector<double> uniform(int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

// Naive reference in double: out[o * inner + i] = op over r of x[(o * reduce + r) * inner + i].
std::vector<double> reference(ReduceOp op, const ReduceShape& s, const std::vector<double>& x,
                              int64_t correction) {
  std::vector<double> out(static_cast<size_t>(s.outer * s.inner));
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      auto at = [&](int64_t r) { return x[(o * s.reduce + r) * s.inner + i]; };
      double sum = 0, prod = 1, best = at(0), mean, ss = 0;
      int64_t arg = 0;
      for (int64_t r = 0; r < s.reduce; ++r) {
        sum += at(r);
        prod *= at(r);
      }
      mean = sum / s.reduce;
      for (int64_t r = 0; r < s.reduce; ++r) ss += (at(r) - mean) * (at(r) - mean);
      for (int64_t r = 1; r < s.reduce; ++r) {
        const bool better = op == ReduceOp::Argmin || op == ReduceOp::Min ? at(r) < best : at(r) > best;
        if (better) {
          best = at(r);
          arg = r;
        }
      }
      double v = 0;
      switch (op) {
        case ReduceOp::Sum: v = sum; break;
        case ReduceOp::Mean: v = mean; break;
        case ReduceOp::Prod: v = prod; break;
        case ReduceOp::Max:
        case ReduceOp::Min: v = best; break;
        case ReduceOp::Argmax:
        case ReduceOp::Argmin: v = static_cast<double>(arg); break;
        case ReduceOp::Var: v = ss / std::max<double>(0, static_cast<double>(s.reduce - correction)); break;
      }
      out[o * s.inner + i] = v;
    }
  }
  return out;
}

const std::vector<ReduceShape> kShapes = {
    {1, 1, 1},   {3, 1, 4}, {1, 7, 1},     {2, 5, 3},    {4, 1000, 1}, {1, 1000, 2},   {2, 3, 1500},
    {1, 300, 5}, {5, 1, 1}, {1, 10000, 1}, {3, 4099, 1}, {7, 17, 33},  {1, 600, 1030}, {2, 2, 1},
};

const std::vector<ReduceOp> kAllOps = {ReduceOp::Sum,    ReduceOp::Mean,   ReduceOp::Max, ReduceOp::Min,
                                       ReduceOp::Argmax, ReduceOp::Argmin, ReduceOp::Var, ReduceOp::Prod};

// Runs `op` on input values `xd` stored as T, output stored as Out, and compares
// with the reference computed from the values actually stored.
template <class T, class Out>
void check_op(ReduceOp op, const ReduceShape& s, const std::vector<double>& xd, double rel,
              int64_t correction = 1) {
  std::vector<T> x;
  std::vector<double> stored;
  for (double v : xd) {
    if constexpr (std::is_same<T, double>::value) {
      x.push_back(v);
    } else {
      x.push_back(static_cast<T>(static_cast<float>(v)));
    }
    stored.push_back(static_cast<double>(static_cast<mg::acc_t<T>>(x.back())));
  }
  const auto want = reference(op, s, stored, correction);
  std::unique_ptr<Out[]> out(new Out[want.size() + 1]());
  reduce(op, s, x.data(), mg::dtype_of<T>(), out.get(), mg::dtype_of<Out>(), correction);
  for (size_t k = 0; k < want.size(); ++k) {
    const double got = static_cast<double>(static_cast<mg::acc_t<Out>>(out[k]));
    INFO(mg::kernels::reduce_op_name(op)
         << " " << mg::dtype_of<T>() << " shape [" << s.outer << ", " << s.reduce << ", " << s.inner << "] k "
         << k << " got " << got << " want " << want[k]);
    if (std::isnan(want[k])) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(std::abs(got - want[k]) <= rel * std::abs(want[k]) + 1e-300);
    }
  }
}

}  // namespace

TEST_CASE("reductions match naive double loops (f64)", "[kernels]") {
  for (const auto& s : kShapes) {
    // Values near 1 keep products finite for the longest rows.
    const auto x = uniform(s.outer * s.reduce * s.inner, 0.999, 1.001, 17);
    for (ReduceOp op : kAllOps) {
      if (op == ReduceOp::Argmax || op == ReduceOp::Argmin) {
        check_op<double, int64_t>(op, s, x, 0);
      } else {
        check_op<double, double>(op, s, x, 1e-12);
      }
    }
    check_op<double, double>(ReduceOp::Var, s, x, 1e-12, 0);
  }
}

TEST_CASE("reductions match naive double loops (f32)", "[kernels]") {
  for (const auto& s : kShapes) {
    // Positive values: no cancellation, so the relative error of the result is meaningful.
    const auto x = uniform(s.outer * s.reduce * s.inner, 0.5, 2, 23);
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min}) {
      check_op<float, float>(op, s, x, op == ReduceOp::Max || op == ReduceOp::Min ? 0 : 1e-6);
    }
    check_op<float, int64_t>(ReduceOp::Argmax, s, x, 0);
    check_op<float, int64_t>(ReduceOp::Argmin, s, x, 0);
    const auto near1 = uniform(s.outer * s.reduce * s.inner, 0.999, 1.001, 29);
    check_op<float, float>(ReduceOp::Prod, s, near1, 1e-5);
    if (s.reduce > 1) {
      check_op<float, float>(ReduceOp::Var, s, x, 1e-5, 1);
      check_op<float, float>(ReduceOp::Var, s, x, 1e-5, 0);
    }
  }
}

TEST_CASE("var: correction, tiny rows and a large mean", "[kernels]") {
  std::vector<double> x = {1, 2, 3, 4}, out(1);
  reduce(ReduceOp::Var, {1, 4, 1}, x.data(), DType::f64, out.data(), DType::f64, 1);
  CHECK(out[0] == Approx(5.0 / 3.0).epsilon(1e-15));
  reduce(ReduceOp::Var, {1, 4, 1}, x.data(), DType::f64, out.data(), DType::f64, 0);
  CHECK(out[0] == Approx(1.25).epsilon(1e-15));
  reduce(ReduceOp::Var, {1, 1, 1}, x.data(), DType::f64, out.data(), DType::f64, 1);
  CHECK(std::isnan(out[0]));  // 0 / 0, like PyTorch
  reduce(ReduceOp::Var, {1, 1, 1}, x.data(), DType::f64, out.data(), DType::f64, 0);
  CHECK(out[0] == 0.0);
  // f32 values 1e4 + small noise: two-pass var keeps the digits that E[x^2] - E[x]^2 would lose.
  const auto noise = uniform(5000, -1, 1, 5);
  std::vector<float> big;
  std::vector<double> stored;
  for (double n : noise) {
    big.push_back(static_cast<float>(1e4 + n));
    stored.push_back(big.back());
  }
  std::vector<float> row_var(1), col_var(2);
  reduce(ReduceOp::Var, {1, 5000, 1}, big.data(), DType::f32, row_var.data(), DType::f32, 1);
  reduce(ReduceOp::Var, {1, 2500, 2}, big.data(), DType::f32, col_var.data(), DType::f32, 1);
  const auto want_row = reference(ReduceOp::Var, {1, 5000, 1}, stored, 1);
  const auto want_col = reference(ReduceOp::Var, {1, 2500, 2}, stored, 1);
  CHECK(row_var[0] == Approx(want_row[0]).epsilon(1e-3));
  CHECK(col_var[0] == Approx(want_col[0]).epsilon(1e-3));
  CHECK(col_var[1] == Approx(want_col[1]).epsilon(1e-3));
}

TEST_CASE("argmax/argmin: first index on ties, NaN wins", "[kernels]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> ties = {1, 3, 3, 2, 1, 1};
  std::vector<int64_t> idx(2);
  reduce(ReduceOp::Argmax, {1, 6, 1}, ties.data(), DType::f64, idx.data(), DType::i64);
  CHECK(idx[0] == 1);
  reduce(ReduceOp::Argmin, {1, 6, 1}, ties.data(), DType::f64, idx.data(), DType::i64);
  CHECK(idx[0] == 0);
  // the same ties down columns: [3, 2] with columns {1, 3, 1} and {3, 2, 1}
  reduce(ReduceOp::Argmax, {1, 3, 2}, ties.data(), DType::f64, idx.data(), DType::i64);
  CHECK(idx == std::vector<int64_t>{1, 0});
  reduce(ReduceOp::Argmin, {1, 3, 2}, ties.data(), DType::f64, idx.data(), DType::i64);
  CHECK(idx == std::vector<int64_t>{0, 2});

  std::vector<float> with_nan = {1, static_cast<float>(nan), 5, static_cast<float>(nan)};
  reduce(ReduceOp::Argmax, {1, 4, 1}, with_nan.data(), DType::f32, idx.data(), DType::i64);
  CHECK(idx[0] == 1);
  reduce(ReduceOp::Argmin, {1, 4, 1}, with_nan.data(), DType::f32, idx.data(), DType::i64);
  CHECK(idx[0] == 1);
  reduce(ReduceOp::Argmax, {1, 2, 2}, with_nan.data(), DType::f32, idx.data(),
         DType::i64);  // columns {1,5},{nan,nan}
  CHECK(idx == std::vector<int64_t>{1, 0});
  std::vector<float> m(2);
  reduce(ReduceOp::Max, {1, 4, 1}, with_nan.data(), DType::f32, m.data(), DType::f32);
  CHECK(std::isnan(m[0]));
  reduce(ReduceOp::Min, {1, 2, 2}, with_nan.data(), DType::f32, m.data(), DType::f32);
  CHECK(m[0] == 1.0f);
  CHECK(std::isnan(m[1]));
  // NaN in the middle of a long row, on both sides of the lane split
  std::vector<float> long_row(10000, 1.0f);
  long_row[7777] = static_cast<float>(nan);
  reduce(ReduceOp::Max, {1, 10000, 1}, long_row.data(), DType::f32, m.data(), DType::f32);
  CHECK(std::isnan(m[0]));
  reduce(ReduceOp::Sum, {1, 10000, 1}, long_row.data(), DType::f32, m.data(), DType::f32);
  CHECK(std::isnan(m[0]));
}

TEST_CASE("integer, bool and half reductions", "[kernels]") {
  std::vector<int32_t> i = {1, -2, 3, 4, 5, 6};
  std::vector<int64_t> out(3);
  reduce(ReduceOp::Sum, {2, 3, 1}, i.data(), DType::i32, out.data(), DType::i64);
  CHECK(out[0] == 2);
  CHECK(out[1] == 15);
  reduce(ReduceOp::Prod, {1, 6, 1}, i.data(), DType::i32, out.data(), DType::i64);
  CHECK(out[0] == -720);
  std::vector<int32_t> mi(2);
  reduce(ReduceOp::Max, {1, 3, 2}, i.data(), DType::i32, mi.data(), DType::i32);
  CHECK(mi == std::vector<int32_t>{5, 6});
  reduce(ReduceOp::Min, {2, 3, 1}, i.data(), DType::i32, mi.data(), DType::i32);
  CHECK(mi == std::vector<int32_t>{-2, 4});
  reduce(ReduceOp::Argmin, {1, 6, 1}, i.data(), DType::i32, out.data(), DType::i64);
  CHECK(out[0] == 1);

  // int64 sums past 2^31 stay exact
  std::vector<int64_t> big(1000, int64_t{3} << 40);
  reduce(ReduceOp::Sum, {1, 1000, 1}, big.data(), DType::i64, out.data(), DType::i64);
  CHECK(out[0] == 1000 * (int64_t{3} << 40));

  // bool: sum counts trues into i64, max is "any"
  std::unique_ptr<bool[]> b(new bool[5]{true, false, true, true, false});
  reduce(ReduceOp::Sum, {1, 5, 1}, b.get(), DType::boolean, out.data(), DType::i64);
  CHECK(out[0] == 3);
  std::unique_ptr<bool[]> any(new bool[1]());
  reduce(ReduceOp::Max, {1, 5, 1}, b.get(), DType::boolean, any.get(), DType::boolean);
  CHECK(any[0]);

  // halves accumulate in float: 3000 halves of 1.0 sum to 3000, though f16 itself can't count past 2048.
  std::vector<f16> h(3000, f16(1.0f));
  std::vector<f16> hs(1);
  reduce(ReduceOp::Sum, {1, 3000, 1}, h.data(), DType::f16, hs.data(), DType::f16);
  CHECK(static_cast<float>(hs[0]) == 3000.0f);
  std::vector<float> fs(1);
  reduce(ReduceOp::Mean, {1, 3000, 1}, h.data(), DType::f16, fs.data(), DType::f32);
  CHECK(fs[0] == 1.0f);
  std::vector<bf16> bh = {bf16(1.0f), bf16(-4.0f), bf16(2.0f)};
  std::vector<bf16> bm(1);
  reduce(ReduceOp::Min, {1, 3, 1}, bh.data(), DType::bf16, bm.data(), DType::bf16);
  CHECK(static_cast<float>(bm[0]) == -4.0f);
  std::vector<float> bv(1);
  reduce(ReduceOp::Var, {1, 3, 1}, bh.data(), DType::bf16, bv.data(), DType::f32, 0);
  CHECK(bv[0] == Approx(62.0 / 9.0).epsilon(1e-6));  // mean -1/3, squared deviations (16 + 121 + 49) / 9
}

TEST_CASE("empty reductions and empty outputs", "[kernels]") {
  std::vector<float> x(1), out(6, -7.0f);
  reduce(ReduceOp::Sum, {2, 0, 3}, x.data(), DType::f32, out.data(), DType::f32);
  CHECK(out == std::vector<float>(6, 0.0f));
  reduce(ReduceOp::Prod, {2, 0, 3}, x.data(), DType::f32, out.data(), DType::f32);
  CHECK(out == std::vector<float>(6, 1.0f));
  reduce(ReduceOp::Mean, {2, 0, 3}, x.data(), DType::f32, out.data(), DType::f32);
  CHECK(std::isnan(out[5]));
  reduce(ReduceOp::Var, {1, 0, 1}, x.data(), DType::f32, out.data(), DType::f32);
  CHECK(std::isnan(out[0]));
  std::vector<int64_t> idx(6);
  CHECK_THROWS_AS(reduce(ReduceOp::Max, {2, 0, 3}, x.data(), DType::f32, out.data(), DType::f32), mg::Error);
  CHECK_THROWS_AS(reduce(ReduceOp::Argmax, {2, 0, 3}, x.data(), DType::f32, idx.data(), DType::i64),
                  mg::Error);
  CHECK_THROWS_AS(reduce(ReduceOp::Min, {1, 0, 1}, x.data(), DType::f32, out.data(), DType::f32), mg::Error);
  std::vector<int64_t> isum(2, 5);
  reduce(ReduceOp::Sum, {1, 0, 2}, x.data(), DType::i32, isum.data(), DType::i64);
  CHECK(isum == std::vector<int64_t>{0, 0});
  // no outputs at all: nothing to do, nothing read
  reduce(ReduceOp::Max, {0, 5, 3}, nullptr, DType::f32, nullptr, DType::f32);
  reduce(ReduceOp::Sum, {4, 5, 0}, nullptr, DType::f32, nullptr, DType::f32);
  // dtype rules
  CHECK_THROWS_AS(reduce(ReduceOp::Mean, {1, 1, 1}, isum.data(), DType::i64, out.data(), DType::f32),
                  mg::Error);
  CHECK_THROWS_AS(reduce(ReduceOp::Max, {1, 1, 1}, x.data(), DType::f32, out.data(), DType::f64), mg::Error);
  CHECK_THROWS_AS(reduce(ReduceOp::Argmax, {1, 1, 1}, x.data(), DType::f32, out.data(), DType::f32),
                  mg::Error);
}

TEST_CASE("sum of 16M f32 ones is exact, and of random values accurate", "[kernels]") {
  const int64_t n = int64_t{1} << 24;
  std::vector<float> ones(n, 1.0f);
  std::vector<float> out(2);
  reduce(ReduceOp::Sum, {1, n, 1}, ones.data(), DType::f32, out.data(), DType::f32);
  CHECK(std::abs(out[0] - 16777216.0) / 16777216.0 < 1e-6);
  CHECK(out[0] == 16777216.0f);
  reduce(ReduceOp::Mean, {1, n, 1}, ones.data(), DType::f32, out.data(), DType::f32);
  CHECK(out[0] == 1.0f);
  // the same down a column of the tiled kernel: [n/2, 2] summed over dim 0
  reduce(ReduceOp::Sum, {1, n / 2, 2}, ones.data(), DType::f32, out.data(), DType::f32);
  CHECK(out[0] == 8388608.0f);
  CHECK(out[1] == 8388608.0f);

  std::mt19937 gen(1234);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(gen);
  double want = 0, want_even = 0, want_odd = 0;
  for (int64_t k = 0; k < n; ++k) {
    want += x[k];
    (k % 2 ? want_odd : want_even) += x[k];
  }
  reduce(ReduceOp::Sum, {1, n, 1}, x.data(), DType::f32, out.data(), DType::f32);
  CHECK(std::abs(out[0] - want) / want < 1e-6);
  reduce(ReduceOp::Sum, {1, n / 2, 2}, x.data(), DType::f32, out.data(), DType::f32);
  CHECK(std::abs(out[0] - want_even) / want_even < 1e-6);
  CHECK(std::abs(out[1] - want_odd) / want_odd < 1e-6);
  // two long rows (split into chunks when there are few rows)
  std::vector<double> two(2);
  reduce(ReduceOp::Sum, {2, n / 2, 1}, x.data(), DType::f32, two.data(), DType::f64);
  double first = 0;
  for (int64_t k = 0; k < n / 2; ++k) first += x[k];
  CHECK(std::abs(two[0] - first) / first < 1e-6);
  CHECK(std::abs(two[0] + two[1] - want) / want < 1e-6);
}
