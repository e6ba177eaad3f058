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
// by bucketed all-reduces overlapped with backward. Dropout (--dropout) and input noise
// (--input-noise) draw from each rank's own generator, seeded seed + rank (different masks per
// rank), rank 0 prints. Test accuracy counts each test image once (parallel::ShardedMetric
// drops the sampler's padding).
//
// Fault tolerance (docs/fault-tolerance.md): --checkpoint-dir D --checkpoint-every K saves a step
// checkpoint every K steps, at each epoch's end and on SIGTERM (parallel::CheckpointManager:
// every rank's RNG, the sampler's global position, rank 0 writing in the background); --resume
// continues from the newest valid one at the exact step, at any world size; rank 0 reads it and
// sends it to the others, so D may be per node (--checkpoint-dir /local/ckpt-{node}). mg-launch restarts
// the job after a failure:
//   scripts/mg-launch --max-restarts 3 -- mpirun -np 2 train_ddp --checkpoint-dir D --checkpoint-every 50
//   --resume
// Same flags and output as train_fashion_mnist, plus the DDP knobs.
//
// Reading order, one concept per section: Flags (the command line), setup (process group, data
// shards, the DDP model, AdamW or ZeRO-1), train_step (one optimizer step), evaluate
// (ShardedMetric), Checkpoints (--resume, periodic saves, SIGTERM), then the loop that ties them
// together (train_epoch, train) and run(), which builds everything in order.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <climits>
#include <cmath>
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
#include "parallel/comm/heartbeat.h"
#include "parallel/data_parallel/distributed.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/powersgd.h"
#include "parallel/resilience/checkpoint_manager.h"
#include "parallel/resilience/sharded_metric.h"
#include "parallel/zero/zero_redundancy_optimizer.h"

#include "fashion_mnist_common.h"

using namespace mg;
using examples::Clock;
using examples::seconds_since;

