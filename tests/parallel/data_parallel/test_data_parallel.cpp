// DataParallel over logical CPU devices (cpu:0, cpu:1, ...): its pieces (broadcast,
// scatter/gather, replicate, parallel_apply) and the whole, which must give the same
// gradients and, after K optimizer steps, the same parameters as one device.
#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "multigrad.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "parallel/parallel.h"
#include "tests/gradcheck.h"
#include "tests/parallel/data_parallel/two_in_two_out.h"
#include "tests/test_device.h"

using namespace mg;
using Catch::Matchers::Contains;
using mg::testing::relative_error;  // max |a - b| / max |b| (tests/gradcheck.h)

namespace {

std::vector<Device> cpus(int n) {
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

// The devices of the equivalence tests: logical CPU devices, or cuda:0..n-1 when
// MG_TEST_DEVICE=cuda (the CUDA emulation build runs them so on 2 and 4 emulated GPUs).
std::vector<Device> test_devices(int n) {
  if (!testing::test_on_cuda()) return cpus(n);
  std::vector<Device> devices;
  for (int i = 0; i < n; ++i) devices.push_back(Device::cuda(i));
  return devices;
}

// Padding 1: the 3x3 convolution keeps the 8x8 input size.
nn::Conv2dOptions padding_one() {
  nn::Conv2dOptions options;
  options.padding = 1;
  return options;
}

// A small CNN without BatchNorm or Dropout: nothing in it mixes the rows of a batch
// or draws random numbers, so DataParallel must reproduce one device exactly (up to
// summation order).
struct SmallCNN : nn::Module {
  nn::Conv2d conv{1, 4, 3, padding_one()};
  nn::Linear fc1{4 * 4 * 4, 16};
  nn::Linear fc2{16, 5};
  SmallCNN() {
    register_module("conv", conv);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override {  // [N, 1, 8, 8] -> [N, 5]
    return fc2(relu(fc1(max_pool2d(relu(conv(x)), 2).flatten(1))));
  }
  std::shared_ptr<nn::Module> clone_empty() const override { return std::make_shared<SmallCNN>(); }
};

struct WithBatchNorm : nn::Module {
  nn::Linear fc{3, 4};
  nn::BatchNorm1d bn{4};
  WithBatchNorm() {
    register_module("fc", fc);
    register_module("bn", bn);
  }
  Tensor forward(const Tensor& x) override { return bn(fc(x)); }
  std::shared_ptr<nn::Module> clone_empty() const override { return std::make_shared<WithBatchNorm>(); }
};

// Throws in the replica that runs on cpu:1.
struct FailsOnCpu1 : nn::Module {
  nn::Linear fc{2, 2};
  FailsOnCpu1() { register_module("fc", fc); }
  Tensor forward(const Tensor& x) override {
    MG_CHECK(x.device() != Device::cpu(1), "boom: this replica refuses ", x.device());
    return fc(x);
  }
  std::shared_ptr<nn::Module> clone_empty() const override { return std::make_shared<FailsOnCpu1>(); }
};

// Writes what each replica thread sees of the thread-local grad mode and autocast state,
// indexed by the replica's device.
std::array<std::atomic<int>, 4> seen_grad_mode, seen_autocast;
struct RecordsThreadState : nn::Module {
  nn::Linear fc{2, 2};
  RecordsThreadState() { register_module("fc", fc); }
  Tensor forward(const Tensor& x) override {
    seen_grad_mode[x.device().index] = GradMode::is_enabled() ? 1 : 0;
    seen_autocast[x.device().index] = autocast_state().enabled ? 1 : 0;
    return fc(x);
  }
  std::shared_ptr<nn::Module> clone_empty() const override { return std::make_shared<RecordsThreadState>(); }
};

}  // namespace

TEST_CASE("broadcast copies to every device and its backward sums the copies' gradients", "[parallel]") {
  Tensor w = tensor<float>({1, 2, 3}).set_requires_grad(true);
  Tensor frozen = tensor<float>({4, 5});
  const auto out = parallel::broadcast({w, frozen}, cpus(3));
  REQUIRE(out.size() == 3);
  for (int d = 0; d < 3; ++d) {
    REQUIRE(out[d].size() == 2);
    CHECK(out[d][0].device() == Device::cpu(d));
    CHECK(out[d][0].to_vector<float>() == std::vector<float>{1, 2, 3});
    CHECK(out[d][1].to_vector<float>() == std::vector<float>{4, 5});
    CHECK(out[d][0].requires_grad());
    CHECK_FALSE(out[d][0].is_leaf());
    CHECK_FALSE(out[d][1].requires_grad());
  }
  // The source device's "copy" is an alias, the others own their memory.
  CHECK(out[0][0].data_ptr() == w.data_ptr());
  CHECK(out[1][0].data_ptr() != w.data_ptr());

  // d(loss)/dw = 1 + 2 + 3: the gradients of the three copies, reduce-added on cpu:0.
  Tensor loss = sum(out[0][0]) + mul(sum(out[1][0]), 2.0).to(Device::cpu(0)) +
                mul(sum(out[2][0]), 3.0).to(Device::cpu(0));
  loss.backward();
  REQUIRE(w.grad().defined());
  CHECK(w.grad().device() == Device::cpu(0));
  CHECK(w.grad().to_vector<float>() == std::vector<float>{6, 6, 6});

  // A copy that gets no gradient contributes nothing.
  w.set_grad(Tensor());
  const auto again = parallel::broadcast({w}, cpus(2));
  sum(again[1][0]).to(Device::cpu(0)).backward();
  CHECK(w.grad().to_vector<float>() == std::vector<float>{1, 1, 1});

  // Without grad mode nothing is recorded.
  {
    NoGradGuard no_grad;
    CHECK_FALSE(parallel::broadcast({w}, cpus(2))[1][0].requires_grad());
  }
}

TEST_CASE("broadcast and reduce_add reject bad arguments", "[parallel]") {
  Tensor a = ones({2}), b = ones({2}, TensorOptions{DType::f32, Device::cpu(1)});
  CHECK_THROWS_WITH(parallel::broadcast({a, b}, cpus(2)),
                    Contains("tensor 0 is on cpu:0 and tensor 1 is on cpu:1"));
  CHECK_THROWS_WITH(parallel::broadcast({a}, {Device::cpu(0), Device::cpu(1), Device::cpu(0)}),
                    Contains("cpu:0 is listed twice"));
  CHECK_THROWS_WITH(parallel::broadcast({a}, {}), Contains("at least one device"));
  CHECK_THROWS_WITH(parallel::reduce_add({a, ones({3})}, Device::cpu(0)),
                    Contains("tensor 0 is [2] f32 but tensor 1 is [3] f32"));
  Tensor total = parallel::reduce_add({a, mul(b, 2.0)}, Device::cpu(0));
  CHECK(total.device() == Device::cpu(0));
  CHECK(total.to_vector<float>() == std::vector<float>{3, 3});
}

TEST_CASE("scatter splits rows like torch.chunk and gather joins them again", "[parallel]") {
  Tensor x = arange(20).to(DType::f32).reshape({10, 2});
  auto rows_of = [](const std::vector<Tensor>& pieces) {
    std::vector<int64_t> rows;
    for (const Tensor& p : pieces) rows.push_back(p.size(0));
    return rows;
  };

  SECTION("uneven last chunk") {
    const auto pieces = parallel::scatter(x, cpus(4));
    CHECK(rows_of(pieces) == std::vector<int64_t>{3, 3, 3, 1});
    for (int i = 0; i < 4; ++i) CHECK(pieces[i].device() == Device::cpu(i));
    CHECK(pieces[3].to_vector<float>() == std::vector<float>{18, 19});
    // The piece already on cpu:0 is a view of x, the others are copies.
    CHECK(pieces[0].data_ptr() == x.data_ptr());
    Tensor back = parallel::gather(pieces, Device::cpu(0));
    CHECK(back.shape() == x.shape());
    CHECK(back.to_vector<float>() == x.to_vector<float>());
    CHECK(parallel::gather(pieces, Device::cpu(2)).device() == Device::cpu(2));
  }
  SECTION("fewer chunks than devices") {
    CHECK(rows_of(parallel::scatter(x.narrow(0, 0, 5), cpus(4))) == std::vector<int64_t>{2, 2, 1});
    CHECK(rows_of(parallel::scatter(x.narrow(0, 0, 2), cpus(4))) == std::vector<int64_t>{1, 1});
    CHECK(rows_of(parallel::scatter(x.narrow(0, 0, 1), cpus(3))) == std::vector<int64_t>{1});
  }
  SECTION("another dim") {
    const auto pieces = parallel::scatter(x, cpus(2), 1);
    CHECK(rows_of(pieces) == std::vector<int64_t>{10, 10});
    CHECK(pieces[1].to_vector<float>()[0] == 1.0f);
    CHECK(parallel::gather(pieces, Device::cpu(0), 1).to_vector<float>() == x.to_vector<float>());
  }
  SECTION("scalars are stacked") {
    Tensor g = parallel::gather(
        {scalar_tensor(1.0), scalar_tensor(2.0, TensorOptions{DType::f32, Device::cpu(1)})}, Device::cpu(0));
    CHECK(g.shape() == Shape{2});
    CHECK(g.to_vector<float>() == std::vector<float>{1, 2});
  }
  SECTION("gradients flow back through gather and scatter") {
    Tensor leaf = x.detach().set_requires_grad(true);
    Tensor weights = arange(20).to(DType::f32).reshape({10, 2});
    sum(mul(parallel::gather(parallel::scatter(leaf, cpus(3)), Device::cpu(1)), weights.to(Device::cpu(1))))
        .backward();
    REQUIRE(leaf.grad().defined());
    CHECK(leaf.grad().device() == Device::cpu(0));
    CHECK(leaf.grad().to_vector<float>() == weights.to_vector<float>());
  }
  SECTION("errors") {
    CHECK_THROWS_WITH(parallel::scatter(scalar_tensor(1.0), cpus(2)), Contains("zero dims"));
    CHECK_THROWS_WITH(parallel::scatter(zeros({0, 3}), cpus(2)), Contains("no rows"));
    CHECK_THROWS_WITH(parallel::gather({ones({2, 3}), ones({2, 4})}, Device::cpu(0)), Contains("cat"));
  }
}

TEST_CASE("replicate makes replicas whose gradients reach the original module", "[parallel]") {
  manual_seed(1);
  WithBatchNorm net;
  net.bn.eval();
  const auto replicas = parallel::replicate(net, cpus(2));
  REQUIRE(replicas.size() == 2);
  const auto original = net.named_parameters();
  for (int d = 0; d < 2; ++d) {
    const auto params = replicas[d]->named_parameters();
    REQUIRE(params.size() == original.size());
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK(params[i].first == original[i].first);
      CHECK(params[i].second.device() == Device::cpu(d));
      CHECK_FALSE(params[i].second.is_leaf());  // broadcast outputs, not new leaves
      CHECK(params[i].second.to_vector<float>() == original[i].second.to_vector<float>());
    }
    for (const auto& [name, buffer] : replicas[d]->named_buffers()) {
      CHECK(buffer.device() == Device::cpu(d));
      CHECK_FALSE(buffer.requires_grad());
    }
    CHECK(replicas[d]->is_training());
    CHECK_FALSE(replicas[d]->child("bn").is_training());
  }
  // Replica 0 shares the module's memory (in-place buffer updates land in the module).
  CHECK(replicas[0]->named_buffers()[0].second.data_ptr() == net.bn.running_mean.data_ptr());
  CHECK(replicas[1]->named_buffers()[0].second.data_ptr() != net.bn.running_mean.data_ptr());

  // Both replicas see the same rows: every gradient is twice the single-device one.
  Tensor x = randn({5, 3});
  Tensor loss =
      sum(replicas[0]->forward(x)) + sum(replicas[1]->forward(x.to(Device::cpu(1)))).to(Device::cpu(0));
  loss.backward();
  WithBatchNorm reference;
  reference.load_state_dict(net.state_dict());
  reference.bn.eval();
  sum(reference.forward(x)).backward();
  const auto expected = reference.named_parameters();
  for (size_t i = 0; i < original.size(); ++i) {
    INFO(original[i].first);
    REQUIRE(original[i].second.grad().defined());
    CHECK(relative_error(original[i].second.grad(), mul(expected[i].second.grad(), 2.0)) < 1e-6);
  }
  CHECK_THROWS_WITH(parallel::replicate(net, {Device::cpu(1), Device::cpu(0)}),
                    Contains("'fc.weight' is on cpu:0 but the replicas are made from devices[0] = cpu:1"));
}

TEST_CASE("DataParallel gradients equal one device's, for even and uneven splits", "[parallel]") {
  struct Case {
    int devices;
    int64_t batch;
    std::vector<int64_t> rows;  // rows per replica
  };
  const std::vector<Case> cases = {
      {2, 8, {4, 4}}, {2, 7, {4, 3}}, {3, 10, {4, 4, 2}}, {4, 2, {1, 1}}, {3, 1, {1}}};
  for (const Case& c : cases) {
    INFO(c.devices << " devices, batch " << c.batch);
    manual_seed(7);
    const std::vector<Device> devices = test_devices(c.devices);
    SmallCNN net;
    net.to(devices[0]);
    std::shared_ptr<nn::Module> single = net.clone();
    parallel::DataParallel dp(net, devices);
    Tensor x = randn({c.batch, 1, 8, 8}).to(devices[0]);
    Tensor y = randint(0, 5, {c.batch}).to(devices[0]);

    Tensor out = dp(x);
    CHECK(out.device() == devices[0]);
    CHECK(dp.last_timings().replicas == static_cast<int>(c.rows.size()));
    Tensor expected_out = single->forward(x);
    CHECK(relative_error(out, expected_out) < 1e-5);

    cross_entropy(out, y).backward();
    cross_entropy(expected_out, y).backward();
    const auto got = net.named_parameters(), want = single->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(got[i].first);
      REQUIRE(got[i].second.grad().defined());
      CHECK(got[i].second.grad().device() == devices[0]);
      CHECK(relative_error(got[i].second.grad(), want[i].second.grad()) < 1e-5);
    }
  }
}

