// Train on Fashion-MNIST with DataParallel: one process, several devices.
//
//   build/examples/train_dp --epochs 3                   (every GPU, or 2 logical CPU devices)
//   build/examples/train_dp --devices 4 --limit-train 50  (4 logical CPU devices: cpu:0..cpu:3)
//
// The same program as train_fashion_mnist.cpp (same flags, same output) with one change:
// the model is wrapped in parallel::DataParallel. Each step scatters the batch across the
// devices, runs a replica of the model on each in its own thread, and gathers the outputs
// on the first device, where the loss, the backward's final sum and the optimizer run.
// Without a GPU the devices are logical CPU devices (cpu:0, cpu:1, ...), which share the
// machine's cores: that exercises DataParallel's whole path but cannot be faster than one
// device (docs/data-parallel.md has the measurements).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "core/autocast.h"
#include "core/cuda_runtime.h"
#include "data/dataloader.h"
#include "data/fashion_mnist.h"
#include "data/transforms.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "optim/checkpoint.h"
#include "optim/lr_scheduler.h"
#include "parallel/data_parallel/data_parallel.h"

#include "fashion_mnist_common.h"

using namespace mg;
using examples::Clock;
using examples::seconds_since;

namespace {

// Every CUDA device when there are any, else `count` logical CPU devices.
std::vector<Device> pick_devices(int count) {
  std::vector<Device> devices;
  if (cuda::device_count() > 0 && cuda_backend() != nullptr) {
    for (int i = 0; i < cuda::device_count(); ++i) devices.push_back(Device::cuda(i));
    return devices;
  }
  MG_CHECK(count >= 1, "--devices must be at least 1, got ", count);
  for (int i = 0; i < count; ++i) devices.push_back(Device::cpu(i));
  return devices;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP or a CNN on Fashion-MNIST with DataParallel over several devices"};
  std::string model_name = "cnn", precision = "f32", checkpoint_dir;
  int epochs = 5, workers = 2, num_devices = 2;
  int64_t batch_size = 128, limit_train = 0;
  double lr = 1e-3, weight_decay = 1e-4;
  bool resume = false;
  uint64_t seed = 42;
  app.add_option("--model", model_name, "mlp (784-256-128-10) or cnn (2 conv + BN + pooling)");
  app.add_option("--epochs", epochs, "passes over the training set");
  app.add_option("--batch-size", batch_size, "samples per step (the global batch, split across devices)");
  app.add_option("--lr", lr, "AdamW learning rate (cosine-annealed to 0 over the run)");
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay");
  app.add_option("--devices", num_devices, "logical CPU devices to use when there is no GPU");
  app.add_option("--precision", precision, "f32 or bf16 (autocast for matmul/conv)");
  app.add_option("--workers", workers, "DataLoader background threads");
  app.add_option("--seed", seed, "initialisation and shuffling seed");
  app.add_option("--limit-train", limit_train,
                 "use only the first N batches of each epoch (0 = all; for smoke tests)");
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "save model + optimizer + position here after every epoch");
  app.add_flag("--resume", resume, "continue from --checkpoint-dir if it holds a checkpoint");
  CLI11_PARSE(app, argc, argv);

