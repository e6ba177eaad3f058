// Exact resume across a process restart: train N steps in one process, save a
// checkpoint, and let a *new* process load it and train M more. Its parameters must
// equal, bit for bit, those of an uninterrupted N+M run (deterministic CPU path).
//
// test_checkpoint.cpp shows the same within one process, with fresh objects. Here
// nothing can survive in memory: the two halves run in child processes. The child
// is this very test binary (found through /proc/self/exe) running the hidden test case
// "[.resume_worker]", told what to do by environment variables:
//
//   MG_RESUME_PHASE=first   train N steps from scratch, save_checkpoint(MG_RESUME_DIR)
//   MG_RESUME_PHASE=second  build the model with *other* weights, scramble the
//                           generator, load_checkpoint, train M steps, write the
//                           parameters to MG_RESUME_DIR/final.safetensors
//
// What must travel in the checkpoint for the bits to match: weights, AdamW moments
// and step counts, the RNG state (Dropout draws its masks from the default
// generator), and the data position (the shuffled epoch order is a function of
// (seed, epoch); N stops in the middle of an epoch, so the batch index matters).
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/safetensors.h"
#include "data/dataloader.h"
#include "data/synthetic.h"
#include "multigrad.h"
#include "nn/nn.h"
#include "optim/adam.h"
#include "optim/checkpoint.h"

using namespace mg;

namespace {

constexpr int kFirstSteps = 9;   // N: one epoch is 6 batches, so N ends 3 batches into epoch 1
constexpr int kSecondSteps = 7;  // M: crosses into epoch 2
constexpr uint64_t kSeed = 5;

data::DataLoaderOptions loader_options() {
  data::DataLoaderOptions options;
  options.batch_size = 16;
  options.shuffle = true;
  options.drop_last = true;
  options.seed = 77;
  options.workers = 2;
  return options;
}

// Everything one run needs, built the same way in every process.
struct Run {
  data::SyntheticClassification dataset{96, {8}, 3, /*seed=*/21};
  data::DataLoader loader{dataset, loader_options()};
  nn::Sequential model;
  std::unique_ptr<optim::AdamW> opt;

  explicit Run(uint64_t init_seed) {
    manual_seed(init_seed);
    model.emplace_back<nn::Linear>(8, 32);
    model.emplace_back<nn::ReLU>();
    model.emplace_back<nn::Dropout>(0.3);
    model.emplace_back<nn::Linear>(32, 3);
    optim::AdamWOptions adamw;
    adamw.lr = 1e-2;
    adamw.weight_decay = 0.05;
    opt = std::make_unique<optim::AdamW>(model.parameters(), adamw);
  }
};

struct Position {
  int64_t epoch = 0, batch = 0;  // the next batch to train on
};

// Trains `steps` batches starting at `at`, crossing epochs as needed; returns the new position.
Position train(Run& run, Position at, int steps) {
  while (steps > 0) {
    run.loader.set_epoch(at.epoch);
    run.loader.set_start_batch(at.batch);
    for (auto it = run.loader.begin(); it != run.loader.end() && steps > 0; ++it, --steps, ++at.batch) {
      Tensor loss = cross_entropy(run.model.forward(it->data), it->target);
      run.opt->zero_grad();
      loss.backward();
      run.opt->step();
    }
    if (at.batch == run.loader.size()) at = {at.epoch + 1, 0};
  }
  return at;
}

std::string temp_dir() { return "/tmp/mg_ckpt_restart_" + std::to_string(::getpid()); }

// The path of this test binary (read before std::system, whose child is the shell).
std::string this_executable() {
  char path[4096];
  const ssize_t n = ::readlink("/proc/self/exe", path, sizeof path - 1);
  REQUIRE(n > 0);
  return std::string(path, static_cast<size_t>(n));
}

// Runs this test binary again as the worker for `phase`; returns its exit status.
int run_worker(const std::string& phase, const std::string& dir) {
  ::setenv("MG_RESUME_PHASE", phase.c_str(), 1);
  ::setenv("MG_RESUME_DIR", dir.c_str(), 1);
  const std::string command = "'" + this_executable() + "' '[resume_worker]' --reporter compact";
  const int status = std::system(command.c_str());
  ::unsetenv("MG_RESUME_PHASE");
  ::unsetenv("MG_RESUME_DIR");
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Bitwise equality of two f32 tensors (== would call -0 and 0 equal and NaN unequal).
bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  const std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
  return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("resume worker: one half of a training run, in its own process", "[.resume_worker]") {
  const char* phase = std::getenv("MG_RESUME_PHASE");
  const char* dir = std::getenv("MG_RESUME_DIR");
  REQUIRE(phase != nullptr);
  REQUIRE(dir != nullptr);
  if (std::string(phase) == "first") {
    Run run(kSeed);
    const Position at = train(run, {}, kFirstSteps);
    REQUIRE(at.epoch == 1);
    REQUIRE(at.batch == 3);
    optim::CheckpointInfo info;
    info.step = kFirstSteps;
    info.epoch = at.epoch;
    info.batches_into_epoch = at.batch;
    optim::save_checkpoint(dir, run.model, *run.opt, info);
  } else {
    REQUIRE(std::string(phase) == "second");
    Run run(/*init_seed=*/12345);  // other weights: only the checkpoint can make them right
    randn({1000});                 // and a generator far from where the first process left it
    const optim::CheckpointInfo info = optim::load_checkpoint(dir, run.model, *run.opt);
    REQUIRE(info.step == kFirstSteps);
    train(run, {info.epoch, info.batches_into_epoch}, kSecondSteps);
    save_safetensors(std::string(dir) + "/final.safetensors", run.model.state_dict());
  }
}

TEST_CASE("train N, save, restart the process, load, train M == train N+M, bit for bit", "[checkpoint]") {
  const std::string dir = temp_dir();

  Run straight(kSeed);
  const Position end = train(straight, {}, kFirstSteps + kSecondSteps);
  REQUIRE(end.epoch == 2);  // the run crosses two epoch boundaries

  REQUIRE(run_worker("first", dir) == 0);
  REQUIRE(optim::checkpoint_exists(dir));
  REQUIRE(run_worker("second", dir) == 0);

  const StateDict resumed = load_safetensors(dir + "/final.safetensors").tensors;
  const StateDict expected = straight.model.state_dict();
  REQUIRE(resumed.size() == expected.size());
  for (const auto& [name, value] : expected) {
    INFO("parameter " << name);
    REQUIRE(resumed.count(name) == 1);
    CHECK(same_bits(resumed.at(name), value));
  }

  // The resumed run must actually depend on what was saved: a checkpoint-free second half from
  // the same weights but a fresh generator (other dropout masks) ends elsewhere.
  Run no_rng(kSeed);
  train(no_rng, {}, kFirstSteps);
  manual_seed(999);
  train(no_rng, {1, 3}, kSecondSteps);
  CHECK_FALSE(same_bits(no_rng.model.state_dict().at("0.weight"), expected.at("0.weight")));

  for (const char* file : {"/model.safetensors", "/optimizer.safetensors", "/final.safetensors"})
    std::remove((dir + file).c_str());
  ::rmdir(dir.c_str());
}
