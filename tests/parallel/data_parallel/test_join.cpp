// Join (parallel/data_parallel/join.h) under `mpiexec -n K`: ranks with different numbers of
// batches (3, 5, 7, ...) train to the end without hanging, and the final model equals one
// process replaying the same samples step by step with the same divisor; the early-termination
// switch and a collective Join does not shadow fail on every rank, naming the rank that joined.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "multigrad.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/join.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

namespace {

constexpr int64_t kPerRank = 4;
constexpr int64_t kFeatures = 6;

std::shared_ptr<nn::MLP> make_model() {
  manual_seed(17);
  return std::make_shared<nn::MLP>(kFeatures, std::vector<int64_t>{12, 12}, 3);
}

// Rank r's batch number s, the same wherever it is computed.
std::pair<Tensor, Tensor> batch_of(int rank, int step) {
  manual_seed(5000 + 100 * static_cast<uint64_t>(rank) + static_cast<uint64_t>(step));
  return {randn({kPerRank, kFeatures}), randint(0, 3, {kPerRank})};
}

int batches_of(int rank) { return 3 + 2 * rank; }  // 3, 5, 7, ...

DDPOptions tiny_buckets() {
  DDPOptions options;
  options.first_bucket_cap_mb = 0.0002;  // several buckets: the joined rank must match each one
  options.bucket_cap_mb = 0.0006;
  return options;
}

// One process, step by step: the ranks that still have a batch at step s contribute their loss
// gradients, summed and divided by the world size or by their number.
std::vector<Tensor> replay(int world, bool divide_by_initial_world_size) {
  auto model = make_model();
  auto opt = testing::sgd_momentum(model->parameters());
  for (int s = 0; s < batches_of(world - 1); ++s) {
    std::vector<int> active;
    for (int r = 0; r < world; ++r)
      if (s < batches_of(r)) active.push_back(r);
    opt->zero_grad();
    Tensor total;
    for (int r : active) {
      auto [x, y] = batch_of(r, s);
      Tensor loss = nn::cross_entropy((*model)(x), y);
      total = total.defined() ? total + loss : loss;
    }
    const double divisor = divide_by_initial_world_size ? world : static_cast<double>(active.size());
    (total * (1.0 / divisor)).backward();
    opt->step();
  }
  return model->parameters();
}

}  // namespace

TEST_CASE("Join: ranks with uneven batches (3 5 7) finish and equal one process replaying them",
          "[mpi][join]") {
  ProcessGroup pg = testing::mpi_test_group();
  for (bool divide_by_initial : {true, false}) {
    INFO("divide_by_initial_world_size = " << divide_by_initial);
    auto model = make_model();
    model->to(pg.device());
    DistributedDataParallel ddp(*model, pg, tiny_buckets());
    auto opt = testing::sgd_momentum(ddp.parameters());
    JoinHookOptions hook_options;
    hook_options.divide_by_initial_world_size = divide_by_initial;
    {
      Join join({&ddp}, /*enable=*/true, /*throw_on_early_termination=*/false, hook_options);
      for (int s = 0; s < batches_of(pg.rank()); ++s) {
        auto [x, y] = batch_of(pg.rank(), s);
        opt->zero_grad();
        nn::cross_entropy(ddp(x.to(pg.device())), y.to(pg.device())).backward();
        opt->step();
      }
    }  // this rank joins here and shadows the others until the last one is done
    auto reference = replay(pg.size(), divide_by_initial);
    auto params = model->parameters();
    REQUIRE(params.size() == reference.size());
    for (size_t i = 0; i < params.size(); ++i) {
      INFO("parameter " << i);
      testing::require_close(params[i], reference[i], 1e-5);
    }
    // After the Join the model is an ordinary DDP again: one more even step works everywhere.
    auto [x, y] = batch_of(pg.rank(), 0);
    nn::cross_entropy(ddp(x.to(pg.device())), y.to(pg.device())).backward();
    ddp.check_replicas();
  }
}

TEST_CASE("Join: ranks with equal inputs and a disabled Join change nothing", "[mpi][join]") {
  ProcessGroup pg = testing::mpi_test_group();
  std::vector<Tensor> results[2];
  for (bool enable : {true, false}) {
    auto model = make_model();
    model->to(pg.device());
    DistributedDataParallel ddp(*model, pg, tiny_buckets());
    auto opt = testing::sgd_momentum(ddp.parameters());
    {
      Join join({&ddp}, enable);
      for (int s = 0; s < 3; ++s) {
        auto [x, y] = batch_of(pg.rank(), s);
        opt->zero_grad();
        nn::cross_entropy(ddp(x.to(pg.device())), y.to(pg.device())).backward();
        opt->step();
      }
    }
    results[enable ? 0 : 1] = model->parameters();
  }
  for (size_t i = 0; i < results[0].size(); ++i)
    testing::require_close(results[0][i], results[1][i], 0.0, 0.0);
}

