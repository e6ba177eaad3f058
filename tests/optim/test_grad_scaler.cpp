// GradScaler: scaled gradients are unscaled exactly, an inf/NaN skips the step and
// backs off, clean steps grow the scale, the state round-trips, and a reducer
// makes the skip decision global (what DDP needs).
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "multigrad.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

using namespace mg;

TEST_CASE("GradScaler unscales gradients and steps when they are finite", "[grad_scaler]") {
  Tensor w = tensor<float>({1.0f, 2.0f}).set_requires_grad(true);
  optim::SGDOptions sgd;
  sgd.lr = 0.1;
  optim::SGD opt({w}, sgd);
  optim::GradScalerOptions scaling;
  scaling.init_scale = 1024.0;
  optim::GradScaler scaler(scaling);
  Tensor loss = sum(mul(w, w));  // d/dw = 2w = [2, 4]
  scaler.scale(loss).backward();
  REQUIRE(w.grad().to_vector<float>() == std::vector<float>{2048.0f, 4096.0f});
  REQUIRE(scaler.step(opt));
  REQUIRE(w.grad().to_vector<float>() == std::vector<float>{2.0f, 4.0f});
  REQUIRE(w.to_vector<float>() == std::vector<float>{0.8f, 1.6f});
  scaler.update();
  REQUIRE(scaler.get_scale() == 1024.0);
  REQUIRE(scaler.growth_tracker() == 1);
}

TEST_CASE("GradScaler skips the step on inf/NaN and backs off; grows after clean steps", "[grad_scaler]") {
  Tensor w = tensor<float>({1.0f}).set_requires_grad(true);
  optim::SGDOptions sgd;
  sgd.lr = 0.1;
  optim::SGD opt({w}, sgd);
  optim::GradScalerOptions scaling;
  scaling.init_scale = 8.0;
  scaling.growth_factor = 2.0;
  scaling.backoff_factor = 0.5;
  scaling.growth_interval = 2;
  optim::GradScaler scaler(scaling);
  for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    w.set_grad(tensor<float>({bad}));
    REQUIRE_FALSE(scaler.step(opt));
    REQUIRE(scaler.found_inf());
    REQUIRE(w.item<float>() == 1.0f);  // untouched
    scaler.update();
  }
  REQUIRE(scaler.get_scale() == 2.0);
  for (int i = 0; i < 2; ++i) {
    w.set_grad(tensor<float>({4.0f}));
    REQUIRE(scaler.step(opt));
    scaler.update();
  }
  REQUIRE(scaler.get_scale() == 4.0);
  REQUIRE(scaler.growth_tracker() == 0);
}

TEST_CASE("GradScaler state round-trips and a reducer makes the verdict global", "[grad_scaler]") {
  optim::GradScalerOptions a_options;
  a_options.init_scale = 256.0;
  a_options.growth_interval = 3;
  optim::GradScaler a(a_options);
  Tensor w = tensor<float>({1.0f}).set_requires_grad(true);
  optim::SGDOptions sgd;
  sgd.lr = 0.1;
  optim::SGD opt({w}, sgd);
  w.set_grad(tensor<float>({1.0f}));
  a.step(opt);
  a.update();
  optim::GradScaler b;
  b.load_state_dict(a.state_dict());
  REQUIRE(b.get_scale() == 256.0);
  REQUIRE(b.growth_tracker() == 1);

  // Another rank saw an inf: the reducer says so, and this rank skips too.
  optim::GradScalerOptions c_options;
  c_options.init_scale = 16.0;
  optim::GradScaler c(c_options);
  c.set_found_inf_reducer([](bool local) { return local || true; });
  w.set_grad(tensor<float>({1.0f}));
  const float before = w.item<float>();
  REQUIRE_FALSE(c.step(opt));
  REQUIRE(w.item<float>() == before);
  c.update();
  REQUIRE(c.get_scale() == 8.0);
  REQUIRE_THROWS_WITH(c.update(), Catch::Contains("step()"));
}

TEST_CASE("GradScaler load_state_dict checks every value first and changes nothing when it refuses",
          "[grad_scaler]") {
  optim::GradScalerOptions options;
  options.init_scale = 64.0;
  optim::GradScaler scaler(options);
  optim::GradScaler source;
  const StateDict good = source.state_dict();
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, double>>{{"growth_factor", 1.0},
                                                   {"growth_factor", std::numeric_limits<double>::infinity()},
                                                   {"backoff_factor", 0.0},
                                                   {"backoff_factor", 1.0},
                                                   {"backoff_factor", std::nan("")},
                                                   {"growth_interval", 0.5},
                                                   {"growth_tracker", -1.0}}) {
    INFO(key << " = " << value);
    StateDict bad = good;
    bad[key] = scalar_tensor(value, TensorOptions{DType::f64});
    bad["scale"] = scalar_tensor(2.0, TensorOptions{DType::f64});  // valid, and read before the bad value
    REQUIRE_THROWS_AS(scaler.load_state_dict(bad), Error);
    REQUIRE(scaler.get_scale() == 64.0);  // the scale was not taken from a state that was refused
  }
}
