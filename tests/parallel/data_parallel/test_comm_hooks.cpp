// DDP communication hooks under `mpiexec -n K` (and over emulated NCCL with MG_TEST_DEVICE=cuda):
// the all-reduce hook is bitwise the default; fp16 / bf16 compression errs only by the cast's
// rounding; PowerSGD at full rank is the all-reduce, and at rank 1 its error feedback keeps the
// sum of applied gradients exactly the true sum minus the residuals; the bytes each one sends.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <vector>

#include "multigrad.h"
#include "parallel/data_parallel/comm_hooks.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/powersgd.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

namespace {

constexpr int64_t kPerRank = 6;
constexpr int64_t kFeatures = 8;

std::shared_ptr<nn::MLP> make_model(int64_t hidden = 16) {
  manual_seed(7);
  return std::make_shared<nn::MLP>(kFeatures, std::vector<int64_t>{hidden, hidden}, 4);
}

std::pair<Tensor, Tensor> global_batch(int world, int step) {
  manual_seed(1000 + static_cast<uint64_t>(step));
  Tensor x = randn({world * kPerRank, kFeatures});
  Tensor y = randint(0, 4, {world * kPerRank});
  return {x, y};
}

Tensor my_part(const Tensor& t, const ProcessGroup& pg) {
  return t.narrow(0, pg.rank() * kPerRank, kPerRank).to(pg.device());
}

DDPOptions tiny_buckets() {
  DDPOptions options;
  options.first_bucket_cap_mb = 0.0002;  // several buckets for the small MLP
  options.bucket_cap_mb = 0.0008;
  return options;
}

using HookSetup = std::function<void(DistributedDataParallel&)>;

// `steps` DDP steps with SGD (momentum), the hook installed by `setup`; the parameters after them.
std::vector<Tensor> train(ProcessGroup& pg, int steps, const HookSetup& setup,
                          int64_t* bytes_per_step = nullptr, int64_t hidden = 16) {
  auto model = make_model(hidden);
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, tiny_buckets());
  if (setup) setup(ddp);
  auto opt = testing::sgd_momentum(ddp.parameters());
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(pg.size(), s);
    opt->zero_grad();
    nn::cross_entropy(ddp(my_part(x, pg)), my_part(y, pg)).backward();
    opt->step();
  }
  if (bytes_per_step) *bytes_per_step = ddp.stats().bytes / steps;
  std::vector<Tensor> out;
  for (const Tensor& p : model->parameters()) out.push_back(p.detach().to(Device::cpu()));
  return out;
}

// One backward of DDP (hook from `setup`) on this rank's part of batch 0: the averaged gradients.
std::vector<Tensor> one_backward(ProcessGroup& pg, const HookSetup& setup) {
  auto model = make_model();
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, tiny_buckets());
  if (setup) setup(ddp);
  auto [x, y] = global_batch(pg.size(), 0);
  nn::cross_entropy(ddp(my_part(x, pg)), my_part(y, pg)).backward();
  std::vector<Tensor> grads;
  for (const Tensor& p : model->parameters()) grads.push_back(p.grad().to(Device::cpu()));
  return grads;
}

HookSetup process_group_hook(ProcessGroup& pg, BucketFuture (*hook)(ProcessGroup&, GradBucket&)) {
  return [&pg, hook](DistributedDataParallel& ddp) {
    ddp.register_comm_hook(std::make_shared<ProcessGroup>(pg), hook);
  };
}

double norm(const Tensor& t) {
  return std::sqrt((t.to(Device::cpu(), DType::f64) * t.to(Device::cpu(), DType::f64)).sum().item<double>());
}

}  // namespace

TEST_CASE("comm hooks: allreduce_hook is bitwise the default all-reduce", "[mpi][ddp][comm_hooks]") {
  ProcessGroup pg = testing::mpi_test_group();
  int64_t plain_bytes = 0, hook_bytes = 0;
  auto plain = train(pg, 4, nullptr, &plain_bytes);
  auto hooked = train(pg, 4, process_group_hook(pg, allreduce_hook), &hook_bytes);
  for (size_t i = 0; i < plain.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(hooked[i].to_vector<float>() == plain[i].to_vector<float>());
  }
  CHECK(hook_bytes == plain_bytes);
}