TEST_CASE("K optimizer steps with DataParallel give one device's parameters", "[parallel]") {
  // Global batch 10 over 3 devices: chunks of 4, 4 and 2 rows.
  constexpr int kSteps = 5;
  constexpr int64_t kBatch = 10;
  for (const std::string optimizer : {"sgd-momentum", "adamw"}) {
    INFO(optimizer);
    manual_seed(11);
    const std::vector<Device> devices = test_devices(testing::test_on_cuda() ? 4 : 3);
    SmallCNN net;
    net.to(devices[0]);
    std::shared_ptr<nn::Module> single = net.clone(), start = net.clone();
    parallel::DataParallel dp(net, devices);
    auto make = [&](std::vector<Tensor> params) -> std::unique_ptr<optim::Optimizer> {
      if (optimizer == "adamw") {
        optim::AdamWOptions adamw;
        adamw.lr = 1e-2;
        adamw.weight_decay = 0.01;
        return std::make_unique<optim::AdamW>(params, adamw);
      }
      optim::SGDOptions sgd;
      sgd.lr = 0.05;
      sgd.momentum = 0.9;
      return std::make_unique<optim::SGD>(params, sgd);
    };
    auto dp_opt = make(dp.parameters());  // the wrapped module's own parameters
    auto single_opt = make(single->parameters());
    for (int step = 0; step < kSteps; ++step) {
      Tensor x = randn({kBatch, 1, 8, 8}).to(devices[0]);
      Tensor y = randint(0, 5, {kBatch}).to(devices[0]);
      dp_opt->zero_grad();
      cross_entropy(dp(x), y).backward();
      dp_opt->step();
      single_opt->zero_grad();
      cross_entropy(single->forward(x), y).backward();
      single_opt->step();
    }
    const auto got = net.named_parameters(), want = single->named_parameters();
    const auto initial = start->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(got[i].first);
      CHECK(relative_error(got[i].second, want[i].second) < 1e-5);
      CHECK(relative_error(got[i].second, initial[i].second) > 1e-4);  // ...and they did move
    }
  }
}

