// Casts among the 7 dtypes (Tensor::to), f16/bf16 conversions (all 65536 bit
// patterns, rounding to nearest even), and the dtype tables (size, name,
// promotion).
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "multigrad.h"
#include "tests/tensor_values.h"

using namespace mg;

using mg::testing::values;

namespace {

const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::f16,    DType::bf16,
                                       DType::i32, DType::i64, DType::boolean};

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 decoded with ldexp, independently of mg::f16.
double decode_half(uint16_t h) {
  const int sign = (h >> 15) & 1, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  double v;
  if (exponent == 0x1f) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    v = std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
  }
  return sign ? -v : v;
}

// bfloat16 decoded with ldexp, independently of mg::bf16.
double decode_bfloat(uint16_t h) {
  const int sign = (h >> 15) & 1, exponent = (h >> 7) & 0xff, mantissa = h & 0x7f;
  double v;
  if (exponent == 0xff) {
    v = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    v = std::ldexp(static_cast<double>(mantissa), -133);  // m/128 * 2^-126
  } else {
    v = std::ldexp(1.0 + mantissa / 128.0, exponent - 127);
  }
  return sign ? -v : v;
}

f16 half_from_bits(uint16_t b) {
  f16 h;
  h.bits = b;
  return h;
}
bf16 bfloat_from_bits(uint16_t b) {
  bf16 h;
  h.bits = b;
  return h;
}

}  // namespace

TEST_CASE("dtype_size, dtype_name, is_floating, is_integral", "[dtype]") {
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::f64) == 8);
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::i32) == 4);
  CHECK(dtype_size(DType::i64) == 8);
  CHECK(dtype_size(DType::boolean) == 1);
  CHECK(std::string(dtype_name(DType::f32)) == "f32");
  CHECK(std::string(dtype_name(DType::f64)) == "f64");
  CHECK(std::string(dtype_name(DType::f16)) == "f16");
  CHECK(std::string(dtype_name(DType::bf16)) == "bf16");
  CHECK(std::string(dtype_name(DType::i32)) == "i32");
  CHECK(std::string(dtype_name(DType::i64)) == "i64");
  CHECK(std::string(dtype_name(DType::boolean)) == "bool");
  CHECK(sizeof(f16) == 2);
  CHECK(sizeof(bf16) == 2);
  for (DType t : kAllDTypes) {
    INFO(dtype_name(t));
    Tensor x = zeros({3}, TensorOptions{t});
    CHECK(x.dtype() == t);
    CHECK(x.itemsize() == dtype_size(t));
    CHECK(x.nbytes() == 3 * dtype_size(t));
    const bool floating = t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
    CHECK(is_floating(t) == floating);
    CHECK(is_integral(t) == (t == DType::i32 || t == DType::i64));
  }
  CHECK(dtype_of<float>() == DType::f32);
  CHECK(dtype_of<f16>() == DType::f16);
  CHECK(dtype_of<bool>() == DType::boolean);
}

TEST_CASE("promote_types table", "[dtype]") {
  using D = DType;
  // Rows/cols in kAllDTypes order: f32 f64 f16 bf16 i32 i64 bool.
  const D expected[7][7] = {
      /* f32  */ {D::f32, D::f64, D::f32, D::f32, D::f32, D::f32, D::f32},
      /* f64  */ {D::f64, D::f64, D::f64, D::f64, D::f64, D::f64, D::f64},
      /* f16  */ {D::f32, D::f64, D::f16, D::f32, D::f16, D::f16, D::f16},
      /* bf16 */ {D::f32, D::f64, D::f32, D::bf16, D::bf16, D::bf16, D::bf16},
      /* i32  */ {D::f32, D::f64, D::f16, D::bf16, D::i32, D::i64, D::i32},
      /* i64  */ {D::f32, D::f64, D::f16, D::bf16, D::i64, D::i64, D::i64},
      /* bool */ {D::f32, D::f64, D::f16, D::bf16, D::i32, D::i64, D::boolean},
  };
  for (size_t i = 0; i < 7; ++i)
    for (size_t j = 0; j < 7; ++j) {
      INFO(dtype_name(kAllDTypes[i]) << " with " << dtype_name(kAllDTypes[j]));
      CHECK(promote_types(kAllDTypes[i], kAllDTypes[j]) == expected[i][j]);
    }
}

