// clip_grad_norm_ against torch.nn.utils.clip_grad_norm_ (norms 1, 2, 3, inf;
// clipped and not; f64 and f32), parameters without gradients, and the
// non-finite cases: error_if_nonfinite throws before touching anything;
// otherwise NaN / inf propagate exactly as PyTorch does (documented in
// optim/clip_grad.h).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

#include "optim/clip_grad.h"
#include "optim_test_util.h"

using mg::Tensor;
using namespace optim_test;

namespace {

std::vector<Tensor> params_with_grads(const json& c, mg::DType dtype) {
  std::vector<Tensor> params;
  const json& shapes = c.at("shapes");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const mg::Shape shape = shapes[i].get<mg::Shape>();
    Tensor p = mg::zeros(shape, {dtype, mg::Device::cpu(), true});
    p.set_grad(from_json(c.at("grads")[i], shape, dtype));
    params.push_back(p);
  }
  return params;
}

}  // namespace

TEST_CASE("clip_grad_norm_ matches PyTorch", "[optim][clip][torch]") {
  for (const json& c : reference().at("clip")) {
    SECTION(c.at("name").get<std::string>()) {
      const mg::DType dtype = parse_dtype(c.at("dtype"));
      const double tol = dtype == mg::DType::f64 ? 1e-12 : 1e-6;
      auto params = params_with_grads(c, dtype);
      const double norm_type = c.at("norm_type").is_string() ? INFINITY : c.at("norm_type").get<double>();
      const double total = mg::optim::clip_grad_norm_(params, c.at("max_norm").get<double>(), norm_type);
      CHECK(total == Approx(c.at("total_norm").get<double>()).epsilon(tol));
      for (size_t i = 0; i < params.size(); ++i) {
        const auto got = params[i].grad().to_vector<double>();
        const auto want = c.at("clipped")[i].get<std::vector<double>>();
        for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == Approx(want[k]).epsilon(tol).margin(tol));
      }
    }
  }
}

TEST_CASE("clip_grad_norm_ ignores parameters without a gradient", "[optim][clip]") {
  Tensor a = mg::zeros({2}, {mg::DType::f32, mg::Device::cpu(), true});
  Tensor b = mg::zeros({2}, {mg::DType::f32, mg::Device::cpu(), true});
  a.set_grad(mg::tensor<float>({3, 4}));
  CHECK(mg::optim::clip_grad_norm_({a, b}, 1.0) == Approx(5.0));
  CHECK(a.grad().to_vector<float>()[1] == Approx(0.8f).epsilon(1e-5));
  CHECK_FALSE(b.grad().defined());
  CHECK(mg::optim::clip_grad_norm_({b}, 1.0) == 0.0);
}

TEST_CASE("clip_grad_norm_ with non-finite gradients", "[optim][clip]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor a = mg::zeros({2}, {mg::DType::f32, mg::Device::cpu(), true});
  Tensor b = mg::zeros({2}, {mg::DType::f32, mg::Device::cpu(), true});

  SECTION("error_if_nonfinite throws and leaves the gradients alone") {
    a.set_grad(mg::tensor<float>({1, 2}));
    b.set_grad(mg::tensor<float>({nan, 2}));
    REQUIRE_THROWS_WITH(
        mg::optim::clip_grad_norm_({a, b}, 1.0, 2.0, true),
        Catch::Contains("total norm of order 2") && Catch::Contains("nan") && Catch::Contains("parameter 1"));
    CHECK(a.grad().to_vector<float>() == std::vector<float>{1, 2});
  }
  SECTION("NaN: returned, and every gradient becomes NaN (as PyTorch)") {
    a.set_grad(mg::tensor<float>({1, 2}));
    b.set_grad(mg::tensor<float>({nan, 2}));
    CHECK(std::isnan(mg::optim::clip_grad_norm_({a, b}, 1.0)));
    for (float v : a.grad().to_vector<float>()) CHECK(std::isnan(v));
  }
  SECTION("inf: returned, finite elements become 0 and inf ones NaN (as PyTorch)") {
    a.set_grad(mg::tensor<float>({1, 2}));
    b.set_grad(mg::tensor<float>({inf, 2}));
    CHECK(std::isinf(mg::optim::clip_grad_norm_({a, b}, 1.0)));
    CHECK(a.grad().to_vector<float>() == std::vector<float>{0, 0});
    CHECK(std::isnan(b.grad().to_vector<float>()[0]));
    CHECK(b.grad().to_vector<float>()[1] == 0.0f);
  }
  SECTION("inf norm type") {
    a.set_grad(mg::tensor<float>({1, -inf}));
    REQUIRE_THROWS_WITH(mg::optim::clip_grad_norm_({a}, 1.0, INFINITY, true), Catch::Contains("inf"));
  }
}