TEST_CASE("DataParallel trains: the parameters move away from their start", "[parallel]") {
  manual_seed(3);
  SmallCNN net;
  std::shared_ptr<nn::Module> start = net.clone();
  parallel::DataParallel dp(net, cpus(2));
  optim::SGDOptions sgd;
  sgd.lr = 0.1;
  optim::SGD opt(dp.parameters(), sgd);
  Tensor x = randn({6, 1, 8, 8});
  Tensor y = randint(0, 5, {6});
  const double first = cross_entropy(dp(x), y).item<double>();
  for (int i = 0; i < 3; ++i) {
    opt.zero_grad();
    cross_entropy(dp(x), y).backward();
    opt.step();
  }
  CHECK(cross_entropy(dp(x), y).item<double>() < first);
  CHECK(relative_error(net.fc2.weight, start->named_parameters()[4].second) > 1e-3);
}

TEST_CASE("DataParallel is a Module over the wrapped module's parameters", "[parallel]") {
  SmallCNN net;
  parallel::DataParallel dp(net, cpus(2), Device::cpu(1));
  CHECK(dp.output_device() == Device::cpu(1));
  const auto params = dp.parameters(), own = net.parameters();
  REQUIRE(params.size() == own.size());
  for (size_t i = 0; i < params.size(); ++i) CHECK(params[i].is_same(own[i]));
  CHECK(dp.named_parameters()[0].first == "module.conv.weight");
  CHECK_THAT(dp.str(), Contains("devices=[cpu:0, cpu:1], output_device=cpu:1"));
  CHECK(dp(randn({3, 1, 8, 8})).device() == Device::cpu(1));
  dp.eval();
  CHECK_FALSE(net.is_training());
}

