// Finite-difference gradient checks (f64, CPU) for the elementwise ops of core/ops.h:
// unary math, binary ops with broadcasting and their scalar forms, where, clamp,
// mixed-dtype promotion, the arithmetic operators and the Tensor method forms.
//
// Non-smooth ops (abs, relu, maximum, minimum, clamp) are checked on inputs that keep
// a margin of many h from their kinks, so the central difference never straddles one.
#include <algorithm>
#include <catch2/catch.hpp>
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

using mg::testing::grid_input;

// Distinct values in (-1, 1), symmetric, none closer to 0 than 1/n (for abs, relu, ...).
Tensor signed_grid(const Shape& shape, uint32_t seed = 1) {
  const int64_t n = mg::shape_numel(shape);
  return grid_input(shape, -1.0 + 1.0 / static_cast<double>(n), 2.0 / static_cast<double>(n), seed);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Unary
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck neg", "[gradcheck][elementwise]") {
  mg::manual_seed(1);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::neg(in[0]); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck exp", "[gradcheck][elementwise]") {
  mg::manual_seed(2);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::exp(in[0]); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck log on [0.5, 2]", "[gradcheck][elementwise]") {
  mg::manual_seed(3);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::log(in[0]); }, {random_input({2, 3, 4}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck sqrt on [0.5, 2]", "[gradcheck][elementwise]") {
  mg::manual_seed(4);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::sqrt(in[0]); }, {random_input({2, 3, 4}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck rsqrt on [0.5, 2]", "[gradcheck][elementwise]") {
  mg::manual_seed(5);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::rsqrt(in[0]); }, {random_input({2, 3, 4}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck abs away from 0", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::abs(in[0]); }, {signed_grid({2, 3, 4})}));
}

TEST_CASE("gradcheck tanh", "[gradcheck][elementwise]") {
  mg::manual_seed(7);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::tanh(in[0]); }, {random_input({2, 3, 4}, -2.0, 2.0)}));
}

TEST_CASE("gradcheck sigmoid", "[gradcheck][elementwise]") {
  mg::manual_seed(8);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::sigmoid(in[0]); }, {random_input({2, 3, 4}, -3.0, 3.0)}));
}

TEST_CASE("gradcheck relu away from 0", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::relu(in[0]); }, {signed_grid({2, 3, 4}, 2)}));
}

TEST_CASE("gradcheck gelu", "[gradcheck][elementwise]") {
  mg::manual_seed(10);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::gelu(in[0]); }, {random_input({2, 3, 4}, -3.0, 3.0)}));
}

TEST_CASE("gradcheck pow 2", "[gradcheck][elementwise]") {
  mg::manual_seed(11);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::pow(in[0], 2.0); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck pow 3", "[gradcheck][elementwise]") {
  mg::manual_seed(12);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::pow(in[0], 3.0); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck pow 0.5 on positive inputs", "[gradcheck][elementwise]") {
  mg::manual_seed(13);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::pow(in[0], 0.5); }, {random_input({2, 3, 4}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck pow -1.5 on positive inputs", "[gradcheck][elementwise]") {
  mg::manual_seed(14);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::pow(in[0], -1.5); }, {random_input({2, 3, 4}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck square", "[gradcheck][elementwise]") {
  mg::manual_seed(15);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::square(in[0]); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck reciprocal away from 0", "[gradcheck][elementwise]") {
  // Magnitudes in [0.5, 1) with alternating signs along the last dim.
  Tensor x = grid_input({2, 3, 4}, 0.5, 0.02, 3);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        Tensor sign = mg::tensor<double>({1, -1, 1, -1}, {4}, kF64);
        return mg::reciprocal(mg::mul(in[0], sign));
      },
      {x}));
}

// ---------------------------------------------------------------------------------------------
// Binary with broadcasting
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck add broadcast [3,1,4] + [2,4]", "[gradcheck][elementwise]") {
  mg::manual_seed(20);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::add(in[0], in[1]); },
                                 {random_input({3, 1, 4}), random_input({2, 4})}));
}

