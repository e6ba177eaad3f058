// NumPy broadcasting (broadcast_shapes and binary ops on real values), strided
// inputs, and type promotion of binary ops and comparisons.
#include <catch2/catch.hpp>
#include <cstdint>
#include <vector>

#include "multigrad.h"
#include "tests/tensor_values.h"

using namespace mg;
using Catch::Matchers::Contains;

using mg::testing::values;

namespace {

std::vector<float> iota_values(int64_t n, float scale = 1.0f, float shift = 0.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * scale + shift;
  return v;
}

}  // namespace

TEST_CASE("broadcast_shapes follows NumPy rules", "[broadcast]") {
  CHECK(broadcast_shapes({3, 1, 4}, {2, 4}, "test") == Shape{3, 2, 4});
  CHECK(broadcast_shapes({2, 4}, {3, 1, 4}, "test") == Shape{3, 2, 4});
  CHECK(broadcast_shapes({}, {2, 3}, "test") == Shape{2, 3});
  CHECK(broadcast_shapes({2, 3}, {}, "test") == Shape{2, 3});
  CHECK(broadcast_shapes({}, {}, "test") == Shape{});
  CHECK(broadcast_shapes({1}, {5}, "test") == Shape{5});
  CHECK(broadcast_shapes({5}, {1}, "test") == Shape{5});
  CHECK(broadcast_shapes({2, 1}, {1, 3}, "test") == Shape{2, 3});
  CHECK(broadcast_shapes({8, 1, 6, 1}, {7, 1, 5}, "test") == Shape{8, 7, 6, 5});
  CHECK(broadcast_shapes({0}, {1}, "test") == Shape{0});
  CHECK(broadcast_shapes({2, 0}, {2, 1}, "test") == Shape{2, 0});
  CHECK(broadcast_shapes({1, 1}, {1}, "test") == Shape{1, 1});

  CHECK_THROWS_AS(broadcast_shapes({3}, {4}, "test"), Error);
  CHECK_THROWS_AS(broadcast_shapes({2, 3}, {3, 2}, "test"), Error);
  CHECK_THROWS_AS(broadcast_shapes({0}, {2}, "test"), Error);
  CHECK_THROWS_AS(broadcast_shapes({2, 1}, {8, 4, 3}, "test"), Error);
  CHECK_THROWS_WITH(broadcast_shapes({2, 3}, {4}, "myop"),
                    Contains("myop") && Contains("[2, 3]") && Contains("[4]"));
}

TEST_CASE("[3,1,4] + [2,4] -> [3,2,4], checked elementwise", "[broadcast]") {
  const std::vector<float> av = iota_values(12, 1.0f, 0.5f);    // [3, 1, 4]
  const std::vector<float> bv = iota_values(8, 100.0f, -7.0f);  // [2, 4]
  Tensor a = tensor<float>(av, {3, 1, 4});
  Tensor b = tensor<float>(bv, {2, 4});
  Tensor c = add(a, b);
  REQUIRE(c.shape() == Shape{3, 2, 4});
  REQUIRE(c.is_contiguous());
  std::vector<float> cv = values(c);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 4; ++k) CHECK(cv[(i * 2 + j) * 4 + k] == av[i * 4 + k] + bv[j * 4 + k]);

  // Commutes for add; the non-commutative ops keep operand order.
  CHECK(values(add(b, a)) == cv);
  std::vector<float> dv = values(sub(b, a));
  std::vector<float> qv = values(div(a, b));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      for (int k = 0; k < 4; ++k) {
        const int o = (i * 2 + j) * 4 + k;
        CHECK(dv[o] == bv[j * 4 + k] - av[i * 4 + k]);
        CHECK(qv[o] == Approx(av[i * 4 + k] / bv[j * 4 + k]));
      }
}

