// Finite-difference gradient checks (f64, CPU) for views and shape ops: view/reshape,
// transpose, permute, narrow, slice (with step), select, expand, squeeze/unsqueeze,
// flatten, contiguous, clone, cat, stack, split, chunk, index_select.
//
// gradcheck perturbs its inputs in place, so inputs are contiguous leaves and the views
// are taken inside the checked function.
//
// The last cases are negative controls: functions whose backward is deliberately wrong,
// which the checker must reject (otherwise every passing case above would prove nothing).
#include <catch2/catch.hpp>
#include <cstdint>
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

Tensor indices(const std::vector<int64_t>& values) {
  return mg::tensor<int64_t>(values, mg::TensorOptions{DType::i64});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck view [2,3,4] -> [4,6]", "[gradcheck][shape]") {
  mg::manual_seed(1);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return in[0].view({4, 6});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck view with -1 followed by an op", "[gradcheck][shape]") {
  mg::manual_seed(2);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::exp(in[0].view({-1, 3}));
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck reshape (view path)", "[gradcheck][shape]") {
  mg::manual_seed(3);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return in[0].reshape({3, 8});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck reshape of a transposed tensor (copy path)", "[gradcheck][shape]") {
  mg::manual_seed(4);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].t().reshape({-1}); }, {random_input({3, 4})}));
}

TEST_CASE("gradcheck transpose(0, 2)", "[gradcheck][shape]") {
  mg::manual_seed(5);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].transpose(0, 2); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck t()", "[gradcheck][shape]") {
  mg::manual_seed(6);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::mul(in[0].t(), in[1]); },
                                 {random_input({3, 4}), random_input({4, 3})}));
}

TEST_CASE("gradcheck permute {2,0,1}", "[gradcheck][shape]") {
  mg::manual_seed(7);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return in[0].permute({2, 0, 1});
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck narrow", "[gradcheck][shape]") {
  mg::manual_seed(8);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].narrow(1, 1, 2); }, {random_input({2, 4, 3})}));
}

TEST_CASE("gradcheck slice with step 2 on the last dim", "[gradcheck][shape]") {
  mg::manual_seed(9);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].slice(1, 0, 6, 2); }, {random_input({5, 6})}));
}

TEST_CASE("gradcheck slice with step 2 and an offset start on dim 0", "[gradcheck][shape]") {
  mg::manual_seed(10);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].slice(0, 1, 5, 2); }, {random_input({5, 6})}));
}

TEST_CASE("gradcheck select", "[gradcheck][shape]") {
  mg::manual_seed(11);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].select(1, 2); }, {random_input({2, 4, 3})}));
}

TEST_CASE("gradcheck select with a negative index", "[gradcheck][shape]") {
  mg::manual_seed(12);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].select(0, -1); }, {random_input({3, 4})}));
}

TEST_CASE("gradcheck expand [3,1] -> [2,3,4]", "[gradcheck][shape]") {
  mg::manual_seed(13);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return in[0].expand({2, 3, 4});
      },
      {random_input({3, 1})}));
}

TEST_CASE("gradcheck expand with -1 then an elementwise op", "[gradcheck][shape]") {
  mg::manual_seed(14);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::square(in[0].expand({-1, 5}));
      },
      {random_input({3, 1})}));
}

TEST_CASE("gradcheck squeeze(dim)", "[gradcheck][shape]") {
  mg::manual_seed(15);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].squeeze(1); }, {random_input({3, 1, 4})}));
}

TEST_CASE("gradcheck squeeze() all size-1 dims", "[gradcheck][shape]") {
  mg::manual_seed(16);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].squeeze(); }, {random_input({1, 3, 1, 4})}));
}

TEST_CASE("gradcheck unsqueeze", "[gradcheck][shape]") {
  mg::manual_seed(17);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return mg::mul(in[0].unsqueeze(1), in[1]); },
                                 {random_input({3, 4}), random_input({3, 2, 4})}));
}

TEST_CASE("gradcheck flatten()", "[gradcheck][shape]") {
  mg::manual_seed(18);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return in[0].flatten(); }, {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck flatten(1) of a permuted tensor", "[gradcheck][shape]") {
  mg::manual_seed(19);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return in[0].permute({1, 0, 2}).flatten(1);
      },
      {random_input({2, 3, 4})}));
}

TEST_CASE("gradcheck contiguous of a transposed tensor", "[gradcheck][shape]") {
  mg::manual_seed(20);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        Tensor y = in[0].transpose(0, 1).contiguous();
        REQUIRE(y.is_contiguous());
        return y;
      },
      {random_input({3, 4})}));
}