TEST_CASE("gradcheck add scalar-shaped [] + [2,3]", "[gradcheck][elementwise]") {
  mg::manual_seed(21);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::add(in[0], in[1]); },
                                 {random_input({}), random_input({2, 3})}));
}

TEST_CASE("gradcheck add with alpha -0.75 broadcast", "[gradcheck][elementwise]") {
  mg::manual_seed(22);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::add(in[0], in[1], -0.75); },
                                 {random_input({3, 1, 4}), random_input({2, 4})}));
}

TEST_CASE("gradcheck add with alpha 2.5, scalar-shaped second operand", "[gradcheck][elementwise]") {
  mg::manual_seed(23);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::add(in[0], in[1], 2.5); },
                                 {random_input({2, 3}), random_input({})}));
}

TEST_CASE("gradcheck sub broadcast [3,1,4] - [2,4]", "[gradcheck][elementwise]") {
  mg::manual_seed(24);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::sub(in[0], in[1]); },
                                 {random_input({3, 1, 4}), random_input({2, 4})}));
}

TEST_CASE("gradcheck sub scalar-shaped [] - [2,3]", "[gradcheck][elementwise]") {
  mg::manual_seed(25);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::sub(in[0], in[1]); },
                                 {random_input({}), random_input({2, 3})}));
}

TEST_CASE("gradcheck mul broadcast [3,1,4] * [2,4]", "[gradcheck][elementwise]") {
  mg::manual_seed(26);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::mul(in[0], in[1]); },
                                 {random_input({3, 1, 4}), random_input({2, 4})}));
}

TEST_CASE("gradcheck mul scalar-shaped [] * [2,3]", "[gradcheck][elementwise]") {
  mg::manual_seed(27);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::mul(in[0], in[1]); },
                                 {random_input({}), random_input({2, 3})}));
}

TEST_CASE("gradcheck mul of a tensor with itself", "[gradcheck][elementwise]") {
  // Both operands are the same leaf: the two gradient contributions must accumulate.
  mg::manual_seed(28);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::mul(in[0], in[0]); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck div broadcast [3,1,4] / [2,4]", "[gradcheck][elementwise]") {
  mg::manual_seed(29);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::div(in[0], in[1]); },
                                 {random_input({3, 1, 4}), random_input({2, 4}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck div [2,3] / scalar-shaped []", "[gradcheck][elementwise]") {
  mg::manual_seed(30);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::div(in[0], in[1]); },
                                 {random_input({2, 3}), random_input({}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck maximum broadcast [3,1,4] vs [2,4] (no ties)", "[gradcheck][elementwise]") {
  // Grids offset by half a step: every pair differs by at least 0.05.
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::maximum(in[0], in[1]); },
                                 {grid_input({3, 1, 4}, -0.6, 0.1, 1), grid_input({2, 4}, -0.35, 0.1, 2)}));
}

TEST_CASE("gradcheck minimum broadcast [3,1,4] vs [2,4] (no ties)", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::minimum(in[0], in[1]); },
                                 {grid_input({3, 1, 4}, -0.6, 0.1, 3), grid_input({2, 4}, -0.35, 0.1, 4)}));
}

TEST_CASE("gradcheck maximum scalar-shaped [] vs [2,3] (no ties)", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::maximum(in[0], in[1]); },
                                 {grid_input({}, 0.05, 0.1), grid_input({2, 3}, -0.3, 0.1, 5)}));
}

TEST_CASE("gradcheck minimum scalar-shaped [] vs [2,3] (no ties)", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::minimum(in[0], in[1]); },
                                 {grid_input({}, 0.05, 0.1), grid_input({2, 3}, -0.3, 0.1, 6)}));
}

TEST_CASE("gradcheck add where the broadcast operand requires no grad", "[gradcheck][elementwise]") {
  mg::manual_seed(31);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::add(in[0], in[1]); },
                                 {random_input({4}), random_input({3, 4}, -1.0, 1.0, false)}));
}

