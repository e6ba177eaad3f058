// LR schedulers: StepLR and CosineAnnealingLR against PyTorch's get_last_lr()
// sequences (tests/fixtures/optim_reference.json: two param groups, lr 0.1 and
// 0.02, past the end of the cosine's period), LinearWarmupCosine against its
// closed form written out here, that each step() writes the group lrs, and the
// scheduler state_dict round trip and errors.
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>

#include "optim/lr_scheduler.h"
#include "optim/sgd.h"
#include "optim_test_util.h"

using mg::Tensor;
using namespace optim_test;

namespace {

struct TwoGroups {
  Tensor a = mg::zeros({1}, {mg::DType::f32, mg::Device::cpu(), true});
  Tensor b = mg::zeros({1}, {mg::DType::f32, mg::Device::cpu(), true});
  mg::optim::SGD opt{std::vector<mg::optim::ParamGroup>{{{a}, {{"lr", 0.1}}}, {{b}, {{"lr", 0.02}}}}};
};

std::unique_ptr<mg::optim::LRScheduler> make(const json& c, mg::optim::Optimizer& opt) {
  const json& o = c.at("options");
  if (c.at("kind") == "StepLR")
    return std::make_unique<mg::optim::StepLR>(
        opt, mg::optim::StepLROptions{o.at("step_size").get<int64_t>(), o.at("gamma").get<double>()});
  return std::make_unique<mg::optim::CosineAnnealingLR>(
      opt, mg::optim::CosineAnnealingLROptions{o.at("t_max").get<int64_t>(), o.at("eta_min").get<double>()});
}

}  // namespace

TEST_CASE("StepLR and CosineAnnealingLR match PyTorch", "[optim][lr_scheduler][torch]") {
  for (const json& c : reference().at("schedulers")) {
    SECTION(c.at("name").get<std::string>()) {
      TwoGroups m;
      auto sched = make(c, m.opt);
      const json& lrs = c.at("lrs");
      for (size_t t = 0; t < lrs.size(); ++t) {
        if (t > 0) sched->step();
        const auto want = lrs[t].get<std::vector<double>>();
        const auto& got = sched->get_last_lr();
        REQUIRE(got.size() == 2);
        for (size_t g = 0; g < 2; ++g) {
          INFO(c.at("name") << " t=" << t << " group " << g << ": " << got[g] << " vs torch " << want[g]);
          CHECK(got[g] == Approx(want[g]).epsilon(1e-12).margin(1e-15));
          CHECK(m.opt.param_groups()[g].lr() == got[g]);  // written into the optimizer
        }
      }
    }
  }
}

TEST_CASE("LinearWarmupCosine follows its closed form", "[optim][lr_scheduler]") {
  TwoGroups m;
  const int64_t warmup = 4, total = 12;
  const double min_lr = 0.001;
  mg::optim::LinearWarmupCosineOptions options;
  options.warmup_steps = warmup;
  options.total_steps = total;
  options.min_lr = min_lr;
  mg::optim::LinearWarmupCosine sched(m.opt, options);
  const double pi = std::acos(-1.0);
  for (int64_t t = 0; t <= total + 3; ++t) {
    if (t > 0) sched.step();
    for (size_t g = 0; g < 2; ++g) {
      const double base = g == 0 ? 0.1 : 0.02;
      double want;
      if (t < warmup)
        want = base * double(t + 1) / double(warmup);
      else if (t > total)
        want = min_lr;
      else
        want =
            min_lr + 0.5 * (base - min_lr) * (1 + std::cos(pi * double(t - warmup) / double(total - warmup)));
      INFO("t=" << t << " group " << g);
      CHECK(sched.get_last_lr()[g] == Approx(want).epsilon(1e-14));
      CHECK(m.opt.param_groups()[g].lr() == sched.get_last_lr()[g]);
    }
  }
  // Landmarks: the first step trains at base/warmup, warmup ends at base, the decay ends at min_lr.
  CHECK(sched.lr_at(0, 0.1) == Approx(0.025));
  CHECK(sched.lr_at(warmup - 1, 0.1) == Approx(0.1));
  CHECK(sched.lr_at(warmup, 0.1) == Approx(0.1));
  CHECK(sched.lr_at(total, 0.1) == Approx(min_lr));
  // No warmup: a plain cosine.
  TwoGroups n;
  mg::optim::LinearWarmupCosineOptions no_warmup;
  no_warmup.warmup_steps = 0;
  no_warmup.total_steps = 10;
  mg::optim::LinearWarmupCosine plain(n.opt, no_warmup);
  CHECK(plain.get_last_lr()[0] == 0.1);
  CHECK(plain.lr_at(5, 0.1) == Approx(0.05));
}

