// Tests for kernels/cpu/embedding: the gather against direct indexing, the
// scatter-add backward against a naive loop and central finite differences in
// f64 (repeated indices, padding_idx), bf16 accumulation of repeated rows, and
// the error raised for an out-of-range index.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "kernels/cpu/embedding.h"
#include "tests/kernels/kernel_test_values.h"

using mg::DType;

using namespace mg::kernel_test;

namespace {

std::vector<double> random_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

template <class T>
std::vector<double> run_forward(DType dtype, const std::vector<double>& weight, int64_t num, int64_t dim,
                                const std::vector<int64_t>& indices) {
  std::vector<T> w = cast_to<T>(weight), out(indices.size() * static_cast<size_t>(dim));
  mg::kernels::cpu::embedding_forward(dtype, w.data(), num, dim, indices.data(),
                                      static_cast<int64_t>(indices.size()), out.data());
  return to_double(out);
}

template <class T>
std::vector<double> run_backward(DType dtype, const std::vector<double>& grad_out,
                                 const std::vector<int64_t>& indices, int64_t dim, int64_t num,
                                 int64_t padding_idx) {
  std::vector<T> g = cast_to<T>(grad_out);
  std::vector<T> gw(static_cast<size_t>(num * dim), static_cast<T>(123.0f));  // garbage: must be zeroed
  mg::kernels::cpu::embedding_backward(dtype, g.data(), indices.data(), static_cast<int64_t>(indices.size()),
                                       dim, num, padding_idx, gw.data());
  return to_double(gw);
}

std::vector<double> reference_backward(const std::vector<double>& grad_out,
                                       const std::vector<int64_t>& indices, int64_t dim, int64_t num,
                                       int64_t padding_idx) {
  std::vector<double> gw(static_cast<size_t>(num * dim), 0.0);
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] == padding_idx) continue;
    for (int64_t d = 0; d < dim; ++d) gw[indices[i] * dim + d] += grad_out[i * dim + d];
  }
  return gw;
}

constexpr int64_t kNum = 6, kDim = 5;
const std::vector<int64_t> kIndices = {2, 0, 2, 5, 2, 3, 0};  // 2 three times, 0 twice, 1 and 4 never

}  // namespace

TEST_CASE("embedding forward gathers rows", "[kernels]") {
  std::vector<double> w = random_values(kNum * kDim, 41);
  std::vector<double> out64 = run_forward<double>(DType::f64, w, kNum, kDim, kIndices);
  std::vector<double> out16 = run_forward<mg::bf16>(DType::bf16, w, kNum, kDim, kIndices);
  std::vector<double> w16 = to_double(cast_to<mg::bf16>(w));
  for (size_t i = 0; i < kIndices.size(); ++i)
    for (int64_t d = 0; d < kDim; ++d) {
      CHECK(out64[i * kDim + d] == w[kIndices[i] * kDim + d]);
      CHECK(out16[i * kDim + d] == w16[kIndices[i] * kDim + d]);  // a copy: bit exact
    }
  std::vector<double> out32 = run_forward<float>(DType::f32, w, kNum, kDim, {});
  CHECK(out32.empty());
}

TEST_CASE("embedding backward sums repeated indices and skips padding_idx", "[kernels][gradcheck]") {
  std::vector<double> g = random_values(static_cast<int64_t>(kIndices.size()) * kDim, 42);
  for (int64_t padding_idx : {int64_t{-1}, int64_t{2}, int64_t{4}}) {
    INFO("padding_idx " << padding_idx);
    std::vector<double> want = reference_backward(g, kIndices, kDim, kNum, padding_idx);
    std::vector<double> got = run_backward<double>(DType::f64, g, kIndices, kDim, kNum, padding_idx);
    for (size_t k = 0; k < want.size(); ++k) REQUIRE(got[k] == Approx(want[k]).margin(1e-15));
    if (padding_idx >= 0)
      for (int64_t d = 0; d < kDim; ++d) CHECK(got[padding_idx * kDim + d] == 0.0);
    for (int64_t d = 0; d < kDim; ++d) CHECK(got[1 * kDim + d] == 0.0);  // never looked up

    // Finite differences of L = sum(g * forward(w)) with respect to w; the
    // padding row is excluded since its gradient is zero by definition.
    std::vector<double> w = random_values(kNum * kDim, 43);
    auto loss = [&](const std::vector<double>& ws) {
      std::vector<double> out = run_forward<double>(DType::f64, ws, kNum, kDim, kIndices);
      double total = 0;
      for (size_t k = 0; k < out.size(); ++k) total += g[k] * out[k];
      return total;
    };
    const double h = 1e-6;
    for (size_t k = 0; k < w.size(); ++k) {
      if (padding_idx >= 0 && static_cast<int64_t>(k) / kDim == padding_idx) continue;
      std::vector<double> plus = w, minus = w;
      plus[k] += h;
      minus[k] -= h;
      INFO("weight element " << k);
      REQUIRE(got[k] == Approx((loss(plus) - loss(minus)) / (2 * h)).margin(1e-8).epsilon(1e-6));
    }
  }
}

