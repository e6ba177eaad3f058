// Finite-difference gradient checks (f64, CPU) for linear algebra and the neural-network
// ops of core/ops.h: matmul (every rank combination, broadcasting batch dims, transposed
// operands), linear, softmax / log_softmax, cross_entropy, layer_norm, embedding, dropout,
// conv2d, max_pool2d and avg_pool2d.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/gradcheck.h"

namespace {

using mg::DType;
using mg::Shape;
using mg::Tensor;
using mg::testing::random_input;
using Inputs = std::vector<Tensor>;

using mg::testing::gradcheck;

using mg::testing::kF64;
const mg::TensorOptions kI64{DType::i64};

using mg::testing::grid_input;

Tensor distinct_pool_input(const Shape& shape, uint32_t seed) {
  const int64_t n = mg::shape_numel(shape);
  return grid_input(shape, -1.0, 2.0 / static_cast<double>(n), seed);
}

Tensor indices(const std::vector<int64_t>& values, const Shape& shape) {
  return mg::tensor<int64_t>(values, shape, kI64);
}

mg::CrossEntropyOptions ce_options(mg::Reduction reduction, int64_t ignore_index = -100,
                                   double smoothing = 0.0) {
  mg::CrossEntropyOptions o;
  o.reduction = reduction;
  o.ignore_index = ignore_index;
  o.label_smoothing = smoothing;
  return o;
}

mg::Conv2dOptions conv_options(int64_t stride, int64_t pad, int64_t dilation) {
  mg::Conv2dOptions o;
  o.stride_h = o.stride_w = stride;
  o.pad_h = o.pad_w = pad;
  o.dilation_h = o.dilation_w = dilation;
  return o;
}

mg::Pool2dOptions pool_options(int64_t kernel, int64_t stride, int64_t pad, bool count_include_pad = true) {
  mg::Pool2dOptions o{kernel, kernel};
  o.stride_h = o.stride_w = stride;
  o.pad_h = o.pad_w = pad;
  o.count_include_pad = count_include_pad;
  return o;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// matmul
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck matmul 2-d [3,4] @ [4,5]", "[gradcheck][linalg]") {
  mg::manual_seed(1);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({3, 4}), random_input({4, 5})}));
}

TEST_CASE("gradcheck matmul 1-d . 1-d (dot)", "[gradcheck][linalg]") {
  mg::manual_seed(2);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({5}), random_input({5})}));
}

TEST_CASE("gradcheck matmul 2-d @ 1-d [3,4] @ [4]", "[gradcheck][linalg]") {
  mg::manual_seed(3);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({3, 4}), random_input({4})}));
}

TEST_CASE("gradcheck matmul 1-d @ 2-d [4] @ [4,5]", "[gradcheck][linalg]") {
  mg::manual_seed(4);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({4}), random_input({4, 5})}));
}

TEST_CASE("gradcheck matmul batched broadcast [2,1,3,4] @ [5,4,2]", "[gradcheck][linalg]") {
  mg::manual_seed(5);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({2, 1, 3, 4}), random_input({5, 4, 2})}));
}

TEST_CASE("gradcheck matmul batched 3-d @ 2-d [2,3,4] @ [4,5]", "[gradcheck][linalg]") {
  mg::manual_seed(6);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({2, 3, 4}), random_input({4, 5})}));
}

TEST_CASE("gradcheck matmul 3-d @ 2-d whose batch dims do not fold into the rows (a strided view)",
          "[gradcheck][linalg]") {
  // [3,2,4] transposed to [2,3,4]: its rows are not one stride apart, so the product runs as a
  // broadcast batch; the contiguous case above runs folded, as one [6,4] @ [4,5] product.
  mg::manual_seed(16);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0].transpose(0, 1), in[1]); },
                                 {random_input({3, 2, 4}), random_input({4, 5})}));
}