namespace {

// ---- The command line ------------------------------------------------------------------------

// Every flag, with its default; the tests and scripts depend on these names and their order in --help.
struct Flags {
  std::string model_name = "cnn", device_name = "auto", precision = "f32", checkpoint_dir, algo = "native";
  int epochs = 3, workers = 1;
  int64_t batch_size = 64, limit_train = 0, check_replicas_every = 0, checkpoint_every = 0, train_subset = 0;
  int keep_checkpoints = 3;
  bool log_steps = false;
  double lr = 2e-3, weight_decay = 1e-4, bucket_cap_mb = 25.0;
  double dropout = -1, input_noise = 0;  // -1: the model's own (mlp none, cnn 0.25)
  bool zero_shard = false;
  std::string zero_partition = "parameters";
  bool resume = false;
  uint64_t seed = 42;
  std::string comm_hook = "none";  // none, fp16, bf16, powersgd (comm_hooks.h, powersgd.h)
  int64_t powersgd_rank = 1, powersgd_start = 10;
};

void add_flags(CLI::App& app, Flags& f) {
  app.add_option("--model", f.model_name, "mlp (784-256-128-10) or cnn (2 conv + BN + pooling)");
  app.add_option(
      "--dropout", f.dropout,
      "dropout probability: after each hidden layer of mlp (default none), before cnn's classifier "
      "(default 0.25); masks come from each rank's own generator");
  app.add_option("--input-noise", f.input_noise,
                 "add this x N(0, 1) to each training input, drawn from the rank's own generator (0 = off)");
  app.add_option("--epochs", f.epochs, "passes over the training set");
  app.add_option("--batch-size", f.batch_size,
                 "samples per step PER RANK (global batch = this x world size)");
  app.add_option("--lr", f.lr, "AdamW learning rate (cosine-annealed to 0 over the run)");
  app.add_option("--weight-decay", f.weight_decay, "AdamW decoupled weight decay");
  app.add_option("--device", f.device_name, "auto (cuda:<local rank> if GPUs, else cpu:0), cpu, ...");
  app.add_option("--precision", f.precision, "f32 or bf16 (autocast for matmul/conv)");
  app.add_option("--workers", f.workers, "DataLoader background threads per rank");
  app.add_option("--seed", f.seed, "initialisation and shuffling seed (the same on every rank)");
  app.add_option("--limit-train", f.limit_train, "use only the first N batches of each epoch (0 = all)");
  app.add_option("--train-subset", f.train_subset,
                 "train on the first N training images only (0 = all 60000)");
  app.add_option(
      "--checkpoint-dir", f.checkpoint_dir,
      "step checkpoints go here (at each epoch's end, every --checkpoint-every steps, on SIGTERM); "
      "{rank} and {node} become the rank and its host name (a directory per rank or node: only "
      "rank 0's is written and read, no shared filesystem needed)");
  app.add_option("--checkpoint-every", f.checkpoint_every,
                 "also checkpoint every K steps (0 = epoch ends only)");
  app.add_option("--keep-checkpoints", f.keep_checkpoints, "keep the newest M checkpoints");
  app.add_flag(
      "--resume", f.resume,
      "continue from the newest valid checkpoint in --checkpoint-dir, if any (at the exact step, any "
      "world size)");
  app.add_flag("--log-steps", f.log_steps, "rank 0 prints 'step N loss L' after every step");
  app.add_option("--bucket-cap-mb", f.bucket_cap_mb, "DDP gradient bucket size");
  app.add_flag("--zero", f.zero_shard,
               "ZeRO-1: shard AdamW's state over the ranks (parallel::ZeroRedundancyOptimizer); checkpoints "
               "hold the consolidated state");
  app.add_option("--zero-partition", f.zero_partition,
                 "with --zero: parameters (whole ones, PyTorch's) or flat (equal ranges, DeepSpeed's)");
  app.add_option("--algo", f.algo, "all-reduce: native (MPI/NCCL) or ring (multigrad's own)");
  app.add_option("--check-replicas-every", f.check_replicas_every,
                 "compare parameter checksums across ranks every K steps (0 = never)");
  app.add_option("--comm-hook", f.comm_hook, "gradient compression: none, fp16, bf16 or powersgd");
  app.add_option("--powersgd-rank", f.powersgd_rank,
                 "with --comm-hook powersgd: the matrix approximation rank");
  app.add_option("--powersgd-start", f.powersgd_start,
                 "with --comm-hook powersgd: plain all-reduce for the steps before this one");
}

// ---- Setup -----------------------------------------------------------------------------------

// One process per device: the launcher (mpirun, srun) says which rank this is. Each rank
// announces its pid, so a script can send it SIGTERM (check_sigterm_resume.sh does).
parallel::ProcessGroup init_process_group(const Flags& f) {
  parallel::InitOptions init;
  if (f.device_name != "auto") init.device = Device::parse(f.device_name);
  parallel::ProcessGroup pg = parallel::init_process_group(init);
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::fprintf(stderr, "rank %d pid %d on node %s\n", pg.rank(), static_cast<int>(getpid()), host);
  return pg;
}

// Each rank reads its own 1/N of the data. Training shards are shuffled with the same seed on
// every rank (so they stay disjoint), and train() calls set_epoch so each epoch reshuffles; test
// shards are not shuffled, and ShardedMetric drops the padding that evens them out.
struct ShardedData {
  ShardedData(const Flags& f, const parallel::ProcessGroup& pg)
      : train_set(data::Split::Train),
        test_set(data::Split::Test),
        normalize(examples::normalize_transform()),
        train_sampler(f.train_subset > 0 ? std::min(f.train_subset, train_set.size()) : train_set.size(),
                      pg.rank(), pg.size(), shard_options(/*shuffle=*/true, f.seed)),
        test_sampler(test_set.size(), pg.rank(), pg.size(), shard_options(/*shuffle=*/false, 0)),
        train_loader(train_set, train_options(f)),
        test_loader(test_set, test_options(f)) {}

