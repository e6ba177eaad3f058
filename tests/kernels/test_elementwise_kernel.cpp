// Tests for kernels/cpu/elementwise: every unary op against std:: math (f64,
// f32, halves), every unary backward against central finite differences of
// the forward in f64, binary ops with broadcast (stride 0) and transposed
// operands, NaN propagation, the scalar forms, where/clamp/fill/arange, and
// copy across all 49 dtype pairs from contiguous and transposed views.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "base/strided_view.h"
#include "kernels/cpu/elementwise.h"
#include "tests/kernels/kernel_test_values.h"

using mg::bf16;
using mg::DType;
using mg::f16;
using mg::StridedView;
using mg::kernels::BinaryOp;
using mg::kernels::UnaryOp;
namespace cpu = mg::kernels::cpu;
using mg::kernel_test::as_double;

namespace {

// A view of `data` with the given shape; contiguous unless strides are given.
StridedView make_view(const void* data, DType dtype, std::vector<int64_t> shape,
                      std::vector<int64_t> strides = {}) {
  StridedView v;
  v.data = const_cast<void*>(data);
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  int64_t expected = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[d] = shape[d];
    v.strides[d] = strides.empty() ? expected : strides[d];
    expected *= shape[d];
  }
  return v;
}

template <class T>
StridedView view_of(std::vector<T>& v, std::vector<int64_t> shape, std::vector<int64_t> strides = {}) {
  return make_view(v.data(), mg::dtype_of<T>(), shape, strides);
}

std::vector<double> uniform(int64_t n, double lo, double hi, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class T>
std::vector<T> cast_vec(const std::vector<double>& v) {
  std::vector<T> out;
  for (double x : v) out.push_back(static_cast<T>(static_cast<float>(x)));
  return out;
}
template <>
std::vector<double> cast_vec<double>(const std::vector<double>& v) {
  return v;
}

// Equal within tolerance, NaN == NaN, inf == inf of the same sign.
bool close(double got, double want, double rel, double abs = 0.0) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::abs(got - want) <= abs + rel * std::abs(want);
}

constexpr double kGeluK = 0.7978845608028654;

double ref_unary(UnaryOp op, double x, double p) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::Rsqrt: return 1.0 / std::sqrt(x);
    case UnaryOp::Abs: return std::abs(x);
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case UnaryOp::Relu: return x < 0 ? 0.0 : x;
    case UnaryOp::GeluTanh: return 0.5 * x * (1.0 + std::tanh(kGeluK * (x + 0.044715 * x * x * x)));
    case UnaryOp::PowScalar: return std::pow(x, p);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Reciprocal: return 1.0 / x;
    case UnaryOp::Sign: return static_cast<double>((x > 0) - (x < 0));
  }
  return 0;
}

struct UnaryCase {
  UnaryOp op;
  double p;       // exponent for PowScalar
  double lo, hi;  // input domain
};

// Inputs stay away from 0 where the op (or its derivative) has a kink or a pole.
const std::vector<UnaryCase>& unary_cases() {
  static const std::vector<UnaryCase> cases = {
      {UnaryOp::Neg, 0, -3, 3},          {UnaryOp::Exp, 0, -5, 5},           {UnaryOp::Log, 0, 0.1, 10},
      {UnaryOp::Sqrt, 0, 0.1, 10},       {UnaryOp::Rsqrt, 0, 0.1, 10},       {UnaryOp::Abs, 0, -3, 3},
      {UnaryOp::Tanh, 0, -3, 3},         {UnaryOp::Sigmoid, 0, -8, 8},       {UnaryOp::Relu, 0, -3, 3},
      {UnaryOp::GeluTanh, 0, -4, 4},     {UnaryOp::PowScalar, 3.0, -2, 2},   {UnaryOp::PowScalar, 2.0, -2, 2},
      {UnaryOp::PowScalar, 0.5, 0.1, 4}, {UnaryOp::PowScalar, -1.5, 0.2, 4}, {UnaryOp::PowScalar, 0.0, -2, 2},
      {UnaryOp::Square, 0, -3, 3},       {UnaryOp::Reciprocal, 0, 0.2, 5},   {UnaryOp::Sign, 0, -3, 3},
  };
  return cases;
}

// Moves points within `gap` of 0 away from it (kinks of abs/relu/sign).
void avoid_zero(std::vector<double>& v, double gap) {
  for (auto& x : v)
    if (std::abs(x) < gap) x = x < 0 ? -gap : gap;
}

