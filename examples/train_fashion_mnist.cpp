// Train a model on Fashion-MNIST: the complete program a user copies.
//
//   build/examples/train_fashion_mnist --model mlp        (15 epochs: >= 0.88 test accuracy)
//   build/examples/train_fashion_mnist --model cnn        (6 epochs: >= 0.92)
//   build/examples/train_fashion_mnist --model mlp --epochs 3 --checkpoint-dir ckpt
//   build/examples/train_fashion_mnist --resume --checkpoint-dir ckpt     (continues where it stopped)
//
// Reads Debian's dataset-fashion-mnist files (/usr/share/datasets/fashion-mnist,
// or $MG_FASHION_MNIST_DIR). Prints a progress line with loss and samples/s,
// test accuracy after every epoch, and a final line with accuracy and wall time.
//
// Defaults: AdamW (lr 1e-3, weight decay 1e-4) cosine-annealed to 0 over the run, batch 128,
// inputs normalised with the training set's mean/std, no augmentation. On the CPU, export
// OPENBLAS_CORETYPE as scripts/common.sh does (Debian's OpenBLAS may pick slow kernels), and on
// a machine shared with other jobs OMP_WAIT_POLICY=passive (spinning OpenMP threads otherwise
// steal the cores their siblings need; see docs/nn-and-optim.md, Part 4).
//
// Measured on a shared 2-core Xeon (AVX-512, OPENBLAS_CORETYPE=SkylakeX, 2 OpenMP threads,
// other builds running), test accuracy after each epoch:
//   mlp  load 4.2-5.5:  epoch 1: 0.853, 5: 0.885, 10: 0.894, 15: 0.8995   100 s in all
//   cnn  load 3.4-7.4, OMP_WAIT_POLICY=passive:
//        epoch 1: 0.886, 2: 0.895, 3: 0.912, 4: 0.916, 5: 0.920, 6: 0.9217   723 s in all
//        (78-151 s per epoch, swinging with the load: over the 10 minutes here)
// docs/nn-and-optim.md (Part 3) has the full tables.
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

#include "fashion_mnist_common.h"

using namespace mg;
using examples::Clock;
using examples::seconds_since;

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP or a CNN on Fashion-MNIST with multigrad"};
  std::string model_name = "mlp", device_name = "auto", precision = "f32", checkpoint_dir;
  int epochs = 0, workers = 2;
  int64_t batch_size = 128, limit_train = 0, limit_test = 0;
  double lr = 1e-3, weight_decay = 1e-4;
  bool resume = false;
  uint64_t seed = 42;
  app.add_option("--model", model_name, "mlp (784-256-128-10) or cnn (2 conv + BN + pooling)");
  app.add_option("--epochs", epochs, "passes over the training set (default: 15 for mlp, 6 for cnn)");
  app.add_option("--batch-size", batch_size, "samples per step");
  app.add_option("--lr", lr, "AdamW learning rate (cosine-annealed to 0 over the run)");
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay");
  app.add_option("--device", device_name, "auto, cpu, cuda:0, ...");
  app.add_option("--precision", precision, "f32 or bf16 (autocast for matmul/conv)");
  app.add_option("--workers", workers, "DataLoader background threads");
  app.add_option("--seed", seed, "initialisation and shuffling seed");
  app.add_option("--limit-train", limit_train,
                 "use only the first N batches of each epoch (0 = all; for smoke tests)");
  app.add_option("--limit-test", limit_test,
                 "evaluate on only the first N test batches of 1000 (0 = all; for smoke tests)");
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "save model + optimizer + position here after every epoch");
  app.add_flag("--resume", resume, "continue from --checkpoint-dir if it holds a checkpoint");
  CLI11_PARSE(app, argc, argv);

  try {
    MG_CHECK(precision == "f32" || precision == "bf16", "--precision must be f32 or bf16, got '", precision,
             "'");
    const bool bf16 = precision == "bf16";
    MG_CHECK(epochs >= 0, "--epochs must be >= 0 (0: the model's default), got ", epochs);
    if (epochs == 0) epochs = model_name == "cnn" ? 6 : 15;  // what reaches the accuracy floors (see top)
    Device device = device_name == "auto"
                        ? (cuda::device_count() > 0 && cuda_backend() ? Device::cuda(0) : Device::cpu(0))
                        : Device::parse(device_name);

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

    std::printf(
        "multigrad Fashion-MNIST: model %s (%lld parameters), device %s, %s, batch %lld, %d epochs, AdamW lr "
        "%g\n",
        model_name.c_str(), static_cast<long long>(model->num_parameters()), device.str().c_str(),
        precision.c_str(), static_cast<long long>(batch_size), epochs, lr);
    const auto run_start = Clock::now();
    double accuracy = 0;
    for (int epoch = start_epoch; epoch < epochs; ++epoch) {
      train_loader.set_epoch(epoch);
      const auto epoch_start = Clock::now();
      double loss_sum = 0;
      int64_t batches = 0;
      for (auto& [x, y] : train_loader) {
        if (batches == steps_per_epoch) break;
        Tensor loss;
        {
          AutocastGuard autocast(DType::bf16, bf16);
          loss = cross_entropy(model->forward(x.to(device)), y.to(device));
        }
        opt.zero_grad();
        loss.backward();
        opt.step();
        schedule.step();
        ++step;
        ++batches;
        loss_sum += loss.item<double>();
        examples::print_progress(epoch + 1, batches, steps_per_epoch, loss_sum,
                                 static_cast<double>(batches * batch_size) / seconds_since(epoch_start));
      }
      auto [correct, seen] = examples::count_correct(*model, test_loader, device, bf16, limit_test);
      accuracy = static_cast<double>(correct) / static_cast<double>(seen);
      std::printf("\nepoch %d: train loss %.4f, test accuracy %.4f, %.1f s\n", epoch + 1,
                  loss_sum / static_cast<double>(std::max<int64_t>(batches, 1)), accuracy,
                  seconds_since(epoch_start));
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
    std::fprintf(stderr, "train_fashion_mnist: %s\n", e.what());
    return 1;
  }
}