TEST_CASE("gradcheck mul of 0-d tensors", "[gradcheck][elementwise]") {
  mg::manual_seed(32);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::mul(in[0], in[1]); },
                                 {random_input({}), random_input({})}));
}

// ---------------------------------------------------------------------------------------------
// Scalar forms
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck add(tensor, scalar)", "[gradcheck][elementwise]") {
  mg::manual_seed(40);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::add(in[0], 1.5); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck sub(tensor, scalar)", "[gradcheck][elementwise]") {
  mg::manual_seed(41);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::sub(in[0], 1.5); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck mul(tensor, scalar)", "[gradcheck][elementwise]") {
  mg::manual_seed(42);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::mul(in[0], -2.5); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck div(tensor, scalar)", "[gradcheck][elementwise]") {
  mg::manual_seed(43);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::div(in[0], -0.4); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck rsub(tensor, scalar) = scalar - tensor", "[gradcheck][elementwise]") {
  mg::manual_seed(44);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::rsub(in[0], 3.0); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck rdiv(tensor, scalar) = scalar / tensor", "[gradcheck][elementwise]") {
  mg::manual_seed(45);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::rdiv(in[0], 3.0); }, {random_input({2, 3}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck maximum(tensor, scalar) (no ties)", "[gradcheck][elementwise]") {
  // Values -0.55, -0.35, ..., 0.45: 0.1 is at least 0.05 away from every element.
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::maximum(in[0], 0.1); },
                                 {grid_input({2, 3}, -0.55, 0.2, 7)}));
}

TEST_CASE("gradcheck minimum(tensor, scalar) (no ties)", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::minimum(in[0], 0.1); },
                                 {grid_input({2, 3}, -0.55, 0.2, 8)}));
}

// ---------------------------------------------------------------------------------------------
// where, clamp
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck where (both branches get grads)", "[gradcheck][elementwise]") {
  mg::manual_seed(50);
  const Tensor cond = mg::tensor<bool>({true, false, false, true, true, false}, {2, 3}, {DType::boolean});
  MG_REQUIRE_GRADCHECK(gradcheck([cond](const Inputs& in) { return mg::where(cond, in[0], in[1]); },
                                 {random_input({2, 3}), random_input({2, 3})}));
}

TEST_CASE("gradcheck where with broadcast branches [3] and [2,1]", "[gradcheck][elementwise]") {
  mg::manual_seed(51);
  const Tensor cond = mg::tensor<bool>({true, false, true, false, true, true}, {2, 3}, {DType::boolean});
  MG_REQUIRE_GRADCHECK(gradcheck([cond](const Inputs& in) { return mg::where(cond, in[0], in[1]); },
                                 {random_input({3}), random_input({2, 1})}));
}

TEST_CASE("gradcheck where with a broadcast condition [2,1] and a scalar-shaped branch",
          "[gradcheck][elementwise]") {
  mg::manual_seed(52);
  const Tensor cond = mg::tensor<bool>({true, false}, {2, 1}, {DType::boolean});
  MG_REQUIRE_GRADCHECK(gradcheck([cond](const Inputs& in) { return mg::where(cond, in[0], in[1]); },
                                 {random_input({2, 3}), random_input({})}));
}

// signed_grid({2,3,4}) holds -1 + (2k + 1)/24: the bounds -0.25 and 1/3 sit halfway between values.
TEST_CASE("gradcheck clamp lo only", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::clamp(in[0], -0.25, std::nullopt); },
                                 {signed_grid({2, 3, 4}, 9)}));
}

TEST_CASE("gradcheck clamp hi only", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::clamp(in[0], std::nullopt, 1.0 / 3.0); },
                                 {signed_grid({2, 3, 4}, 10)}));
}

TEST_CASE("gradcheck clamp lo and hi", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::clamp(in[0], -0.25, 1.0 / 3.0); },
                                 {signed_grid({2, 3, 4}, 11)}));
}