template <class T>
void check_unary_against_std(double rel, double abs) {
  for (const auto& c : unary_cases()) {
    INFO("op " << mg::kernels::unary_op_name(c.op) << " p " << c.p << " dtype " << mg::dtype_of<T>());
    auto xd = uniform(257, c.lo, c.hi, 7);
    avoid_zero(xd, 1e-3);
    std::vector<T> x = cast_vec<T>(xd), y(x.size());
    cpu::unary(c.op, view_of(x, {257}), view_of(y, {257}), c.p);
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = ref_unary(c.op, static_cast<double>(x[i]), c.p);
      INFO("x = " << static_cast<double>(x[i]) << " got " << static_cast<double>(y[i]) << " want " << want);
      REQUIRE(close(static_cast<double>(y[i]), want, rel, abs));
    }
  }
}

}  // namespace

TEST_CASE("unary ops match std:: math in f64", "[kernels]") {
  check_unary_against_std<double>(1e-14, 1e-300);
}

TEST_CASE("unary ops match std:: math in f32", "[kernels]") { check_unary_against_std<float>(2e-6, 1e-7); }

TEST_CASE("unary ops on halves compute in float and round once", "[kernels]") {
  auto xd = uniform(100, -3, 3, 11);
  std::vector<f16> h = cast_vec<f16>(xd), hy(h.size());
  std::vector<bf16> b = cast_vec<bf16>(xd), by(b.size());
  cpu::unary(UnaryOp::Tanh, view_of(h, {100}), view_of(hy, {100}));
  cpu::unary(UnaryOp::Exp, view_of(b, {100}), view_of(by, {100}));
  for (size_t i = 0; i < h.size(); ++i) {
    REQUIRE(hy[i].bits == f16(std::tanh(static_cast<float>(h[i]))).bits);
    REQUIRE(by[i].bits == bf16(std::exp(static_cast<float>(b[i]))).bits);
  }
}

TEST_CASE("unary ops on integers", "[kernels]") {
  std::vector<int32_t> x = {-5, -1, 0, 1, 7}, y(5);
  auto vx = view_of(x, {5}), vy = view_of(y, {5});
  cpu::unary(UnaryOp::Neg, vx, vy);
  CHECK(y == std::vector<int32_t>{5, 1, 0, -1, -7});
  cpu::unary(UnaryOp::Abs, vx, vy);
  CHECK(y == std::vector<int32_t>{5, 1, 0, 1, 7});
  cpu::unary(UnaryOp::Relu, vx, vy);
  CHECK(y == std::vector<int32_t>{0, 0, 0, 1, 7});
  cpu::unary(UnaryOp::Square, vx, vy);
  CHECK(y == std::vector<int32_t>{25, 1, 0, 1, 49});
  cpu::unary(UnaryOp::Sign, vx, vy);
  CHECK(y == std::vector<int32_t>{-1, -1, 0, 1, 1});
  std::vector<int64_t> x64 = {-3, 4}, y64(2);
  cpu::unary(UnaryOp::Neg, view_of(x64, {2}), view_of(y64, {2}));
  CHECK(y64 == std::vector<int64_t>{3, -4});
  CHECK_THROWS_AS(cpu::unary(UnaryOp::Exp, vx, vy), mg::Error);
  std::vector<float> f(5);
  CHECK_THROWS_AS(cpu::unary(UnaryOp::Neg, vx, view_of(f, {5})), mg::Error);  // dtype mismatch
}

TEST_CASE("unary special values: NaN, zero, sign", "[kernels]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> x = {nan, 0.0, -0.0, -2.0}, y(4);
  cpu::unary(UnaryOp::Sign, view_of(x, {4}), view_of(y, {4}));
  CHECK(std::isnan(y[0]));
  CHECK(y[1] == 0.0);
  CHECK(y[3] == -1.0);
  cpu::unary(UnaryOp::Relu, view_of(x, {4}), view_of(y, {4}));
  CHECK(std::isnan(y[0]));
  CHECK(y[3] == 0.0);
  cpu::unary(UnaryOp::Sigmoid, view_of(x, {4}), view_of(y, {4}));
  CHECK(y[1] == 0.5);
}

TEST_CASE("unary on a transposed view writes through strides", "[kernels]") {
  // x is a [3, 2] view of a [2, 3] buffer; out is contiguous [3, 2].
  std::vector<double> buf = {1, 2, 3, 4, 5, 6}, y(6);
  cpu::unary(UnaryOp::Square, view_of(buf, {3, 2}, {1, 3}), view_of(y, {3, 2}));
  CHECK(y == std::vector<double>{1, 16, 4, 25, 9, 36});
}

