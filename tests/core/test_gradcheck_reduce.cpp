// Finite-difference gradient checks (f64, CPU) for the reductions of core/ops.h:
// sum, mean, max, min, var (over all elements, one dim, two non-adjacent dims, with and
// without keepdim), sum_to, and the Tensor::sum / Tensor::mean method forms.
//
// max/min are checked on inputs without ties (a shuffled grid of distinct values), so the
// selected element is unique and stays selected under a perturbation of h.
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

using mg::testing::grid_input;

Tensor distinct_input(const Shape& shape, uint32_t seed) { return grid_input(shape, -1.2, 0.1, seed); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// sum
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck sum over all", "[gradcheck][reduce]") {
  mg::manual_seed(1);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::sum(in[0]); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum over all, keepdim", "[gradcheck][reduce]") {
  mg::manual_seed(2);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::sum(in[0], {}, true); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum over dim 1", "[gradcheck][reduce]") {
  mg::manual_seed(3);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::sum(in[0], {1}); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum over dim -1, keepdim", "[gradcheck][reduce]") {
  mg::manual_seed(4);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::sum(in[0], {-1}, true); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum over dims {0,2}", "[gradcheck][reduce]") {
  mg::manual_seed(5);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::sum(in[0], {0, 2});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum over dims {0,2}, keepdim", "[gradcheck][reduce]") {
  mg::manual_seed(6);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::sum(in[0], {0, 2}, true);
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum of a non-contiguous (transposed) input over dim 0", "[gradcheck][reduce]") {
  mg::manual_seed(7);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::sum(in[0].transpose(0, 2), {0}); },
                                 {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum over dims given out of order and negative {-1, 0}", "[gradcheck][reduce]") {
  mg::manual_seed(8);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::sum(in[0], {-1, 0});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum of a 0-d tensor", "[gradcheck][reduce]") {
  mg::manual_seed(9);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::sum(in[0]); }, {random_input({})}));
}

// ---------------------------------------------------------------------------------------------
// mean
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck mean over all", "[gradcheck][reduce]") {
  mg::manual_seed(10);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::mean(in[0]); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck mean over dim 1", "[gradcheck][reduce]") {
  mg::manual_seed(11);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::mean(in[0], {1}); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck mean over dim 1, keepdim", "[gradcheck][reduce]") {
  mg::manual_seed(12);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::mean(in[0], {1}, true); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck mean over dims {0,2}", "[gradcheck][reduce]") {
  mg::manual_seed(13);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::mean(in[0], {0, 2});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck mean over dims {0,2}, keepdim", "[gradcheck][reduce]") {
  mg::manual_seed(14);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::mean(in[0], {0, 2}, true);
      },
      {random_input({2, 3, 4})}));
}

// ---------------------------------------------------------------------------------------------
// max / min (no ties)
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck max over all", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::max(in[0]); }, {distinct_input({2, 3, 4}, 1)}));
}

TEST_CASE("gradcheck max over dim 1", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::max(in[0], {1}); }, {distinct_input({2, 3, 4}, 2)}));
}

TEST_CASE("gradcheck max over dim -1, keepdim", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::max(in[0], {-1}, true); }, {distinct_input({2, 3, 4}, 3)}));
}

TEST_CASE("gradcheck max over dims {0,2}", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::max(in[0], {0, 2});
      },
      {distinct_input({2, 3, 4}, 4)}));
}

TEST_CASE("gradcheck min over all", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::min(in[0]); }, {distinct_input({2, 3, 4}, 5)}));
}

TEST_CASE("gradcheck min over dim 0", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::min(in[0], {0}); }, {distinct_input({2, 3, 4}, 6)}));
}

TEST_CASE("gradcheck min over dim 2, keepdim", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::min(in[0], {2}, true); }, {distinct_input({2, 3, 4}, 7)}));
}

TEST_CASE("gradcheck max over dim 0 of a 1-d input", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::max(in[0], {0}); }, {distinct_input({7}, 8)}));
}

TEST_CASE("gradcheck min over dims {2,0}, keepdim", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::min(in[0], {2, 0}, true);
      },
      {distinct_input({2, 3, 4}, 9)}));
}

TEST_CASE("gradcheck max of a transposed (non-contiguous) input over dim 1", "[gradcheck][reduce]") {
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::max(in[0].t(), {1}); }, {distinct_input({4, 3}, 10)}));
}

// ---------------------------------------------------------------------------------------------
// var
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck var over all, correction 1", "[gradcheck][reduce]") {
  mg::manual_seed(30);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::var(in[0]); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck var over dim 1, correction 0", "[gradcheck][reduce]") {
  mg::manual_seed(31);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::var(in[0], {1}, 0); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck var over dim 1, correction 1", "[gradcheck][reduce]") {
  mg::manual_seed(32);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::var(in[0], {1}, 1); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck var over dims {0,2}, correction 0, keepdim", "[gradcheck][reduce]") {
  mg::manual_seed(33);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::var(in[0], {0, 2}, 0, true);
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck var over dims {0,2}, correction 1", "[gradcheck][reduce]") {
  mg::manual_seed(34);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::var(in[0], {0, 2}, 1);
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck var over dim -1, correction 1, keepdim", "[gradcheck][reduce]") {
  mg::manual_seed(35);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::var(in[0], {-1}, 1, true); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck var of a transposed (non-contiguous) input over dim 0", "[gradcheck][reduce]") {
  mg::manual_seed(36);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::var(in[0].t(), {0}); }, {random_input({3, 4})}));
}

// ---------------------------------------------------------------------------------------------
// sum_to
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck sum_to [2,3,4] -> [3,1]", "[gradcheck][reduce]") {
  mg::manual_seed(40);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::sum_to(in[0], {3, 1});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum_to [2,3,4] -> [1,4]", "[gradcheck][reduce]") {
  mg::manual_seed(41);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::sum_to(in[0], {1, 4});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck sum_to [2,3,4] -> [] (scalar)", "[gradcheck][reduce]") {
  mg::manual_seed(42);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::sum_to(in[0], {}); }, {random_input({2, 3, 4})}));
}

// ---------------------------------------------------------------------------------------------
// Method forms
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck Tensor::sum()", "[gradcheck][reduce]") {
  mg::manual_seed(50);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].sum(); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck Tensor::sum(dims, keepdim)", "[gradcheck][reduce]") {
  mg::manual_seed(51);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return in[0].sum({0, 2}, true);
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck Tensor::mean()", "[gradcheck][reduce]") {
  mg::manual_seed(52);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].mean(); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck Tensor::mean(dims)", "[gradcheck][reduce]") {
  mg::manual_seed(53);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].mean({1}); }, {random_input({2, 3, 4})}));
}
