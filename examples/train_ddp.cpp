// Train on Fashion-MNIST with DistributedDataParallel: one process per device.
//
//   mpirun -np 2 build/examples/train_ddp --model cnn --epochs 3          (one node, 2 ranks)
//   mpirun -np 8 -H node1:4,node2:4 build/examples/train_ddp --epochs 3   (two nodes, 4 GPUs each)
//   srun -n 8 --ntasks-per-node 4 --gpus-per-task 1 build/examples/train_ddp
//   (as root add --allow-run-as-root; more ranks than cores needs --oversubscribe)
//
// Each rank builds the same model from the same seed (DDP checks it and broadcasts rank 0's
// weights anyway), reads its own 1/N of every epoch through a DistributedSampler (set_epoch
// each epoch, or every epoch repeats epoch 0's order), and trains on --batch-size samples per
// step: the global batch is batch-size × world size, so the learning rate that suits a
// single-process run at that global batch suits this one. Gradients are averaged across ranks
// by bucketed all-reduces overlapped with backward. Dropout uses seed + rank (different masks
// per rank), rank 0 prints. Test accuracy counts each test image once (parallel::ShardedMetric
// drops the sampler's padding).
//
// Fault tolerance (docs/fault-tolerance.md): --checkpoint-dir D --checkpoint-every K saves a step
// checkpoint every K steps, at each epoch's end and on SIGTERM (parallel::CheckpointManager:
// every rank's RNG, the sampler's global position, rank 0 writing in the background); --resume
// continues from the newest valid one at the exact step, at any world size. mg-launch restarts
// the job after a failure:
//   scripts/mg-launch --max-restarts 3 -- mpirun -np 2 train_ddp --checkpoint-dir D --checkpoint-every 50
//   --resume
// Same flags and output as train_fashion_mnist, plus the DDP knobs.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>

#include "core/autocast.h"
#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "data/fashion_mnist.h"
#include "data/transforms.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "parallel/checkpoint_manager.h"
#include "parallel/distributed.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/sharded_metric.h"
#include "parallel/zero_redundancy_optimizer.h"

#include "fashion_mnist_common.h"

using namespace mg;
using examples::Clock;
using examples::seconds_since;

