// SGD, Adam and AdamW against PyTorch, and the Optimizer contract.
//
// Trajectories: 10 steps on the tiny linear regression of
// tests/fixtures/optim_reference.json (scripts/gen_optim_reference.py, torch 1.13),
// comparing W and b after EVERY step so a mismatch names the first bad step.
// f64 cases must agree to 1e-12 (only rounding differs, so any mistake in the
// update rule -- eps placement, bias correction, first momentum step, decay
// order -- shows up); f32 cases to 1e-5.
//
// Contract: parameters without a gradient are skipped (state untouched),
// mismatched gradients throw naming both sides before anything changes,
// zero_grad sets grads undefined, options are validated, parameters may belong
// to one group only.
//
// Kernels: kernels/cpu/optim on a tensor large enough to take the OpenMP path,
// against the update rules written out in double, element by element.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>

#include "kernels/cpu/optim.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
#include "optim_test_util.h"

using mg::Tensor;
using namespace optim_test;

namespace {

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

void check_trajectory(const std::string& name) {
  const json& c = trajectory(name);
  const mg::DType dtype = parse_dtype(c.at("dtype"));
  const double tol = dtype == mg::DType::f64 ? 1e-12 : 1e-5;
  Problem prob(dtype);
  auto opt = make_optimizer(c, {{"W", prob.W}, {"b", prob.b}});
  const json& steps = c.at("steps");
  REQUIRE(steps.size() == 10);
  for (size_t s = 0; s < steps.size(); ++s) {
    prob.compute_grads(*opt);
    opt->step();
    const double dw = max_abs_diff(values(prob.W), steps[s].at("W").get<std::vector<double>>());
    const double db = max_abs_diff(values(prob.b), steps[s].at("b").get<std::vector<double>>());
    INFO(name << " step " << s + 1 << ": max |W - torch| = " << dw << ", max |b - torch| = " << db);
    REQUIRE(dw <= tol);
    REQUIRE(db <= tol);
  }
  // The whole trajectory must actually move (a no-op optimizer would "match" nothing).
  CHECK(max_abs_diff(values(prob.W), reference().at("problem").at("W").get<std::vector<double>>()) > 0.1);
}

}  // namespace

TEST_CASE("optimizer trajectories match PyTorch", "[optim][torch]") {
  for (const json& c : reference().at("trajectories")) {
    const std::string name = c.at("name");
    SECTION(name) { check_trajectory(name); }
  }
}

TEST_CASE("options structs are aggregates with defaults, set field by field", "[optim]") {
  Problem prob(mg::DType::f64);
  // multigrad is C++17: set the fields you need by name, the others keep their defaults
  // (a C++20 program may use designated initializers on the same structs); see docs/nn-and-optim.md.
  mg::optim::AdamWOptions adamw_options;
  adamw_options.lr = 2e-3;
  adamw_options.weight_decay = 0.05;
  mg::optim::AdamW adamw({prob.W, prob.b}, adamw_options);
  CHECK(adamw.param_groups()[0].lr() == 2e-3);
  CHECK(adamw.param_groups()[0].get("weight_decay") == 0.05);
  CHECK(adamw.param_groups()[0].get("beta2") == 0.999);
  CHECK(adamw.name() == std::string("AdamW"));
  mg::optim::AdamW adamw_default({Tensor(mg::zeros({2}))});
  CHECK(adamw_default.param_groups()[0].get("weight_decay") == 0.01);  // PyTorch's AdamW default
  mg::optim::SGDOptions sgd_options;
  sgd_options.lr = 0.1;
  sgd_options.momentum = 0.9;
  sgd_options.nesterov = true;
  mg::optim::SGD sgd({mg::zeros({3})}, sgd_options);
  CHECK(sgd.param_groups()[0].get("nesterov") == 1.0);
  CHECK(sgd.param_groups()[0].get("dampening") == 0.0);
}

