// Pipeline parallelism under `mpiexec -n K` (K = 2, 3 and 4 stages): every rank builds the whole
// model after the same seed and keeps its stage; a reference copy trains on one process with the
// whole batch. With GPipe, 1F1B and ZB-H1, 1, 4 and 8 micro-batches, each stage's parameters after 5 AdamW
// steps must equal the reference's same layers, and the last stage's loss the reference loss; the
// same for the interleaved schedule with 2 and 3 chunks per rank.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "multigrad.h"
#include "parallel/pipeline/pipeline.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;
using mg::testing::adamw;
using mg::testing::sgd_momentum;

namespace {

// Three Linear-ReLU pairs, then two Linears: 8 layers, cut into 2, 3 or 4 stages that each hold a
// Linear ([0, 2) [2, 4) [4, 6) [6, 8) on 4; [0, 2) [2, 5) [5, 8) on 3).
std::shared_ptr<nn::Sequential> make_model(Device device) {
  manual_seed(3);
  auto model = std::make_shared<nn::Sequential>();
  model->emplace_back<nn::Linear>(8, 16);
  model->emplace_back<nn::ReLU>();
  model->emplace_back<nn::Linear>(16, 16);
  model->emplace_back<nn::ReLU>();
  model->emplace_back<nn::Linear>(16, 16);
  model->emplace_back<nn::ReLU>();
  model->emplace_back<nn::Linear>(16, 16);
  model->emplace_back<nn::Linear>(16, 4);
  model->to(device);
  return model;
}

Tensor loss_fn(const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); }

}  // namespace

TEST_CASE("a pipeline of stages equals single-device training with the same global batch",
          "[mpi][pipeline]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int p = pg.size(), rank = pg.rank();
  const Device device = pg.device();
  struct Case {
    const char* name;
    PipelineSchedule schedule;
    int micro_batches;
  };
  const Case cases[] = {{"GPipe x4", PipelineSchedule::GPipe, 4},
                        {"1F1B x4", PipelineSchedule::OneForwardOneBackward, 4},
                        {"1F1B x1", PipelineSchedule::OneForwardOneBackward, 1},
                        {"GPipe x8", PipelineSchedule::GPipe, 8},
                        {"ZB-H1 x4", PipelineSchedule::ZeroBubbleH1, 4},
                        {"ZB-H1 x8", PipelineSchedule::ZeroBubbleH1, 8},
                        {"ZB-H1 x1", PipelineSchedule::ZeroBubbleH1, 1}};
  for (const Case& c : cases) {
    INFO(c.name << " on " << p << " stages");
    auto reference = make_model(device);
    auto reference_opt = adamw(reference->parameters());
    auto full = make_model(device);
    auto stage = pipeline_stage(*full, rank, p);
    auto stage_opt = adamw(stage->parameters());
    Pipeline pipe(stage, pg, loss_fn, c.schedule);
    for (int step = 0; step < 5; ++step) {
      manual_seed(70 + static_cast<uint64_t>(step));
      Tensor x = randn({8, 8}).to(device), y = randint(0, 4, {8}).to(device);
      reference_opt->zero_grad();
      Tensor reference_loss = loss_fn((*reference)(x), y);
      reference_loss.backward();
      reference_opt->step();
      stage_opt->zero_grad();
      PipelineStepResult r =
          pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), c.micro_batches);
      stage_opt->step();
      CHECK(r.bubble() >= 0.0);
      CHECK(r.bubble() <= 1.0);
      if (pipe.is_last()) CHECK(std::abs(r.loss - reference_loss.item<double>()) < 1e-5);
    }
    std::vector<Tensor> mine = stage->parameters();
    std::vector<Tensor> expected = pipeline_stage(*reference, rank, p)->parameters();
    REQUIRE(mine.size() == expected.size());
    for (size_t i = 0; i < mine.size(); ++i) testing::require_close(mine[i], expected[i], 1e-5);
  }
}

// Linear-Tanh pairs, 16 layers: 2 chunks on each of 3 or 4 ranks, or 2 or 3 on each of 2 (8 chunks at
// most, so that every chunk has a Linear).
std::shared_ptr<nn::Sequential> make_deep_model(Device device) {
  manual_seed(4);
  auto model = std::make_shared<nn::Sequential>();
  for (int i = 0; i < 7; ++i) {
    model->emplace_back<nn::Linear>(8, 8);
    model->emplace_back<nn::Tanh>();
  }
  model->emplace_back<nn::Linear>(8, 8);
  model->emplace_back<nn::Linear>(8, 4);
  model->to(device);
  return model;
}