// ---------------------------------------------------------------------------------------------
// Mixed dtype
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck mul of an f64 leaf with an f32 tensor (grad keeps the leaf's dtype)",
          "[gradcheck][elementwise]") {
  mg::manual_seed(60);
  const Tensor y32 = mg::randn({2, 3}, {DType::f32});
  Tensor x = random_input({3, 2, 3});
  MG_REQUIRE_GRADCHECK(gradcheck(
      [y32](const Inputs& in) {
        Tensor out = mg::mul(in[0], y32);
        REQUIRE(out.dtype() == DType::f64);
        return out;
      },
      {x}));
  REQUIRE(x.grad().defined());
  CHECK(x.grad().dtype() == x.dtype());
  CHECK(x.grad().shape() == x.shape());

  // And the other way round: an f32 leaf times an f64 tensor gets an f32 gradient equal to
  // the f64 factor (sum-reduced over the broadcast dim), to f32 precision.
  Tensor x32 = mg::randn({2, 3}, {DType::f32});
  x32.set_requires_grad(true);
  const Tensor y64 = random_input({4, 2, 3}, -1.0, 1.0, false);
  Tensor out = mg::mul(x32, y64);
  CHECK(out.dtype() == DType::f64);
  mg::sum(out).backward();
  REQUIRE(x32.grad().defined());
  CHECK(x32.grad().dtype() == DType::f32);
  const std::vector<float> g = x32.grad().to_vector<float>();
  const std::vector<double> expected = mg::sum(y64, {0}).to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == Approx(expected[i]).epsilon(1e-5));
}

// ---------------------------------------------------------------------------------------------
// Operators
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck unary operator-", "[gradcheck][elementwise]") {
  mg::manual_seed(70);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return -in[0]; }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck operators + - * / on tensors with broadcasting", "[gradcheck][elementwise]") {
  mg::manual_seed(71);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) { return (in[0] + in[1]) * in[2] - in[0] / in[3]; },
      {random_input({2, 3}), random_input({3}), random_input({2, 1}), random_input({1, 3}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck operators with a scalar on either side", "[gradcheck][elementwise]") {
  mg::manual_seed(72);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        const Tensor& x = in[0];
        return (x + 1.0) * 2.0 - x / 4.0 + (3.0 - x) * (0.5 + x) + 2.0 / (x + 3.0) + 1.5 * x - 0.25;
      },
      {random_input({2, 3})}));
}

// ---------------------------------------------------------------------------------------------
// Tensor method forms
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck Tensor::exp", "[gradcheck][elementwise]") {
  mg::manual_seed(80);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].exp(); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck Tensor::log", "[gradcheck][elementwise]") {
  mg::manual_seed(81);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].log(); }, {random_input({2, 3}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck Tensor::sqrt", "[gradcheck][elementwise]") {
  mg::manual_seed(82);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].sqrt(); }, {random_input({2, 3}, 0.5, 2.0)}));
}

TEST_CASE("gradcheck Tensor::pow 3", "[gradcheck][elementwise]") {
  mg::manual_seed(83);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].pow(3.0); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck Tensor::relu away from 0", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].relu(); }, {signed_grid({2, 3}, 12)}));
}

TEST_CASE("gradcheck Tensor::abs away from 0", "[gradcheck][elementwise]") {
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].abs(); }, {signed_grid({2, 3}, 13)}));
}

// ---------------------------------------------------------------------------------------------
// Compositions (the chain rule across several nodes, and a leaf used twice)
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck composite: tanh(x) * sigmoid(y) + exp(-x^2)", "[gradcheck][elementwise]") {
  mg::manual_seed(90);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::add(mg::mul(mg::tanh(in[0]), mg::sigmoid(in[1])), mg::exp(mg::neg(mg::square(in[0]))));
      },
      {random_input({3, 4}), random_input({4})}));
}