TEST_CASE("unary_backward matches central finite differences in f64", "[kernels][gradcheck]") {
  const int64_t n = 64;
  const double h = 1e-6;
  for (const auto& c : unary_cases()) {
    auto x = uniform(n, c.lo, c.hi, 3);
    avoid_zero(x, 1e-2);
    auto g = uniform(n, -1, 1, 5);
    std::vector<double> y(n), xp(x), xm(x), yp(n), ym(n), gi(n), gi_no_output(n);
    for (int64_t i = 0; i < n; ++i) {
      xp[i] += h;
      xm[i] -= h;
    }
    cpu::unary(c.op, view_of(x, {n}), view_of(y, {n}), c.p);
    cpu::unary(c.op, view_of(xp, {n}), view_of(yp, {n}), c.p);
    cpu::unary(c.op, view_of(xm, {n}), view_of(ym, {n}), c.p);
    cpu::unary_backward(c.op, view_of(g, {n}), view_of(x, {n}), view_of(y, {n}), view_of(gi, {n}), c.p);
    // Same result when only the input is saved (ops that prefer y recompute it).
    cpu::unary_backward(c.op, view_of(g, {n}), view_of(x, {n}), StridedView{}, view_of(gi_no_output, {n}),
                        c.p);
    for (int64_t i = 0; i < n; ++i) {
      const double fd = g[i] * (yp[i] - ym[i]) / (2 * h);
      INFO("op " << mg::kernels::unary_op_name(c.op) << " p " << c.p << " x " << x[i] << " grad " << gi[i]
                 << " fd " << fd);
      REQUIRE(close(gi[i], fd, 1e-6, 1e-7));
      REQUIRE(close(gi_no_output[i], gi[i], 1e-12, 1e-14));
    }
  }
}

TEST_CASE("unary_backward at the kinks: relu and abs have gradient 0 at 0", "[kernels]") {
  std::vector<double> x = {0.0, 2.0, -2.0}, g = {1.0, 1.0, 1.0}, gi(3);
  cpu::unary_backward(UnaryOp::Relu, view_of(g, {3}), view_of(x, {3}), StridedView{}, view_of(gi, {3}));
  CHECK(gi == std::vector<double>{0.0, 1.0, 0.0});
  cpu::unary_backward(UnaryOp::Abs, view_of(g, {3}), view_of(x, {3}), StridedView{}, view_of(gi, {3}));
  CHECK(gi == std::vector<double>{0.0, 1.0, -1.0});
  // Log needs the input: passing only the output is an error.
  CHECK_THROWS_AS(
      cpu::unary_backward(UnaryOp::Log, view_of(g, {3}), StridedView{}, view_of(x, {3}), view_of(gi, {3})),
      mg::Error);
  // f32 backward of tanh through the output.
  std::vector<float> gf = {2.0f}, yf = {0.5f}, gif(1);
  cpu::unary_backward(UnaryOp::Tanh, view_of(gf, {1}), StridedView{}, view_of(yf, {1}), view_of(gif, {1}));
  CHECK(gif[0] == 1.5f);
}

namespace {

double ref_int_pow(double x, double y) {
  if (y < 0) return x == 1 ? 1 : (x == -1 ? (static_cast<int64_t>(y) % 2 ? -1 : 1) : 0);
  double r = 1;
  for (int i = 0; i < static_cast<int>(y); ++i) r *= x;
  return r;
}

double ref_binary(BinaryOp op, double x, double y, bool integer) {
  switch (op) {
    case BinaryOp::Add: return x + y;
    case BinaryOp::Sub: return x - y;
    case BinaryOp::Mul: return x * y;
    case BinaryOp::Div: return x / y;
    case BinaryOp::Maximum: return std::isnan(x) || std::isnan(y) ? std::nan("") : std::max(x, y);
    case BinaryOp::Minimum: return std::isnan(x) || std::isnan(y) ? std::nan("") : std::min(x, y);
    case BinaryOp::Pow: return integer ? ref_int_pow(x, y) : std::pow(x, y);
    case BinaryOp::Eq: return x == y;
    case BinaryOp::Ne: return x != y;
    case BinaryOp::Lt: return x < y;
    case BinaryOp::Le: return x <= y;
    case BinaryOp::Gt: return x > y;
    case BinaryOp::Ge: return x >= y;
    case BinaryOp::LogicalAnd: return x != 0 && y != 0;
    case BinaryOp::LogicalOr: return x != 0 || y != 0;
  }
  return 0;
}

const std::vector<BinaryOp> kAllBinary = {
    BinaryOp::Add,     BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div,        BinaryOp::Maximum,
    BinaryOp::Minimum, BinaryOp::Pow, BinaryOp::Eq,  BinaryOp::Ne,         BinaryOp::Lt,
    BinaryOp::Le,      BinaryOp::Gt,  BinaryOp::Ge,  BinaryOp::LogicalAnd, BinaryOp::LogicalOr};

// Small integers (with halves for floats) so that ties and zeros occur.
template <class T>
std::vector<T> grid_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-6, 6);
  std::vector<T> v;
  for (int64_t i = 0; i < n; ++i) {
    const int k = dist(gen);
    v.push_back(static_cast<T>(std::is_integral<T>::value ? k / 2 : k * 0.5));
  }
  return v;
}