  static data::DistributedSamplerOptions shard_options(bool shuffle, uint64_t seed) {
    data::DistributedSamplerOptions options;
    options.shuffle = shuffle;
    if (shuffle) options.seed = seed;
    return options;
  }
  data::DataLoaderOptions train_options(const Flags& f) {
    data::DataLoaderOptions options = examples::loader_options(f.batch_size, f.workers, normalize);
    options.drop_last = true;  // every step has a full batch on every rank
    options.seed = f.seed;
    options.sampler = &train_sampler;
    return options;
  }
  data::DataLoaderOptions test_options(const Flags& f) {
    data::DataLoaderOptions options = examples::loader_options(1000, f.workers, normalize);
    options.sampler = &test_sampler;
    return options;
  }

  data::FashionMNIST train_set, test_set;
  std::shared_ptr<data::Normalize> normalize;
  data::DistributedSampler train_sampler, test_sampler;
  data::DataLoader train_loader, test_loader;
};

// --model with --dropout: the mlp gets Dropout after each hidden ReLU, the cnn its own rate.
std::shared_ptr<nn::Module> make_model(const Flags& f) {
  if (f.dropout < 0) return examples::make_model(f.model_name);
  MG_CHECK(f.dropout < 1, "--dropout must be in [0, 1), got ", f.dropout);
  if (f.model_name == "cnn") {
    nn::FashionCNNOptions options;
    options.dropout = f.dropout;
    return std::make_shared<nn::FashionCNN>(options);
  }
  MG_CHECK(f.model_name == "mlp", "--model must be mlp or cnn, got '", f.model_name, "'");
  auto mlp = std::make_shared<nn::Sequential>();  // nn::MLP's layers, with dropout
  mlp->emplace_back<nn::Flatten>();
  int64_t in = 784;
  for (int64_t hidden : {256, 128}) {
    mlp->emplace_back<nn::Linear>(in, hidden);
    mlp->emplace_back<nn::ReLU>();
    mlp->emplace_back<nn::Dropout>(f.dropout);
    in = hidden;
  }
  mlp->emplace_back<nn::Linear>(in, 10);
  return mlp;
}

// --checkpoint-dir with {rank} and {node} replaced.
std::string checkpoint_dir(const Flags& f, const parallel::ProcessGroup& pg) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::string dir = f.checkpoint_dir;
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"{rank}", std::to_string(pg.rank())},
                                   {"{node}", std::string(host)}})
    for (size_t at = dir.find(key); at != std::string::npos; at = dir.find(key, at + value.size()))
      dir.replace(at, key.size(), value);
  return dir;
}

// How DDP averages gradients: buckets of --bucket-cap-mb, all-reduced as backward fills them.
parallel::DDPOptions ddp_options(const Flags& f) {
  parallel::DDPOptions options;
  options.bucket_cap_mb = f.bucket_cap_mb;
  options.algo = f.algo == "ring" ? parallel::AllreduceAlgo::Ring : parallel::AllreduceAlgo::Native;
  options.check_replicas_every = f.check_replicas_every;
  return options;
}

// --comm-hook: how each gradient bucket is averaged (plain, half precision, or PowerSGD).
void register_comm_hook(const Flags& f, parallel::DistributedDataParallel& ddp,
                        const parallel::ProcessGroup& pg) {
  MG_CHECK(
      f.comm_hook == "none" || f.comm_hook == "fp16" || f.comm_hook == "bf16" || f.comm_hook == "powersgd",
      "--comm-hook must be none, fp16, bf16 or powersgd, got '", f.comm_hook, "'");
  auto group = std::make_shared<parallel::ProcessGroup>(pg);
  if (f.comm_hook == "fp16") ddp.register_comm_hook(group, parallel::fp16_compress_hook);
  if (f.comm_hook == "bf16") ddp.register_comm_hook(group, parallel::bf16_compress_hook);
  if (f.comm_hook == "powersgd") {
    parallel::PowerSGDOptions options;
    options.matrix_approximation_rank = f.powersgd_rank;
    options.start_powerSGD_iter = f.powersgd_start;
    ddp.register_comm_hook(std::make_shared<parallel::PowerSGDState>(pg, options), parallel::powersgd_hook);
  }
}