TEST_CASE("DataParallel with BatchNorm: replica 0 updates the module's running statistics", "[parallel]") {
  manual_seed(5);
  WithBatchNorm net;
  std::shared_ptr<nn::Module> reference = net.clone();
  parallel::DataParallel dp(net, cpus(2));
  Tensor x = randn({8, 3});
  dp(x);
  // The module's running stats moved exactly as one forward over the first chunk would
  // move them; the second replica's update went to a copy.
  reference->forward(x.narrow(0, 0, 4));
  const auto got = net.named_buffers(), want = reference->named_buffers();
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(got[i].first);
    CHECK(relative_error(got[i].second, want[i].second) < 1e-6);
  }
  CHECK(net.bn.running_mean.to_vector<float>() != std::vector<float>(4, 0.0f));
}

TEST_CASE("parallel_apply carries grad mode and autocast into the replica threads", "[parallel]") {
  RecordsThreadState net;
  parallel::DataParallel dp(net, cpus(3));
  Tensor x = randn({6, 2});
  {
    NoGradGuard no_grad;
    Tensor out = dp(x);
    CHECK_FALSE(out.requires_grad());
    for (int d = 0; d < 3; ++d) CHECK(seen_grad_mode[d] == 0);
  }
  CHECK(dp(x).requires_grad());
  for (int d = 0; d < 3; ++d) CHECK(seen_grad_mode[d] == 1);
  for (int d = 0; d < 3; ++d) CHECK(seen_autocast[d] == 0);
  {
    AutocastGuard autocast(DType::bf16);
    Tensor out = dp(x);
    CHECK(out.dtype() == DType::bf16);
    for (int d = 0; d < 3; ++d) CHECK(seen_autocast[d] == 1);
  }
}