// Runs `op` on a [3, 4] output whose operands are given by (buffer, strides),
// and checks every element against ref_binary.
template <class T>
void check_binary_layout(BinaryOp op, std::vector<T>& a, std::vector<int64_t> sa, std::vector<T>& b,
                         std::vector<int64_t> sb, bool transposed_out) {
  const bool boolean = mg::kernels::binary_op_returns_bool(op);
  const bool integer = std::is_integral<T>::value;
  std::vector<T> out_t(12);
  std::unique_ptr<bool[]> out_b(new bool[12]());
  const std::vector<int64_t> so = transposed_out ? std::vector<int64_t>{1, 3} : std::vector<int64_t>{4, 1};
  StridedView out = boolean ? make_view(out_b.get(), DType::boolean, {3, 4}, so) : view_of(out_t, {3, 4}, so);
  cpu::binary(op, view_of(a, {3, 4}, sa), view_of(b, {3, 4}, sb), out);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 4; ++j) {
      const double x = static_cast<double>(a[i * sa[0] + j * sa[1]]);
      const double y = static_cast<double>(b[i * sb[0] + j * sb[1]]);
      const int64_t k = i * so[0] + j * so[1];
      const double got = boolean ? static_cast<double>(out_b[k]) : static_cast<double>(out_t[k]);
      double want = ref_binary(op, x, y, integer);
      if (!boolean && std::is_same<T, float>::value) want = static_cast<float>(want);
      INFO("op " << mg::kernels::binary_op_name(op) << " x " << x << " y " << y << " got " << got << " want "
                 << want);
      REQUIRE(close(got, want, std::is_same<T, float>::value ? 1e-6 : 1e-15));
    }
  }
}

template <class T>
void check_binary_all_layouts() {
  std::vector<T> a = grid_values<T>(12, 1), b = grid_values<T>(12, 2);
  std::vector<T> row = grid_values<T>(4, 3), col = grid_values<T>(3, 4);
  for (BinaryOp op : kAllBinary) {
    if (std::is_integral<T>::value && op == BinaryOp::Div) continue;
    for (bool transposed_out : {false, true}) {
      check_binary_layout(op, a, {4, 1}, b, {4, 1}, transposed_out);      // both contiguous
      check_binary_layout(op, a, {4, 1}, row, {0, 1}, transposed_out);    // b broadcast over rows
      check_binary_layout(op, a, {4, 1}, col, {1, 0}, transposed_out);    // b broadcast over columns
      check_binary_layout(op, row, {0, 1}, b, {4, 1}, transposed_out);    // a broadcast
      check_binary_layout(op, a, {1, 3}, b, {4, 1}, transposed_out);      // a transposed
      check_binary_layout(op, a, {1, 3}, b, {1, 3}, transposed_out);      // both transposed
      check_binary_layout(op, row, {0, 1}, col, {1, 0}, transposed_out);  // outer product
    }
  }
}

}  // namespace

TEST_CASE("binary ops with broadcasting and transposed operands (f64)", "[kernels]") {
  check_binary_all_layouts<double>();
}
TEST_CASE("binary ops with broadcasting and transposed operands (f32)", "[kernels]") {
  check_binary_all_layouts<float>();
}
TEST_CASE("binary ops with broadcasting and transposed operands (i32, i64)", "[kernels]") {
  check_binary_all_layouts<int32_t>();
  check_binary_all_layouts<int64_t>();
}

TEST_CASE("binary on 3-d views that coalesce partially", "[kernels]") {
  // a: [2, 3, 4] contiguous; b: [4] broadcast to [2, 3, 4]; out: a permuted layout.
  std::vector<double> a(24), b = {1, 2, 3, 4}, out(24);
  for (int i = 0; i < 24; ++i) a[i] = i;
  // out is [2, 3, 4] with strides so that dim 0 is innermost in memory.
  cpu::binary(BinaryOp::Mul, view_of(a, {2, 3, 4}), view_of(b, {2, 3, 4}, {0, 0, 1}),
              view_of(out, {2, 3, 4}, {1, 8, 2}));
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) REQUIRE(out[i + 8 * j + 2 * k] == a[i * 12 + j * 4 + k] * b[k]);
}