TEST_CASE("scheduler settings are validated", "[optim][lr_scheduler]") {
  TwoGroups m;
  mg::optim::StepLROptions step;
  step.step_size = 0;
  REQUIRE_THROWS_WITH(mg::optim::StepLR(m.opt, step), Catch::Contains("step_size must be >= 1"));
  mg::optim::CosineAnnealingLROptions cosine;
  cosine.t_max = 0;
  REQUIRE_THROWS_WITH(mg::optim::CosineAnnealingLR(m.opt, cosine), Catch::Contains("t_max must be >= 1"));
  mg::optim::LinearWarmupCosineOptions warmup_cosine;
  warmup_cosine.warmup_steps = 5;
  warmup_cosine.total_steps = 5;
  REQUIRE_THROWS_WITH(mg::optim::LinearWarmupCosine(m.opt, warmup_cosine),
                      Catch::Contains("must be greater than warmup_steps"));
}

TEST_CASE("scheduler state dict round trip and errors", "[optim][lr_scheduler][state_dict]") {
  TwoGroups m;
  mg::optim::StepLROptions step;
  step.step_size = 2;
  step.gamma = 0.5;
  mg::optim::StepLR sched(m.opt, step);
  for (int i = 0; i < 5; ++i) sched.step();
  const mg::StateDict sd = sched.state_dict();
  CHECK(sd.at("last_epoch").item<double>() == 5.0);
  CHECK(sd.at("base_lrs.1").item<double>() == 0.02);
  CHECK(sd.at("gamma").item<double>() == 0.5);

  TwoGroups m2;
  mg::optim::StepLROptions other_step;
  other_step.step_size = 7;
  other_step.gamma = 0.9;
  mg::optim::StepLR sched2(m2.opt, other_step);  // settings come from the state
  sched2.load_state_dict(sd);
  CHECK(sched2.last_epoch() == 5);
  CHECK(sched2.get_last_lr() == sched.get_last_lr());
  CHECK(m2.opt.param_groups()[0].lr() == sched.get_last_lr()[0]);  // written into the optimizer
  CHECK(m2.opt.param_groups()[1].lr() == sched.get_last_lr()[1]);
  for (int i = 0; i < 4; ++i) {
    sched.step();
    sched2.step();
    CHECK(sched2.get_last_lr() == sched.get_last_lr());
  }

  SECTION("errors leave the scheduler untouched") {
    mg::StateDict bad = sd;
    bad.erase("gamma");
    bad["base_lrs.2"] = mg::scalar_tensor(0.1, {mg::DType::f64});
    bad["last_epoch"] = mg::zeros({3}, {mg::DType::f64});
    REQUIRE_THROWS_WITH(sched2.load_state_dict(bad), Catch::Contains("missing keys: gamma") &&
                                                         Catch::Contains("unexpected keys: base_lrs.2") &&
                                                         Catch::Contains("mis-shaped keys: last_epoch"));
    mg::StateDict cosine_state;
    {
      TwoGroups m3;
      mg::optim::CosineAnnealingLROptions cosine;
      cosine.t_max = 5;
      cosine_state = mg::optim::CosineAnnealingLR(m3.opt, cosine).state_dict();
    }
    REQUIRE_THROWS_WITH(sched2.load_state_dict(cosine_state),
                        Catch::Contains("unexpected keys:") && Catch::Contains("t_max"));
    mg::StateDict bad_value = sd;
    bad_value["step_size"] = mg::scalar_tensor(2.5, {mg::DType::f64});
    REQUIRE_THROWS_WITH(sched2.load_state_dict(bad_value),
                        Catch::Contains("step_size must be a whole number"));
    CHECK(sched2.last_epoch() == 9);
    CHECK(sched2.state_dict().at("step_size").item<double>() == 2.0);
  }
}

TEST_CASE("set_step jumps to a step in O(1), as that many step() calls would", "[optim][lr_scheduler]") {
  TwoGroups stepped, jumped;
  mg::optim::CosineAnnealingLROptions cosine;
  cosine.t_max = 10;
  cosine.eta_min = 0.001;
  mg::optim::CosineAnnealingLR a(stepped.opt, cosine), b(jumped.opt, cosine);
  for (int64_t t = 1; t <= 25; ++t) {
    a.step();
    b.set_step(t);
    CHECK(b.last_epoch() == t);
    CHECK(b.get_last_lr() == a.get_last_lr());
    CHECK(jumped.opt.param_groups()[0].lr() == stepped.opt.param_groups()[0].lr());
  }
  // A resumed step of 10^15 (a damaged or foreign checkpoint) used to spin in a loop of step()s.
  const auto start = std::chrono::steady_clock::now();
  b.set_step(1'000'000'000'000'000);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  CHECK(b.get_last_lr()[0] == b.lr_at(1'000'000'000'000'000, 0.1));
  CHECK_THROWS_WITH(b.set_step(-1), Catch::Contains("must be >= 0"));
}