TEST_CASE("the interleaved 1F1B schedule equals single-device training with the same global batch",
          "[mpi][pipeline]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int p = pg.size(), rank = pg.rank();
  const Device device = pg.device();
  if (device.is_cuda()) {
    // Over NCCL: refused on every rank before any message (pipeline.cpp says why).
    auto full = make_deep_model(device);
    std::vector<std::shared_ptr<nn::Module> > chunks;
    for (auto& chunk : pipeline_chunks(*full, rank, p, 2)) chunks.push_back(chunk);
    Pipeline pipe(chunks, pg, loss_fn);
    Tensor x = randn({12, 8}).to(device), y = randint(0, 4, {12}).to(device);
    REQUIRE_THROWS_WITH(pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), p),
                        Catch::Contains("runs over MPI (CPU tensors) only"));
    return;
  }
  for (int v : {2, 3}) {
    if (p * v > 8) continue;  // 16 layers: chunks of 2 (each with a Linear)
    for (int m : {p, 2 * p}) {
      INFO(v << " chunks per rank on " << p << " ranks, " << m << " micro-batches");
      auto reference = make_deep_model(device);
      auto reference_opt = adamw(reference->parameters());
      auto full = make_deep_model(device);
      std::vector<std::shared_ptr<nn::Module> > chunks;
      std::vector<Tensor> params;
      for (auto& chunk : pipeline_chunks(*full, rank, p, v)) {
        for (const Tensor& t : chunk->parameters()) params.push_back(t);
        chunks.push_back(chunk);
      }
      auto opt = adamw(params);
      Pipeline pipe(chunks, pg, loss_fn);
      REQUIRE(pipe.num_chunks() == v);
      for (int step = 0; step < 5; ++step) {
        manual_seed(80 + static_cast<uint64_t>(step));
        Tensor x = randn({24, 8}).to(device), y = randint(0, 4, {24}).to(device);  // m = 2-8 divide it
        reference_opt->zero_grad();
        Tensor reference_loss = loss_fn((*reference)(x), y);
        reference_loss.backward();
        reference_opt->step();
        opt->zero_grad();
        PipelineStepResult r =
            pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), m);
        opt->step();
        if (pipe.is_last()) CHECK(std::abs(r.loss - reference_loss.item<double>()) < 1e-5);
      }
      std::vector<Tensor> expected;
      for (auto& chunk : pipeline_chunks(*reference, rank, p, v))
        for (const Tensor& t : chunk->parameters()) expected.push_back(t);
      REQUIRE(params.size() == expected.size());
      for (size_t i = 0; i < params.size(); ++i) testing::require_close(params[i], expected[i], 1e-5);
    }
  }
  // Micro-batches go in groups of p: every rank refuses another count before communicating.
  auto full = make_deep_model(device);
  std::vector<std::shared_ptr<nn::Module> > chunks;
  for (auto& chunk : pipeline_chunks(*full, rank, p, 2)) chunks.push_back(chunk);
  Pipeline pipe(chunks, pg, loss_fn);
  // 60 rows: p + 1 micro-batches divide them (p = 2, 3, 4), but not into groups of p.
  Tensor x = randn({60, 8}).to(device), y = randint(0, 4, {60}).to(device);
  REQUIRE_THROWS_WITH(pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), p + 1),
                      Catch::Contains("do not divide into them"));
}

TEST_CASE("pipeline stages and batches are checked", "[mpi][pipeline]") {
  ProcessGroup pg = testing::mpi_test_group();
  auto full = make_model(pg.device());
  REQUIRE_THROWS_WITH(pipeline_stage(*full, 0, 9), Catch::Contains("8 layers cannot fill 9 stages"));
  auto stage = pipeline_stage(*full, pg.rank(), pg.size());
  Pipeline pipe(stage, pg, loss_fn);
  Tensor x = randn({6, 8}).to(pg.device()), y = randint(0, 4, {6}).to(pg.device());
  // Every rank fails before any communication: no stage is left waiting.
  if (pipe.is_first())
    REQUIRE_THROWS_WITH(pipe.train_step(x, y, 4),
                        Catch::Contains("6 rows do not divide into 4 micro-batches"));
  else if (pipe.is_last())
    REQUIRE_THROWS_WITH(pipe.train_step(Tensor(), y, 4), Catch::Contains("6 rows do not divide into 4"));
  else
    REQUIRE_THROWS_WITH(pipe.train_step(Tensor(), Tensor(), 0), Catch::Contains("must be >= 1"));
}