TEST_CASE("maximum and minimum propagate NaN from either side", "[kernels]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> a = {nan, 1.0, 2.0, nan}, b = {1.0, nan, 3.0, nan}, out(4);
  cpu::binary(BinaryOp::Maximum, view_of(a, {4}), view_of(b, {4}), view_of(out, {4}));
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(out[1]));
  CHECK(out[2] == 3.0);
  CHECK(std::isnan(out[3]));
  cpu::binary(BinaryOp::Minimum, view_of(a, {4}), view_of(b, {4}), view_of(out, {4}));
  CHECK(std::isnan(out[0]));
  CHECK(std::isnan(out[1]));
  CHECK(out[2] == 2.0);
  std::vector<float> af = {1.0f, 5.0f}, of(2);
  cpu::binary_scalar(BinaryOp::Maximum, view_of(af, {2}), nan, view_of(of, {2}));
  CHECK(std::isnan(of[0]));
  CHECK(std::isnan(of[1]));
}

TEST_CASE("binary dtype rules", "[kernels]") {
  std::vector<int32_t> a = {7, -7}, b = {2, 2}, out(2);
  CHECK_THROWS_AS(cpu::binary(BinaryOp::Div, view_of(a, {2}), view_of(b, {2}), view_of(out, {2})), mg::Error);
  std::vector<float> f(2);
  CHECK_THROWS_AS(cpu::binary(BinaryOp::Add, view_of(a, {2}), view_of(f, {2}), view_of(out, {2})), mg::Error);
  CHECK_THROWS_AS(cpu::binary(BinaryOp::Lt, view_of(a, {2}), view_of(b, {2}), view_of(out, {2})),
                  mg::Error);  // comparison output must be bool
  std::vector<int32_t> c(3);
  CHECK_THROWS_AS(cpu::binary(BinaryOp::Add, view_of(a, {2}), view_of(c, {3}), view_of(out, {2})), mg::Error);

  // bool: add is or, mul is and, sub refuses.
  std::unique_ptr<bool[]> x(new bool[4]{false, false, true, true}), y(new bool[4]{false, true, false, true}),
      z(new bool[4]());
  auto vx = make_view(x.get(), DType::boolean, {4}), vy = make_view(y.get(), DType::boolean, {4}),
       vz = make_view(z.get(), DType::boolean, {4});
  cpu::binary(BinaryOp::Add, vx, vy, vz);
  CHECK((!z[0] && z[1] && z[2] && z[3]));
  cpu::binary(BinaryOp::Mul, vx, vy, vz);
  CHECK((!z[0] && !z[1] && !z[2] && z[3]));
  cpu::binary(BinaryOp::Ne, vx, vy, vz);
  CHECK((!z[0] && z[1] && z[2] && !z[3]));
  CHECK_THROWS_AS(cpu::binary(BinaryOp::Sub, vx, vy, vz), mg::Error);
}

TEST_CASE("integer pow wraps and handles negative exponents", "[kernels]") {
  std::vector<int64_t> a = {2, 3, -2, 1, -1, -1, 5}, b = {10, 0, 3, -4, -3, -2, -1}, out(7);
  cpu::binary(BinaryOp::Pow, view_of(a, {7}), view_of(b, {7}), view_of(out, {7}));
  CHECK(out == std::vector<int64_t>{1024, 1, -8, 1, -1, 1, 0});
}