TEST_CASE("a failing replica is re-thrown in the caller with its device named", "[parallel]") {
  FailsOnCpu1 net;
  parallel::DataParallel dp(net, cpus(3));
  CHECK_THROWS_WITH(dp(randn({6, 2})),
                    Contains("replica 1 on cpu:1 failed: boom: this replica refuses cpu:1"));
  // One row: a single replica on cpu:0 runs, so nothing fails.
  CHECK(dp(randn({1, 2})).shape() == Shape{1, 2});
  // The shells kept nothing from the failed step, and DataParallel still works.
  FailsOnCpu1 other;
  parallel::DataParallel dp2(other, {Device::cpu(0), Device::cpu(2)});
  CHECK(dp2(randn({4, 2})).shape() == Shape{4, 2});
}

TEST_CASE("devices that do not fit are errors naming both sides", "[parallel]") {
  SmallCNN net;
  CHECK_THROWS_WITH(parallel::DataParallel(net, {Device::cpu(1), Device::cpu(0)}),
                    Contains("must be on devices[0] = cpu:1, but 'conv.weight' is on cpu:0"));
  CHECK_THROWS_WITH(parallel::DataParallel(net, {Device::cpu(0), Device::cpu(0)}), Contains("listed twice"));
  CHECK_THROWS_WITH(parallel::DataParallel(net, {Device::cpu(0), Device::cuda(0)}),
                    Contains("all be CPU or all be CUDA, got cpu:0 and cuda:0"));

  // A replica whose parameters are not on its device, or an input on the wrong device.
  const auto replicas = parallel::replicate(net, cpus(2));
  Tensor x = randn({2, 1, 8, 8});
  CHECK_THROWS_WITH(parallel::parallel_apply(replicas, {x, x}, cpus(2)),
                    Contains("input 1 is on cpu:0 but replica 1 runs on cpu:1"));
  CHECK_THROWS_WITH(parallel::parallel_apply({replicas[0], replicas[0]}, {x, x.to(Device::cpu(1))}, cpus(2)),
                    Contains("replica 1 should be on cpu:1 but its parameter 'conv.weight' is on cpu:0"));
  const auto outputs = parallel::parallel_apply(replicas, {x, x.to(Device::cpu(1))});
  CHECK(outputs[1].device() == Device::cpu(1));

  // The module moved after wrapping: the next forward says so.
  parallel::DataParallel dp(net, cpus(2));
  net.to(Device::cpu(1));
  CHECK_THROWS_WITH(dp(x),
                    Contains("'conv.weight' is on cpu:1 but the replicas are made from devices[0] = cpu:0"));
}

// ---- bucket_cap_mb = auto (parallel/data_parallel/bucket_autotune.h) --------------------------------

TEST_CASE("fit_alpha_beta recovers a link's latency and bandwidth from all-reduce timings",
          "[parallel][autotune]") {
  const double alpha = 30e-6, beta = 1.0 / 1.2e9;  // 30 us, 1.2 GB/s
  std::vector<std::pair<double, double>> exact, noisy;
  const double wobble[] = {1.03, 0.97, 1.02, 0.98, 1.01, 0.99};  // +-3%, like repeated medians
  int i = 0;
  for (double bytes = 4096; bytes <= 16 << 20; bytes *= 4, ++i) {
    exact.emplace_back(bytes, alpha + beta * bytes);
    noisy.emplace_back(bytes, (alpha + beta * bytes) * wobble[i % 6]);
  }
  parallel::LinkFit fit = parallel::fit_alpha_beta(exact);
  CHECK(fit.points == 7);
  CHECK(fit.alpha_s == Approx(alpha).epsilon(1e-9));
  CHECK(fit.beta_s_per_byte == Approx(beta).epsilon(1e-9));
  // Weighted by 1/T^2: 3% noise moves alpha (carried by the small sizes) by about as much.
  parallel::LinkFit rough = parallel::fit_alpha_beta(noisy);
  CHECK(rough.alpha_s == Approx(alpha).epsilon(0.06));
  CHECK(rough.beta_s_per_byte == Approx(beta).epsilon(0.06));
  // Timings that fall with size would give a negative beta: it is 0, alpha their weighted mean.
  parallel::LinkFit flat = parallel::fit_alpha_beta({{1000, 2e-3}, {2000, 1e-3}});
  CHECK(flat.beta_s_per_byte == 0);
  CHECK(flat.alpha_s == Approx(1.2e-3));
  CHECK_THROWS_WITH(parallel::fit_alpha_beta({{1000, 1e-3}, {1000, 2e-3}}), Contains("two distinct sizes"));
}

