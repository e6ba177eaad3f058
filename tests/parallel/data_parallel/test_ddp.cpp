// DistributedDataParallel under `mpiexec -n K`: the equivalence that defines it (K steps of DDP on
// N ranks with per-rank batch B == K steps of one process on batch N·B), gradient accumulation
// with no_sync, the ring algorithm, bucket views, and every error a user can trip over.
// Every rank computes the single-process reference itself, from the same seed and the full batch.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "multigrad.h"
#include "parallel/data_parallel/distributed.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;
using mg::testing::adamw;
using mg::testing::sgd_momentum;

namespace {

constexpr int64_t kPerRank = 6;
constexpr int64_t kFeatures = 8;

// Linear-ReLU-Linear-ReLU-Linear: 3 layers, 6 parameters, several buckets with tiny caps.
std::shared_ptr<nn::MLP> make_model(uint64_t seed, int64_t hidden = 16) {
  manual_seed(seed);
  return std::make_shared<nn::MLP>(kFeatures, std::vector<int64_t>{hidden, hidden}, 4);
}

// The global batch of step `step`: identical on every rank (a fixed seed per step).
std::pair<Tensor, Tensor> global_batch(int world, int step) {
  manual_seed(1000 + static_cast<uint64_t>(step));
  Tensor x = randn({world * kPerRank, kFeatures});
  Tensor y = randint(0, 4, {world * kPerRank});
  return {x, y};
}

using MakeOptimizer = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor>)>;

// K steps on one process with the whole global batch (the reference; DDP's accumulated
// micro-batches of equal size average to the same full batch).
std::vector<Tensor> train_single(const MakeOptimizer& make_opt, int world, int steps) {
  auto model = make_model(7);
  auto opt = make_opt(model->parameters());
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(world, s);
    opt->zero_grad();
    nn::cross_entropy((*model)(x), y).backward();
    opt->step();
  }
  return model->parameters();
}

// K steps of DDP: each rank takes its slice; with micro_steps > 1 the slice is split further and
// all but the last micro-batch run under no_sync (losses scaled by 1/micro_steps).
std::vector<Tensor> train_ddp(ProcessGroup& pg, const MakeOptimizer& make_opt, int steps, int micro_steps,
                              DDPOptions options) {
  auto model = make_model(7);
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, options);
  auto opt = make_opt(ddp.parameters());
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = global_batch(pg.size(), s);
    Tensor mine_x = x.narrow(0, pg.rank() * kPerRank, kPerRank).to(pg.device());
    Tensor mine_y = y.narrow(0, pg.rank() * kPerRank, kPerRank).to(pg.device());
    opt->zero_grad();
    int64_t micro = kPerRank / micro_steps;
    for (int m = 0; m < micro_steps; ++m) {
      Tensor loss =
          nn::cross_entropy(ddp(mine_x.narrow(0, m * micro, micro)), mine_y.narrow(0, m * micro, micro)) *
          (1.0 / micro_steps);
      if (m + 1 < micro_steps) {
        auto guard = ddp.no_sync();
        loss.backward();
      } else {
        loss.backward();
      }
    }
    opt->step();
  }
  return model->parameters();
}

void require_close(const std::vector<Tensor>& a, const std::vector<Tensor>& b, double rtol) {
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("tensor " << i);
    testing::require_close(a[i], b[i], rtol, 1e-12);
  }
}

DDPOptions tiny_buckets() {
  DDPOptions options;
  options.first_bucket_cap_mb = 0.0002;  // ~200 bytes and ~800 bytes: four buckets for this MLP
  options.bucket_cap_mb = 0.0008;
  return options;
}

}  // namespace

TEST_CASE("DDP on N ranks with batch B equals one process on batch N*B", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  struct Case {
    const char* name;
    MakeOptimizer make_opt;
    AllreduceAlgo algo;
    bool bucket_view;
    int micro_steps;
  };
  const Case cases[] = {
      {"sgd-momentum native", sgd_momentum, AllreduceAlgo::Native, false, 1},
      {"adamw native", adamw, AllreduceAlgo::Native, false, 1},
      {"sgd-momentum ring", sgd_momentum, AllreduceAlgo::Ring, false, 1},
      {"adamw bucket view", adamw, AllreduceAlgo::Native, true, 1},
      {"sgd-momentum no_sync x3", sgd_momentum, AllreduceAlgo::Native, false, 3},
      {"adamw no_sync x2 ring", adamw, AllreduceAlgo::Ring, false, 2},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    DDPOptions options = tiny_buckets();
    options.algo = c.algo;
    options.gradient_as_bucket_view = c.bucket_view;
    auto reference = train_single(c.make_opt, pg.size(), 4);
    auto distributed = train_ddp(pg, c.make_opt, 4, c.micro_steps, options);
    require_close(distributed, reference, 1e-5);
  }
}