TEST_CASE("gradcheck clone", "[gradcheck][shape]") {
  mg::manual_seed(21);
  MG_REQUIRE_GRADCHECK(
      gradcheck([](const Inputs& in) { return mg::mul(in[0].clone(), in[0]); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck chained views: slice -> transpose -> select -> unsqueeze", "[gradcheck][shape]") {
  mg::manual_seed(22);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::tanh(in[0].slice(2, 1, 5, 2).transpose(0, 2).select(1, 1).unsqueeze(0));
      },
      {random_input({2, 3, 5})}));
}

TEST_CASE("gradcheck expand of a 0-d tensor to [2,3]", "[gradcheck][shape]") {
  mg::manual_seed(23);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].expand({2, 3}); }, {random_input({})}));
}

TEST_CASE("gradcheck squeeze(dim) of a dim that is not size 1 (no-op)", "[gradcheck][shape]") {
  mg::manual_seed(24);
  MG_REQUIRE_GRADCHECK(gradcheck([](const Inputs& in) { return in[0].squeeze(0); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck unsqueeze(-1) then expand", "[gradcheck][shape]") {
  mg::manual_seed(25);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return in[0].unsqueeze(-1).expand({3, 4, 2});
      },
      {random_input({3, 4})}));
}

// ---------------------------------------------------------------------------------------------
// Joining and splitting
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck cat of 3 inputs along dim 1", "[gradcheck][shape]") {
  mg::manual_seed(30);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::cat({in[0], in[1], in[2]}, 1);
      },
      {random_input({2, 1, 3}), random_input({2, 2, 3}), random_input({2, 3, 3})}));
}

TEST_CASE("gradcheck cat along dim 0 with the same input twice", "[gradcheck][shape]") {
  mg::manual_seed(31);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::cat({in[0], in[1], in[0]}, 0);
      },
      {random_input({2, 3}), random_input({1, 3})}));
}

TEST_CASE("gradcheck stack of 3 inputs along dim 1", "[gradcheck][shape]") {
  mg::manual_seed(32);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::stack({in[0], in[1], in[2]}, 1);
      },
      {random_input({2, 3}), random_input({2, 3}), random_input({2, 3})}));
}

TEST_CASE("gradcheck stack along dim 0", "[gradcheck][shape]") {
  mg::manual_seed(33);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        return mg::stack({in[0], in[1]}, 0);
      },
      {random_input({4}), random_input({4})}));
}

TEST_CASE("gradcheck split by size 3 of 7 rows (uneven)", "[gradcheck][shape]") {
  mg::manual_seed(34);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        std::vector<Tensor> parts = mg::split(in[0], 3, 0);
        REQUIRE(parts.size() == 3);
        REQUIRE(parts[2].size(0) == 1);
        // A different function of each piece, so a misrouted gradient shows.
        return mg::cat({mg::exp(parts[0]), mg::mul(parts[1], 2.0), mg::square(parts[2])}, 0);
      },
      {random_input({7, 3})}));
}

TEST_CASE("gradcheck split by sizes {1,3,2} along dim 1, one piece unused", "[gradcheck][shape]") {
  // The unused middle piece receives no gradient: its slice of x.grad must be zero.
  mg::manual_seed(35);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        std::vector<Tensor> parts = mg::split(in[0], std::vector<int64_t>{1, 3, 2}, 1);
        REQUIRE(parts.size() == 3);
        return mg::cat({mg::tanh(parts[2]), parts[0]}, 1);
      },
      {random_input({2, 6})}));
}

TEST_CASE("gradcheck chunk 3 of 5 rows", "[gradcheck][shape]") {
  mg::manual_seed(36);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        std::vector<Tensor> parts = mg::chunk(in[0], 3, 0);
        REQUIRE(parts.size() == 3);
        return mg::cat({mg::mul(parts[0], 3.0), mg::exp(parts[1]), parts[2]}, 0);
      },
      {random_input({5, 4})}));
}

TEST_CASE("gradcheck chunk along dim 1", "[gradcheck][shape]") {
  mg::manual_seed(37);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        std::vector<Tensor> parts = mg::chunk(in[0], 2, 1);
        REQUIRE(parts.size() == 2);
        return mg::mul(parts[0], parts[1]);
      },
      {random_input({3, 4})}));
}

TEST_CASE("gradcheck index_select dim 0 with repeated indices", "[gradcheck][shape]") {
  mg::manual_seed(38);
  const Tensor idx = indices({2, 0, 2, 3, 2});
  MG_REQUIRE_GRADCHECK(
      gradcheck([idx](const Inputs& in) { return mg::index_select(in[0], 0, idx); }, {random_input({4, 3})}));
}