TEST_CASE("Join shadows the buffer broadcast and ends with every rank holding the same buffers",
          "[mpi][join]") {
  ProcessGroup pg = testing::mpi_test_group();
  struct WithNorm : nn::Module {
    nn::BatchNorm1d norm{kFeatures};
    nn::Linear fc{kFeatures, 3};
    WithNorm() {
      register_module("norm", norm);
      register_module("fc", fc);
    }
    Tensor forward(const Tensor& x) override { return fc(norm(x)); }
  };
  manual_seed(3);
  WithNorm model;
  model.to(pg.device());
  DistributedDataParallel ddp(model, pg, tiny_buckets());
  auto opt = testing::sgd_momentum(ddp.parameters());
  {
    Join join({&ddp});
    for (int s = 0; s < batches_of(pg.rank()); ++s) {
      auto [x, y] = batch_of(pg.rank(), s);
      opt->zero_grad();
      nn::cross_entropy(ddp(x.to(pg.device())), y.to(pg.device())).backward();
      opt->step();
    }
  }
  Tensor mean = model.norm.buffer("running_mean").clone(), most = mean.clone(), least = mean.clone();
  pg.allreduce(most, ReduceOp::Max)->wait();
  pg.allreduce(least, ReduceOp::Min)->wait();
  testing::require_close(most, least, 0.0, 0.0);
  CHECK(mean.abs().sum().item<double>() > 0.0);  // the statistics were really updated
  ddp.check_replicas();
}

TEST_CASE("Join with throw_on_early_termination: every rank throws, naming the first to run out",
          "[mpi][join]") {
  ProcessGroup pg = testing::mpi_test_group();
  if (pg.size() == 1) return;
  auto model = make_model();
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, tiny_buckets());
  auto opt = testing::sgd_momentum(ddp.parameters());
  auto train = [&] {
    Join join({&ddp}, /*enable=*/true, /*throw_on_early_termination=*/true);
    for (int s = 0; s < 2 + pg.rank(); ++s) {  // rank 0 runs out first, after 2 batches
      auto [x, y] = batch_of(pg.rank(), s);
      opt->zero_grad();
      nn::cross_entropy(ddp(x.to(pg.device())), y.to(pg.device())).backward();
      opt->step();
    }
  };
  CHECK_THROWS_WITH(train(),
                    Catch::Contains("Join (throw_on_early_termination): rank(s) 0 ran out of inputs"));
  pg.barrier()->wait();  // nobody is left inside a collective
}

TEST_CASE("Join: a collective Join does not shadow fails on every rank, naming the joined rank",
          "[mpi][join]") {
  ProcessGroup pg = testing::mpi_test_group();
  if (pg.size() == 1) return;
  auto model = make_model();
  model->to(pg.device());
  DistributedDataParallel ddp(*model, pg, tiny_buckets());
  auto opt = testing::sgd_momentum(ddp.parameters());
  auto train = [&] {
    Join join({&ddp});
    for (int s = 0; s < (pg.rank() == 0 ? 1 : 2); ++s) {  // rank 0 joins after one batch
      auto [x, y] = batch_of(pg.rank(), s);
      opt->zero_grad();
      Tensor loss = nn::cross_entropy(ddp(x.to(pg.device())), y.to(pg.device()));
      loss.backward();
      opt->step();
      Tensor logged = loss.detach().reshape({1}).clone();
      pg.allreduce(logged)->wait();  // the user's own collective: the joined rank cannot answer it
    }
  };
  CHECK_THROWS_WITH(train(), Catch::Contains("rank 0 has joined (parallel::Join") &&
                                 Catch::Contains("Join's notification allreduce(sum) i64"));
  pg.barrier()->wait();  // the group is still in step
  // ... and still usable on every rank: the mismatch failed one call, it did not break the group
  // (over NCCL, the user's allreduce met Join's notification on the CPU backend, which carries
  // the NCCL ops' signature check).
  Tensor one = ones({1}).to(pg.device());
  pg.allreduce(one)->wait();
  CHECK(one.to(Device::cpu()).item<float>() == static_cast<float>(pg.size()));
}