TEST_CASE("DDP buckets: reverse order, several of them, rebuilt after the first pass", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto model = make_model(3);
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, tiny_buckets());
  auto layout = ddp.bucket_layout();
  REQUIRE(layout.size() >= 4);
  CHECK(layout.front().front() == "layers.4.bias");  // the last registered parameter comes first
  CHECK(layout.back().back() == "layers.0.weight");
  CHECK_FALSE(ddp.buckets_rebuilt());
  auto [x, y] = global_batch(pg.size(), 0);
  nn::cross_entropy(ddp(x.to(pg.device())), y.to(pg.device())).backward();
  CHECK(ddp.buckets_rebuilt());
  CHECK(ddp.stats().backward_passes == 1);
  CHECK(ddp.stats().bytes == model->num_parameters() * 4);
}

TEST_CASE("DDP over a checkpointed model reduces each parameter once and equals one process", "[mpi][ddp]") {
  // Every layer of the MLP checkpointed on its own: each parameter becomes ready inside one of
  // several inner (recompute) backwards, and DDP's finalize, queued in the first of them, must
  // wait for the outer pass -- run at the end of the first recompute it would find the other
  // buckets not ready.
  ProcessGroup pg = testing::mpi_test_group();
  auto reference = train_single(adamw, pg.size(), 3);
  auto model = make_model(7);
  model->to(pg.device());
  auto checkpointed = std::make_shared<nn::Sequential>();
  for (size_t i = 0; i < model->layers.size(); ++i)
    checkpointed->push_back(nn::checkpoint_wrapper(model->layers.ptr(i)));
  DistributedDataParallel ddp(*checkpointed, pg, tiny_buckets());
  auto opt = adamw(ddp.parameters());
  for (int s = 0; s < 3; ++s) {
    auto [x, y] = global_batch(pg.size(), s);
    opt->zero_grad();
    nn::cross_entropy(ddp(x.narrow(0, pg.rank() * kPerRank, kPerRank).to(pg.device())),
                      y.narrow(0, pg.rank() * kPerRank, kPerRank).to(pg.device()))
        .backward();
    opt->step();
  }
  CHECK(ddp.stats().backward_passes == 3);
  CHECK(ddp.stats().bytes == 3 * model->num_parameters() * 4);  // each parameter once per step, not twice
  require_close(model->parameters(), reference, 1e-5);
}

TEST_CASE("DDP broadcasts rank 0's parameters at construction", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto model = make_model(100 + static_cast<uint64_t>(pg.rank()));  // different seeds per rank
  DistributedDataParallel ddp(*model, pg);
  auto reference = make_model(100);
  require_close(model->parameters(), reference->parameters(), 0.0);
  ddp.check_replicas();  // and they now agree
}

TEST_CASE("DDP refuses ranks with different models, naming the difference", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  if (pg.size() == 1) return;
  auto model = make_model(1, pg.rank() == 1 ? 12 : 16);
  if (pg.rank() == 1) {
    CHECK_THROWS_WITH(DistributedDataParallel(*model, pg),
                      Catch::Contains("layers.0.weight [12, 8] f32' on rank 1") &&
                          Catch::Contains("[16, 8] f32' on rank 0"));
  } else {
    CHECK_THROWS_WITH(DistributedDataParallel(*model, pg),
                      Catch::Contains("another rank holds a different model"));
  }
}

namespace {
// A model with a parameter forward never uses.
struct WithUnused : nn::Module {
  nn::Linear used{kFeatures, 4};
  nn::Linear unused{kFeatures, 4};
  WithUnused() {
    register_module("used", used);
    register_module("unused", unused);
  }
  Tensor forward(const Tensor& x) override { return used(x); }
};
}  // namespace

TEST_CASE("DDP names parameters that got no gradient; find_unused_parameters copes", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto [x, y] = global_batch(pg.size(), 0);
  {
    manual_seed(5);
    WithUnused model;
    DistributedDataParallel ddp(model, pg);
    CHECK_THROWS_WITH(nn::cross_entropy(ddp(x), y).backward(),
                      Catch::Contains("received no gradient") &&
                          Catch::Contains("unused.weight, unused.bias") &&
                          Catch::Contains("find_unused_parameters"));
  }
  {
    manual_seed(5);
    WithUnused model;
    DDPOptions options;
    options.find_unused_parameters = true;
    DistributedDataParallel ddp(model, pg, options);
    nn::cross_entropy(ddp(x), y).backward();
    CHECK(model.used.weight.grad().defined());
    CHECK(model.unused.weight.grad().defined());
    CHECK(model.unused.weight.grad().abs().sum().item<double>() == 0.0);
  }
}

TEST_CASE("check_replicas names the first divergent parameter on every rank", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  if (pg.size() == 1) return;
  auto model = make_model(9);
  DDPOptions options;
  options.check_replicas_every = 1;
  DistributedDataParallel ddp(*model, pg, options);
  auto [x, y] = global_batch(pg.size(), 0);
  ddp(x);  // identical: passes
  if (pg.rank() == 1) {
    NoGradGuard no_grad;
    model->parameters()[2].add_(1e-3);  // layers.2.weight drifts on rank 1 only
  }
  CHECK_THROWS_WITH(ddp(x), Catch::Contains("replicas diverged") && Catch::Contains("layers.2.weight") &&
                                Catch::Contains("on rank 1"));
}