// AdamW, either replicated (every rank holds all of its state) or, with --zero, ZeRO-1: each
// rank keeps the AdamW state of its shard of the parameters only, and the step all-gathers.
class AdamWOrZero {
 public:
  AdamWOrZero(const Flags& f, parallel::DistributedDataParallel& ddp, const parallel::ProcessGroup& pg) {
    optim::AdamWOptions adamw;
    adamw.lr = f.lr;
    adamw.weight_decay = f.weight_decay;
    if (!f.zero_shard) {
      replicated_ = std::make_unique<optim::AdamW>(ddp.parameters(), adamw);
      return;
    }
    if (f.zero_partition != "parameters" && f.zero_partition != "flat")
      throw Error("--zero-partition must be parameters or flat, got '" + f.zero_partition + "'");
    parallel::ZeroOptions zero_options;
    zero_options.partition =
        f.zero_partition == "flat" ? parallel::ZeroPartition::Flat : parallel::ZeroPartition::Parameters;
    zero_ = std::make_unique<parallel::ZeroRedundancyOptimizer>(
        ddp.parameters(), pg,
        [adamw](std::vector<Tensor> shard) { return std::make_unique<optim::AdamW>(shard, adamw); },
        zero_options);
  }

  // ZeRO's zero_grad clears every parameter's gradient, not only its shard's.
  void zero_grad() { zero_ ? zero_->zero_grad() : replicated_->zero_grad(); }
  void step() { zero_ ? zero_->step() : replicated_->step(); }
  // The optimizer that holds the hyperparameters (what the LR schedule drives).
  optim::Optimizer& local() { return zero_ ? zero_->local_optimizer() : *replicated_; }
  // What a checkpoint saves: the plain optimizer, or ZeRO's state consolidated on rank 0.
  void add_to(parallel::TrainingState& state) {
    state.optimizer = zero_ ? nullptr : &local();
    state.zero = zero_.get();
  }
  bool sharded() const { return zero_ != nullptr; }
  // Bytes of optimizer state this rank holds: all of AdamW's moments, or (--zero) its shard's.
  int64_t state_bytes() const {
    if (zero_) return zero_->state_bytes();
    int64_t bytes = 0;
    for (int64_t i = 0; i < replicated_->num_params(); ++i)
      for (const auto& [name, t] : replicated_->state(i)) bytes += static_cast<int64_t>(t.nbytes());
    return bytes;
  }

 private:
  std::unique_ptr<optim::AdamW> replicated_;
  std::unique_ptr<parallel::ZeroRedundancyOptimizer> zero_;
};

// ---- One step, and evaluation ----------------------------------------------------------------

// Forward (bf16 autocast if asked), loss, backward -- during which DDP all-reduces each gradient
// bucket as soon as it is full, overlapping communication with the rest of backward -- then the
// optimizer and LR schedule step. Returns the loss (this rank's batch).
double train_step(parallel::DistributedDataParallel& ddp, AdamWOrZero& opt, optim::LRScheduler& schedule,
                  const Tensor& x, const Tensor& y, Device device, bool bf16, double input_noise) {
  Tensor input = x.to(device);
  if (input_noise > 0)
    input = input + randn(input.shape(), TensorOptions{input.dtype(), device}) * input_noise;
  Tensor loss;
  {
    AutocastGuard autocast(DType::bf16, bf16);
    loss = cross_entropy(ddp(input), y.to(device));
  }
  opt.zero_grad();
  loss.backward();
  opt.step();
  schedule.step();
  return loss.item<double>();
}

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
  MG_CHECK(total.count == loader.dataset().size(), "evaluate: counted ", total.count,
           " test samples, the test set has ", loader.dataset().size());
  return total.mean();
}

// ---- Fault tolerance -------------------------------------------------------------------------

// Step checkpoints in --checkpoint-dir: model, optimizer (consolidated with --zero), schedule,
// every rank's RNG and the sampler's global position. The files are the same with and without
// --zero, so a run may switch between the two, or change its world size. Without
// --checkpoint-dir every call does nothing.
class Checkpoints {
 public:
  Checkpoints(const Flags& f, const parallel::ProcessGroup& pg, const parallel::TrainingState& state)
      : flags_(f), pg_(pg), state_(state) {
    if (f.checkpoint_dir.empty()) return;
    parallel::CheckpointManagerOptions options;
    options.every_steps = f.checkpoint_every;
    options.keep_last = f.keep_checkpoints;
    manager_ = std::make_unique<parallel::CheckpointManager>(pg, checkpoint_dir(f, pg), options);
  }

