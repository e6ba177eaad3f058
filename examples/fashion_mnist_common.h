// What the Fashion-MNIST training examples share (train_fashion_mnist, train_dp, train_ddp):
// the two models, the input normalisation, scoring a test loader, and the progress line. Each
// example keeps its own main(), so the differences between one device, DataParallel and DDP
// stay side by side in three short files.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "data/transforms.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/checkpoint.h"
#include "optim/lr_scheduler.h"

namespace examples {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "mlp": 784-256-128-10 (the dataset README's MLP); "cnn": 2 conv + BN + pooling (nn/zoo.h).
inline std::shared_ptr<mg::nn::Module> make_model(const std::string& name) {
  if (name == "mlp") return std::make_shared<mg::nn::MLP>(784, std::vector<int64_t>{256, 128}, 10);
  if (name == "cnn") return std::make_shared<mg::nn::FashionCNN>();
  throw mg::Error("--model must be mlp or cnn, got '" + name + "'");
}

// The loader settings every example shares (batch size, background workers, the normalisation);
// each example then sets its own order: shuffle and seed, or a DistributedSampler.
inline mg::data::DataLoaderOptions loader_options(int64_t batch_size, int workers,
                                                  std::shared_ptr<const mg::data::Transform> transform) {
  mg::data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.workers = workers;
  options.transform = std::move(transform);
  return options;
}

// Pixels in [0, 1] -> zero mean, unit variance (the training set's statistics).
inline std::shared_ptr<mg::data::Normalize> normalize_transform() {
  return std::make_shared<mg::data::Normalize>(std::vector<double>{mg::data::FashionMNIST::kMean},
                                               std::vector<double>{mg::data::FashionMNIST::kStd});
}

// {correct, seen} over a loader (its first `limit_batches` batches when > 0), in eval mode and
// without building a graph.
inline std::pair<int64_t, int64_t> count_correct(mg::nn::Module& model, mg::data::DataLoader& loader,
                                                 mg::Device device, bool bf16, int64_t limit_batches = 0) {
  mg::NoGradGuard no_grad;
  model.eval();
  int64_t correct = 0, seen = 0, batches = 0;
  for (auto& [x, y] : loader) {
    if (limit_batches > 0 && batches++ == limit_batches) break;
    mg::AutocastGuard autocast(mg::DType::bf16, bf16);
    mg::Tensor predicted = mg::argmax(model.forward(x.to(device)), 1);
    correct += mg::sum(mg::eq(predicted, y.to(device))).item<int64_t>();
    seen += y.numel();
  }
  model.train();
  return {correct, seen};
}

// "\repoch 2 [  120/  468] loss 0.4123  2512 samples/s", every 20 batches and at the end.
inline void print_progress(int epoch, int64_t batches, int64_t steps_per_epoch, double loss_sum,
                           double samples_per_second, const char* note = "") {
  if (batches % 20 != 0 && batches != steps_per_epoch) return;
  std::printf("\repoch %d [%5lld/%5lld] loss %.4f%s  %.0f samples/s", epoch, static_cast<long long>(batches),
              static_cast<long long>(steps_per_epoch), loss_sum / static_cast<double>(batches), note,
              samples_per_second);
  std::fflush(stdout);
}

// Resumes `schedule` at the checkpoint's step, after checking its position against this run: an
// epoch in [0, epochs] and a step in [0, epochs x steps_per_epoch] (a checkpoint of a longer run,
// or a damaged one, is refused naming both). The scheduler jumps there in O(1) (set_step): a loop
// of step() calls spun for days on a checkpoint whose step was 10^15. Returns the epoch to start.
inline int resume_position(const mg::optim::CheckpointInfo& info, const std::string& dir, int epochs,
                           int64_t steps_per_epoch, mg::optim::LRScheduler& schedule) {
  const int64_t total_steps = static_cast<int64_t>(epochs) * steps_per_epoch;
  MG_CHECK(info.epoch >= 0 && info.epoch <= epochs && info.step >= 0 && info.step <= total_steps, dir,
           ": the checkpoint is at epoch ", info.epoch, ", step ", info.step,
           ", beyond what this run can reach (", epochs, " epochs x ", steps_per_epoch,
           " steps = ", total_steps,
           " steps): a checkpoint of another run (--epochs, --limit-train, --batch-size?), or a damaged one");
  schedule.set_step(info.step);
  return static_cast<int>(info.epoch);
}

}  // namespace examples