TEST_CASE("comm hooks: fp16 and bf16 compression err only by the cast's rounding", "[mpi][ddp][comm_hooks]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size();
  // Every rank's local gradient, computed here from the same model and that rank's part of the batch.
  auto [x, y] = global_batch(world, 0);
  std::vector<std::vector<double>> exact, magnitude;  // per parameter: the average, and the mean of |g_r|
  for (int r = 0; r < world; ++r) {
    auto model = make_model();
    nn::cross_entropy((*model)(x.narrow(0, r * kPerRank, kPerRank)), y.narrow(0, r * kPerRank, kPerRank))
        .backward();
    auto params = model->parameters();
    exact.resize(params.size());
    magnitude.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      auto g = params[i].grad().to_vector<double>();
      exact[i].resize(g.size());
      magnitude[i].resize(g.size());
      for (size_t k = 0; k < g.size(); ++k) {
        exact[i][k] += g[k] / world;
        magnitude[i][k] += std::abs(g[k]) / world;
      }
    }
  }
  auto uncompressed = one_backward(pg, nullptr);
  struct Case {
    const char* name;
    BucketFuture (*hook)(ProcessGroup&, GradBucket&);
    double unit_roundoff, smallest_step;  // relative rounding; absolute rounding below the normal range
  };
  for (const Case& c : {Case{"fp16", fp16_compress_hook, std::ldexp(1.0, -11), std::ldexp(1.0, -25)},
                        Case{"bf16", bf16_compress_hook, std::ldexp(1.0, -8), 0.0}}) {
    INFO(c.name);
    auto grads = one_backward(pg, process_group_hook(pg, c.hook));
    bool differs_from_f32 = false;
    double worst = 0;  // the largest error as a fraction of the bound
    for (size_t i = 0; i < grads.size(); ++i) {
      auto g = grads[i].to_vector<double>();
      auto f = uncompressed[i].to_vector<double>();
      for (size_t k = 0; k < g.size(); ++k) {
        // Each of the N casts and the N-1 rounded partial sums errs by at most u·|value| (+ the
        // subnormal step): together below 2N (u·mean|g_r| + step).
        const double bound = 2 * world * (c.unit_roundoff * magnitude[i][k] + c.smallest_step) + 1e-12;
        worst = std::max(worst, std::abs(g[k] - exact[i][k]) / bound);
        differs_from_f32 = differs_from_f32 || g[k] != f[k];
      }
    }
    INFO("largest error / bound = " << worst);
    CHECK(worst <= 1.0);
    CHECK(differs_from_f32);  // the cast really happened
  }
  int64_t plain_bytes = 0, fp16_bytes = 0;
  train(pg, 1, nullptr, &plain_bytes);
  train(pg, 1, process_group_hook(pg, fp16_compress_hook), &fp16_bytes);
  CHECK(fp16_bytes * 2 == plain_bytes);
}

TEST_CASE("comm hooks: PowerSGD at full rank equals the all-reduce, before and after it starts",
          "[mpi][ddp][comm_hooks]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto reference = train(pg, 5, nullptr);
  for (bool warm_start : {true, false}) {
    INFO("warm_start " << warm_start);
    PowerSGDOptions options;
    options.matrix_approximation_rank = 16;  // >= min(rows, cols) of every weight: exact
    options.min_compression_rate = 0;        // compress every matrix although it does not pay
    options.start_powerSGD_iter = 2;
    options.warm_start = warm_start;
    auto state = std::make_shared<PowerSGDState>(pg, options);
    auto compressed =
        train(pg, 5, [&](DistributedDataParallel& ddp) { ddp.register_comm_hook(state, powersgd_hook); });
    CHECK(state->iteration() == 5);
    CHECK(state->last_step().compressed_tensors == 3);  // the three weight matrices; biases plain
    CHECK(state->last_step().uncompressed_tensors == 3);
    for (size_t i = 0; i < reference.size(); ++i) {
      INFO("parameter " << i);
      testing::require_close(compressed[i], reference[i], 1e-5);
    }
  }
}

namespace {
// `steps` backward passes at fixed parameters with PowerSGD at rank 1 from the first step; per
// parameter, the sum of the averaged gradients DDP applied minus the sum of the true averages
// (one process, whole batch), and the residuals summed over ranks. With the same batch every
// step the gradient is the same: without error feedback each step drops the same part of it.
struct FeedbackRun {
  std::vector<Tensor> gap, residual_sum;
  double gap_norm = 0;
};
FeedbackRun run_feedback(ProcessGroup& pg, int steps, bool error_feedback, bool same_batch_every_step) {
  auto reference = make_model();
  auto model = make_model();
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, tiny_buckets());
  PowerSGDOptions options;
  options.start_powerSGD_iter = 0;
  options.use_error_feedback = error_feedback;
  auto state = std::make_shared<PowerSGDState>(pg, options);
  ddp.register_comm_hook(state, powersgd_hook);
  auto params = model->parameters(), reference_params = reference->parameters();
  FeedbackRun run;
  for (const Tensor& p : reference_params) run.gap.push_back(zeros(p.shape(), TensorOptions{DType::f64}));
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(pg.size(), same_batch_every_step ? 0 : s);
    for (Tensor& p : reference_params) p.set_grad(Tensor());
    for (Tensor& p : params) p.set_grad(Tensor());
    nn::cross_entropy((*reference)(x), y).backward();
    nn::cross_entropy(ddp(my_part(x, pg)), my_part(y, pg)).backward();
    for (size_t i = 0; i < params.size(); ++i) {
      run.gap[i].add_(params[i].grad().to(Device::cpu(), DType::f64));
      run.gap[i].sub_(reference_params[i].grad().to(DType::f64));
    }
  }
  double squares = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    squares += std::pow(norm(run.gap[i]), 2);
    Tensor residual = state->residual_of(params[i]);
    Tensor summed = residual.defined() ? residual.clone()
                                       : zeros(params[i].shape(), TensorOptions{DType::f32, pg.device()});
    pg.allreduce(summed)->wait();
    run.residual_sum.push_back(summed.to(Device::cpu(), DType::f64));
  }
  run.gap_norm = std::sqrt(squares);
  return run;
}
}  // namespace