TEST_CASE("binary ops produce the promoted dtype for every pair", "[dtype]") {
  for (DType a : kAllDTypes)
    for (DType b : kAllDTypes) {
      INFO(dtype_name(a) << " * " << dtype_name(b));
      Tensor x = full({2}, 1.0, TensorOptions{a});
      Tensor y = full({2}, 1.0, TensorOptions{b});
      Tensor p = mul(x, y);
      CHECK(p.dtype() == promote_types(a, b));
      CHECK(p.to_vector<double>() == std::vector<double>{1.0, 1.0});
    }
}

TEST_CASE("casts among all 7 dtypes keep small integers", "[cast]") {
  const std::vector<double> src_values = {0, 1, 2, 5};
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      INFO(dtype_name(from) << " -> " << dtype_name(to));
      Tensor x = tensor<double>(src_values, TensorOptions{from});
      Tensor y = x.to(to);
      CHECK(y.dtype() == to);
      CHECK(y.shape() == Shape{4});
      std::vector<double> got = y.to_vector<double>();
      for (size_t i = 0; i < src_values.size(); ++i) {
        double want = src_values[i];
        if (from == DType::boolean || to == DType::boolean) want = want != 0 ? 1.0 : 0.0;
        CHECK(got[i] == want);
      }
      // Round trip back to the source dtype.
      if (from != DType::boolean && to != DType::boolean) CHECK(y.to(from).to_vector<double>() == src_values);
    }
}

TEST_CASE("float -> int truncates toward zero; -> bool tests != 0", "[cast]") {
  const std::vector<double> v = {-2.75, -1.0, -0.5, 0.0, 0.5, 1.0, 3.25, 100.5};
  for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    INFO("from " << dtype_name(from));
    Tensor x = tensor<double>(v, TensorOptions{from});
    CHECK(x.to(DType::i32).to_vector<int32_t>() == std::vector<int32_t>{-2, -1, 0, 0, 0, 1, 3, 100});
    CHECK(x.to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{-2, -1, 0, 0, 0, 1, 3, 100});
    CHECK(x.to(DType::boolean).to_vector<bool>() ==
          std::vector<bool>{true, true, true, false, true, true, true, true});
  }
  // -0.0 and tiny values.
  CHECK(tensor<float>({-0.0f, 1e-30f}).to(DType::boolean).to_vector<bool>() ==
        std::vector<bool>{false, true});
  CHECK(tensor<float>({-0.999f, 0.999f}).to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{0, 0});
  // Large values.
  CHECK(tensor<double>({1099511627776.0}).to(DType::i64).item<int64_t>() == (int64_t(1) << 40));
  CHECK(tensor<double>({-2147483648.0}).to(DType::i32).item<int32_t>() == INT32_MIN);
  CHECK(tensor<int64_t>({(int64_t(1) << 53)}).to(DType::f64).item<double>() == 9007199254740992.0);
  CHECK(tensor<int64_t>({(int64_t(1) << 24) + 1}).to(DType::f32).item<float>() == 16777216.0f);
  CHECK(tensor<int32_t>({-7}).to(DType::f16).item<float>() == -7.0f);
  CHECK(tensor<int32_t>({-7, 0}).to(DType::boolean).to_vector<bool>() == std::vector<bool>{true, false});
  CHECK(tensor<bool>({true, false}).to(DType::f32).to_vector<float>() == std::vector<float>{1.0f, 0.0f});
  CHECK(tensor<bool>({true, false}).to(DType::bf16).to_vector<float>() == std::vector<float>{1.0f, 0.0f});
  CHECK(tensor<bool>({true, false}).to(DType::i64).to_vector<int64_t>() == std::vector<int64_t>{1, 0});
}