TEST_CASE("binary_scalar", "[kernels]") {
  std::vector<float> a = {1.0f, 2.0f, 4.0f}, out(3);
  cpu::binary_scalar(BinaryOp::Mul, view_of(a, {3}), 0.5, view_of(out, {3}));
  CHECK(out == std::vector<float>{0.5f, 1.0f, 2.0f});
  cpu::binary_scalar(BinaryOp::Pow, view_of(a, {3}), 2.0, view_of(out, {3}));
  CHECK(out == std::vector<float>{1.0f, 4.0f, 16.0f});
  cpu::binary_scalar(BinaryOp::Div, view_of(a, {3}), 4.0, view_of(out, {3}));
  CHECK(out == std::vector<float>{0.25f, 0.5f, 1.0f});
  cpu::binary_scalar(BinaryOp::Sub, view_of(a, {3}), 1.0, view_of(out, {3}));
  CHECK(out == std::vector<float>{0.0f, 1.0f, 3.0f});

  // f32 vs 0.1: the scalar rounds to float, like PyTorch, so 0.1f == 0.1.
  std::vector<float> tenth = {0.1f};
  std::unique_ptr<bool[]> eq(new bool[3]());
  cpu::binary_scalar(BinaryOp::Eq, view_of(tenth, {1}), 0.1, make_view(eq.get(), DType::boolean, {1}));
  CHECK(eq[0]);

  // integers: exact comparisons against non-integers, arithmetic needs a representable scalar.
  std::vector<int32_t> i = {2, 3, -3}, io(3);
  std::unique_ptr<bool[]> lt(new bool[3]());
  cpu::binary_scalar(BinaryOp::Lt, view_of(i, {3}), 2.5, make_view(lt.get(), DType::boolean, {3}));
  CHECK((lt[0] && !lt[1] && lt[2]));
  cpu::binary_scalar(BinaryOp::Gt, view_of(i, {3}), 1e10, make_view(lt.get(), DType::boolean, {3}));
  CHECK((!lt[0] && !lt[1] && !lt[2]));
  cpu::binary_scalar(BinaryOp::Add, view_of(i, {3}), 10.0, view_of(io, {3}));
  CHECK(io == std::vector<int32_t>{12, 13, 7});
  CHECK_THROWS_AS(cpu::binary_scalar(BinaryOp::Add, view_of(i, {3}), 0.5, view_of(io, {3})), mg::Error);
  CHECK_THROWS_AS(cpu::binary_scalar(BinaryOp::Div, view_of(i, {3}), 2.0, view_of(io, {3})), mg::Error);

  // halves compute in float with a float scalar
  std::vector<bf16> h = {bf16(1.0f), bf16(3.0f)}, ho(2);
  cpu::binary_scalar(BinaryOp::Mul, view_of(h, {2}), 0.1, view_of(ho, {2}));
  CHECK(ho[0].bits == bf16(0.1f).bits);
  CHECK(ho[1].bits == bf16(3.0f * 0.1f).bits);
}

TEST_CASE("axpby, in place and out of place", "[kernels]") {
  std::vector<double> a = {1, 2, 3}, b = {10, 20, 30}, out(3);
  cpu::axpby(view_of(a, {3}), 0.5, view_of(b, {3}), view_of(out, {3}));
  CHECK(out == std::vector<double>{6, 12, 18});
  cpu::axpby(view_of(a, {3}), -1.0, view_of(b, {3}), view_of(a, {3}));  // out aliases a
  CHECK(a == std::vector<double>{-9, -18, -27});
  std::vector<f16> ha = {f16(1.0f)}, hb = {f16(2.0f)};
  cpu::axpby(view_of(ha, {1}), 0.25, view_of(hb, {1}), view_of(ha, {1}));
  CHECK(static_cast<float>(ha[0]) == 1.5f);
  std::vector<int32_t> ia(1), ib(1);
  CHECK_THROWS_AS(cpu::axpby(view_of(ia, {1}), 1.0, view_of(ib, {1}), view_of(ia, {1})), mg::Error);
}

TEST_CASE("where with a broadcast condition", "[kernels]") {
  std::unique_ptr<bool[]> cond(new bool[3]{true, false, true});
  std::vector<float> a = {1, 2, 3, 4, 5, 6}, b = {-1, -2, -3, -4, -5, -6}, out(6);
  // cond [3] broadcast to [2, 3]; b transposed.
  cpu::where(make_view(cond.get(), DType::boolean, {2, 3}, {0, 1}), view_of(a, {2, 3}),
             view_of(b, {2, 3}, {1, 2}), view_of(out, {2, 3}));
  CHECK(out == std::vector<float>{1, -3, 3, 4, -4, 6});
  std::vector<f16> ha = {f16(1.0f), f16(2.0f)}, hb = {f16(-1.0f), f16(-2.0f)}, ho(2);
  std::unique_ptr<bool[]> c2(new bool[2]{false, true});
  cpu::where(make_view(c2.get(), DType::boolean, {2}), view_of(ha, {2}), view_of(hb, {2}), view_of(ho, {2}));
  CHECK(static_cast<float>(ho[0]) == -1.0f);
  CHECK(static_cast<float>(ho[1]) == 2.0f);
}

TEST_CASE("clamp", "[kernels]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  std::vector<double> x = {-5, -1, 0, 1, 5, nan}, y(6);
  cpu::clamp(view_of(x, {6}), view_of(y, {6}), -1.5, 2.0);
  CHECK(y[0] == -1.5);
  CHECK(y[1] == -1);
  CHECK(y[4] == 2.0);
  CHECK(std::isnan(y[5]));
  cpu::clamp(view_of(x, {6}), view_of(y, {6}), -inf, 0.5);  // upper bound only
  CHECK(y[0] == -5);
  CHECK(y[4] == 0.5);
  cpu::clamp(view_of(x, {6}), view_of(y, {6}), 3.0, 1.0);  // lo > hi -> hi
  CHECK(y[0] == 1.0);
  CHECK(y[4] == 1.0);
  std::vector<int64_t> i = {-5, 0, 5}, io(3);
  cpu::clamp(view_of(i, {3}), view_of(io, {3}), -1.5, inf);
  CHECK(io == std::vector<int64_t>{-1, 0, 5});
  cpu::clamp(view_of(i, {3}), view_of(io, {3}), -inf, 2.5);
  CHECK(io == std::vector<int64_t>{-5, 0, 2});
}