TEST_CASE("a matrix shared by every batch entry gets its gradient from one product, not a stack",
          "[linalg][memory]") {
  // [B, T, C] @ [C, N] (Linear's weight applied to a batch of sequences) folds the batch into the
  // rows; the weight's gradient is then one [C, N] GEMM. Summed from a broadcast batch it would
  // hold a [B, C, N] stack of per-entry gradients first: B times the gradient's bytes.
  mg::manual_seed(17);
  const int64_t B = 16, T = 8, C = 64, N = 512;
  Tensor x = mg::randn({B, T, C}), w = mg::randn({C, N});
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  const int64_t stack_bytes = B * C * N * 4;
  const int64_t before = mg::cpu_device_memory(0).live_bytes;
  mg::reset_cpu_device_peak(0);
  mg::sum(mg::matmul(x, w)).backward();
  const int64_t peak = mg::cpu_device_memory(0).peak_bytes - before;
  INFO("peak " << peak << " bytes; a [B, C, N] f32 stack is " << stack_bytes);
  CHECK(peak < stack_bytes / 2);
  // The same numbers as the per-entry products, and the gradient as X^T 1 written out.
  auto max_diff = [](const Tensor& a, const Tensor& b) {
    const std::vector<double> u = a.to_vector<double>(), v = b.to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < u.size(); ++i) worst = std::max(worst, std::abs(u[i] - v[i]));
    return worst;
  };
  const Tensor y = mg::matmul(x.detach(), w.detach());
  for (int64_t b = 0; b < B; b += 5)
    CHECK(max_diff(y.select(0, b), mg::matmul(x.detach().select(0, b), w.detach())) < 1e-4);
  const Tensor expected = mg::matmul(x.detach().reshape({B * T, C}).t(), mg::ones({B * T, N}));
  CHECK(max_diff(w.grad(), expected) < 1e-3);
}

TEST_CASE("gradcheck matmul 1-d @ batched 3-d [4] @ [2,4,3]", "[gradcheck][linalg]") {
  mg::manual_seed(7);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({4}), random_input({2, 4, 3})}));
}

TEST_CASE("gradcheck matmul transposed left operand a.t() @ b", "[gradcheck][linalg]") {
  mg::manual_seed(8);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0].t(), in[1]); },
                                 {random_input({4, 3}), random_input({4, 5})}));
}

TEST_CASE("gradcheck matmul transposed right operand a @ b.t()", "[gradcheck][linalg]") {
  mg::manual_seed(9);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1].t()); },
                                 {random_input({3, 4}), random_input({5, 4})}));
}

TEST_CASE("gradcheck matmul both operands transposed a.t() @ b.t()", "[gradcheck][linalg]") {
  mg::manual_seed(10);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0].t(), in[1].t()); },
                                 {random_input({4, 3}), random_input({5, 4})}));
}

TEST_CASE("gradcheck Tensor::matmul", "[gradcheck][linalg]") {
  mg::manual_seed(12);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].matmul(in[1]); },
                                 {random_input({3, 4}), random_input({4, 2})}));
}

TEST_CASE("gradcheck matmul grad for the left operand only (right is a constant)", "[gradcheck][linalg]") {
  mg::manual_seed(13);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::matmul(in[0], in[1]); },
                                 {random_input({2, 3, 4}), random_input({4, 2}, -1.0, 1.0, false)}));
}

TEST_CASE("gradcheck matmul output used transposed (non-contiguous incoming gradient)",
          "[gradcheck][linalg]") {
  mg::manual_seed(14);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::exp(mg::matmul(in[0], in[1]).t()); },
                                 {random_input({3, 4}), random_input({4, 5})}));
}

// ---------------------------------------------------------------------------------------------
// linear
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck linear with bias", "[gradcheck][linalg]") {
  mg::manual_seed(20);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::linear(in[0], in[1], in[2]); },
                                 {random_input({3, 4}), random_input({5, 4}), random_input({5})}));
}

TEST_CASE("gradcheck linear without bias", "[gradcheck][linalg]") {
  mg::manual_seed(21);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::linear(in[0], in[1]); },
                                 {random_input({3, 4}), random_input({5, 4})}));
}

TEST_CASE("gradcheck linear with bias on a 3-d input [2,3,4]", "[gradcheck][linalg]") {
  mg::manual_seed(22);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::linear(in[0], in[1], in[2]); },
                                 {random_input({2, 3, 4}), random_input({5, 4}), random_input({5})}));
}