TEST_CASE("float -> int of NaN, infinities and out-of-range values saturates, as the GPU does", "[cast]") {
  // C++ leaves these casts undefined; PTX's cvt.rzi gives NaN -> 0 and clamps to the bounds.
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> v = {std::nan(""), inf, -inf, 1e300, -1e300, 3e9, -3e9, 2147483647.5};
  for (DType from : {DType::f32, DType::f64}) {
    INFO("from " << dtype_name(from));
    Tensor x = tensor<double>(v, TensorOptions{from});
    const int32_t lo = INT32_MIN, hi = INT32_MAX;
    // 2147483647.5 is 2^31 in f32 (out of range: the bound), and truncates to 2^31 - 1 in f64.
    CHECK(x.to(DType::i32).to_vector<int32_t>() == std::vector<int32_t>{0, hi, lo, hi, lo, hi, lo, hi});
    const int64_t lo64 = INT64_MIN, hi64 = INT64_MAX;
    CHECK(x.to(DType::i64).to_vector<int64_t>() ==
          std::vector<int64_t>{0, hi64, lo64, hi64, lo64, 3000000000, -3000000000,
                               from == DType::f32 ? 2147483648 : 2147483647});
  }
  // The first double at or beyond 2^63 is the bound; the largest below it converts exactly.
  CHECK(tensor<double>({9223372036854775808.0}).to(DType::i64).item<int64_t>() == INT64_MAX);
  CHECK(tensor<double>({9223372036854774784.0}).to(DType::i64).item<int64_t>() == 9223372036854774784);
  CHECK(tensor<double>({-9223372036854775808.0}).to(DType::i64).item<int64_t>() == INT64_MIN);
  CHECK(tensor<float>({std::nanf("")}).to(DType::f16).to(DType::i32).item<int32_t>() == 0);
  CHECK(tensor<float>({-1e30f}).to(DType::bf16).to(DType::i32).item<int32_t>() == INT32_MIN);
}

TEST_CASE("integer +, - and * wrap around on overflow, as on the GPU (and in PyTorch)", "[cast]") {
  // Signed overflow is undefined in C++; the kernels compute in unsigned arithmetic. Found by the
  // FSDP checkpoint fuzzer: a BatchNorm's loaded num_batches_tracked at INT64_MAX, then += 1.
  Tensor counter = tensor<int64_t>({INT64_MAX, INT64_MIN, 3});
  counter.add_(1.0);
  CHECK(counter.to_vector<int64_t>() == std::vector<int64_t>{INT64_MIN, INT64_MIN + 1, 4});
  CHECK(sub(tensor<int64_t>({INT64_MIN}), tensor<int64_t>({1})).item<int64_t>() == INT64_MAX);
  CHECK(mul(tensor<int64_t>({INT64_MAX}), tensor<int64_t>({2})).item<int64_t>() == -2);
  CHECK(add(tensor<int32_t>({INT32_MAX}), tensor<int32_t>({1})).item<int32_t>() == INT32_MIN);
  CHECK(mul(tensor<int32_t>({65536}), tensor<int32_t>({65536})).item<int32_t>() == 0);
}

TEST_CASE("0.1 in bf16 and f16: rounding error within half an ulp", "[cast][half]") {
  const float bf = tensor<float>({0.1f}).to(DType::bf16).to(DType::f32).item<float>();
  CHECK(std::fabs(bf - 0.1) <= 0.1 * std::ldexp(1.0, -8));
  CHECK(bf == 0.10009765625f);  // 0x3DCD: rounded up from 0x3DCCCCCD

  const float h = tensor<float>({0.1f}).to(DType::f16).to(DType::f32).item<float>();
  CHECK(std::fabs(h - 0.1) <= 0.1 * std::ldexp(1.0, -11));
  CHECK(h == 0.0999755859375f);  // 0x2E66

  // From f64 as well.
  CHECK(tensor<double>({0.1}).to(DType::bf16).item<float>() == 0.10009765625f);
  CHECK(tensor<double>({0.1}).to(DType::f16).item<float>() == 0.0999755859375f);

  // bf16 -> f16 -> bf16 of a value exact in both.
  CHECK(tensor<float>({0.375f}).to(DType::bf16).to(DType::f16).to(DType::bf16).item<float>() == 0.375f);

  // Many values: the relative error stays within the unit roundoff.
  for (int i = 1; i < 2000; ++i) {
    const float x = static_cast<float>(i) * 0.0123f;
    const double eb = std::fabs(static_cast<float>(bf16(x)) - static_cast<double>(x)) / x;
    const double eh = std::fabs(static_cast<float>(f16(x)) - static_cast<double>(x)) / x;
    REQUIRE(eb <= std::ldexp(1.0, -8));
    REQUIRE(eh <= std::ldexp(1.0, -11));
  }
}