TEST_CASE("comm hooks: PowerSGD's error feedback keeps the applied sum the true sum minus the residuals",
          "[mpi][ddp][comm_hooks]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto with_feedback = run_feedback(pg, 8, true, /*same_batch_every_step=*/false);
  // By construction Σ_t applied_t = Σ_t true_t - Σ_ranks residual: the gap is exactly the residual.
  for (size_t i = 0; i < with_feedback.gap.size(); ++i) {
    INFO("parameter " << i);
    Tensor identity = with_feedback.gap[i] + with_feedback.residual_sum[i];
    CHECK(norm(identity) <= 1e-5 * norm(with_feedback.residual_sum[i]) + 1e-6);
  }
  // The same gradient every step: without feedback each step drops the same part of it, and the
  // gap grows with the steps; with it the gap (the residual) stays bounded.
  auto early = run_feedback(pg, 2, false, true), late = run_feedback(pg, 16, false, true);
  auto early_fed = run_feedback(pg, 2, true, true), late_fed = run_feedback(pg, 16, true, true);
  if (pg.rank() == 0)
    std::cout << "PowerSGD rank 1, one batch, |sum applied - sum true| after 2 and 16 steps: without error "
                 "feedback "
              << early.gap_norm << ", " << late.gap_norm << "; with it " << early_fed.gap_norm << ", "
              << late_fed.gap_norm << "\n";
  CHECK(late.gap_norm > 4 * early.gap_norm);
  CHECK(late_fed.gap_norm < 0.5 * late.gap_norm);
}

TEST_CASE("comm hooks: bytes per step of each hook", "[mpi][ddp][comm_hooks]") {
  ProcessGroup pg = testing::mpi_test_group();
  constexpr int64_t kHidden = 64;
  int64_t plain = 0, fp16 = 0, bf16 = 0, powersgd = 0;
  train(pg, 3, nullptr, &plain, kHidden);
  train(pg, 3, process_group_hook(pg, fp16_compress_hook), &fp16, kHidden);
  train(pg, 3, process_group_hook(pg, bf16_compress_hook), &bf16, kHidden);
  PowerSGDOptions options;
  options.start_powerSGD_iter = 0;
  auto state = std::make_shared<PowerSGDState>(pg, options);
  train(
      pg, 3, [&](DistributedDataParallel& ddp) { ddp.register_comm_hook(state, powersgd_hook); }, &powersgd,
      kHidden);
  if (pg.rank() == 0)
    std::cout << "bytes all-reduced per step (MLP 8-64-64-4): all-reduce " << plain << ", fp16 " << fp16
              << ", bf16 " << bf16 << ", PowerSGD rank 1 " << powersgd << " ("
              << static_cast<double>(plain) / powersgd << "x fewer)\n";
  CHECK(fp16 * 2 == plain);
  CHECK(bf16 * 2 == plain);
  CHECK(powersgd == state->last_step().bytes_sent);
  CHECK(plain == state->last_step().bytes_uncompressed);
  CHECK(powersgd * 8 < plain);
}

TEST_CASE("comm hooks: registered once, before the first backward", "[mpi][ddp][comm_hooks]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto model = make_model();
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, tiny_buckets());
  auto group = std::make_shared<ProcessGroup>(pg);
  ddp.register_comm_hook(group, allreduce_hook);
  CHECK_THROWS_WITH(ddp.register_comm_hook(group, fp16_compress_hook), Catch::Contains("already registered"));
  auto model2 = make_model();
  model2->to(pg.device());
  DistributedDataParallel late(*model2, pg, tiny_buckets());
  auto [x, y] = global_batch(pg.size(), 0);
  nn::cross_entropy(late(my_part(x, pg)), my_part(y, pg)).backward();
  CHECK_THROWS_WITH(late.register_comm_hook(group, fp16_compress_hook),
                    Catch::Contains("before the first backward"));
}