TEST_CASE("fill and arange", "[kernels]") {
  std::vector<float> f(7);
  cpu::fill(view_of(f, {7}), 2.5);
  CHECK(f == std::vector<float>(7, 2.5f));
  std::vector<double> d(6, 0.0);
  cpu::fill(view_of(d, {3}, {2}), -1.0);  // every other element
  CHECK(d == std::vector<double>{-1, 0, -1, 0, -1, 0});
  std::vector<int32_t> i(3);
  cpu::fill(view_of(i, {3}), 7);
  CHECK(i == std::vector<int32_t>{7, 7, 7});
  CHECK_THROWS_AS(cpu::fill(view_of(i, {3}), 1e12), mg::Error);
  std::vector<bf16> h(2);
  cpu::fill(view_of(h, {2}), 0.1);
  CHECK(h[1].bits == 0x3DCD);
  std::unique_ptr<bool[]> bl(new bool[2]());
  cpu::fill(make_view(bl.get(), DType::boolean, {2}), 3.0);
  CHECK((bl[0] && bl[1]));

  std::vector<int64_t> r(5);
  cpu::arange(view_of(r, {5}), 3, 2);
  CHECK(r == std::vector<int64_t>{3, 5, 7, 9, 11});
  std::vector<double> rd(4);
  cpu::arange(view_of(rd, {4}), 1.0, -0.5);
  CHECK(rd == std::vector<double>{1.0, 0.5, 0.0, -0.5});
  std::vector<f16> rh(3);
  cpu::arange(view_of(rh, {3}), 0, 0.25);
  CHECK(static_cast<float>(rh[2]) == 0.5f);
}

namespace {

// Reference conversion of a double to storage type T (the documented rules).
template <class T>
T make_value(double v) {
  if constexpr (std::is_same<T, bool>::value) {
    return v != 0;
  } else if constexpr (std::is_same<T, f16>::value || std::is_same<T, bf16>::value) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);  // truncates toward zero for integers
  }
}

const std::vector<double> kCopyValues = {0.0, 1.0, -2.7, 3.5, 0.1, -1.0, 100.25};

// Copies a [2, 3] From tensor into a [2, 3] To tensor, the input either
// contiguous or a transposed view of a [3, 2] buffer.
template <class From, class To>
void check_copy(bool transposed) {
  std::unique_ptr<From[]> src(new From[6]);  // (not std::vector: vector<bool> has no data())
  for (int k = 0; k < 6; ++k) src[k] = make_value<From>(kCopyValues[k]);
  std::unique_ptr<To[]> dst(new To[6]());
  const std::vector<int64_t> strides = transposed ? std::vector<int64_t>{1, 2} : std::vector<int64_t>{3, 1};
  cpu::copy(make_view(src.get(), mg::dtype_of<From>(), {2, 3}, strides),
            make_view(dst.get(), mg::dtype_of<To>(), {2, 3}));
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      const From s = src[i * strides[0] + j * strides[1]];
      const To want = make_value<To>(as_double(s));
      INFO(mg::dtype_of<From>() << " -> " << mg::dtype_of<To>() << " value " << as_double(s));
      REQUIRE(as_double(dst[i * 3 + j]) == as_double(want));
    }
  }
}

template <class From>
void check_copy_to_all(bool transposed) {
  for (DType to : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    mg::visit_dtype(to, [&](auto tag) { check_copy<From, typename decltype(tag)::type>(transposed); });
  }
}

}  // namespace