  // --resume: loads the newest valid checkpoint and moves the sampler to its exact sample (at
  // this run's world size); the start when there is none.
  parallel::TrainingPosition resume(data::DistributedSampler& sampler) {
    if (!manager_ || !flags_.resume) return {};
    auto resumed = manager_->load_latest(state_);
    if (!resumed) return {};
    const parallel::TrainingPosition& position = resumed->position;
    sampler.set_start_sample(position.epoch, position.samples_into_epoch);
    if (pg_.is_main())
      std::printf("resumed from %s: step %lld, epoch %lld after %lld samples, saved by %d rank(s), now %d\n",
                  resumed->dir.c_str(), static_cast<long long>(position.step),
                  static_cast<long long>(position.epoch) + 1,
                  static_cast<long long>(position.samples_into_epoch), resumed->world_size, pg_.size());
    return position;
  }

  // After every step, on every rank: saves when due or once SIGTERM reached any rank
  // (preempted() is a collective, so all ranks agree). True: saved, stop now.
  bool after_step(const parallel::TrainingPosition& position) {
    const bool stop = manager_ && manager_->preempted();
    if (!manager_ || !(stop || manager_->due(position.step))) return false;
    manager_->save(state_, position);
    if (!stop) return false;
    manager_->wait();
    if (pg_.is_main())
      std::printf("\nSIGTERM: saved step %lld to %s and stopped\n", static_cast<long long>(position.step),
                  manager_->dir().c_str());
    return true;
  }

  void at_epoch_end(const parallel::TrainingPosition& position) {
    if (manager_) manager_->save(state_, position);
  }
  // Rank 0's background write has finished (a failed write throws on every rank).
  void wait() {
    if (manager_) manager_->wait();
  }

 private:
  const Flags& flags_;
  const parallel::ProcessGroup& pg_;
  parallel::TrainingState state_;
  std::unique_ptr<parallel::CheckpointManager> manager_;
};

// ---- The training loop -----------------------------------------------------------------------

// What the loop works on; run() owns all of it.
struct Job {
  const Flags& flags;
  parallel::ProcessGroup& pg;
  ShardedData& data;
  nn::Module& model;
  parallel::DistributedDataParallel& ddp;
  AdamWOrZero& opt;
  optim::LRScheduler& schedule;
  Checkpoints& checkpoints;
  int64_t steps_per_epoch;
  bool bf16;
};

struct EpochLoss {
  double sum = 0;
  int64_t batches = 0;
};

// The rest of one epoch from `position` (mid-epoch after --resume). --limit-train caps each
// epoch in samples (batches of this run's global batch), so a resume at another world size
// stops at the same place. False: SIGTERM stopped the run (the step is saved).
bool train_epoch(Job& job, int epoch, Clock::time_point epoch_start, parallel::TrainingPosition& position,
                 EpochLoss& loss) {
  const Flags& f = job.flags;
  const bool main_rank = job.pg.is_main();
  const int64_t global_batch = f.batch_size * job.pg.size();
  const int64_t samples_cap = f.limit_train > 0 ? f.limit_train * global_batch : INT64_MAX;
  for (auto& [x, y] : job.data.train_loader) {
    if (position.samples_into_epoch + global_batch > samples_cap) break;
    const double loss_value =
        train_step(job.ddp, job.opt, job.schedule, x, y, job.pg.device(), job.bf16, f.input_noise);
    ++position.step;
    parallel::note_step(position.step);  // the heartbeat's stall bound adapts to the step time
    position.samples_into_epoch += global_batch;
    ++loss.batches;
    loss.sum += loss_value;
    if (f.log_steps && main_rank)
      std::printf("step %lld loss %.6f\n", static_cast<long long>(position.step), loss_value);
    if (main_rank && !f.log_steps)
      examples::print_progress(
          epoch + 1, loss.batches, job.steps_per_epoch, loss.sum,
          static_cast<double>(loss.batches * f.batch_size * job.pg.size()) / seconds_since(epoch_start),
          " (rank 0; samples/s of all ranks)");
    if (job.checkpoints.after_step(position)) return false;
  }
  return true;
}