  try {
    MG_CHECK(precision == "f32" || precision == "bf16", "--precision must be f32 or bf16, got '", precision,
             "'");
    const bool bf16 = precision == "bf16";
    const std::vector<Device> devices = pick_devices(num_devices);
    const Device device = devices[0];  // parameters, outputs, loss and optimizer live here

    data::FashionMNIST train_set(data::Split::Train), test_set(data::Split::Test);
    auto normalize = examples::normalize_transform();
    data::DataLoaderOptions train_options = examples::loader_options(batch_size, workers, normalize);
    train_options.shuffle = true;
    train_options.drop_last = true;
    train_options.seed = seed;
    data::DataLoader train_loader(train_set, train_options);
    data::DataLoader test_loader(test_set, examples::loader_options(1000, workers, normalize));

    manual_seed(seed);
    std::shared_ptr<nn::Module> model = examples::make_model(model_name);
    model->to(device);
    parallel::DataParallel dp(model, devices);  // the only line train_fashion_mnist.cpp lacks
    optim::AdamWOptions adamw;
    adamw.lr = lr;
    adamw.weight_decay = weight_decay;
    optim::AdamW opt(model->parameters(), adamw);
    const int64_t steps_per_epoch =
        limit_train > 0 ? std::min(limit_train, train_loader.size()) : train_loader.size();
    optim::CosineAnnealingLROptions cosine;
    cosine.t_max = epochs * steps_per_epoch;
    optim::CosineAnnealingLR schedule(opt, cosine);

    int start_epoch = 0;
    int64_t step = 0;
    if (resume && !checkpoint_dir.empty() && optim::checkpoint_exists(checkpoint_dir)) {
      optim::CheckpointInfo info = optim::load_checkpoint(checkpoint_dir, *model, opt);
      start_epoch = examples::resume_position(info, checkpoint_dir, epochs, steps_per_epoch, schedule);
      step = info.step;
      std::printf("resumed from %s at epoch %d, step %lld\n", checkpoint_dir.c_str(), start_epoch,
                  static_cast<long long>(step));
    }

    std::string device_list;
    for (const Device& d : devices) device_list += (device_list.empty() ? "" : ",") + d.str();
    std::printf(
        "multigrad Fashion-MNIST: model %s (%lld parameters), DataParallel over %s, %s, batch %lld, %d "
        "epochs, AdamW lr %g\n",
        model_name.c_str(), static_cast<long long>(model->num_parameters()), device_list.c_str(),
        precision.c_str(), static_cast<long long>(batch_size), epochs, lr);
    const auto run_start = Clock::now();
    double accuracy = 0;
    for (int epoch = start_epoch; epoch < epochs; ++epoch) {
      train_loader.set_epoch(epoch);
      const auto epoch_start = Clock::now();
      double loss_sum = 0;
      int64_t batches = 0;
      parallel::DataParallelTimings phases;  // summed over the epoch's steps
      for (auto& [x, y] : train_loader) {
        if (batches == steps_per_epoch) break;
        Tensor loss;
        {
          AutocastGuard autocast(DType::bf16, bf16);
          loss = cross_entropy(dp(x), y.to(device));
        }
        opt.zero_grad();
        loss.backward();
        opt.step();
        schedule.step();
        ++step;
        ++batches;
        loss_sum += loss.item<double>();
        const parallel::DataParallelTimings& t = dp.last_timings();
        phases.scatter_ms += t.scatter_ms;
        phases.replicate_ms += t.replicate_ms;
        phases.apply_ms += t.apply_ms;
        phases.gather_ms += t.gather_ms;
        examples::print_progress(epoch + 1, batches, steps_per_epoch, loss_sum,
                                 static_cast<double>(batches * batch_size) / seconds_since(epoch_start));
      }
      auto [correct, seen] = examples::count_correct(dp, test_loader, device, bf16);  // through DP too
      accuracy = static_cast<double>(correct) / static_cast<double>(seen);
      const double per_step = 1.0 / static_cast<double>(std::max<int64_t>(batches, 1));
      std::printf("\nepoch %d: train loss %.4f, test accuracy %.4f, %.1f s\n", epoch + 1, loss_sum * per_step,
                  accuracy, seconds_since(epoch_start));
      std::printf(
          "  forward per step: scatter %.2f ms, replicate %.2f ms, replicas %.2f ms, gather %.2f ms\n",
          phases.scatter_ms * per_step, phases.replicate_ms * per_step, phases.apply_ms * per_step,
          phases.gather_ms * per_step);
      if (!checkpoint_dir.empty()) {
        optim::CheckpointInfo info;
        info.step = step;
        info.epoch = epoch + 1;
        optim::save_checkpoint(checkpoint_dir, *model, opt, info);
      }
    }
    std::printf("final: model %s, test accuracy %.4f, wall time %.1f s\n", model_name.c_str(), accuracy,
                seconds_since(run_start));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_dp: %s\n", e.what());
    return 1;
  }
}