TEST_CASE("predicted exposed communication follows the buckets through the link", "[parallel][autotune]") {
  // Two 1 MiB gradients ready at 1 s and 2 s; backward ends at 2 s; T(S) = 0.5 s + S us/B.
  const int64_t mib = 1 << 20;
  parallel::GradientTimeline timeline =
      parallel::proportional_timeline({mib, mib}, {DType::f32, DType::f32}, 2.0);
  REQUIRE(timeline.ready_s == std::vector<double>{1.0, 2.0});
  parallel::LinkFit link;
  link.alpha_s = 0.5;
  link.beta_s_per_byte = 1e-6;
  // One bucket each: the first runs 1 -> 2.548576, the second 2.548576 -> 4.097152.
  CHECK(parallel::predicted_exposed_s(timeline, link, 1, 1) == Approx(2.097152));
  // One bucket: ready at 2 s, all of its 2.597152 s exposed.
  CHECK(parallel::predicted_exposed_s(timeline, link, 2, 2) == Approx(2.597152));
}

TEST_CASE("the chosen bucket cap: small for a fast-starting link, one bucket for a slow-starting one",
          "[parallel][autotune]") {
  // 40 gradients of 512 KiB (20 MiB), backward lasting as long as their all-reduce in one piece.
  const int64_t grad = 512 << 10, count = 40;
  auto link_of = [](double alpha, double beta) {
    parallel::LinkFit link;
    link.alpha_s = alpha;
    link.beta_s_per_byte = beta;
    return link;
  };
  auto timeline_for = [&](const parallel::LinkFit& link) {
    return parallel::proportional_timeline(std::vector<int64_t>(count, grad),
                                           std::vector<DType>(count, DType::f32),
                                           link.seconds(static_cast<double>(grad * count)));
  };
  auto choose = [&](double alpha, double beta) {
    return parallel::choose_bucket_cap(timeline_for(link_of(alpha, beta)), link_of(alpha, beta), 1.0);
  };
  const double beta = 1e-9;  // 1 GB/s
  parallel::BucketCapChoice tiny = choose(1e-9, beta);
  CHECK(tiny.bucket_cap_mb == 0.5);  // one gradient per bucket: latency costs nothing
  CHECK(tiny.buckets == count);
  parallel::BucketCapChoice huge = choose(10.0, beta);
  CHECK(huge.buckets == 1);  // every extra all-reduce costs 10 s: one bucket, no small first one
  CHECK(huge.bucket_cap_mb >= 20.0);
  CHECK(huge.first_bucket_cap_mb == huge.bucket_cap_mb);
  // In between, the square-root law: s* = sqrt(2 alpha P / beta) = 6.5 MB for alpha = 1 ms.
  parallel::BucketCapChoice middle = choose(1e-3, beta);
  CHECK(middle.bucket_cap_mb >= 2.0);
  CHECK(middle.bucket_cap_mb <= 8.0);
  // ... and it beats PyTorch's fixed 25 MB and the smallest cap on the model's own cost.
  const auto& link = middle.link;
  auto cost = [&](double first, double cap, int buckets) {
    return parallel::predicted_exposed_s(timeline_for(link), link, first, cap) + buckets * link.alpha_s;
  };
  CHECK(cost(middle.first_bucket_cap_mb, middle.bucket_cap_mb, middle.buckets) < cost(1.0, 25.0, 2));
  CHECK(cost(middle.first_bucket_cap_mb, middle.bucket_cap_mb, middle.buckets) < cost(0.5, 0.5, count));
  CHECK(middle.summary().find("chose bucket_cap_mb=") != std::string::npos);
}

// ---- any forward signature (nn/value.h): several inputs, nested lists, several outputs ----------