// The optimizer state each rank holds (gathered, printed by rank 0): ZeRO-1 shows 1/N per rank.
void print_optimizer_state(parallel::ProcessGroup& pg, const AdamWOrZero& opt) {
  Tensor state_bytes = zeros({pg.size()}, TensorOptions{DType::f64});
  pg.allgather(state_bytes, full({1}, static_cast<double>(opt.state_bytes()), TensorOptions{DType::f64}))
      ->wait();
  std::string per_rank;
  for (double b : state_bytes.to_vector<double>())
    per_rank += str_cat(per_rank.empty() ? "" : " / ", b / 1e6);
  if (pg.is_main())
    std::printf("optimizer state per rank (MB): %s%s\n", per_rank.c_str(),
                opt.sharded() ? " (ZeRO-1: sharded)" : " (replicated)");
}

// Epochs from `position` on: train, evaluate on all ranks, checkpoint at the epoch's end.
// Each epoch reshuffles (set_epoch: the same new order on every rank).
void train(Job& job, parallel::TrainingPosition position) {
  const Flags& f = job.flags;
  const bool main_rank = job.pg.is_main();
  const auto run_start = Clock::now();
  double accuracy = 0;
  for (int epoch = static_cast<int>(position.epoch); epoch < f.epochs; ++epoch) {
    job.data.train_sampler.set_epoch(epoch);
    job.ddp.reset_stats();
    const auto epoch_start = Clock::now();
    EpochLoss loss;
    if (!train_epoch(job, epoch, epoch_start, position, loss)) return;  // SIGTERM: saved, exit 0
    accuracy =
        evaluate(job.model, job.pg, job.data.test_loader, job.data.test_sampler, job.pg.device(), job.bf16);
    const auto& stats = job.ddp.stats();
    if (main_rank)
      std::printf(
          "\nepoch %d: train loss %.4f (rank 0), test accuracy %.4f, %.1f s; all-reduce %.0f ms busy, %.0f "
          "ms exposed, %lld bytes/step\n",
          epoch + 1, loss.sum / static_cast<double>(std::max<int64_t>(loss.batches, 1)), accuracy,
          seconds_since(epoch_start), stats.comm_ms, stats.exposed_ms,
          static_cast<long long>(stats.bytes / std::max<int64_t>(stats.backward_passes, 1)));
    position.epoch = epoch + 1;
    position.samples_into_epoch = 0;
    job.checkpoints.at_epoch_end(position);
  }
  job.checkpoints.wait();
  print_optimizer_state(job.pg, job.opt);
  if (main_rank)
    std::printf("final: model %s, %d ranks, test accuracy %.4f, wall time %.1f s\n", f.model_name.c_str(),
                job.pg.size(), accuracy, seconds_since(run_start));
}

