// Autocast: which ops drop to 16 bits, which stay in f32, and that gradients of
// f32 parameters come back in f32 and close to the full-precision ones.
#include <catch2/catch.hpp>
#include <cmath>

#include "core/autocast.h"
#include "multigrad.h"

using namespace mg;

namespace {
double relative_error(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  Tensor diff = sub(a.to(DType::f64), b.to(DType::f64));
  return std::sqrt(sum(square(diff)).item<double>() / sum(square(b.to(DType::f64))).item<double>());
}
}  // namespace

TEST_CASE("autocast runs matmul/linear/conv in the low dtype and keeps reductions in f32", "[autocast]") {
  manual_seed(5);
  for (DType low : {DType::bf16, DType::f16}) {
    INFO(dtype_name(low));
    Tensor x = randn({8, 16}), w = randn({4, 16}), b = randn({4});
    AutocastGuard guard(low);
    REQUIRE(autocast_state().enabled);
    REQUIRE(linear(x, w, b).dtype() == low);
    REQUIRE(matmul(x, w.t()).dtype() == low);
    REQUIRE(conv2d(randn({1, 2, 5, 5}), randn({3, 2, 3, 3}), randn({3})).dtype() == low);
    Tensor half = randn({3, 5}).to(low);
    REQUIRE(softmax(half, 1).dtype() == DType::f32);
    REQUIRE(log_softmax(half, 1).dtype() == DType::f32);
    REQUIRE(sum(half).dtype() == DType::f32);
    REQUIRE(mean(half, {1}).dtype() == DType::f32);
    REQUIRE(layer_norm(half, {5}).dtype() == DType::f32);
    REQUIRE(cross_entropy(half, tensor<int64_t>({0, 1, 4}, {3}, TensorOptions{DType::i64})).dtype() ==
            DType::f32);
  }
  REQUIRE_FALSE(autocast_state().enabled);  // the guard restored the previous state
}

TEST_CASE("autocast gradients reach f32 parameters in f32, close to full precision", "[autocast]") {
  manual_seed(6);
  Tensor x = randn({32, 64}), y = randint(0, 10, {32});
  Tensor w1 = mul(randn({128, 64}), 0.1).set_requires_grad(true);
  Tensor w2 = mul(randn({10, 128}), 0.1).set_requires_grad(true);
  auto loss_of = [&]() { return cross_entropy(linear(relu(linear(x, w1)), w2), y); };

  Tensor full_loss = loss_of();
  full_loss.backward();
  Tensor g1 = w1.grad().clone(), g2 = w2.grad().clone();
  w1.set_grad(Tensor());
  w2.set_grad(Tensor());

  Tensor mixed_loss;
  {
    AutocastGuard guard(DType::bf16);
    mixed_loss = loss_of();
  }
  REQUIRE(mixed_loss.dtype() == DType::f32);
  mixed_loss.backward();
  REQUIRE(w1.grad().dtype() == DType::f32);
  REQUIRE(w2.grad().dtype() == DType::f32);
  // bf16 keeps 8 bits of mantissa: ~0.4% per rounding; a few percent end to end.
  CHECK(std::fabs(mixed_loss.item<double>() - full_loss.item<double>()) <
        0.02 * std::fabs(full_loss.item<double>()));
  CHECK(relative_error(w1.grad(), g1) < 0.05);
  CHECK(relative_error(w2.grad(), g2) < 0.05);
  // And the low-precision result really differs (the cast happened).
  CHECK(mixed_loss.item<double>() != full_loss.item<double>());
}

TEST_CASE("autocast rejects a dtype that is not 16-bit", "[autocast]") {
  REQUIRE_THROWS_WITH(AutocastGuard(DType::f64), Catch::Contains("bf16 or f16") && Catch::Contains("f64"));
}