TEST_CASE("embedding backward accumulates halves in float", "[kernels]") {
  // 1000 lookups of row 0, each contributing 1.0: summed in bf16 the total would
  // stall at 256 (256 + 1 rounds back to 256); accumulated in float and stored
  // once it is exactly 1000 (representable in bf16).
  const int64_t count = 1000;
  std::vector<int64_t> indices(static_cast<size_t>(count), 0);
  std::vector<double> g(static_cast<size_t>(count * 2), 1.0);
  std::vector<double> got = run_backward<mg::bf16>(DType::bf16, g, indices, 2, 3, -1);
  CHECK(got[0] == 1000.0);
  CHECK(got[1] == 1000.0);
  CHECK(got[2] == 0.0);
  std::vector<double> got16 = run_backward<mg::f16>(DType::f16, g, indices, 2, 3, -1);
  CHECK(got16[0] == 1000.0);

  std::vector<double> g32 = random_values(static_cast<int64_t>(kIndices.size()) * kDim, 44);
  std::vector<double> want = reference_backward(g32, kIndices, kDim, kNum, -1);
  std::vector<double> got32 = run_backward<float>(DType::f32, g32, kIndices, kDim, kNum, -1);
  for (size_t k = 0; k < want.size(); ++k) REQUIRE(got32[k] == Approx(want[k]).margin(1e-6));
}

TEST_CASE("embedding backward is independent of thread scheduling on a large input", "[kernels]") {
  // Large enough to take the parallel path when built with OpenMP.
  const int64_t num = 300, dim = 64, count = 4000;
  std::vector<int64_t> indices(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) indices[i] = (i * 7919) % num;
  std::vector<double> g = random_values(count * dim, 45);
  std::vector<double> got = run_backward<double>(DType::f64, g, indices, dim, num, 5);
  std::vector<double> want = reference_backward(g, indices, dim, num, 5);
  for (size_t k = 0; k < want.size(); ++k) REQUIRE(got[k] == Approx(want[k]).margin(1e-12));
}

TEST_CASE("embedding rejects out-of-range indices, naming position and value", "[kernels]") {
  std::vector<float> w(kNum * kDim, 1.0f), out(3 * kDim, -1.0f), gw(kNum * kDim, -1.0f), g(3 * kDim, 1.0f);
  std::vector<int64_t> too_big = {0, 6, 1};
  REQUIRE_THROWS_AS(
      mg::kernels::cpu::embedding_forward(DType::f32, w.data(), kNum, kDim, too_big.data(), 3, out.data()),
      mg::Error);
  REQUIRE_THROWS_WITH(
      mg::kernels::cpu::embedding_forward(DType::f32, w.data(), kNum, kDim, too_big.data(), 3, out.data()),
      Catch::Contains("index 6") && Catch::Contains("position 1"));
  for (float v : out) CHECK(v == -1.0f);  // nothing written

  std::vector<int64_t> negative = {0, 1, -1};
  REQUIRE_THROWS_WITH(mg::kernels::cpu::embedding_backward(DType::f32, g.data(), negative.data(), 3, kDim,
                                                           kNum, -1, gw.data()),
                      Catch::Contains("index -1") && Catch::Contains("position 2"));
  std::vector<int64_t> ok = {0, 1, 2};
  REQUIRE_THROWS_WITH(
      mg::kernels::cpu::embedding_backward(DType::f32, g.data(), ok.data(), 3, kDim, kNum, kNum, gw.data()),
      Catch::Contains("padding_idx 6"));
}