TEST_CASE("parameters without a gradient are skipped", "[optim]") {
  for (int kind = 0; kind < 3; ++kind) {
    Tensor used = mg::ones({3}, {mg::DType::f32, mg::Device::cpu(), true});
    Tensor unused = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
    std::unique_ptr<mg::optim::Optimizer> opt;
    if (kind == 0)
      opt = std::make_unique<mg::optim::SGD>(std::vector<Tensor>{used, unused},
                                             mg::optim::SGDOptions{0.1, 0.9, 0.0, 0.1, false});
    if (kind == 1) opt = std::make_unique<mg::optim::Adam>(std::vector<Tensor>{used, unused});
    if (kind == 2) opt = std::make_unique<mg::optim::AdamW>(std::vector<Tensor>{used, unused});
    INFO(opt->name());
    for (int s = 0; s < 3; ++s) {
      opt->zero_grad();
      mg::sum(used * used).backward();
      CHECK_FALSE(unused.grad().defined());
      opt->step();
    }
    CHECK(unused.to_vector<float>() == std::vector<float>{1, 1});  // weight decay did not touch it either
    CHECK(opt->state(1).empty());
    CHECK_FALSE(opt->state(0).empty());
    CHECK(used.to_vector<float>()[0] < 1.0f);
    if (kind > 0) CHECK(opt->state(0).at("step").item<double>() == 3.0);
  }
}

TEST_CASE("a parameter that misses steps keeps its own Adam step count", "[optim]") {
  Tensor a = mg::ones({2}, {mg::DType::f64, mg::Device::cpu(), true});
  Tensor b = mg::ones({2}, {mg::DType::f64, mg::Device::cpu(), true});
  mg::optim::Adam opt({a, b});
  for (int s = 0; s < 4; ++s) {
    opt.zero_grad();
    (s % 2 == 0 ? mg::sum(a * b) : mg::sum(a * a)).backward();  // b gets a grad on even steps only
    opt.step();
  }
  CHECK(opt.state(0).at("step").item<double>() == 4.0);
  CHECK(opt.state(1).at("step").item<double>() == 2.0);
  const mg::StateDict sd = opt.state_dict();
  CHECK(sd.at("param_groups.0.step").item<double>() == 4.0);
}

TEST_CASE("zero_grad sets gradients undefined", "[optim]") {
  Tensor w = mg::ones({2, 2}, {mg::DType::f32, mg::Device::cpu(), true});
  mg::optim::SGDOptions sgd;
  sgd.lr = 0.1;
  mg::optim::SGD opt({w}, sgd);
  mg::sum(w * 3.0).backward();
  REQUIRE(w.grad().defined());
  opt.zero_grad();
  CHECK_FALSE(w.grad().defined());
  opt.step();  // nothing has a gradient: a no-op
  CHECK(w.to_vector<float>() == std::vector<float>(4, 1.0f));
}