// The numeric flags' ranges, checked before anything starts (each error names its flag): --epochs 0
// used to fail in the scheduler naming no flag, --limit-train -3 and --check-replicas-every -1
// were accepted, --workers 100000 failed after 18 s of thread creation, --bucket-cap-mb inf was
// an undefined cast.
void check_flags(const Flags& f) {
  MG_CHECK(f.epochs >= 1 && f.epochs <= 1000000, "--epochs must be from 1 to 1000000, got ", f.epochs);
  MG_CHECK(f.batch_size >= 1 && f.batch_size <= 1000000, "--batch-size must be from 1 to 1000000, got ",
           f.batch_size);
  MG_CHECK(f.workers >= 0 && f.workers <= 256, "--workers must be from 0 to 256, got ", f.workers);
  MG_CHECK(f.limit_train >= 0, "--limit-train must be >= 0 (0 = all), got ", f.limit_train);
  MG_CHECK(f.train_subset >= 0, "--train-subset must be >= 0 (0 = all), got ", f.train_subset);
  MG_CHECK(f.check_replicas_every >= 0, "--check-replicas-every must be >= 0 (0 = never), got ",
           f.check_replicas_every);
  MG_CHECK(f.checkpoint_every >= 0, "--checkpoint-every must be >= 0 (0 = only at epoch ends), got ",
           f.checkpoint_every);
  MG_CHECK(f.keep_checkpoints >= 1, "--keep-checkpoints must be >= 1, got ", f.keep_checkpoints);
  MG_CHECK(std::isfinite(f.bucket_cap_mb) && f.bucket_cap_mb > 0 && f.bucket_cap_mb <= 1048576,
           "--bucket-cap-mb must be a finite number of MB in (0, 1048576], got ", f.bucket_cap_mb);
  MG_CHECK(std::isfinite(f.lr) && f.lr >= 0, "--lr must be a finite number >= 0, got ", f.lr);
  MG_CHECK(std::isfinite(f.weight_decay) && f.weight_decay >= 0,
           "--weight-decay must be a finite number >= 0, got ", f.weight_decay);
  MG_CHECK(std::isfinite(f.input_noise) && f.input_noise >= 0,
           "--input-noise must be a finite number >= 0, got ", f.input_noise);
  MG_CHECK(f.powersgd_rank >= 1, "--powersgd-rank must be >= 1, got ", f.powersgd_rank);
  MG_CHECK(f.powersgd_start >= 0, "--powersgd-start must be >= 0, got ", f.powersgd_start);
}

// Builds everything in the order the random draws depend on, then trains.
void run(const Flags& f) {
  check_flags(f);
  MG_CHECK(f.precision == "f32" || f.precision == "bf16", "--precision must be f32 or bf16, got '",
           f.precision, "'");
  MG_CHECK(f.algo == "native" || f.algo == "ring", "--algo must be native or ring, got '", f.algo, "'");
  parallel::ProcessGroup pg = init_process_group(f);
  ShardedData data(f, pg);

  manual_seed(f.seed);  // identical initialisation on every rank...
  std::shared_ptr<nn::Module> model = make_model(f);
  model->to(pg.device());
  parallel::DistributedDataParallel ddp(*model, pg, ddp_options(f));  // ...verified and broadcast
  manual_seed(parallel::seed_for_rank(f.seed, pg.rank()));            // ...while dropout differs per rank
  register_comm_hook(f, ddp, pg);
  AdamWOrZero opt(f, ddp, pg);
  const int64_t steps_per_epoch =
      f.limit_train > 0 ? std::min(f.limit_train, data.train_loader.size()) : data.train_loader.size();
  optim::CosineAnnealingLROptions cosine;
  cosine.t_max = f.epochs * steps_per_epoch;
  optim::CosineAnnealingLR schedule(opt.local(), cosine);

  parallel::TrainingState state;
  state.module = model.get();
  opt.add_to(state);
  state.scheduler = &schedule;
  Checkpoints checkpoints(f, pg, state);
  const parallel::TrainingPosition position = checkpoints.resume(data.train_sampler);

  if (pg.is_main())
    std::printf(
        "multigrad DDP Fashion-MNIST: model %s (%lld parameters), %d ranks (%s launcher), device %s per "
        "rank, "
        "%s, batch %lld per rank = %lld global, %d epochs, AdamW lr %g, all-reduce %s, buckets %g MB\n",
        f.model_name.c_str(), static_cast<long long>(model->num_parameters()), pg.size(),
        pg.launch().launcher.c_str(), pg.device().str().c_str(), f.precision.c_str(),
        static_cast<long long>(f.batch_size), static_cast<long long>(f.batch_size * pg.size()), f.epochs,
        f.lr, f.algo.c_str(), f.bucket_cap_mb);
  Job job{f, pg, data, *model, ddp, opt, schedule, checkpoints, steps_per_epoch, f.precision == "bf16"};
  train(job, position);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train on Fashion-MNIST with DistributedDataParallel (launch with mpirun -np N)"};
  Flags flags;
  add_flags(app, flags);
  CLI11_PARSE(app, argc, argv);
  try {
    run(flags);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_ddp: %s\n", e.what());
    return 1;
  }
}