namespace {

// Test accuracy over the whole test set: each rank scores its shard; every image counts once.
double evaluate(nn::Module& model, parallel::ProcessGroup& pg, data::DataLoader& loader,
                const data::DistributedSampler& sampler, Device device, bool bf16) {
  NoGradGuard no_grad;
  model.eval();
  parallel::ShardedMetric correct(sampler);
  for (auto& [x, y] : loader) {
    AutocastGuard autocast(DType::bf16, bf16);
    correct.add(eq(argmax(model.forward(x.to(device)), 1), y.to(device)));
  }
  model.train();
  const auto total = correct.all_reduce(pg);
  check(total.count == loader.dataset().size(), "evaluate: counted ", total.count,
        " test samples, the test set has ", loader.dataset().size());
  return total.mean();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train on Fashion-MNIST with DistributedDataParallel (launch with mpirun -np N)"};
  std::string model_name = "cnn", device_name = "auto", precision = "f32", checkpoint_dir, algo = "native";
  int epochs = 3, workers = 1;
  int64_t batch_size = 64, limit_train = 0, check_replicas_every = 0, checkpoint_every = 0, train_subset = 0;
  int keep_checkpoints = 3;
  bool log_steps = false;
  double lr = 2e-3, weight_decay = 1e-4, bucket_cap_mb = 25.0;
  bool zero_shard = false;
  std::string zero_partition = "parameters";
  bool resume = false;
  uint64_t seed = 42;
  app.add_option("--model", model_name, "mlp (784-256-128-10) or cnn (2 conv + BN + pooling)");
  app.add_option("--epochs", epochs, "passes over the training set");
  app.add_option("--batch-size", batch_size, "samples per step PER RANK (global batch = this x world size)");
  app.add_option("--lr", lr, "AdamW learning rate (cosine-annealed to 0 over the run)");
  app.add_option("--weight-decay", weight_decay, "AdamW decoupled weight decay");
  app.add_option("--device", device_name, "auto (cuda:<local rank> if GPUs, else cpu:0), cpu, ...");
  app.add_option("--precision", precision, "f32 or bf16 (autocast for matmul/conv)");
  app.add_option("--workers", workers, "DataLoader background threads per rank");
  app.add_option("--seed", seed, "initialisation and shuffling seed (the same on every rank)");
  app.add_option("--limit-train", limit_train, "use only the first N batches of each epoch (0 = all)");
  app.add_option("--train-subset", train_subset, "train on the first N training images only (0 = all 60000)");
  app.add_option(
      "--checkpoint-dir", checkpoint_dir,
      "step checkpoints go here (at each epoch's end, every --checkpoint-every steps, on SIGTERM)");
  app.add_option("--checkpoint-every", checkpoint_every,
                 "also checkpoint every K steps (0 = epoch ends only)");
  app.add_option("--keep-checkpoints", keep_checkpoints, "keep the newest M checkpoints");
  app.add_flag(
      "--resume", resume,
      "continue from the newest valid checkpoint in --checkpoint-dir, if any (at the exact step, any "
      "world size)");
  app.add_flag("--log-steps", log_steps, "rank 0 prints 'step N loss L' after every step");
  app.add_option("--bucket-cap-mb", bucket_cap_mb, "DDP gradient bucket size");
  app.add_flag("--zero", zero_shard,
               "ZeRO-1: shard AdamW's state over the ranks (optim::ZeroRedundancyOptimizer); checkpoints "
               "hold the consolidated state");
  app.add_option("--zero-partition", zero_partition,
                 "with --zero: parameters (whole ones, PyTorch's) or flat (equal ranges, DeepSpeed's)");
  app.add_option("--algo", algo, "all-reduce: native (MPI/NCCL) or ring (multigrad's own)");
  app.add_option("--check-replicas-every", check_replicas_every,
                 "compare parameter checksums across ranks every K steps (0 = never)");
  CLI11_PARSE(app, argc, argv);

  try {
    check(precision == "f32" || precision == "bf16", "--precision must be f32 or bf16, got '", precision,
          "'");
    check(algo == "native" || algo == "ring", "--algo must be native or ring, got '", algo, "'");
    const bool bf16 = precision == "bf16";
    parallel::InitOptions init;
    if (device_name != "auto") init.device = Device::parse(device_name);
    parallel::ProcessGroup pg = parallel::init_process_group(init);
    const Device device = pg.device();
    const bool main_rank = pg.is_main();
    char host[64] = {};
    gethostname(host, sizeof(host) - 1);
    std::fprintf(stderr, "rank %d pid %d on node %s\n", pg.rank(), static_cast<int>(getpid()), host);

    data::FashionMNIST train_set(data::Split::Train), test_set(data::Split::Test);
    auto normalize = examples::normalize_transform();
    data::DistributedSamplerOptions train_shard;
    train_shard.shuffle = true;
    train_shard.seed = seed;
    const int64_t train_size = train_subset > 0 ? std::min(train_subset, train_set.size()) : train_set.size();
    data::DistributedSampler train_sampler(train_size, pg.rank(), pg.size(), train_shard);
    data::DistributedSamplerOptions test_shard;
    test_shard.shuffle = false;
    data::DistributedSampler test_sampler(test_set.size(), pg.rank(), pg.size(), test_shard);
    data::DataLoaderOptions train_options = examples::loader_options(batch_size, workers, normalize);
    train_options.drop_last = true;
    train_options.seed = seed;
    train_options.sampler = &train_sampler;
    data::DataLoader train_loader(train_set, train_options);
    data::DataLoaderOptions test_options = examples::loader_options(1000, workers, normalize);
    test_options.sampler = &test_sampler;
    data::DataLoader test_loader(test_set, test_options);

    manual_seed(seed);  // identical initialisation on every rank...
    std::shared_ptr<nn::Module> model = examples::make_model(model_name);
    model->to(device);
    parallel::DDPOptions ddp_options;
    ddp_options.bucket_cap_mb = bucket_cap_mb;
    ddp_options.algo = algo == "ring" ? parallel::AllreduceAlgo::Ring : parallel::AllreduceAlgo::Native;
    ddp_options.check_replicas_every = check_replicas_every;
    parallel::DistributedDataParallel ddp(*model, pg, ddp_options);  // ...verified and broadcast
    manual_seed(parallel::seed_for_rank(seed, pg.rank()));           // ...while dropout differs per rank
    optim::AdamWOptions adamw;
    adamw.lr = lr;
    adamw.weight_decay = weight_decay;
    // --zero: each rank keeps the AdamW state of its shard of the parameters only (ZeRO-1).
    std::unique_ptr<optim::AdamW> replicated;
    std::unique_ptr<optim::ZeroRedundancyOptimizer> zero;
    if (zero_shard) {
      if (zero_partition != "parameters" && zero_partition != "flat")
        throw Error("--zero-partition must be parameters or flat, got '" + zero_partition + "'");
      optim::ZeroOptions zero_options;
      zero_options.partition =
          zero_partition == "flat" ? optim::ZeroPartition::Flat : optim::ZeroPartition::Parameters;
      zero = std::make_unique<optim::ZeroRedundancyOptimizer>(
          ddp.parameters(), pg,
          [&](std::vector<Tensor> shard) { return std::make_unique<optim::AdamW>(shard, adamw); },
          zero_options);
    } else {
      replicated = std::make_unique<optim::AdamW>(ddp.parameters(), adamw);
    }
    optim::Optimizer& opt = zero ? zero->local_optimizer() : *replicated;  // hyperparameters and schedule
    const int64_t steps_per_epoch =
        limit_train > 0 ? std::min(limit_train, train_loader.size()) : train_loader.size();
    optim::CosineAnnealingLROptions cosine;
    cosine.t_max = epochs * steps_per_epoch;
    optim::CosineAnnealingLR schedule(opt, cosine);

    // Step checkpoints: model, optimizer (consolidated with --zero), schedule, every rank's RNG
    // and the sampler's global position. The files are the same with and without --zero, so a
    // run may switch between the two, or change its world size.
    std::unique_ptr<parallel::CheckpointManager> checkpoints;
    parallel::TrainingState state;
    state.module = model.get();
    state.optimizer = zero ? nullptr : &opt;
    state.zero = zero.get();
    state.scheduler = &schedule;
    parallel::TrainingPosition position;
    if (!checkpoint_dir.empty()) {
      parallel::CheckpointManagerOptions checkpoint_options;
      checkpoint_options.every_steps = checkpoint_every;
      checkpoint_options.keep_last = keep_checkpoints;
      checkpoints = std::make_unique<parallel::CheckpointManager>(pg, checkpoint_dir, checkpoint_options);
      if (resume) {
        if (auto resumed = checkpoints->load_latest(state)) {
          position = resumed->position;
          train_sampler.set_start_sample(position.epoch, position.samples_into_epoch);
          if (main_rank)
            std::printf(
                "resumed from %s: step %lld, epoch %lld after %lld samples, saved by %d rank(s), now %d\n",
                resumed->dir.c_str(), static_cast<long long>(position.step),
                static_cast<long long>(position.epoch) + 1,
                static_cast<long long>(position.samples_into_epoch), resumed->world_size, pg.size());
        }
      }
    }
    const int64_t global_batch = batch_size * pg.size();
    // --limit-train caps each epoch in samples (batches of this run's global batch).
    const int64_t samples_cap = limit_train > 0 ? limit_train * global_batch : INT64_MAX;

    if (main_rank)
      std::printf(
          "multigrad DDP Fashion-MNIST: model %s (%lld parameters), %d ranks (%s launcher), device %s per "
          "rank, "
          "%s, batch %lld per rank = %lld global, %d epochs, AdamW lr %g, all-reduce %s, buckets %g MB\n",
          model_name.c_str(), static_cast<long long>(model->num_parameters()), pg.size(),
          pg.launch().launcher.c_str(), device.str().c_str(), precision.c_str(),
          static_cast<long long>(batch_size), static_cast<long long>(batch_size * pg.size()), epochs, lr,
          algo.c_str(), bucket_cap_mb);
    const auto run_start = Clock::now();
    double accuracy = 0;
    for (int epoch = static_cast<int>(position.epoch); epoch < epochs; ++epoch) {
      train_sampler.set_epoch(epoch);  // a new shuffle each epoch, the same on every rank
      ddp.reset_stats();
      const auto epoch_start = Clock::now();
      double loss_sum = 0;
      int64_t batches = 0;
      for (auto& [x, y] : train_loader) {
        if (position.samples_into_epoch + global_batch > samples_cap) break;
        Tensor loss;
        {
          AutocastGuard autocast(DType::bf16, bf16);
          loss = cross_entropy(ddp(x.to(device)), y.to(device));
        }
        zero ? zero->zero_grad() : opt.zero_grad();
        loss.backward();
        zero ? zero->step() : opt.step();
        schedule.step();
        ++position.step;
        position.samples_into_epoch += global_batch;
        ++batches;
        const double loss_value = loss.item<double>();
        loss_sum += loss_value;
        if (log_steps && main_rank)
          std::printf("step %lld loss %.6f\n", static_cast<long long>(position.step), loss_value);
        if (main_rank)
          if (!log_steps)
            examples::print_progress(
                epoch + 1, batches, steps_per_epoch, loss_sum,
                static_cast<double>(batches * batch_size * pg.size()) / seconds_since(epoch_start),
                " (rank 0; samples/s of all ranks)");
        // preempted() is a collective: every rank asks after every step, and all agree.
        const bool stop = checkpoints && checkpoints->preempted();
        if (checkpoints && (stop || checkpoints->due(position.step))) {
          checkpoints->save(state, position);
          if (stop) {
            checkpoints->wait();
            if (main_rank)
              std::printf("\nSIGTERM: saved step %lld to %s and stopped\n",
                          static_cast<long long>(position.step), checkpoint_dir.c_str());
            return 0;
          }
        }
      }
      accuracy = evaluate(*model, pg, test_loader, test_sampler, device, bf16);
      const auto& stats = ddp.stats();
      if (main_rank)
        std::printf(
            "\nepoch %d: train loss %.4f (rank 0), test accuracy %.4f, %.1f s; all-reduce %.0f ms busy, %.0f "
            "ms "
            "exposed\n",
            epoch + 1, loss_sum / static_cast<double>(std::max<int64_t>(batches, 1)), accuracy,
            seconds_since(epoch_start), stats.comm_ms, stats.exposed_ms);
      position.epoch = epoch + 1;
      position.samples_into_epoch = 0;
      if (checkpoints) checkpoints->save(state, position);
    }
    if (checkpoints) checkpoints->wait();
    // The optimizer state each rank holds: all of AdamW's moments, or (--zero) its shard's.
    int64_t mine = 0;
    if (zero) {
      mine = zero->state_bytes();
    } else {
      for (int64_t i = 0; i < opt.num_params(); ++i)
        for (const auto& [name, t] : opt.state(i)) mine += static_cast<int64_t>(t.nbytes());
    }
    Tensor state_bytes = zeros({pg.size()}, TensorOptions{DType::f64});
    pg.allgather(state_bytes, full({1}, static_cast<double>(mine), TensorOptions{DType::f64}))->wait();
    std::string per_rank;
    for (double b : state_bytes.to_vector<double>())
      per_rank += str_cat(per_rank.empty() ? "" : " / ", b / 1e6);
    if (main_rank) {
      std::printf("optimizer state per rank (MB): %s%s\n", per_rank.c_str(),
                  zero ? " (ZeRO-1: sharded)" : " (replicated)");
      std::printf("final: model %s, %d ranks, test accuracy %.4f, wall time %.1f s\n", model_name.c_str(),
                  pg.size(), accuracy, seconds_since(run_start));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_ddp: %s\n", e.what());
    return 1;
  }
}