namespace {

struct TwoInTwoOut : testing::TwoInTwoOut {
  TwoInTwoOut() : testing::TwoInTwoOut(4, 5) {}
};

// One tensor in, one out, but written as forward_values only: forward(x) falls back to it.
struct OnlyValues : nn::Module {
  nn::Linear fc{2, 3};
  OnlyValues() { register_module("fc", fc); }
  nn::Values forward_values(const nn::Values& in) override { return {fc(in.at(0).tensor())}; }
  std::shared_ptr<nn::Module> clone_empty() const override { return std::make_shared<OnlyValues>(); }
};

// Returns a different structure on cpu:1, or a number: outputs gather cannot join.
struct BadOutputs : nn::Module {
  nn::Linear fc{2, 2};
  bool number = false;  // copied by clone_empty, so the replicas do the same
  BadOutputs() { register_module("fc", fc); }
  nn::Values forward_values(const nn::Values& in) override {
    const Tensor& x = in.at(0).tensor();
    if (number) return {fc(x), 3};
    if (x.device() == Device::cpu(1)) return {fc(x), fc(x)};
    return {fc(x)};
  }
  std::shared_ptr<nn::Module> clone_empty() const override {
    auto copy = std::make_shared<BadOutputs>();
    copy->number = number;
    return copy;
  }
};

Tensor two_output_loss(const nn::Values& out, const Tensor& y) {
  return add(cross_entropy(out.at(0).tensor(), y), mean(mul(out.at(1).list().at(0).tensor(), 2.0)));
}

}  // namespace

TEST_CASE("scatter and gather of nested inputs and outputs: tensors split, everything else copied",
          "[parallel]") {
  Tensor x = arange(10).to(DType::f32).reshape({5, 2});
  Tensor m = arange(5).to(DType::f32);
  const nn::Values inputs{x, nn::Value{m, 0.5, "tag"}, nn::Value()};
  const auto pieces = parallel::scatter(inputs, cpus(3));
  REQUIRE(pieces.size() == 3);  // 2, 2, 1 rows
  for (int r = 0; r < 3; ++r) {
    INFO("replica " << r);
    const nn::Values& mine = pieces[r];
    CHECK(nn::describe(mine) == (r < 2 ? "(Tensor[2, 2], [Tensor[2], 0.5, \"tag\"], None)"
                                       : "(Tensor[1, 2], [Tensor[1], 0.5, \"tag\"], None)"));
    CHECK(mine[0].tensor().device() == Device::cpu(r));
    CHECK(mine[1].list()[0].tensor().device() == Device::cpu(r));
    CHECK(mine[1].list()[0].tensor().to_vector<float>()[0] == static_cast<float>(2 * r));
  }
  // Tensors of different row counts split on their own as long as the piece counts agree...
  CHECK(parallel::scatter(nn::Values{x, arange(10).to(DType::f32)}, cpus(3))[2][1].tensor().size(0) == 2);
  // ...otherwise rows would reach no replica (PyTorch drops them silently).
  CHECK_THROWS_WITH(parallel::scatter(nn::Values{x, nn::Value{x.narrow(0, 0, 2)}}, cpus(3)),
                    Contains("input [0] [5, 2] splits into 3 pieces but input [1][0] [2, 2] into 2"));
  CHECK_THROWS_WITH(parallel::scatter(nn::Values{x, scalar_tensor(1.0)}, cpus(2)),
                    Contains("input [1] is a tensor with zero dims"));
  // No tensor: a copy for every device; no inputs at all: one replica.
  CHECK(parallel::scatter(nn::Values{1, "a"}, cpus(3)).size() == 3);
  CHECK(parallel::scatter(nn::Values{}, cpus(3)).size() == 1);

  // gather joins every tensor leaf on the destination; zero-dim leaves become a vector; None stays.
  std::vector<nn::Values> outputs;
  for (int r = 0; r < 3; ++r) {
    const nn::Values& mine = pieces[r];
    outputs.push_back({nn::Value{mul(mine[0].tensor(), 2.0), sum(mine[1].list()[0].tensor())}, nn::Value()});
  }
  const nn::Values joined = parallel::gather(outputs, Device::cpu(1));
  REQUIRE(nn::describe(joined) == "([Tensor[5, 2], Tensor[3]], None)");
  CHECK(joined[0].list()[0].tensor().device() == Device::cpu(1));
  CHECK(joined[0].list()[0].tensor().to_vector<float>() == mul(x, 2.0).to_vector<float>());
  CHECK(joined[0].list()[1].tensor().to_vector<float>() == std::vector<float>{1, 5, 4});  // 0+1, 2+3, 4
  std::vector<nn::Values> uneven = outputs;
  uneven[2] = {nn::Value{x}, nn::Value()};
  CHECK_THROWS_WITH(parallel::gather(uneven, Device::cpu(0)),
                    Contains("replica 2 returned ([Tensor[5, 2]], None)") && Contains("differ at [0]"));
  CHECK_THROWS_WITH(parallel::gather({nn::Values{1}, nn::Values{1}}, Device::cpu(0)),
                    Contains("output [0] is 1; only tensors (and None) can be gathered"));
}