TEST_CASE("a gradient that does not match its parameter is refused before any update", "[optim]") {
  Tensor first = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
  Tensor w = mg::ones({3}, {mg::DType::f32, mg::Device::cpu(), true});
  mg::optim::SGDOptions sgd;
  sgd.lr = 0.1;
  mg::optim::SGD opt({first, w}, sgd);
  first.set_grad(mg::ones({2}));

  SECTION("dtype") {
    w.mutable_grad() = mg::ones({3}, {mg::DType::f64});
    REQUIRE_THROWS_WITH(opt.step(), Catch::Contains("SGD.step: parameter 1 is f32 on cpu:0") &&
                                        Catch::Contains("gradient is f64 on cpu:0"));
  }
  SECTION("device") {
    w.mutable_grad() = mg::ones({3}, {mg::DType::f32, mg::Device::cpu(1)});
    REQUIRE_THROWS_WITH(opt.step(), Catch::Contains("f32 on cpu:0") && Catch::Contains("f32 on cpu:1"));
  }
  SECTION("shape") {
    w.mutable_grad() = mg::ones({4});
    REQUIRE_THROWS_WITH(opt.step(), Catch::Contains("shape [3]") && Catch::Contains("[4]"));
  }
  // The valid first parameter was not updated either.
  CHECK(first.to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("steps run under NoGradGuard and bump the parameters' version", "[optim]") {
  Tensor w = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
  mg::optim::Adam opt({w});
  mg::sum(w * w).backward();
  const uint64_t before = w.version();
  opt.step();
  CHECK(w.version() > before);
  CHECK(mg::GradMode::is_enabled());  // restored afterwards
  CHECK(w.requires_grad());
  CHECK(w.is_leaf());
}

TEST_CASE("non-contiguous gradients are accepted", "[optim]") {
  Tensor w = mg::zeros({2, 3}, {mg::DType::f64, mg::Device::cpu(), true});
  mg::optim::SGDOptions sgd;
  sgd.lr = 1.0;
  mg::optim::SGD opt({w}, sgd);
  Tensor g = mg::arange(0, 6, 1, {mg::DType::f64}).reshape({3, 2}).t();  // [2, 3], transposed strides
  REQUIRE_FALSE(g.is_contiguous());
  w.set_grad(g);
  opt.step();
  CHECK(w.to_vector<double>() == std::vector<double>{-0, -2, -4, -1, -3, -5});
}

TEST_CASE("param groups: defaults, overrides, add_param_group", "[optim]") {
  Tensor a = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
  Tensor b = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
  Tensor c = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
  mg::optim::SGDOptions defaults;
  defaults.lr = 0.1;
  defaults.momentum = 0.9;
  mg::optim::SGD opt({mg::optim::ParamGroup{{a}, {}}, mg::optim::ParamGroup{{b}, {{"lr", 0.5}}}}, defaults);
  REQUIRE(opt.param_groups().size() == 2);
  CHECK(opt.param_groups()[0].lr() == 0.1);
  CHECK(opt.param_groups()[1].lr() == 0.5);
  CHECK(opt.param_groups()[1].get("momentum") == 0.9);  // filled from the defaults
  opt.add_param_group({{c}, {{"momentum", 0.0}}});
  CHECK(opt.num_params() == 3);
  CHECK(opt.param_groups()[2].get("momentum") == 0.0);
  CHECK(opt.param_groups()[2].lr() == 0.1);

  SECTION("one update per group's lr") {
    for (const Tensor& p : {a, b, c}) p.set_grad(mg::ones({2}));
    opt.step();
    CHECK(a.to_vector<float>()[0] == Approx(0.9f));
    CHECK(b.to_vector<float>()[0] == Approx(0.5f));
    CHECK(c.to_vector<float>()[0] == Approx(0.9f));
    CHECK(opt.state(0).count("momentum_buffer") == 1);
    CHECK(opt.state(2).empty());  // momentum 0: no buffer
  }
  SECTION("errors") {
    REQUIRE_THROWS_WITH(opt.add_param_group({{a}, {}}), Catch::Contains("already in group 0"));
    Tensor d = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
    REQUIRE_THROWS_WITH(opt.add_param_group({{d}, {{"momentun", 0.5}}}),
                        Catch::Contains("unknown option 'momentun'") && Catch::Contains("momentum"));
    REQUIRE_THROWS_WITH(opt.add_param_group({{d, d}, {}}), Catch::Contains("repeats parameter 0"));
    REQUIRE_THROWS_WITH(opt.add_param_group({{mg::ones({2}, {mg::DType::i64})}, {}}),
                        Catch::Contains("floating-point"));
    Tensor nonleaf = d * 2.0;
    REQUIRE_THROWS_WITH(opt.add_param_group({{nonleaf}, {}}), Catch::Contains("non-leaf"));
    CHECK(opt.num_params() == 3);
    REQUIRE_THROWS_WITH(opt.param_groups()[0].get("betas"), Catch::Contains("no hyperparameter 'betas'"));
  }
}

TEST_CASE("hyperparameters are validated", "[optim]") {
  Tensor w = mg::ones({2}, {mg::DType::f32, mg::Device::cpu(), true});
  using mg::optim::Adam;
  using mg::optim::SGD;
  mg::optim::SGDOptions negative_lr;
  negative_lr.lr = -1.0;
  REQUIRE_THROWS_WITH(SGD({w}, negative_lr), Catch::Contains("invalid learning rate -1"));
  mg::optim::SGDOptions nesterov_without_momentum;
  nesterov_without_momentum.lr = 0.1;
  nesterov_without_momentum.nesterov = true;
  REQUIRE_THROWS_WITH(SGD({w}, nesterov_without_momentum), Catch::Contains("nesterov momentum requires"));
  mg::optim::SGDOptions nesterov_with_dampening;
  nesterov_with_dampening.lr = 0.1;
  nesterov_with_dampening.momentum = 0.9;
  nesterov_with_dampening.dampening = 0.1;
  nesterov_with_dampening.nesterov = true;
  REQUIRE_THROWS_WITH(SGD({w}, nesterov_with_dampening), Catch::Contains("dampening == 0"));
  mg::optim::AdamOptions beta1_one;
  beta1_one.beta1 = 1.0;
  REQUIRE_THROWS_WITH(Adam({w}, beta1_one), Catch::Contains("invalid beta1 1"));
  mg::optim::AdamOptions negative_eps;
  negative_eps.eps = -1e-8;
  REQUIRE_THROWS_WITH(Adam({w}, negative_eps), Catch::Contains("invalid eps"));
  REQUIRE_THROWS_WITH(SGD(std::vector<Tensor>{}), Catch::Contains("empty parameter list"));
  Tensor h = mg::ones({2}, {mg::DType::f16, mg::Device::cpu(), true});
  mg::optim::SGDOptions sgd;
  sgd.lr = 0.1;
  SGD half({h}, sgd);
  h.set_grad(mg::ones({2}, {mg::DType::f16}));
  REQUIRE_THROWS_WITH(half.step(), Catch::Contains("f32 or f64"));
}

namespace {

std::vector<double> random_vector(size_t n, double lo, double hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}

template <class T>
std::vector<T> as(const std::vector<double>& v) {
  return std::vector<T>(v.begin(), v.end());
}

template <class T>
double max_rel_err(const std::vector<T>& got, const std::vector<double>& want) {
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i)
    m = std::max(m, std::abs(static_cast<double>(got[i]) - want[i]) / std::max(1.0, std::abs(want[i])));
  return m;
}

// Two fused steps of each kernel (so the "later step" branches run too) on n
// elements, against the rules in double.
template <class T>
void check_kernels(mg::DType dtype, double tol) {
  namespace k = mg::kernels::cpu;
  const size_t n = (1 << 17) + 3;  // above the OpenMP threshold, not a multiple of the vector width
  const auto p0 = random_vector(n, -1, 1, 1), g1 = random_vector(n, -1, 1, 2),
             g2 = random_vector(n, -1, 1, 3);

  SECTION("sgd nesterov + weight decay + dampening 0") {
    mg::kernels::SgdHyper h;
    h.lr = 0.1, h.momentum = 0.9, h.weight_decay = 0.01, h.nesterov = true;
    std::vector<T> p = as<T>(p0), buf(n);
    k::sgd_step(dtype, n, p.data(), as<T>(g1).data(), buf.data(), true, h);
    k::sgd_step(dtype, n, p.data(), as<T>(g2).data(), buf.data(), false, h);
    std::vector<double> want(n), want_buf(n);
    for (size_t i = 0; i < n; ++i) {
      double x = p0[i], b = 0;
      for (int s = 0; s < 2; ++s) {
        const double d = (s ? g2[i] : g1[i]) + 0.01 * x;
        b = s ? 0.9 * b + d : d;
        x -= 0.1 * (d + 0.9 * b);
      }
      want[i] = x, want_buf[i] = b;
    }
    CHECK(max_rel_err(p, want) < tol);
    CHECK(max_rel_err(buf, want_buf) < tol);
  }
  SECTION("adam / adamw with amsgrad") {
    for (bool decoupled : {false, true}) {
      mg::kernels::AdamHyper h;
      h.lr = 0.01, h.beta1 = 0.8, h.beta2 = 0.9, h.eps = 1e-6, h.weight_decay = 0.1, h.amsgrad = true;
      std::vector<T> p = as<T>(p0), m(n), v(n), vmax(n);
      for (int s = 1; s <= 2; ++s) {
        h.step = s;
        auto kernel = decoupled ? k::adamw_step : k::adam_step;
        kernel(dtype, n, p.data(), as<T>(s == 1 ? g1 : g2).data(), m.data(), v.data(), vmax.data(), h);
      }
      std::vector<double> want(n);
      for (size_t i = 0; i < n; ++i) {
        double x = p0[i], mm = 0, vv = 0, vm = 0;
        for (int s = 1; s <= 2; ++s) {
          double g = s == 1 ? g1[i] : g2[i];
          if (decoupled)
            x *= 1 - 0.01 * 0.1;
          else
            g += 0.1 * x;
          mm = 0.8 * mm + 0.2 * g;
          vv = 0.9 * vv + 0.1 * g * g;
          vm = std::max(vm, vv);
          const double mhat = mm / (1 - std::pow(0.8, s)), vhat = vm / (1 - std::pow(0.9, s));
          x -= 0.01 * mhat / (std::sqrt(vhat) + 1e-6);
        }
        want[i] = x;
      }
      INFO((decoupled ? "adamw" : "adam"));
      CHECK(max_rel_err(p, want) < tol);
    }
  }
}

}  // namespace

TEST_CASE("optimizer kernels follow the update rules (f64)", "[optim][kernel]") {
  check_kernels<double>(mg::DType::f64, 1e-13);
}
TEST_CASE("optimizer kernels follow the update rules (f32)", "[optim][kernel]") {
  check_kernels<float>(mg::DType::f32, 1e-5);
}
TEST_CASE("optimizer kernels refuse other dtypes", "[optim][kernel]") {
  float x = 0;
  REQUIRE_THROWS_WITH(mg::kernels::cpu::sgd_step(mg::DType::bf16, 1, &x, &x, nullptr, true, {}),
                      Catch::Contains("f32 or f64"));
}