TEST_CASE("[3,1] op [1,4] is an outer operation", "[broadcast]") {
  Tensor a = tensor<float>({1, 2, 3}, {3, 1});
  Tensor b = tensor<float>({10, 20, 30, 40}, {1, 4});
  std::vector<float> m = values(mul(a, b));
  std::vector<float> s = values(sub(a, b));
  std::vector<float> mx = values(maximum(a, tensor<float>({0, 2.5f, 5, -1}, {1, 4})));
  const float bv[4] = {10, 20, 30, 40}, cv[4] = {0, 2.5f, 5, -1};
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      CHECK(m[i * 4 + j] == (i + 1) * bv[j]);
      CHECK(s[i * 4 + j] == (i + 1) - bv[j]);
      CHECK(mx[i * 4 + j] == std::max<float>(i + 1, cv[j]));
    }
}

TEST_CASE("scalar [] broadcasts with [2,3]; [1] with [5]", "[broadcast]") {
  Tensor s = scalar_tensor(10.0);
  Tensor m = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor r = add(s, m);
  CHECK(r.shape() == Shape{2, 3});
  CHECK(values(r) == std::vector<float>{11, 12, 13, 14, 15, 16});
  CHECK(values(sub(m, s)) == std::vector<float>{-9, -8, -7, -6, -5, -4});
  CHECK(values(sub(s, m)) == std::vector<float>{9, 8, 7, 6, 5, 4});
  CHECK(add(s, s).dim() == 0);
  CHECK(add(s, s).item<float>() == 20.0f);

  Tensor one = tensor<float>({2});
  Tensor five = tensor<float>({1, 2, 3, 4, 5});
  Tensor p = mul(one, five);
  CHECK(p.shape() == Shape{5});
  CHECK(values(p) == std::vector<float>{2, 4, 6, 8, 10});
  CHECK(values(div(five, one)) == std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f});
  // [1] with [] stays [1].
  CHECK(add(one, s).shape() == Shape{1});
}

TEST_CASE("incompatible shapes throw", "[broadcast]") {
  CHECK_THROWS_AS(add(zeros({3}), zeros({4})), Error);
  CHECK_THROWS_AS(mul(zeros({2, 3}), zeros({3, 2})), Error);
  CHECK_THROWS_AS(sub(zeros({2, 3, 4}), zeros({3, 3})), Error);
  CHECK_THROWS_AS(eq(zeros({2}), zeros({3})), Error);
  CHECK_THROWS_AS(where(zeros({2}, TensorOptions{DType::boolean}), zeros({3}), zeros({3})), Error);
  // The in-place form cannot grow its target.
  Tensor small = zeros({3});
  CHECK_THROWS_AS(small.add_(zeros({2, 3})), Error);
  CHECK(values(small) == std::vector<float>{0, 0, 0});
}

TEST_CASE("broadcast binary ops on non-contiguous inputs", "[broadcast]") {
  Tensor base = tensor<float>(iota_values(6), {2, 3});
  Tensor t = base.t();  // [3, 2]: t[i][j] = base[j][i] = j*3 + i
  REQUIRE_FALSE(t.is_contiguous());
  Tensor row = tensor<float>({10, 20});
  Tensor r = add(t, row);
  REQUIRE(r.shape() == Shape{3, 2});
  CHECK(r.is_contiguous());
  std::vector<float> rv = values(r);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      CHECK(rv[i * 2 + j] == static_cast<float>(j * 3 + i) + (j == 0 ? 10.0f : 20.0f));

  // Both operands transposed.
  std::vector<float> tt = values(mul(t, t));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) CHECK(tt[i * 2 + j] == static_cast<float>((j * 3 + i) * (j * 3 + i)));

  // Transposed [3,2] against a column [3,1] from a strided slice.
  Tensor strided = tensor<float>(iota_values(9), {9}).slice(0, 0, 9, 3).view({3, 1});  // 0, 3, 6
  std::vector<float> sv = values(sub(t, strided));
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j)
      CHECK(sv[i * 2 + j] == static_cast<float>(j * 3 + i) - static_cast<float>(3 * i));

  // Permuted 3-d tensor + expanded operand.
  Tensor x = tensor<float>(iota_values(24), {2, 3, 4}).permute({2, 0, 1});  // [4, 2, 3]
  Tensor e = tensor<float>({1, 2, 3}).expand({2, 3});                       // [2, 3], stride 0 rows
  std::vector<float> xv = values(add(x, e));
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 3; ++c)
        CHECK(xv[(a * 2 + b) * 3 + c] == static_cast<float>(b * 12 + c * 4 + a) + static_cast<float>(c + 1));
  // The inputs are untouched.
  CHECK(values(base) == iota_values(6));
}