TEST_CASE("broadcast_buffers makes every rank use rank 0's buffers", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  struct WithNorm : nn::Module {
    nn::BatchNorm1d norm{kFeatures};
    nn::Linear fc{kFeatures, 4};
    WithNorm() {
      register_module("norm", norm);
      register_module("fc", fc);
    }
    Tensor forward(const Tensor& x) override { return fc(norm(x)); }
  };
  manual_seed(2);
  WithNorm model;
  DistributedDataParallel ddp(model, pg);
  model.eval();
  {
    NoGradGuard no_grad;
    model.norm.buffer("running_mean").fill_(static_cast<double>(pg.rank()));  // ranks disagree...
  }
  auto [x, y] = global_batch(pg.size(), 0);
  ddp(x);  // ...until the forward's broadcast
  for (float v : model.norm.buffer("running_mean").to_vector<float>()) CHECK(v == 0.0f);
}

TEST_CASE("the GradScaler's skip decision is shared by all ranks", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto model = make_model(4);
  DistributedDataParallel ddp(*model, pg);
  optim::SGDOptions sgd;
  sgd.lr = 0.1;
  optim::SGD opt(ddp.parameters(), sgd);
  optim::GradScalerOptions scaling;
  scaling.init_scale = 1024.0;
  optim::GradScaler scaler(scaling);
  synchronize_grad_scaler(scaler, pg);
  auto before = model->parameters()[0].clone();
  auto [x, y] = global_batch(pg.size(), 0);
  scaler.scale(nn::cross_entropy(ddp(x), y)).backward();
  if (pg.rank() == pg.size() - 1) {
    NoGradGuard no_grad;
    model->parameters()[0].mutable_grad().fill_(std::nan(""));  // only the last rank overflows
  }
  CHECK_FALSE(scaler.step(opt));  // skipped on every rank, not only the overflowing one
  scaler.update();
  CHECK(scaler.get_scale() == 512.0);
  require_close({model->parameters()[0]}, {before}, 0.0);  // nobody stepped
}

TEST_CASE("rank 0 checkpoints, every rank resumes, and the run continues exactly", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  std::string dir = (std::filesystem::temp_directory_path() / "mg_test_ddp_checkpoint").string();
  if (pg.rank() == 0) std::filesystem::remove_all(dir);
  pg.barrier()->wait();
  auto run = [&](optim::Optimizer& opt, DistributedDataParallel& ddp, int from, int to) {
    for (int s = from; s < to; ++s) {
      auto [x, y] = global_batch(pg.size(), s);
      opt.zero_grad();
      nn::cross_entropy(ddp(x.narrow(0, pg.rank() * kPerRank, kPerRank)),
                        y.narrow(0, pg.rank() * kPerRank, kPerRank))
          .backward();
      opt.step();
    }
  };
  auto model = make_model(11);
  DistributedDataParallel ddp(*model, pg);
  auto opt = adamw(ddp.parameters());
  run(*opt, ddp, 0, 3);
  TrainingPosition saved;
  saved.step = 3;
  {
    CheckpointManager manager(pg, dir);
    manager.save(TrainingState{model.get(), opt.get()}, saved);
    manager.wait();  // a collective: rank 0's files are complete before anyone reads them
  }
  run(*opt, ddp, 3, 6);

  auto resumed = make_model(99);  // different init: everything must come from the checkpoint
  DistributedDataParallel resumed_ddp(*resumed, pg);
  auto resumed_opt = adamw(resumed_ddp.parameters());
  auto point = CheckpointManager(pg, dir).load_latest(TrainingState{resumed.get(), resumed_opt.get()});
  REQUIRE(point);
  CHECK(point->position.step == 3);
  run(*resumed_opt, resumed_ddp, 3, 6);
  require_close(resumed->parameters(), model->parameters(), 0.0);
  pg.barrier()->wait();
  if (pg.rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("uneven datasets: every rank gets the same number of batches", "[mpi][ddp]") {
  ProcessGroup pg = testing::mpi_test_group();
  for (int64_t n : {10, 11, 13, 1}) {
    data::DistributedSamplerOptions options;
    options.shuffle = true;
    options.seed = 3;
    data::DistributedSampler sampler(n, pg.rank(), pg.size(), options);
    Tensor count = full({1}, static_cast<double>(sampler.indices(0).size()), TensorOptions{DType::i64});
    Tensor most = count.clone(), least = count.clone();
    pg.allreduce(most, ReduceOp::Max)->wait();
    pg.allreduce(least, ReduceOp::Min)->wait();
    CHECK(most.item<int64_t>() == least.item<int64_t>());  // nobody waits for a rank with one more batch
    CHECK(least.item<int64_t>() * pg.size() >= n);         // padding by wrapping: nothing is left out
  }
}
