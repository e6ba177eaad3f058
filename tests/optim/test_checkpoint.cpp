// Checkpoints: exact resume (bitwise on the CPU), scaler state, and a damaged
// checkpoint rejected without touching the model.
#include <unistd.h>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>

#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "optim/checkpoint.h"

using namespace mg;

namespace {

std::string temp_dir(const std::string& name) {
  return "/tmp/mg_ckpt_" + std::to_string(::getpid()) + "_" + name;
}

// One training step whose data comes from the default generator, so resuming
// exactly needs the RNG state as much as the weights and the optimizer moments.
void train_steps(nn::Module& model, optim::Optimizer& opt, int steps) {
  for (int i = 0; i < steps; ++i) {
    Tensor x = randn({16, 8});
    Tensor y = randint(0, 3, {16});
    Tensor loss = cross_entropy(model.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}

std::vector<std::vector<float>> snapshot(const nn::Module& model) {
  std::vector<std::vector<float>> values;
  for (const Tensor& p : model.parameters()) values.push_back(p.to_vector<float>());
  return values;
}

// Checkpoint metadata that records only the step.
optim::CheckpointInfo at_step(int64_t step) {
  optim::CheckpointInfo info;
  info.step = step;
  return info;
}

}  // namespace

TEST_CASE("train N, save, load into fresh objects, train M == train N+M bit for bit", "[checkpoint]") {
  const int n = 7, m = 5;
  const std::string dir = temp_dir("resume");
  optim::AdamWOptions adamw;
  adamw.lr = 1e-2;
  adamw.weight_decay = 0.05;

  manual_seed(11);
  nn::MLP straight(8, {32, 16}, 3);
  optim::AdamW straight_opt(straight.parameters(), adamw);
  train_steps(straight, straight_opt, n + m);

  manual_seed(11);
  nn::MLP first(8, {32, 16}, 3);
  optim::AdamW first_opt(first.parameters(), adamw);
  train_steps(first, first_opt, n);
  optim::CheckpointInfo saved;
  saved.step = n;
  saved.epoch = 0;
  saved.batches_into_epoch = n;
  optim::save_checkpoint(dir, first, first_opt, saved);

  // "Restart": new objects with different weights, a scrambled generator.
  manual_seed(999);
  nn::MLP resumed(8, {32, 16}, 3);
  optim::AdamW resumed_opt(resumed.parameters(), adamw);
  randn({100});
  REQUIRE(optim::checkpoint_exists(dir));
  optim::CheckpointInfo info = optim::load_checkpoint(dir, resumed, resumed_opt);
  REQUIRE(info.step == n);
  REQUIRE(info.batches_into_epoch == n);
  train_steps(resumed, resumed_opt, m);

  REQUIRE(snapshot(resumed) == snapshot(straight));
  std::remove((dir + "/model.safetensors").c_str());
  std::remove((dir + "/optimizer.safetensors").c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("a damaged checkpoint is rejected and leaves the model and optimizer untouched", "[checkpoint]") {
  const std::string dir = temp_dir("damaged");
  optim::AdamWOptions adamw;
  adamw.lr = 1e-2;
  manual_seed(3);
  nn::MLP model(8, {16}, 3);
  optim::AdamW opt(model.parameters(), adamw);
  train_steps(model, opt, 2);
  optim::save_checkpoint(dir, model, opt, at_step(2));

  nn::MLP other(8, {16}, 3);
  optim::AdamW other_opt(other.parameters(), adamw);
  const auto before = snapshot(other);

  SECTION("truncated optimizer file") {
    std::ifstream in(dir + "/optimizer.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(dir + "/optimizer.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    REQUIRE_THROWS_WITH(optim::load_checkpoint(dir, other, other_opt),
                        Catch::Contains("optimizer.safetensors"));
  }
  SECTION("files from two different checkpoints") {
    const std::string dir2 = temp_dir("damaged2");
    optim::save_checkpoint(dir2, model, opt, at_step(3));
    std::rename((dir2 + "/optimizer.safetensors").c_str(), (dir + "/optimizer.safetensors").c_str());
    std::remove((dir2 + "/model.safetensors").c_str());
    ::rmdir(dir2.c_str());
    REQUIRE_THROWS_WITH(optim::load_checkpoint(dir, other, other_opt),
                        Catch::Contains("different checkpoints"));
  }
  SECTION("optimizer state for another model: the model is restored") {
    nn::MLP wider(8, {20}, 3);
    optim::AdamW wider_opt(wider.parameters(), adamw);
    train_steps(wider, wider_opt, 1);
    const std::string dir2 = temp_dir("damaged3");
    optim::save_checkpoint(dir2, wider, wider_opt, at_step(2));
    // model file from `model` (loads fine), optimizer file from `wider` (wrong shapes), same metadata.
    optim::save_checkpoint(dir2, model, wider_opt, at_step(2));
    REQUIRE_THROWS(optim::load_checkpoint(dir2, other, other_opt));
    std::remove((dir2 + "/model.safetensors").c_str());
    std::remove((dir2 + "/optimizer.safetensors").c_str());
    ::rmdir(dir2.c_str());
  }
  REQUIRE(snapshot(other) == before);
  std::remove((dir + "/model.safetensors").c_str());
  std::remove((dir + "/optimizer.safetensors").c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("the GradScaler state travels with the optimizer", "[checkpoint]") {
  const std::string dir = temp_dir("scaler");
  nn::MLP model(4, {4}, 2);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3;
  optim::AdamW opt(model.parameters(), adamw);
  optim::GradScalerOptions scaling;
  scaling.init_scale = 128.0;
  optim::GradScaler scaler(scaling);
  optim::save_checkpoint(dir, model, opt, at_step(1), &scaler);
  optim::GradScaler restored;
  optim::load_checkpoint(dir, model, opt, &restored);
  REQUIRE(restored.get_scale() == 128.0);
  std::remove((dir + "/model.safetensors").c_str());
  std::remove((dir + "/optimizer.safetensors").c_str());
  ::rmdir(dir.c_str());
}