TEST_CASE("gradients of broadcast inputs are summed back to their shapes", "[broadcast][autograd]") {
  Tensor a = tensor<float>({1, 2, 3}, {3, 1}, TensorOptions{DType::f32, Device::cpu(), true});
  Tensor b = tensor<float>({1, 10, 100, 1000}, {1, 4}, TensorOptions{DType::f32, Device::cpu(), true});
  mul(a, b).sum().backward();
  REQUIRE(a.grad().shape() == Shape{3, 1});
  REQUIRE(b.grad().shape() == Shape{1, 4});
  CHECK(values(a.grad()) == std::vector<float>{1111, 1111, 1111});
  CHECK(values(b.grad()) == std::vector<float>{6, 6, 6, 6});

  Tensor s = scalar_tensor(2.0, TensorOptions{DType::f32, Device::cpu(), true});
  add(s, zeros({2, 3})).sum().backward();
  CHECK(s.grad().dim() == 0);
  CHECK(s.grad().item<float>() == 6.0f);
}

TEST_CASE("type promotion of binary ops", "[broadcast][dtype]") {
  Tensor i32 = tensor<int32_t>({1, 2, 3});
  Tensor i64 = tensor<int64_t>({4, 5, 6});
  Tensor f32 = tensor<float>({0.5f, 0.25f, -1.0f});
  Tensor f64 = tensor<double>({0.125, 1.0, 2.0});
  Tensor bl = tensor<bool>({true, false, true});
  Tensor h16 = tensor<float>({1.5f, 2.0f, -3.0f}, TensorOptions{DType::f16});
  Tensor b16 = tensor<float>({0.5f, 4.0f, 8.0f}, TensorOptions{DType::bf16});

  Tensor r1 = add(i32, f32);
  CHECK(r1.dtype() == DType::f32);
  CHECK(values(r1) == std::vector<float>{1.5f, 2.25f, 2.0f});
  CHECK(add(f32, i32).dtype() == DType::f32);

  Tensor r2 = add(i64, f64);
  CHECK(r2.dtype() == DType::f64);
  CHECK(r2.to_vector<double>() == std::vector<double>{4.125, 6.0, 8.0});

  Tensor r3 = add(bl, i32);
  CHECK(r3.dtype() == DType::i32);
  CHECK(r3.to_vector<int32_t>() == std::vector<int32_t>{2, 2, 4});

  Tensor r4 = add(h16, b16);
  CHECK(r4.dtype() == DType::f32);
  CHECK(values(r4) == std::vector<float>{2.0f, 6.0f, 5.0f});

  Tensor r5 = add(i32, i64);
  CHECK(r5.dtype() == DType::i64);
  CHECK(r5.to_vector<int64_t>() == std::vector<int64_t>{5, 7, 9});

  CHECK(add(h16, h16).dtype() == DType::f16);
  CHECK(add(h16, f32).dtype() == DType::f32);
  CHECK(add(i64, h16).dtype() == DType::f16);
  CHECK(add(f32, f64).dtype() == DType::f64);
  CHECK(mul(i32, i32).dtype() == DType::i32);
  CHECK(mul(i32, i32).to_vector<int32_t>() == std::vector<int32_t>{1, 4, 9});

  // Integer / integer is true division in f32.
  Tensor q = div(tensor<int32_t>({7, -7, 1}), tensor<int32_t>({2, 2, 4}));
  CHECK(q.dtype() == DType::f32);
  CHECK(values(q) == std::vector<float>{3.5f, -3.5f, 0.25f});
  Tensor q64 = div(tensor<int64_t>({9}), tensor<int64_t>({4}));
  CHECK(q64.dtype() == DType::f32);
  CHECK(q64.item<float>() == 2.25f);
  CHECK(div(f64, i32).dtype() == DType::f64);

  // Promotion combined with broadcasting.
  Tensor col = tensor<int64_t>({1, 2}, {2, 1});
  Tensor pr = add(col, tensor<float>({0.5f, 0.25f, 0.125f}));
  CHECK(pr.dtype() == DType::f32);
  CHECK(pr.shape() == Shape{2, 3});
  CHECK(values(pr) == std::vector<float>{1.5f, 1.25f, 1.125f, 2.5f, 2.25f, 2.125f});
}

