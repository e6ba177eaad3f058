// Factories (zeros/ones/full/arange/empty/*_like/tensor<T>) and the Philox RNG:
// reproducibility, distribution checks, a known-answer test against an
// independent Philox4x32-10, per-element independence, generator state.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "base/philox.h"
#include "multigrad.h"
#include "tests/tensor_values.h"

using namespace mg;

using mg::testing::values;

namespace {

// ---- An independent Philox4x32-10, written from the paper (Salmon et al., SC'11)
//      and Random123's reference: counter (4 words), key (2 words).
struct Words4 {
  uint32_t v[4];
};

Words4 reference_philox4x32_10(Words4 ctr, uint32_t key0, uint32_t key1) {
  const uint64_t M0 = 0xD2511F53ull, M1 = 0xCD9E8D57ull;
  const uint32_t W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
  uint32_t k[2] = {key0, key1};
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key schedule: bump before every round after the first
      k[0] += W0;
      k[1] += W1;
    }
    const uint64_t p0 = M0 * ctr.v[0];
    const uint64_t p1 = M1 * ctr.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0 & 0xffffffffu);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1 & 0xffffffffu);
    Words4 next;
    next.v[0] = hi1 ^ ctr.v[1] ^ k[0];
    next.v[1] = lo1;
    next.v[2] = hi0 ^ ctr.v[3] ^ k[1];
    next.v[3] = lo0;
    ctr = next;
  }
  return ctr;
}