TEST_CASE("copy converts between all 49 dtype pairs", "[kernels]") {
  for (bool transposed : {false, true}) {
    for (DType from :
         {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
      mg::visit_dtype(from, [&](auto tag) { check_copy_to_all<typename decltype(tag)::type>(transposed); });
    }
  }
}

TEST_CASE("copy conversion spot checks", "[kernels]") {
  std::vector<double> d = {-2.7, 0.1, 2.9, -0.5};
  std::vector<int32_t> i(4);
  cpu::copy(view_of(d, {4}), view_of(i, {4}));
  CHECK(i == std::vector<int32_t>{-2, 0, 2, 0});  // truncation toward zero
  std::vector<bf16> b(4);
  std::vector<f16> h(4);
  cpu::copy(view_of(d, {4}), view_of(b, {4}));
  cpu::copy(view_of(d, {4}), view_of(h, {4}));
  CHECK(b[1].bits == 0x3DCD);  // 0.1f = 0x3DCCCCCD rounds up to nearest even bf16
  CHECK(h[1].bits == 0x2E66);  // 0.1 in binary16
  std::unique_ptr<bool[]> bl(new bool[4]());
  cpu::copy(view_of(d, {4}), make_view(bl.get(), DType::boolean, {4}));
  CHECK((bl[0] && bl[1] && bl[2] && bl[3]));
  std::vector<float> f(4);
  cpu::copy(make_view(bl.get(), DType::boolean, {4}), view_of(f, {4}));
  CHECK(f == std::vector<float>{1, 1, 1, 1});
  std::vector<double> zero = {0.0, -0.0};
  cpu::copy(view_of(zero, {2}), make_view(bl.get(), DType::boolean, {2}));
  CHECK((!bl[0] && !bl[1]));
  // bf16 -> f16 goes through float exactly
  std::vector<bf16> b2 = {bf16(1.5f)};
  std::vector<f16> h2(1);
  cpu::copy(view_of(b2, {1}), view_of(h2, {1}));
  CHECK(static_cast<float>(h2[0]) == 1.5f);
}

TEST_CASE("copy from transposed and broadcast views", "[kernels]") {
  // [3, 4] buffer, copied as its [4, 3] transpose into a contiguous tensor.
  std::vector<float> src(12), dst(12);
  for (int k = 0; k < 12; ++k) src[k] = static_cast<float>(k);
  cpu::copy(view_of(src, {4, 3}, {1, 4}), view_of(dst, {4, 3}));
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) REQUIRE(dst[i * 3 + j] == src[j * 4 + i]);
  // a batch of transposes with ragged tiles: [2, 37, 45] viewed from a [2, 45, 37] buffer, into f64
  std::vector<float> batch(2 * 45 * 37);
  for (size_t k = 0; k < batch.size(); ++k) batch[k] = static_cast<float>(k);
  std::vector<double> batch_t(batch.size());
  cpu::copy(view_of(batch, {2, 37, 45}, {45 * 37, 1, 37}), view_of(batch_t, {2, 37, 45}));
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 37; ++i)
      for (int j = 0; j < 45; ++j) REQUIRE(batch_t[(b * 37 + i) * 45 + j] == batch[b * 45 * 37 + j * 37 + i]);
  // a [3] row broadcast to [2, 3] (expand().contiguous())
  std::vector<double> row = {1, 2, 3}, out(6);
  cpu::copy(view_of(row, {2, 3}, {0, 1}), view_of(out, {2, 3}));
  CHECK(out == std::vector<double>{1, 2, 3, 1, 2, 3});
  // 0-d tensors and empty tensors
  std::vector<double> s = {4.0}, so = {0.0};
  cpu::copy(make_view(s.data(), DType::f64, {}), make_view(so.data(), DType::f64, {}));
  CHECK(so[0] == 4.0);
  cpu::copy(make_view(nullptr, DType::f64, {0, 3}), make_view(nullptr, DType::f32, {0, 3}));
}

TEST_CASE("large maps take the same path results as small ones", "[kernels]") {
  // Big enough to be split across threads when OpenMP is on.
  const int64_t rows = 300, cols = 1001;
  auto ad = uniform(rows * cols, -1, 1, 21);
  auto bd = uniform(cols, -1, 1, 22);
  std::vector<double> out(rows * cols), outt(rows * cols);
  cpu::binary(BinaryOp::Add, view_of(ad, {rows, cols}), view_of(bd, {rows, cols}, {0, 1}),
              view_of(out, {rows, cols}));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) REQUIRE(out[i * cols + j] == ad[i * cols + j] + bd[j]);
  // transposed copy of the same big tensor, and a big contiguous copy
  cpu::copy(view_of(out, {cols, rows}, {1, cols}), view_of(outt, {cols, rows}));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) REQUIRE(outt[j * rows + i] == out[i * cols + j]);
  std::vector<double> same(rows * cols);
  cpu::copy(view_of(out, {rows * cols}), view_of(same, {rows * cols}));
  REQUIRE(same == out);
  std::vector<float> f(rows * cols);
  cpu::unary(UnaryOp::Neg, view_of(ad, {rows * cols}), view_of(out, {rows * cols}));
  cpu::copy(view_of(out, {rows * cols}), view_of(f, {rows * cols}));
  for (int64_t k = 0; k < rows * cols; ++k) REQUIRE(f[k] == static_cast<float>(-ad[k]));
}