TEST_CASE("overflow, underflow, NaN", "[cast][half]") {
  Tensor big = tensor<float>({70000.0f, -70000.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 6e-8f, -1e-9f});
  std::vector<float> h = values(big.to(DType::f16));
  CHECK(std::isinf(h[0]));
  CHECK(h[0] > 0);
  CHECK(std::isinf(h[1]));
  CHECK(h[1] < 0);
  CHECK(h[2] == 65504.0f);  // the largest finite half
  CHECK(h[3] == 65504.0f);  // below the midpoint to infinity
  CHECK(std::isinf(h[4]));  // the midpoint rounds to even = infinity
  CHECK(h[5] == 0.0f);
  CHECK(h[6] == std::ldexp(1.0f, -24));  // nearest subnormal
  CHECK(h[7] == 0.0f);
  CHECK(std::signbit(h[7]));  // -0 keeps its sign

  CHECK(f16(std::ldexp(1.0f, -25)).bits == 0x0000);      // tie -> even (zero)
  CHECK(f16(3 * std::ldexp(1.0f, -25)).bits == 0x0002);  // tie between 1 and 2 ulps -> 2
  CHECK(f16(std::ldexp(1.0f, -24)).bits == 0x0001);
  CHECK(f16(std::ldexp(1.0f, -14)).bits == 0x0400);     // smallest normal
  CHECK(f16(std::ldexp(1023.0f, -24)).bits == 0x03ff);  // largest subnormal
  CHECK(f16(1.0f).bits == 0x3c00);
  CHECK(f16(-2.0f).bits == 0xc000);
  CHECK(f16(2049.0f).bits == f16(2048.0f).bits);       // tie -> even
  CHECK(static_cast<float>(f16(2051.0f)) == 2052.0f);  // tie -> even (up)

  std::vector<float> b = values(tensor<float>({3.4e38f, 1e38f, -3.4e38f}).to(DType::bf16));
  CHECK(std::isinf(b[0]));
  CHECK(std::isfinite(b[1]));
  CHECK(b[1] == Approx(1e38).epsilon(0.01));
  CHECK(std::isinf(b[2]));
  CHECK(bf16(1.0f).bits == 0x3f80);

  CHECK(std::isinf(tensor<double>({1e300}).to(DType::f32).item<float>()));
  CHECK(std::isinf(tensor<double>({1e10}).to(DType::f16).item<float>()));
  CHECK(tensor<double>({1e-300}).to(DType::f32).item<float>() == 0.0f);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor n = tensor<float>({nan, 1.0f});
  CHECK(std::isnan(values(n.to(DType::f16))[0]));
  CHECK(std::isnan(values(n.to(DType::bf16))[0]));
  CHECK(std::isnan(n.to(DType::f64).to_vector<double>()[0]));
  CHECK(n.to(DType::boolean).to_vector<bool>() == std::vector<bool>{true, true});
  CHECK(std::isnan(static_cast<float>(f16(nan))));
  CHECK(std::isnan(static_cast<float>(bf16(nan))));
  // A signalling-looking NaN whose payload sits only in the low bits stays NaN in bf16.
  CHECK(std::isnan(static_cast<float>(bf16(bits_to_float(0x7f800001u)))));
  CHECK(std::isnan(static_cast<float>(f16(bits_to_float(0x7f800001u)))));
  CHECK(std::isinf(static_cast<float>(f16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isinf(static_cast<float>(bf16(-std::numeric_limits<float>::infinity()))));
}

TEST_CASE("f16: all 65536 bit patterns decode correctly and round-trip", "[half]") {
  int nan_count = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = static_cast<float>(half_from_bits(bits));
    const double want = decode_half(bits);
    if (std::isnan(want)) {
      ++nan_count;
      REQUIRE(std::isnan(f));
      const uint16_t back = f16(f).bits;
      REQUIRE((back & 0x7c00) == 0x7c00);
      REQUIRE((back & 0x03ff) != 0);
      REQUIRE((back & 0x8000) == (bits & 0x8000));
      continue;
    }
    INFO("bits 0x" << std::hex << b);
    REQUIRE(static_cast<double>(f) == want);
    REQUIRE(std::signbit(f) == static_cast<bool>(bits & 0x8000));
    REQUIRE(f16(f).bits == bits);
  }
  CHECK(nan_count == 2 * 1023);
}

TEST_CASE("bf16: all 65536 bit patterns decode correctly and round-trip", "[half]") {
  int nan_count = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = static_cast<float>(bfloat_from_bits(bits));
    const double want = decode_bfloat(bits);
    if (std::isnan(want)) {
      ++nan_count;
      REQUIRE(std::isnan(f));
      REQUIRE(std::isnan(static_cast<float>(bf16(f))));
      continue;
    }
    INFO("bits 0x" << std::hex << b);
    REQUIRE(static_cast<double>(f) == want);
    REQUIRE(bf16(f).bits == bits);
  }
  CHECK(nan_count == 2 * 127);
}