TEST_CASE("gradcheck linear with a constant weight (grads for input and bias)", "[gradcheck][linalg]") {
  mg::manual_seed(23);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::linear(in[0], in[1], in[2]); },
                {random_input({3, 4}), random_input({5, 4}, -1.0, 1.0, false), random_input({5})}));
}

// ---------------------------------------------------------------------------------------------
// softmax / log_softmax
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck softmax dim 0 of [2,3,4]", "[gradcheck][nn]") {
  mg::manual_seed(30);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::softmax(in[0], 0); },
                                 {random_input({2, 3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck softmax dim 1 of [2,3,4]", "[gradcheck][nn]") {
  mg::manual_seed(31);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::softmax(in[0], 1); },
                                 {random_input({2, 3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck softmax dim -1 of [2,3,4]", "[gradcheck][nn]") {
  mg::manual_seed(32);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::softmax(in[0], -1); },
                                 {random_input({2, 3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck log_softmax dim 0 of [2,3,4]", "[gradcheck][nn]") {
  mg::manual_seed(33);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::log_softmax(in[0], 0); },
                                 {random_input({2, 3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck log_softmax dim 1 of [2,3,4]", "[gradcheck][nn]") {
  mg::manual_seed(34);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::log_softmax(in[0], 1); },
                                 {random_input({2, 3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck log_softmax dim -1 of [2,3,4]", "[gradcheck][nn]") {
  mg::manual_seed(35);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::log_softmax(in[0], -1); },
                                 {random_input({2, 3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck softmax of a non-contiguous (transposed) input", "[gradcheck][nn]") {
  mg::manual_seed(36);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::softmax(in[0].t(), 1); },
                                 {random_input({4, 3}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck softmax of a 1-d input", "[gradcheck][nn]") {
  mg::manual_seed(37);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::softmax(in[0], 0); }, {random_input({5}, -2.0, 2.0)}));
}

// ---------------------------------------------------------------------------------------------
// cross_entropy (only the logits get gradients; targets are integer constants)
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck cross_entropy mean", "[gradcheck][nn]") {
  mg::manual_seed(40);
  const Tensor t = indices({0, 4, 2, 2}, {4});
  MG_REQUIRE_GRADCHECK(gradcheck([t](const Inputs& in) { return mg::cross_entropy(in[0], t); },
                                 {random_input({4, 5}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy sum", "[gradcheck][nn]") {
  mg::manual_seed(41);
  const Tensor t = indices({1, 3, 0, 4}, {4});
  MG_REQUIRE_GRADCHECK(
      gradcheck([t](const Inputs& in) { return mg::cross_entropy(in[0], t, ce_options(mg::Reduction::Sum)); },
                {random_input({4, 5}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy none", "[gradcheck][nn]") {
  mg::manual_seed(42);
  const Tensor t = indices({1, 3, 0, 4}, {4});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [t](const Inputs& in) { return mg::cross_entropy(in[0], t, ce_options(mg::Reduction::None)); },
      {random_input({4, 5}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy mean with the default ignore_index -100", "[gradcheck][nn]") {
  mg::manual_seed(43);
  const Tensor t = indices({1, -100, 0, 4, -100}, {5});
  MG_REQUIRE_GRADCHECK(gradcheck([t](const Inputs& in) { return mg::cross_entropy(in[0], t); },
                                 {random_input({5, 5}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy mean with ignore_index 2", "[gradcheck][nn]") {
  mg::manual_seed(44);
  const Tensor t = indices({2, 3, 2, 0, 1}, {5});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [t](const Inputs& in) { return mg::cross_entropy(in[0], t, ce_options(mg::Reduction::Mean, 2)); },
      {random_input({5, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy none with ignore_index 2", "[gradcheck][nn]") {
  mg::manual_seed(45);
  const Tensor t = indices({2, 3, 2, 0, 1}, {5});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [t](const Inputs& in) { return mg::cross_entropy(in[0], t, ce_options(mg::Reduction::None, 2)); },
      {random_input({5, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy mean with label_smoothing 0.1", "[gradcheck][nn]") {
  mg::manual_seed(46);
  const Tensor t = indices({0, 4, 2, 1}, {4});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [t](const Inputs& in) {
        return mg::cross_entropy(in[0], t, ce_options(mg::Reduction::Mean, -100, 0.1));
      },
      {random_input({4, 5}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy sum with label_smoothing 0.2 and ignore_index 1", "[gradcheck][nn]") {
  mg::manual_seed(47);
  const Tensor t = indices({0, 1, 2, 1, 3}, {5});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [t](const Inputs& in) { return mg::cross_entropy(in[0], t, ce_options(mg::Reduction::Sum, 1, 0.2)); },
      {random_input({5, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy [N,C,d] form, mean", "[gradcheck][nn]") {
  mg::manual_seed(48);
  const Tensor t = indices({0, 3, 1, 2, 2, 0}, {2, 3});
  MG_REQUIRE_GRADCHECK(gradcheck([t](const Inputs& in) { return mg::cross_entropy(in[0], t); },
                                 {random_input({2, 4, 3}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy [N,C,d] form, none, with ignore_index and label_smoothing",
          "[gradcheck][nn]") {
  mg::manual_seed(49);
  const Tensor t = indices({0, 3, -100, 2, 1, 0}, {2, 3});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [t](const Inputs& in) {
        return mg::cross_entropy(in[0], t, ce_options(mg::Reduction::None, -100, 0.1));
      },
      {random_input({2, 4, 3}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy mean with i32 targets", "[gradcheck][nn]") {
  mg::manual_seed(39);
  const Tensor t = mg::tensor<int32_t>({3, 0, 1}, {3}, mg::TensorOptions{DType::i32});
  MG_REQUIRE_GRADCHECK(gradcheck([t](const Inputs& in) { return mg::cross_entropy(in[0], t); },
                                 {random_input({3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck cross_entropy of transposed (non-contiguous) logits", "[gradcheck][nn]") {
  mg::manual_seed(38);
  const Tensor t = indices({2, 0, 1}, {3});
  MG_REQUIRE_GRADCHECK(gradcheck([t](const Inputs& in) { return mg::cross_entropy(in[0].t(), t); },
                                 {random_input({4, 3}, -2.0, 2.0)}));
}

// ---------------------------------------------------------------------------------------------
// batch_norm (the fused CPU kernel): training statistics, eval statistics, with/without affine
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck batch_norm in training mode, [N, C, H, W], with weight and bias", "[gradcheck][nn]") {
  mg::manual_seed(60);
  Tensor rm = mg::zeros({3}, mg::TensorOptions{DType::f64}),
         rv = mg::ones({3}, mg::TensorOptions{DType::f64});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [rm, rv](const Inputs& in) { return mg::batch_norm(in[0], in[1], in[2], rm, rv, true, 1e-5); },
      {random_input({2, 3, 2, 2}), random_input({3}, 0.5, 1.5), random_input({3})}));
}

TEST_CASE("gradcheck batch_norm in training mode, [N, C], without weight and bias", "[gradcheck][nn]") {
  mg::manual_seed(61);
  Tensor rm = mg::zeros({4}, mg::TensorOptions{DType::f64}),
         rv = mg::ones({4}, mg::TensorOptions{DType::f64});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [rm, rv](const Inputs& in) { return mg::batch_norm(in[0], Tensor(), Tensor(), rm, rv, true, 1e-5); },
      {random_input({5, 4})}));
}

TEST_CASE("gradcheck batch_norm in eval mode (running statistics)", "[gradcheck][nn]") {
  mg::manual_seed(62);
  Tensor rm = random_input({3}).detach(), rv = random_input({3}, 0.5, 2.0).detach();
  MG_REQUIRE_GRADCHECK(gradcheck(
      [rm, rv](const Inputs& in) { return mg::batch_norm(in[0], in[1], in[2], rm, rv, false, 1e-5); },
      {random_input({2, 3, 3}), random_input({3}, 0.5, 1.5), random_input({3})}));
}

TEST_CASE("batch_norm's fused kernel equals the composed formula, forward and backward", "[nn]") {
  mg::manual_seed(63);
  for (DType dtype : {DType::f64, DType::f32}) {
    Tensor x = mg::randn({4, 3, 5, 5}, mg::TensorOptions{dtype}).set_requires_grad(true);
    Tensor w = mg::randn({3}, mg::TensorOptions{dtype}).set_requires_grad(true);
    Tensor b = mg::randn({3}, mg::TensorOptions{dtype}).set_requires_grad(true);
    Tensor rm = mg::zeros({3}, mg::TensorOptions{dtype}), rv = mg::ones({3}, mg::TensorOptions{dtype});
    Tensor batch_mean, batch_var;
    Tensor fused = mg::batch_norm(x, w, b, rm, rv, true, 1e-5, &batch_mean, &batch_var);
    Tensor mu = mg::mean(x, {0, 2, 3}, true), var = mg::var(x, {0, 2, 3}, 0, true);
    Tensor composed =
        mg::add(mg::mul(mg::mul(mg::sub(x, mu), mg::rsqrt(mg::add(var, 1e-5))), w.reshape({1, 3, 1, 1})),
                b.reshape({1, 3, 1, 1}));
    const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
    auto close = [tol](const Tensor& a, const Tensor& r) {
      auto u = a.to_vector<double>(), v = r.to_vector<double>();
      REQUIRE(u.size() == v.size());
      for (size_t i = 0; i < u.size(); ++i) REQUIRE(std::abs(u[i] - v[i]) <= tol * (1 + std::abs(v[i])));
    };
    close(fused, composed);
    close(batch_mean, mu.reshape({3}));
    close(batch_var, var.reshape({3}));
    Tensor g = mg::randn(fused.shape(), mg::TensorOptions{dtype});
    mg::sum(mg::mul(fused, g)).backward();
    Tensor gx = x.grad().clone(), gw = w.grad().clone(), gb = b.grad().clone();
    x.set_grad(Tensor());
    w.set_grad(Tensor());
    b.set_grad(Tensor());
    mg::sum(mg::mul(composed, g)).backward();
    close(gx, x.grad());
    close(gw, w.grad());
    close(gb, b.grad());
  }
}

TEST_CASE("batch_norm refuses what the fused kernel cannot take, naming it", "[nn]") {
  Tensor rm = mg::zeros({3}), rv = mg::ones({3});
  CHECK_THROWS_WITH(mg::batch_norm(mg::zeros({2, 3}, mg::TensorOptions{DType::bf16}), Tensor(), Tensor(), rm,
                                   rv, true, 1e-5),
                    Catch::Contains("f32 or f64"));
  CHECK_THROWS_WITH(mg::batch_norm(mg::zeros({1, 3}), Tensor(), Tensor(), rm, rv, true, 1e-5),
                    Catch::Contains("more than one value per channel"));
  CHECK_THROWS_WITH(mg::batch_norm(mg::zeros({2, 3}), mg::ones({4}), Tensor(), rm, rv, true, 1e-5),
                    Catch::Contains("must be [3]"));
}

// ---------------------------------------------------------------------------------------------
// layer_norm
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck layer_norm with weight and bias", "[gradcheck][nn]") {
  mg::manual_seed(50);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::layer_norm(in[0], {5}, in[1], in[2]); },
                                 {random_input({3, 5}), random_input({5}, 0.5, 1.5), random_input({5})}));
}

TEST_CASE("gradcheck layer_norm without weight and bias", "[gradcheck][nn]") {
  mg::manual_seed(51);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::layer_norm(in[0], {5}); }, {random_input({3, 5})}));
}

TEST_CASE("gradcheck layer_norm with weight only", "[gradcheck][nn]") {
  mg::manual_seed(52);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::layer_norm(in[0], {5}, in[1]); },
                                 {random_input({3, 5}), random_input({5}, 0.5, 1.5)}));
}

TEST_CASE("gradcheck layer_norm with a 2-d normalized_shape [3,4]", "[gradcheck][nn]") {
  mg::manual_seed(53);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::layer_norm(in[0], {3, 4}, in[1], in[2]);
      },
      {random_input({2, 3, 4}), random_input({3, 4}, 0.5, 1.5), random_input({3, 4})}));
}

TEST_CASE("gradcheck layer_norm of a transposed (non-contiguous) input", "[gradcheck][nn]") {
  mg::manual_seed(54);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::layer_norm(in[0].t(), {4}, in[1], in[2]); },
                {random_input({4, 3}), random_input({4}, 0.5, 1.5), random_input({4})}));
}

// ---------------------------------------------------------------------------------------------
// embedding (gradient w.r.t. the weight)
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck embedding with repeated indices", "[gradcheck][nn]") {
  mg::manual_seed(60);
  const Tensor idx = indices({1, 3, 1, 0, 3, 1}, {2, 3});
  MG_REQUIRE_GRADCHECK(
      gradcheck([idx](const Inputs& in) { return mg::embedding(in[0], idx); }, {random_input({5, 3})}));
}

TEST_CASE("gradcheck embedding with padding_idx", "[gradcheck][nn]") {
  // The padding row is read in the forward but gets no gradient (PyTorch semantics), so a
  // finite difference through it would disagree by design. The checked function masks the
  // padding positions out of the output (their true derivative is then 0 too); the explicit
  // checks below pin the padding row's zero gradient on the unmasked output.
  mg::manual_seed(61);
  const Tensor idx = indices({1, 3, 1, 0, 3, 1}, {2, 3});
  const Tensor keep = mg::tensor<double>({1, 0, 1, 1, 0, 1}, {2, 3, 1}, kF64);
  MG_REQUIRE_GRADCHECK(
      gradcheck([idx, keep](const Inputs& in) { return mg::mul(mg::embedding(in[0], idx, 3), keep); },
                {random_input({5, 3})}));

  Tensor w = random_input({5, 3});
  mg::sum(mg::embedding(w, idx, 3)).backward();
  REQUIRE(w.grad().defined());
  const std::vector<double> g = w.grad().to_vector<double>();
  const std::vector<double> expected = {1, 1, 1, 3, 3, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // row 3 = padding
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == expected[i]);
}

TEST_CASE("gradcheck embedding with i32 indices of a 0-d index tensor", "[gradcheck][nn]") {
  mg::manual_seed(62);
  const Tensor idx = mg::tensor<int32_t>({2}, {}, mg::TensorOptions{DType::i32});
  MG_REQUIRE_GRADCHECK(
      gradcheck([idx](const Inputs& in) { return mg::embedding(in[0], idx); }, {random_input({4, 3})}));
}

// ---------------------------------------------------------------------------------------------
// dropout (the mask is fixed by reseeding inside f before every evaluation)
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck dropout p=0.3 with a fixed mask", "[gradcheck][nn]") {
  mg::manual_seed(70);
  Tensor x = random_input({4, 5}, 0.5, 1.5);  // nonzero, so dropped elements show as exact zeros
  auto f = [](const Inputs& in) {
    mg::manual_seed(1234);
    return mg::dropout(in[0], 0.3);
  };
  MG_REQUIRE_GRADCHECK(gradcheck(f, {x}));
  // The mask must actually drop some elements and keep others, or the check proves little.
  const std::vector<double> y = f({x}).to_vector<double>();
  const auto zeros = std::count(y.begin(), y.end(), 0.0);
  CHECK(zeros > 0);
  CHECK(zeros < static_cast<long>(y.size()));
}

TEST_CASE("gradcheck dropout in eval mode (identity)", "[gradcheck][nn]") {
  mg::manual_seed(71);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) { return mg::mul(mg::dropout(in[0], 0.5, false), 1.0); }, {random_input({3, 4})}));
}

// ---------------------------------------------------------------------------------------------
// conv2d: x [2,3,H,W], weight [4,3,3,3], bias [4]; grads for all three
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck conv2d stride 1, no padding, with bias", "[gradcheck][nn]") {
  mg::manual_seed(80);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2]); },
                {random_input({2, 3, 5, 5}), random_input({4, 3, 3, 3}), random_input({4})}));
}

TEST_CASE("gradcheck conv2d stride 2, with bias", "[gradcheck][nn]") {
  mg::manual_seed(81);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2], conv_options(2, 0, 1)); },
                {random_input({2, 3, 7, 7}), random_input({4, 3, 3, 3}), random_input({4})}));
}

TEST_CASE("gradcheck conv2d padding 1, with bias", "[gradcheck][nn]") {
  mg::manual_seed(82);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2], conv_options(1, 1, 1)); },
                {random_input({2, 3, 5, 5}), random_input({4, 3, 3, 3}), random_input({4})}));
}

TEST_CASE("gradcheck conv2d dilation 2, with bias", "[gradcheck][nn]") {
  mg::manual_seed(83);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2], conv_options(1, 0, 2)); },
                {random_input({2, 3, 7, 7}), random_input({4, 3, 3, 3}), random_input({4})}));
}