// multigrad's convention: key = seed, counter = {element lo, element hi, offset lo, offset hi}.
Words4 reference_for(uint64_t seed, uint64_t element, uint64_t offset) {
  Words4 ctr{{static_cast<uint32_t>(element), static_cast<uint32_t>(element >> 32),
              static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
  return reference_philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

void check_block(const PhiloxBlock& got, const Words4& want) {
  for (int i = 0; i < 4; ++i) {
    INFO("word " << i);
    CHECK(got.word[i] == want.v[i]);
  }
}

// Restores the default generator after a test.
struct GeneratorRestore {
  GeneratorState saved = generator_state();
  ~GeneratorRestore() { set_generator_state(saved); }
};

}  // namespace

// ---- factories ---------------------------------------------------------------
TEST_CASE("zeros, ones, full", "[factories]") {
  Tensor z = zeros({2, 3});
  CHECK(z.shape() == Shape{2, 3});
  CHECK(z.strides() == Shape{3, 1});
  CHECK(z.dtype() == DType::f32);
  CHECK(z.device() == Device::cpu(0));
  CHECK_FALSE(z.requires_grad());
  CHECK(values(z) == std::vector<float>(6, 0.0f));

  Tensor o = ones({4}, TensorOptions{DType::i32});
  CHECK(o.dtype() == DType::i32);
  CHECK(o.to_vector<int32_t>() == std::vector<int32_t>{1, 1, 1, 1});

  Tensor f = full({2, 2}, 7.5, TensorOptions{DType::f64});
  CHECK(f.dtype() == DType::f64);
  CHECK(f.to_vector<double>() == std::vector<double>(4, 7.5));

  Tensor fb = full({3}, 2.0, TensorOptions{DType::boolean});
  CHECK(fb.to_vector<bool>() == std::vector<bool>{true, true, true});
  CHECK(full({2}, 0.0, TensorOptions{DType::boolean}).to_vector<bool>() == std::vector<bool>{false, false});
  CHECK(values(full({2}, -3.25, TensorOptions{DType::f16})) == std::vector<float>{-3.25f, -3.25f});
  CHECK(values(full({2}, 0.1, TensorOptions{DType::bf16}))[0] == static_cast<float>(bf16(0.1f)));
  CHECK(full({1}, -7.0, TensorOptions{DType::i64}).item<int64_t>() == -7);
  CHECK_THROWS_AS(full({1}, 1e20, TensorOptions{DType::i32}), Error);  // out of range for i32

  Tensor g = full({2}, 1.5, TensorOptions{DType::f32, Device::cpu(), true});
  CHECK(g.requires_grad());
  CHECK(g.is_leaf());

  Tensor on1 = zeros({2}, TensorOptions{DType::f32, Device::cpu(1)});
  CHECK(on1.device() == Device::cpu(1));

  Tensor s = scalar_tensor(4.0);
  CHECK(s.dim() == 0);
  CHECK(s.item<float>() == 4.0f);
  CHECK(zeros({}).dim() == 0);
  CHECK(zeros({0, 4}).numel() == 0);
  CHECK_THROWS_AS(zeros({-1, 2}), Error);
}

TEST_CASE("arange", "[factories]") {
  Tensor a = arange(5);
  CHECK(a.dtype() == DType::f32);
  CHECK(values(a) == std::vector<float>{0, 1, 2, 3, 4});

  CHECK(values(arange(2.0, 6.0)) == std::vector<float>{2, 3, 4, 5});
  CHECK(values(arange(5.0, 0.0, -1.0)) == std::vector<float>{5, 4, 3, 2, 1});
  CHECK(values(arange(1.0, -1.0, -0.5)) == std::vector<float>{1.0f, 0.5f, 0.0f, -0.5f});
  CHECK(values(arange(0.0, 1.0, 0.25)) == std::vector<float>{0.0f, 0.25f, 0.5f, 0.75f});

  Tensor frac = arange(0.0, 1.0, 0.3);  // ceil(1/0.3) = 4 elements
  REQUIRE(frac.numel() == 4);
  std::vector<float> fv = values(frac);
  for (int i = 0; i < 4; ++i) CHECK(fv[i] == Approx(0.3 * i));

  Tensor i = arange(-3.0, 3.0, 1.0, TensorOptions{DType::i64});
  CHECK(i.dtype() == DType::i64);
  CHECK(i.to_vector<int64_t>() == std::vector<int64_t>{-3, -2, -1, 0, 1, 2});
  CHECK(arange(4, TensorOptions{DType::i64}).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3});
  CHECK(arange(10.0, 0.0, -3.0, TensorOptions{DType::i32}).to_vector<int32_t>() ==
        std::vector<int32_t>{10, 7, 4, 1});
  CHECK(arange(0.0, 3.0, 1.0, TensorOptions{DType::f64}).to_vector<double>() == std::vector<double>{0, 1, 2});

  CHECK(arange(2.0, 2.0).numel() == 0);
  CHECK(arange(0).numel() == 0);
  CHECK_THROWS_AS(arange(0.0, 1.0, 0.0), Error);
  CHECK_THROWS_AS(arange(0.0, 5.0, -1.0), Error);
  CHECK_THROWS_AS(arange(5.0, 0.0, 1.0), Error);
}

TEST_CASE("empty and *_like", "[factories]") {
  Tensor e = empty({3, 4}, TensorOptions{DType::f64});
  CHECK(e.shape() == Shape{3, 4});
  CHECK(e.dtype() == DType::f64);
  CHECK(e.is_contiguous());
  CHECK(e.nbytes() == 96);
  CHECK(empty({0}).numel() == 0);

  Tensor src = full({2, 3}, 5.0, TensorOptions{DType::bf16, Device::cpu(1), true});
  Tensor z = zeros_like(src);
  CHECK(z.shape() == src.shape());
  CHECK(z.dtype() == DType::bf16);
  CHECK(z.device() == Device::cpu(1));
  CHECK_FALSE(z.requires_grad());
  CHECK(values(z) == std::vector<float>(6, 0.0f));
  CHECK(z.data_ptr() != src.data_ptr());
  Tensor o = ones_like(src);
  CHECK(values(o) == std::vector<float>(6, 1.0f));
  Tensor el = empty_like(src);
  CHECK(el.shape() == src.shape());
  CHECK(el.dtype() == DType::bf16);
  CHECK(el.device() == Device::cpu(1));
  // zeros_like of a non-contiguous tensor is a fresh contiguous tensor.
  Tensor zt = zeros_like(zeros({2, 3}).t());
  CHECK(zt.shape() == Shape{3, 2});
  CHECK(zt.is_contiguous());
}

TEST_CASE("factories reject shapes whose size overflows, naming the factory and the shape",
          "[factories][overflow]") {
  using Catch::Matchers::Contains;
  const int64_t two_62 = int64_t(1) << 62, two_32 = int64_t(1) << 32;
  // Unchecked, 2^62 * 4 bytes wraps to 0: a "2^62-element" tensor over a 0-byte allocation.
  CHECK_THROWS_WITH(empty({two_62}), Contains("empty") && Contains("4611686018427387904"));
  // 2^32 * 2^32 elements is a signed overflow (to 0 in practice).
  CHECK_THROWS_WITH(zeros({two_32, two_32}), Contains("[4294967296, 4294967296]") && Contains("64 bits"));
  CHECK_THROWS_WITH(ones({two_32, two_32, 0}, TensorOptions{DType::f64}), Contains("64 bits"));
  CHECK_THROWS_WITH(full({3, -2}, 1.0), Contains("negative") && Contains("[3, -2]"));
  CHECK_THROWS_WITH(rand({two_62, 4}), Contains("64 bits"));
  CHECK_THROWS_WITH(tensor<float>({1.0f}, {two_32, two_32}), Contains("tensor") && Contains("64 bits"));
  // A zero dim with sane others is an empty tensor, as before.
  CHECK(empty({two_32, 0}).numel() == 0);
  CHECK(empty({two_32, 0}).nbytes() == 0);
}

TEST_CASE("tensor<T> from host vectors, for each dtype", "[factories]") {
  Tensor f = tensor<float>({1.5f, -2.0f});
  CHECK(f.dtype() == DType::f32);
  CHECK(values(f) == std::vector<float>{1.5f, -2.0f});

  Tensor d = tensor<double>({0.1, 1e300}, TensorOptions{DType::f64});
  CHECK(d.dtype() == DType::f64);
  CHECK(d.to_vector<double>() == std::vector<double>{0.1, 1e300});

  Tensor i32 = tensor<int32_t>({-5, 2147483647}, TensorOptions{DType::i32});
  CHECK(i32.dtype() == DType::i32);
  CHECK(i32.to_vector<int32_t>() == std::vector<int32_t>{-5, 2147483647});

  Tensor i64 = tensor<int64_t>({-(int64_t(1) << 40) - 1, 3}, TensorOptions{DType::i64});
  CHECK(i64.dtype() == DType::i64);
  CHECK(i64.to_vector<int64_t>() == std::vector<int64_t>{-(int64_t(1) << 40) - 1, 3});

  Tensor b = tensor<bool>({true, false, true}, TensorOptions{DType::boolean});
  CHECK(b.dtype() == DType::boolean);
  CHECK(b.to_vector<bool>() == std::vector<bool>{true, false, true});

  // Converted to options.dtype (f16/bf16 have no host vector type of their own here).
  Tensor h = tensor<float>({0.5f, 65504.0f, 1e5f}, TensorOptions{DType::f16});
  CHECK(h.dtype() == DType::f16);
  std::vector<float> hv = values(h);
  CHECK(hv[0] == 0.5f);
  CHECK(hv[1] == 65504.0f);
  CHECK(std::isinf(hv[2]));
  Tensor bf = tensor<double>({1.0, 3.0}, TensorOptions{DType::bf16});
  CHECK(bf.dtype() == DType::bf16);
  CHECK(values(bf) == std::vector<float>{1.0f, 3.0f});
  Tensor as_int = tensor<float>({1.7f, -1.7f}, TensorOptions{DType::i32});
  CHECK(as_int.to_vector<int32_t>() == std::vector<int32_t>{1, -1});
  Tensor as_f = tensor<int64_t>({7, -8}, TensorOptions{DType::f32});
  CHECK(values(as_f) == std::vector<float>{7, -8});
  Tensor on1 = tensor<int64_t>({4}, TensorOptions{DType::i64, Device::cpu(1)});
  CHECK(on1.device() == Device::cpu(1));
  CHECK(on1.item<int64_t>() == 4);

  // Shapes.
  Tensor m = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(m.shape() == Shape{2, 3});
  CHECK(m.select(0, 1).select(0, 2).item<float>() == 6.0f);
  CHECK(tensor<float>({9}, Shape{}).dim() == 0);
  CHECK_THROWS_AS(tensor<float>({1, 2, 3}, {2, 2}), Error);
  Tensor g = tensor<float>({1}, {1}, TensorOptions{DType::f32, Device::cpu(), true});
  CHECK(g.requires_grad());
}

// torch::tensor(std::vector<int64_t>{...}) is an int64 tensor, and a vector of bools
// a bool tensor; multigrad's tensor<T>(values) without options converts everything to
// TensorOptions' default f32, which silently loses data: 2^31-1 does not survive a
// round trip through f32, nor does 2^40+1, and 1e300 becomes inf.
TEST_CASE("tensor<T> infers its dtype from T when no dtype is given", "[factories][dtype_inference]") {
  CHECK(tensor<int64_t>({1, 2}).dtype() == DType::i64);
  CHECK(tensor<int32_t>({1, 2}).dtype() == DType::i32);
  CHECK(tensor<bool>({true, false}).dtype() == DType::boolean);
  CHECK(tensor<double>({0.5}).dtype() == DType::f64);
  CHECK(tensor<float>({0.5f}).dtype() == DType::f32);
  CHECK(tensor<int32_t>({2147483647}).to_vector<int32_t>() == std::vector<int32_t>{2147483647});
  CHECK(tensor<int64_t>({(int64_t(1) << 40) + 1}).to_vector<int64_t>() ==
        std::vector<int64_t>{(int64_t(1) << 40) + 1});
  CHECK(tensor<double>({1e300}).to_vector<double>() == std::vector<double>{1e300});
  // Integer class labels work without spelling out the dtype.
  CHECK_NOTHROW(cross_entropy(zeros({2, 3}), tensor<int64_t>({0, 2})));
}

// ---- RNG ---------------------------------------------------------------------
TEST_CASE("manual_seed makes rand/randn/randint reproducible; successive calls differ", "[rng]") {
  GeneratorRestore restore;
  manual_seed(123);
  CHECK(generator_state().seed == 123);
  CHECK(generator_state().offset == 0);
  Tensor r1 = rand({100}), n1 = randn({100}), i1 = randint(0, 1000, {100});
  Tensor r1b = rand({100});
  manual_seed(123);
  Tensor r2 = rand({100}), n2 = randn({100}), i2 = randint(0, 1000, {100});
  Tensor r2b = rand({100});
  CHECK(values(r1) == values(r2));
  CHECK(values(n1) == values(n2));
  CHECK(i1.to_vector<int64_t>() == i2.to_vector<int64_t>());
  CHECK(values(r1b) == values(r2b));
  // Successive calls differ.
  CHECK(values(r1) != values(r1b));
  CHECK(values(rand({100})) != values(rand({100})));
  CHECK(values(randn({100})) != values(randn({100})));
  CHECK(randint(0, 1000, {100}).to_vector<int64_t>() != randint(0, 1000, {100}).to_vector<int64_t>());
  // Different seeds differ.
  manual_seed(124);
  CHECK(values(rand({100})) != values(r1));
  // Shape does not change the values of shared positions (element i is a function of i).
  manual_seed(7);
  std::vector<float> small = values(rand({10}));
  manual_seed(7);
  std::vector<float> big = values(rand({2, 50}));
  CHECK(std::vector<float>(big.begin(), big.begin() + 10) == small);
}

TEST_CASE("rand is uniform on [0, 1)", "[rng]") {
  GeneratorRestore restore;
  manual_seed(2024);
  const int64_t n = 1 << 20;
  std::vector<float> v = values(rand({n}));
  REQUIRE(static_cast<int64_t>(v.size()) == n);
  double sum = 0, sum_sq = 0;
  float lo = 1.0f, hi = 0.0f;
  std::vector<int64_t> bins(10, 0);
  for (float x : v) {
    sum += x;
    sum_sq += static_cast<double>(x) * x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    bins[std::min<int>(static_cast<int>(x * 10), 9)]++;
  }
  CHECK(lo >= 0.0f);
  CHECK(hi < 1.0f);
  const double mean = sum / n;
  const double sigma_mean = std::sqrt(1.0 / 12.0 / n);
  CHECK(std::fabs(mean - 0.5) < 4 * sigma_mean);
  const double var = sum_sq / n - mean * mean;
  // Var of U(0,1) = 1/12; sd of the sample variance ~ sqrt((1/80 - 1/144) / n).
  CHECK(std::fabs(var - 1.0 / 12.0) < 4 * std::sqrt((1.0 / 80 - 1.0 / 144) / n));
  // Each decile holds 10% within 4 sigma of a binomial.
  const double p = 0.1, sd = std::sqrt(n * p * (1 - p));
  for (int b = 0; b < 10; ++b) {
    INFO("bin " << b << " count " << bins[b]);
    CHECK(std::fabs(bins[b] - n * p) < 4 * sd);
  }
  // Other dtypes receive the same draws.
  manual_seed(5);
  std::vector<float> f32 = values(rand({64}));
  manual_seed(5);
  std::vector<double> f64 = rand({64}, TensorOptions{DType::f64}).to_vector<double>();
  for (int i = 0; i < 64; ++i) CHECK(f64[i] == static_cast<double>(f32[i]));
}

TEST_CASE("randn is standard normal", "[rng]") {
  GeneratorRestore restore;
  manual_seed(99);
  const int64_t n = 1 << 20;
  std::vector<float> v = values(randn({n}));
  double sum = 0, sum_sq = 0, sum_4 = 0;
  int64_t within_1 = 0;
  for (float x : v) {
    REQUIRE(std::isfinite(x));
    sum += x;
    sum_sq += static_cast<double>(x) * x;
    if (std::fabs(x) < 1.0f) ++within_1;
  }
  const double mean = sum / n;
  const double var = sum_sq / n - mean * mean;
  for (float x : v) sum_4 += std::pow(static_cast<double>(x) - mean, 4);
  CHECK(std::fabs(mean) < 4.0 / std::sqrt(static_cast<double>(n)));
  CHECK(std::fabs(var - 1.0) < 4.0 * std::sqrt(2.0 / n));
  CHECK(sum_4 / n == Approx(3.0).margin(0.05));  // kurtosis of a normal
  // P(|x| < 1) = 0.682689...
  const double p = 0.6826894921, sd = std::sqrt(n * p * (1 - p));
  CHECK(std::fabs(within_1 - n * p) < 4 * sd);
}

TEST_CASE("randint stays in [low, high) and hits every value", "[rng]") {
  GeneratorRestore restore;
  manual_seed(11);
  Tensor r = randint(-3, 4, {10000});
  CHECK(r.dtype() == DType::i64);
  std::vector<int64_t> v = r.to_vector<int64_t>();
  std::set<int64_t> seen(v.begin(), v.end());
  CHECK(*seen.begin() == -3);
  CHECK(*seen.rbegin() == 3);
  CHECK(seen.size() == 7);
  std::vector<int64_t> counts(7, 0);
  for (int64_t x : v) {
    REQUIRE(x >= -3);
    REQUIRE(x < 4);
    counts[x + 3]++;
  }
  const double p = 1.0 / 7, sd = std::sqrt(10000 * p * (1 - p));
  for (int64_t c : counts) CHECK(std::fabs(c - 10000 * p) < 4 * sd);

  Tensor r32 = randint(0, 2, {1000}, TensorOptions{DType::i32});
  CHECK(r32.dtype() == DType::i32);
  std::vector<int32_t> v32 = r32.to_vector<int32_t>();
  std::set<int32_t> s32(v32.begin(), v32.end());
  CHECK(s32 == std::set<int32_t>{0, 1});
  Tensor big = randint(int64_t(1) << 40, (int64_t(1) << 40) + 5, {200});
  for (int64_t x : big.to_vector<int64_t>()) {
    CHECK(x >= (int64_t(1) << 40));
    CHECK(x < (int64_t(1) << 40) + 5);
  }
  CHECK_THROWS_AS(randint(5, 5, {2}), Error);
  CHECK_THROWS_AS(randint(5, 1, {2}), Error);
}

TEST_CASE("Philox4x32-10 known answers", "[rng][philox]") {
  // The independent reference reproduces Random123's published kat_vectors.
  check_block(PhiloxBlock{{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
              reference_philox4x32_10(Words4{{0, 0, 0, 0}}, 0, 0));
  check_block(PhiloxBlock{{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
              reference_philox4x32_10(Words4{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
                                      0xffffffffu, 0xffffffffu));
  check_block(PhiloxBlock{{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
              reference_philox4x32_10(Words4{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
                                      0xa4093822u, 0x299f31d0u));

  // multigrad's philox4x32_10 (seed, element, offset) against the reference and the published vectors.
  check_block(philox4x32_10(0, 0, 0), reference_for(0, 0, 0));
  check_block(philox4x32_10(0, 0, 0), Words4{{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}});
  check_block(philox4x32_10(~0ull, ~0ull, ~0ull),
              Words4{{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}});
  check_block(philox4x32_10(0x299f31d0a4093822ull, 0x85a308d3243f6a88ull, 0x0370734413198a2eull),
              Words4{{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}});
  const uint64_t seeds[] = {1, 42, 0x5eed, 0xdeadbeefcafef00dull};
  const uint64_t elements[] = {0, 1, 7, 1000003, (1ull << 32) + 5};
  const uint64_t offsets[] = {0, 1, 3, (1ull << 33) + 1};
  for (uint64_t s : seeds)
    for (uint64_t e : elements)
      for (uint64_t o : offsets) {
        INFO("seed " << s << " element " << e << " offset " << o);
        check_block(philox4x32_10(s, e, o), reference_for(s, e, o));
      }
  // philox_uniform uses the top 24 bits of word 0.
  const Words4 w = reference_for(42, 17, 3);
  CHECK(philox_uniform(42, 17, 3) == static_cast<float>(w.v[0] >> 8) / 16777216.0f);
}

TEST_CASE("each element of a random call can be computed alone", "[rng][philox]") {
  GeneratorRestore restore;
  manual_seed(31337);
  rand({3});  // advance the offset so it is not 0
  const GeneratorState before = generator_state();
  CHECK(before.offset == 1);
  std::vector<float> r = values(rand({2, 500}));
  CHECK(generator_state().offset == before.offset + 1);
  for (int64_t i = 0; i < 1000; ++i) {
    INFO("element " << i);
    REQUIRE(r[static_cast<size_t>(i)] ==
            philox_uniform(before.seed, static_cast<uint64_t>(i), before.offset));
  }
  const GeneratorState before_n = generator_state();
  std::vector<float> n = values(randn({300}));
  for (int64_t i = 0; i < 300; ++i)
    REQUIRE(n[static_cast<size_t>(i)] ==
            philox_normal(before_n.seed, static_cast<uint64_t>(i), before_n.offset));
  // Dropout takes its own offset too.
  const GeneratorState before_d = generator_state();
  dropout(ones({10}), 0.5, true);
  CHECK(generator_state().offset == before_d.offset + 1);
}

TEST_CASE("generator_state / set_generator_state round-trip", "[rng]") {
  GeneratorRestore restore;
  manual_seed(77);
  rand({5});
  const GeneratorState saved = generator_state();
  std::vector<float> a = values(rand({50}));
  std::vector<float> a_n = values(randn({50}));
  std::vector<int64_t> a_i = randint(0, 100, {50}).to_vector<int64_t>();
  set_generator_state(saved);
  CHECK(generator_state().seed == saved.seed);
  CHECK(generator_state().offset == saved.offset);
  CHECK(values(rand({50})) == a);
  CHECK(values(randn({50})) == a_n);
  CHECK(randint(0, 100, {50}).to_vector<int64_t>() == a_i);
  // An arbitrary state is honoured exactly.
  set_generator_state(GeneratorState{9, 1234});
  std::vector<float> x = values(rand({4}));
  for (int i = 0; i < 4; ++i) CHECK(x[i] == philox_uniform(9, static_cast<uint64_t>(i), 1234));
  CHECK(generator_state().offset == 1235);
  // manual_seed resets the offset.
  manual_seed(77);
  CHECK(generator_state().offset == 0);
}