TEST_CASE("gradcheck index_select dim 1 with repeated indices", "[gradcheck][shape]") {
  mg::manual_seed(39);
  const Tensor idx = indices({1, 1, 0, 3});
  MG_REQUIRE_GRADCHECK(gradcheck([idx](const Inputs& in) { return mg::index_select(in[0], 1, idx); },
                                 {random_input({2, 4, 3})}));
}

TEST_CASE("gradcheck cat, stack and split with negative dims", "[gradcheck][shape]") {
  mg::manual_seed(40);
  MG_REQUIRE_GRADCHECK(gradcheck(
      [](const Inputs& in) {
        Tensor joined = mg::cat({in[0], in[1]}, -1);           // [2, 5]
        std::vector<Tensor> parts = mg::split(joined, 2, -1);  // 2, 2, 1
        REQUIRE(parts.size() == 3);
        return mg::stack({mg::exp(parts[1]), parts[0]}, -1);  // [2, 2, 2]
      },
      {random_input({2, 3}), random_input({2, 2})}));
}

TEST_CASE("gradcheck index_select with a 0-d index", "[gradcheck][shape]") {
  mg::manual_seed(41);
  const Tensor idx = mg::tensor<int64_t>({1}, {}, mg::TensorOptions{DType::i64});
  MG_REQUIRE_GRADCHECK(
      gradcheck([idx](const Inputs& in) { return mg::index_select(in[0], 1, idx); }, {random_input({2, 3})}));
}

TEST_CASE("gradcheck index_select of a transposed (non-contiguous) input", "[gradcheck][shape]") {
  mg::manual_seed(42);
  const Tensor idx = indices({0, 2, 0});
  MG_REQUIRE_GRADCHECK(gradcheck([idx](const Inputs& in) { return mg::index_select(in[0].t(), 0, idx); },
                                 {random_input({4, 3})}));
}

// ---------------------------------------------------------------------------------------------
// Negative controls: a wrong backward must make gradcheck fail.
// ---------------------------------------------------------------------------------------------

TEST_CASE("gradcheck negative control: a hook doubling an intermediate's gradient", "[gradcheck][negative]") {
  mg::manual_seed(90);
  const mg::testing::GradcheckResult result = gradcheck(
      [](const Inputs& in) {
        Tensor y = mg::exp(in[0]);
        y.register_hook([](const Tensor& g) { return mg::mul(g, 2.0); });
        return mg::tanh(y);
      },
      {random_input({2, 3})});
  INFO(result.message);
  CHECK_FALSE(result.ok);
  CHECK(result.message.find("input 0") != std::string::npos);
}

TEST_CASE("gradcheck negative control: a hook zeroing the gradient of the second input's path",
          "[gradcheck][negative]") {
  // The first input's gradient is right; the checker must still find the second one wrong.
  mg::manual_seed(91);
  const mg::testing::GradcheckResult result = gradcheck(
      [](const Inputs& in) {
        Tensor b = mg::square(in[1]);
        b.register_hook([](const Tensor& g) { return mg::zeros_like(g); });
        return mg::mul(in[0], b);
      },
      {random_input({2, 3}), random_input({2, 3}, 0.5, 1.0)});
  INFO(result.message);
  CHECK_FALSE(result.ok);
  CHECK(result.message.find("input 1") != std::string::npos);
}

TEST_CASE("gradcheck negative control: a detached factor drops half of d(x*x)", "[gradcheck][negative]") {
  // x * x.detach() has the value x^2 but autograd sees only one factor: grad x instead of 2x.
  mg::manual_seed(92);
  const mg::testing::GradcheckResult result = gradcheck(
      [](const Inputs& in) { return mg::mul(in[0], in[0].detach()); }, {random_input({2, 3}, 0.5, 1.0)});
  INFO(result.message);
  CHECK_FALSE(result.ok);
}

TEST_CASE("gradcheck negative control: a tiny gradient error (1e-3 relative) is still caught",
          "[gradcheck][negative]") {
  // A scale of 1.001 on the gradient is above rtol = 1e-4: the checker's tolerance is tight.
  mg::manual_seed(93);
  const mg::testing::GradcheckResult result = gradcheck(
      [](const Inputs& in) {
        Tensor y = mg::mul(in[0], 3.0);
        y.register_hook([](const Tensor& g) { return mg::mul(g, 1.001); });
        return y;
      },
      {random_input({2, 3}, 0.5, 1.0)});
  INFO(result.message);
  CHECK_FALSE(result.ok);
}