TEST_CASE("gradcheck conv2d stride 2, padding 1, dilation 2, with bias", "[gradcheck][nn]") {
  mg::manual_seed(84);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2], conv_options(2, 1, 2)); },
                {random_input({2, 3, 7, 7}), random_input({4, 3, 3, 3}), random_input({4})}));
}

TEST_CASE("gradcheck conv2d stride 2, padding 1, dilation 2, without bias", "[gradcheck][nn]") {
  mg::manual_seed(85);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::conv2d(in[0], in[1], Tensor(), conv_options(2, 1, 2)); },
                {random_input({2, 3, 7, 7}), random_input({4, 3, 3, 3})}));
}

TEST_CASE("gradcheck conv2d asymmetric stride/padding/dilation and a 2x3 kernel", "[gradcheck][nn]") {
  mg::manual_seed(86);
  mg::Conv2dOptions o;
  o.stride_h = 1;
  o.stride_w = 2;
  o.pad_h = 0;
  o.pad_w = 1;
  o.dilation_h = 2;
  o.dilation_w = 1;
  MG_REQUIRE_GRADCHECK(
      gradcheck([o](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2], o); },
                {random_input({1, 2, 6, 7}), random_input({3, 2, 2, 3}), random_input({3})}));
}

TEST_CASE("gradcheck conv2d grad for the input only (constant weight and bias)", "[gradcheck][nn]") {
  mg::manual_seed(87);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2], conv_options(2, 1, 1)); },
                {random_input({2, 3, 5, 5}), random_input({4, 3, 3, 3}, -1.0, 1.0, false),
                 random_input({4}, -1.0, 1.0, false)}));
}