TEST_CASE("K optimizer steps with DataParallel of a two-input, two-output module give one device's",
          "[parallel]") {
  // Batch 7 over 2 devices (4 + 3 rows) and batch 10 over 3 (4 + 4 + 2).
  for (const int n : {2, 3}) {
    const int64_t batch = n == 2 ? 7 : 10;
    INFO(n << " devices, batch " << batch);
    manual_seed(21);
    const std::vector<Device> devices = test_devices(n);
    TwoInTwoOut net;
    net.to(devices[0]);
    std::shared_ptr<nn::Module> single = net.clone();
    parallel::DataParallel dp(net, devices);
    optim::SGDOptions sgd;
    sgd.lr = 0.1;
    sgd.momentum = 0.9;
    optim::SGD dp_opt(dp.parameters(), sgd), single_opt(single->parameters(), sgd);
    for (int step = 0; step < 3; ++step) {
      Tensor x = randn({batch, 4}).to(devices[0]);
      Tensor z = randn({batch, 3}).to(devices[0]);
      Tensor y = randint(0, 5, {batch}).to(devices[0]);
      const nn::Values inputs{x, nn::Value{z, 0.5}};
      const nn::Values out = dp(inputs);
      CHECK(dp.last_timings().replicas == n);
      const nn::Values want = (*single)(inputs);
      REQUIRE(nn::describe(out) == nn::describe(want));
      CHECK(out[0].tensor().device() == devices[0]);
      CHECK(relative_error(out[0].tensor(), want[0].tensor()) < 1e-5);
      CHECK(relative_error(out[1].list()[0].tensor(), want[1].list()[0].tensor()) < 1e-5);
      dp_opt.zero_grad();
      two_output_loss(out, y).backward();
      single_opt.zero_grad();
      two_output_loss(want, y).backward();
      const auto got = net.named_parameters(), expected = single->named_parameters();
      for (size_t i = 0; i < got.size(); ++i) {
        INFO(got[i].first);
        REQUIRE(got[i].second.grad().defined());  // both outputs' parameters got their gradient
        CHECK(relative_error(got[i].second.grad(), expected[i].second.grad()) < 1e-5);
      }
      dp_opt.step();
      single_opt.step();
    }
    const auto got = net.named_parameters(), expected = single->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(got[i].first);
      CHECK(relative_error(got[i].second, expected[i].second) < 1e-5);
    }
  }
}

TEST_CASE("a module with only forward_values works through forward(x), DataParallel and replicate",
          "[parallel]") {
  manual_seed(4);
  OnlyValues net;
  Tensor x = randn({5, 2});
  Tensor direct = net(x);  // Module::forward falls back to forward_values
  CHECK(direct.shape() == Shape{5, 3});
  parallel::DataParallel dp(net, cpus(2));
  CHECK(relative_error(dp(x), direct) < 1e-6);
  CHECK(dp.last_timings().replicas == 2);
  const auto replicas = parallel::replicate(net, cpus(2));
  CHECK(relative_error(replicas[1]->forward(x.to(Device::cpu(1))).to(Device::cpu(0)), direct) < 1e-6);

  // A module with neither forward is an error, not endless recursion; one-tensor modules refuse more.
  nn::ModuleList empty;
  CHECK_THROWS_WITH(empty(x), Contains("has no forward(const Tensor&) and no forward_values"));
  CHECK_THROWS_WITH(empty(nn::Values{x}), Contains("has no forward(const Tensor&) and no forward_values"));
  nn::Linear fc(2, 2);
  CHECK_THROWS_WITH(fc(nn::Values{x, x}), Contains("Linear takes one tensor") && Contains("(Tensor[5, 2], "
                                                                                          "Tensor[5, 2])"));
  CHECK(fc(nn::Values{x}).at(0).tensor().shape() == Shape{5, 2});

  // Outputs gather cannot join, and several outputs asked for as one tensor.
  BadOutputs bad;
  parallel::DataParallel bad_dp(bad, cpus(2));
  CHECK_THROWS_WITH(
      bad_dp(nn::Values{randn({4, 2})}),
      Contains("replica 1 returned (Tensor[2, 2], Tensor[2, 2]) but replica 0 returned (Tensor[2, 2])"));
  BadOutputs numbers;
  numbers.number = true;
  CHECK_THROWS_WITH(parallel::DataParallel(numbers, cpus(2))(randn({4, 2})),
                    Contains("output [1] is 3; only tensors (and None) can be gathered"));
  BadOutputs on_cpu1;
  on_cpu1.to(Device::cpu(1));
  parallel::DataParallel one_device(on_cpu1, {Device::cpu(1)});
  CHECK_THROWS_WITH(one_device(randn({4, 2})),
                    Contains("the module returned (Tensor[4, 2], Tensor[4, 2]), not one tensor"));
}