TEST_CASE("f16 and bf16 round to nearest, ties to even, at every midpoint", "[half]") {
  // Between each pair of adjacent positive finite values: just below the midpoint
  // rounds down, just above rounds up, the midpoint itself goes to the even one.
  for (uint32_t b = 0; b < 0x7bff; ++b) {
    const float lo = static_cast<float>(half_from_bits(static_cast<uint16_t>(b)));
    const float hi = static_cast<float>(half_from_bits(static_cast<uint16_t>(b + 1)));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in float
    INFO("f16 bits 0x" << std::hex << b);
    REQUIRE(f16(std::nextafter(mid, 0.0f)).bits == b);
    REQUIRE(f16(std::nextafter(mid, std::numeric_limits<float>::infinity())).bits == b + 1);
    REQUIRE(f16(mid).bits == ((b & 1) ? b + 1 : b));
    REQUIRE(f16(-mid).bits == (0x8000u | ((b & 1) ? b + 1 : b)));
  }
  for (uint32_t b = 0; b < 0x7f7f; ++b) {
    const float lo = static_cast<float>(bfloat_from_bits(static_cast<uint16_t>(b)));
    const float hi = static_cast<float>(bfloat_from_bits(static_cast<uint16_t>(b + 1)));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);
    INFO("bf16 bits 0x" << std::hex << b);
    REQUIRE(bf16(std::nextafter(mid, 0.0f)).bits == b);
    REQUIRE(bf16(std::nextafter(mid, std::numeric_limits<float>::infinity())).bits == b + 1);
    REQUIRE(bf16(mid).bits == ((b & 1) ? b + 1 : b));
  }
}

TEST_CASE("Tensor::to details", "[cast]") {
  Tensor x = tensor<float>({1, 2, 3});
  CHECK(x.to(DType::f32).is_same(x));  // no-op returns the same tensor
  CHECK(x.to(Device::cpu(0)).is_same(x));
  CHECK(cast(x, DType::f32).is_same(x));
  Tensor y = x.to(DType::f64);
  CHECK_FALSE(y.is_same(x));
  CHECK(y.data_ptr() != x.data_ptr());
  // Cast and move in one step.
  Tensor z = x.to(Device::cpu(1), DType::i32);
  CHECK(z.device() == Device::cpu(1));
  CHECK(z.dtype() == DType::i32);
  CHECK(z.to_vector<int32_t>() == std::vector<int32_t>{1, 2, 3});
  // Non-contiguous source: result is contiguous, in logical order.
  Tensor t = tensor<float>({0, 1, 2, 3, 4, 5}, {2, 3}).t();
  Tensor ti = t.to(DType::i64);
  CHECK(ti.is_contiguous());
  CHECK(ti.shape() == Shape{3, 2});
  CHECK(ti.to_vector<int64_t>() == std::vector<int64_t>{0, 3, 1, 4, 2, 5});
  // A cast is a copy: writing the result leaves the source alone.
  y.fill_(9.0);
  CHECK(values(x) == std::vector<float>{1, 2, 3});
  // Gradients flow back through a float cast, in the source dtype.
  Tensor w = tensor<float>({1.5f, -2.0f}, Shape{2}, TensorOptions{DType::f32, Device::cpu(), true});
  Tensor w16 = w.to(DType::bf16);
  CHECK(w16.requires_grad());
  mul(w16.to(DType::f64), 3.0).sum().backward();
  CHECK(w.grad().dtype() == DType::f32);
  CHECK(values(w.grad()) == std::vector<float>{3.0f, 3.0f});
}