TEST_CASE("gradcheck conv2d grads for weight and bias only (constant input)", "[gradcheck][nn]") {
  mg::manual_seed(88);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) { return mg::conv2d(in[0], in[1], in[2], conv_options(1, 1, 2)); },
      {random_input({2, 3, 6, 6}, -1.0, 1.0, false), random_input({4, 3, 3, 3}), random_input({4})}));
}

// ---------------------------------------------------------------------------------------------
// pooling (max pooling on inputs without ties)
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck max_pool2d kernel 2", "[gradcheck][nn]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::max_pool2d(in[0], 2); },
                                 {distinct_pool_input({2, 2, 4, 4}, 1)}));
}

TEST_CASE("gradcheck max_pool2d kernel 3, stride 2, padding 1 (overlapping windows)", "[gradcheck][nn]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::max_pool2d(in[0], pool_options(3, 2, 1)); },
                {distinct_pool_input({2, 2, 5, 5}, 2)}));
}

TEST_CASE("gradcheck max_pool2d on a 3-d [C,H,W] input", "[gradcheck][nn]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::max_pool2d(in[0], pool_options(2, 1, 0)); },
                {distinct_pool_input({2, 4, 4}, 3)}));
}

TEST_CASE("gradcheck avg_pool2d kernel 2", "[gradcheck][nn]") {
  mg::manual_seed(93);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::avg_pool2d(in[0], 2); }, {random_input({2, 2, 4, 4})}));
}

TEST_CASE("gradcheck avg_pool2d kernel 3, stride 2, padding 1, count_include_pad true", "[gradcheck][nn]") {
  mg::manual_seed(94);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::avg_pool2d(in[0], pool_options(3, 2, 1, true)); },
                {random_input({2, 2, 5, 5})}));
}

TEST_CASE("gradcheck avg_pool2d kernel 3, stride 2, padding 1, count_include_pad false", "[gradcheck][nn]") {
  mg::manual_seed(95);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::avg_pool2d(in[0], pool_options(3, 2, 1, false)); },
                {random_input({2, 2, 5, 5})}));
}

TEST_CASE("gradcheck avg_pool2d kernel 2, stride 1, padding 1, count_include_pad false", "[gradcheck][nn]") {
  mg::manual_seed(96);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::avg_pool2d(in[0], pool_options(2, 1, 1, false)); },
                {random_input({1, 2, 4, 4})}));
}
