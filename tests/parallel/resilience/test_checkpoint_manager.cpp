// CheckpointManager in a world of one: step directories, keep-last-M, a corrupt or truncated
// newest checkpoint skipped for the previous valid one, exact resume with the scheduler and the
// generator, and the background write. (The multi-rank, multi-node proof is tests/parallel/multinode/.)
#include <unistd.h>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <string>

#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "parallel/resilience/checkpoint_manager.h"
#include "parallel/resilience/sharded_metric.h"

using namespace mg;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = "/tmp/mg_ckptmgr_" + std::to_string(::getpid()) + "_" + name;
  std::system(("rm -rf '" + dir + "'").c_str());
  return dir;
}

struct Run {
  nn::MLP model{8, {16}, 3};
  optim::AdamW opt{model.parameters(), optim::AdamWOptions{}};
  optim::CosineAnnealingLR schedule{opt, [] {
                                      optim::CosineAnnealingLROptions o;
                                      o.t_max = 20;
                                      return o;
                                    }()};
  parallel::TrainingState state() {
    parallel::TrainingState s;
    s.module = &model;
    s.optimizer = &opt;
    s.scheduler = &schedule;
    return s;
  }
  void step() {  // data from the default generator: resuming needs its state too
    Tensor loss = cross_entropy(model.forward(randn({8, 8})), randint(0, 3, {8}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    schedule.step();
  }
};

std::vector<float> flat(const nn::Module& m) {
  std::vector<float> all;
  for (const Tensor& p : m.parameters())
    for (float v : p.to_vector<float>()) all.push_back(v);
  return all;
}

}  // namespace

TEST_CASE("CheckpointManager keeps the last M, resumes exactly, and skips a damaged newest one",
          "[checkpoint][fault]") {
  parallel::ProcessGroup pg = parallel::init_process_group();
  const std::string dir = fresh_dir("main");
  manual_seed(3);
  Run straight;
  for (int i = 0; i < 12; ++i) straight.step();

  manual_seed(3);
  Run first;
  parallel::CheckpointManagerOptions options;
  options.every_steps = 3;
  options.keep_last = 2;
  {
    parallel::CheckpointManager checkpoints(pg, dir, options);
    for (int64_t step = 1; step <= 9; ++step) {
      first.step();
      if (checkpoints.due(step)) checkpoints.save(first.state(), {step, 0, step * 8});
    }
    checkpoints.wait();
    const auto kept = checkpoints.checkpoints();
    REQUIRE(kept.size() == 2);  // steps 6 and 9; step 3 was deleted once 9 was complete
    REQUIRE(kept[0] == dir + "/step-00000006");
    REQUIRE(kept[1] == dir + "/step-00000009");
  }

  SECTION("a resume at the newest continues bit for bit") {
    manual_seed(999);  // anything: the checkpoint restores the generator
    Run resumed;
    parallel::CheckpointManager checkpoints(pg, dir, options);
    auto point = checkpoints.load_latest(resumed.state());
    REQUIRE(point);
    REQUIRE(point->position.step == 9);
    REQUIRE(point->position.samples_into_epoch == 72);
    REQUIRE(point->world_size == 1);
    for (int i = 0; i < 3; ++i) resumed.step();
    REQUIRE(flat(resumed.model) == flat(straight.model));
    REQUIRE(resumed.schedule.last_epoch() == straight.schedule.last_epoch());
  }

  SECTION("a 64-byte overwrite in the newest model file: the previous checkpoint is used") {
    const std::string victim = dir + "/step-00000009/model.safetensors";
    std::fstream file(victim, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-200, std::ios::end);
    file.write(std::string(64, '\x55').data(), 64);
    file.close();
    manual_seed(999);
    Run resumed;
    parallel::CheckpointManager checkpoints(pg, dir, options);
    auto point = checkpoints.load_latest(resumed.state());
    REQUIRE(point);
    REQUIRE(point->position.step == 6);
    for (int i = 0; i < 6; ++i) resumed.step();
    REQUIRE(flat(resumed.model) == flat(straight.model));
  }

  SECTION("a truncated newest optimizer file: the previous checkpoint is used") {
    const std::string victim = dir + "/step-00000009/optimizer.safetensors";
    REQUIRE(::truncate(victim.c_str(), 100) == 0);
    Run resumed;
    parallel::CheckpointManager checkpoints(pg, dir, options);
    auto point = checkpoints.load_latest(resumed.state());
    REQUIRE(point);
    REQUIRE(point->position.step == 6);
  }

  SECTION("no valid checkpoint at all: nothing is loaded") {
    for (const char* step : {"6", "9"})
      REQUIRE(::truncate((dir + "/step-0000000" + step + "/model.safetensors").c_str(), 10) == 0);
    Run resumed;
    const auto before = flat(resumed.model);
    parallel::CheckpointManager checkpoints(pg, dir, options);
    REQUIRE_FALSE(checkpoints.load_latest(resumed.state()));
    REQUIRE(flat(resumed.model) == before);
  }
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("ShardedMetric drops the DistributedSampler's padding: each sample counts once", "[metric]") {
  // 10 samples over 3 ranks: 4 + 4 + 4 positions, 2 of them padding (ranks 1 and 2's last).
  int64_t total = 0;
  double sum = 0;
  for (int64_t rank = 0; rank < 3; ++rank) {
    data::DistributedSamplerOptions options;
    options.shuffle = false;
    data::DistributedSampler sampler(10, rank, 3, options);
    REQUIRE(sampler.real_size() == (rank == 0 ? 4 : 3));
    parallel::ShardedMetric metric(sampler);
    metric.add(ones({3}));
    metric.add(ones({1}));  // the padding position on ranks 1 and 2
    total += metric.local().count;
    sum += metric.local().sum;
  }
  REQUIRE(total == 10);
  REQUIRE(sum == 10.0);
  data::DistributedSampler one(10, 0, 1);
  parallel::ShardedMetric metric(one);
  REQUIRE_THROWS_WITH(metric.add(ones({2, 2})), Catch::Contains("one value per sample"));
}