TEST_CASE("scalar operands: integers stay integral unless the scalar is fractional", "[broadcast][dtype]") {
  Tensor i = tensor<int32_t>({1, 2, 3});
  Tensor times2 = mul(i, 2.0);
  CHECK(times2.dtype() == DType::i32);
  CHECK(times2.to_vector<int32_t>() == std::vector<int32_t>{2, 4, 6});
  Tensor half = mul(i, 0.5);
  CHECK(half.dtype() == DType::f32);
  CHECK(values(half) == std::vector<float>{0.5f, 1.0f, 1.5f});
  Tensor d = div(i, 2.0);
  CHECK(d.dtype() == DType::f32);
  CHECK(values(d) == std::vector<float>{0.5f, 1.0f, 1.5f});
  CHECK(add(tensor<double>({1.0}), 1.0).dtype() == DType::f64);
}

TEST_CASE("comparisons return bool and broadcast", "[broadcast][dtype]") {
  Tensor a = tensor<float>({1, 2, 3});
  Tensor b = tensor<float>({3, 2, 1});
  Tensor lt_ab = lt(a, b);
  CHECK(lt_ab.dtype() == DType::boolean);
  CHECK(lt_ab.to_vector<bool>() == std::vector<bool>{true, false, false});
  CHECK(le(a, b).to_vector<bool>() == std::vector<bool>{true, true, false});
  CHECK(gt(a, b).to_vector<bool>() == std::vector<bool>{false, false, true});
  CHECK(ge(a, b).to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK(eq(a, b).to_vector<bool>() == std::vector<bool>{false, true, false});
  CHECK(ne(a, b).to_vector<bool>() == std::vector<bool>{true, false, true});

  // [3,1] == [1,3] -> identity pattern.
  Tensor id = eq(a.view({3, 1}), a.view({1, 3}));
  CHECK(id.dtype() == DType::boolean);
  CHECK(id.shape() == Shape{3, 3});
  CHECK(id.to_vector<bool>() ==
        std::vector<bool>{true, false, false, false, true, false, false, false, true});

  // Mixed dtypes compare by value after promotion; result is still bool.
  Tensor mixed = lt(tensor<int32_t>({1, 2, 3}), tensor<double>({1.5, 1.5, 3.0}));
  CHECK(mixed.dtype() == DType::boolean);
  CHECK(mixed.to_vector<bool>() == std::vector<bool>{true, false, false});

  Tensor sc = gt(a, 1.5);
  CHECK(sc.dtype() == DType::boolean);
  CHECK(sc.to_vector<bool>() == std::vector<bool>{false, true, true});
  CHECK(eq(tensor<int64_t>({2, 3}), 2.0).to_vector<bool>() == std::vector<bool>{true, false});

  // Comparisons carry no gradient.
  Tensor w = tensor<float>({1, 2}, {2}, TensorOptions{DType::f32, Device::cpu(), true});
  CHECK_FALSE(lt(w, 1.5).requires_grad());
  CHECK_FALSE(eq(w, w).requires_grad());

  // logical ops and where.
  Tensor m1 = tensor<bool>({true, true, false, false});
  Tensor m2 = tensor<bool>({true, false, true, false});
  CHECK(logical_and(m1, m2).to_vector<bool>() == std::vector<bool>{true, false, false, false});
  CHECK(logical_or(m1, m2).to_vector<bool>() == std::vector<bool>{true, true, true, false});
  Tensor picked = where(gt(a, 1.5), a, tensor<float>({-1}));
  CHECK(values(picked) == std::vector<float>{-1, 2, 3});
}
