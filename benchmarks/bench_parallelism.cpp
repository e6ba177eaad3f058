// bench_parallelism: one model, one global batch, one optimizer, every strategy multigrad has.
//
//   mpirun -np N build/benchmarks/bench_parallelism [--layers 4] [--embd 128] [--heads 4]
//          [--seq 64] [--global-batch 16] [--micro-batches 4] [--steps 10] [--json FILE]
//          [--memory-cap-mb X]   (marks the strategies whose fullest rank needs more than X MB)
//
//   single     one device, the whole batch (rank 0 alone: the baseline of every ratio)
//   dp         DataParallel over N logical devices in rank 0's process
//   ddp        DistributedDataParallel over the N ranks
//   ddp+zero1  the same, AdamW's state sharded (ZeroRedundancyOptimizer, flat partition)
//   zero2      no DDP: gradients reduce-scattered bucket by bucket in backward (ZeRO stage 2)
//   fsdp       FullyShardedDataParallel, one unit per transformer block (ZeRO stage 3)
//   fsdp+ac    the same with every block's activations recomputed in backward (checkpointing)
//   tp         TensorParallelGPT: every block's heads and MLP features split over the N ranks
//   pp-gpipe   the GPT cut into N pipeline stages, m micro-batches, GPipe
//   pp-1f1b    the same, one-forward-one-backward
//   pp-zbh1    the same, zero-bubble ZB-H1 (1F1B's messages; each backward split into B and W)
//   dp2xtp2..  DDP over N/2 data groups x tensor parallelism over pairs (N >= 4, even)
//   cp-ring    ContextParallelGPT: every sequence split over the N ranks (zigzag), ring attention
//   cp-ulysses the same split, Ulysses' all-to-alls (N dividing the heads)
//   cp-ring+fsdp  cp-ring with FSDP (a unit per block) over the N ranks in place of DDP
//
// Per strategy: samples/s and its ratio to single, each rank's memory (parameters, gradients,
// optimizer state, and the rest of the step's peak: activations and temporaries), the bytes each
// rank moves per step next to the strategy's formula, the pipeline bubble, and the largest
// difference of the loss curve from single's (every strategy computes the same mathematics, so the
// curves must agree to rounding). For the data-parallel family (single, ddp, ddp+zero1, zero2, fsdp,
// fsdp+ac) the parameters, gradients and optimizer state per rank are also checked against the
// ZeRO paper's formulas written for what multigrad keeps in f32 training (4 + 4 + 8 bytes per
// parameter: DDP 4+4+8, ZeRO-1 4+4+8/N, ZeRO-2 4+(4+8)/N, ZeRO-3 (4+4+8)/N plus the gathered
// units in flight): a difference beyond the shards' padding exits 4 too.
//
// The bytes moved are counted where they are asked for, then checked against a formula worked
// out here from the model's parameter and activation sizes alone:
//   - the ProcessGroup strategies: ProcessGroup::requested_traffic(), which every collective and
//     send adds its tensor's bytes to, call by call (as the ring algorithm would send them: a
//     figure per call, not bytes measured on a link -- tests/parallel/multinode/ measures those);
//   - dp: cross_device_copy_bytes(), what Tensor::to / copy_ really copied between the devices.
// A count off its formula means a collective too many or too few, a tensor sent twice or
// missed: exit 4. A loss curve off single's: exit 3. Dropout is 0 (its masks
// would differ between strategies). On a machine without GPUs every rank is one CPU core: the
// binary re-executes itself once with one BLAS/OpenMP thread; the ranks that wait while rank 0
// runs single and dp wait in a sleeping receive, so DataParallel has the cores to itself.
#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)
#include <CLI/CLI.hpp>
#endif

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/clock.h"
#include "bench_common.h"
#include "bench_parallelism.h"
#include "core/allocator.h"
#include "multigrad.h"

#ifdef MG_HAS_MPI
#include <mpi.h>
#endif

#if !defined(MG_HAS_CLI11) || !defined(MG_HAS_NLOHMANN_JSON)
int main() {
  std::printf(
      "bench_parallelism needs CLI11 and nlohmann-json (apt-get install libcli11-dev nlohmann-json3-dev)\n");
  return 77;
}
#else

using namespace mg;
using namespace mg::parallel;
using namespace mg::bench_parallelism;
using Clock = std::chrono::steady_clock;

namespace {

double allreduce_value(ProcessGroup& pg, double v, ReduceOp op = ReduceOp::Sum) {
  Tensor t = full({1}, v, TensorOptions{DType::f64});
  pg.allreduce(t, op)->wait();
  return t.item<double>();
}

// Rank 0 tells the waiting ranks it is done. They wait polling MPI every millisecond, directly:
// a ProcessGroup receive polls every 20 us (its latency matters) and a spinning MPI barrier
// would take a core, either of them stolen from DataParallel's threads in rank 0.
void release_waiting_ranks(ProcessGroup& pg) {
#ifdef MG_HAS_MPI
  int mpi_up = 0;
  MPI_Initialized(&mpi_up);
  if (mpi_up && pg.size() > 1) {
    int token = 0;
    if (pg.rank() == 0) {
      for (int r = 1; r < pg.size(); ++r) MPI_Send(&token, 1, MPI_INT, r, 7707, MPI_COMM_WORLD);
    } else {
      MPI_Request request;
      MPI_Irecv(&token, 1, MPI_INT, 0, 7707, MPI_COMM_WORLD, &request);
      for (int done = 0; !done;) {
        MPI_Test(&request, &done, MPI_STATUS_IGNORE);
        if (!done) usleep(1000);
      }
    }
    return;
  }
#endif
  pg.barrier()->wait();
}

// What one rank measured of one strategy.
struct Measured {
  std::vector<double> step_ms, losses;
  double bytes = 0, calls = 0, bubble = 0;
  int64_t rise[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // per logical device: the largest step's rise
};

// One step of `s` on this rank (or, for a rank-0 strategy on another rank, the wait for it).
void measure_step(ProcessGroup& world, const Config& c, Strategy& s, int step, Measured& m) {
  const bool active = !s.on_rank0_only || world.rank() == 0;
  if (active) {
    if (!s.on_rank0_only) world.barrier()->wait();  // steps start together
    int64_t start[8];
    for (int d = 0; d < 8; ++d) {
      reset_cpu_device_peak(d);
      start[d] = cpu_device_memory(d).live_bytes;
    }
    const std::pair<double, double> moved_before = s.moved();
    const auto t0 = Clock::now();
    auto [loss_share, step_bubble] = s.step(step);
    const double ms = ms_since(t0);
    if (step >= c.warmup) {
      m.step_ms.push_back(ms);
      m.losses.push_back(loss_share);
      m.bubble += step_bubble / c.steps;
      const std::pair<double, double> moved_after = s.moved();
      m.bytes += (moved_after.first - moved_before.first) / c.steps;
      m.calls += (moved_after.second - moved_before.second) / c.steps;
      for (int d = 0; d < 8; ++d) m.rise[d] = std::max(m.rise[d], cpu_device_memory(d).peak_bytes - start[d]);
    }
  }
  if (s.on_rank0_only) release_waiting_ranks(world);
}

// Rank 0's row for `s` from every rank's measurements (a collective).
Row summarise(ProcessGroup& world, const Config& c, Strategy& s, Measured& m) {
  Row row;
  row.name = s.name;
  row.note = s.note;
  const bool active = !s.on_rank0_only || world.rank() == 0;
  // The slowest rank's time is the step's; losses summed over the ranks' shares.
  m.losses.resize(static_cast<size_t>(c.steps), 0.0);
  m.step_ms.resize(static_cast<size_t>(c.steps), 0.0);
  std::vector<double> step_ms(m.step_ms.size());
  for (size_t i = 0; i < step_ms.size(); ++i) {
    step_ms[i] = allreduce_value(world, m.step_ms[i], ReduceOp::Max);
    row.losses.push_back(allreduce_value(world, m.losses[i]));
  }
  row.step_ms = bench::median(step_ms);
  row.samples_per_s = static_cast<double>(c.global_batch) / (row.step_ms / 1000.0);
  const double ranks = s.on_rank0_only ? 1.0 : world.size();
  row.counted_bytes = allreduce_value(world, m.bytes) / ranks;
  row.counted_calls = allreduce_value(world, m.calls) / ranks;
  // (+ 1e-9 of the formula: the per-step means are sums of doubles)
  row.slack_bytes = s.slack_per_call * row.counted_calls + 1e-9 * s.predicted_bytes;
  row.bubble = allreduce_value(world, m.bubble) / ranks;
  row.predicted_bytes = s.predicted_bytes;
  row.memory_formula = s.memory_formula;
  row.gathered_peak = allreduce_value(world, s.gathered_peak ? s.gathered_peak() : 0.0, ReduceOp::Max);
  // Every rank's memory entries, gathered in rank order: 8 slots of (used, params, grads,
  // optimizer, rest) per rank.
  std::vector<Memory> mine = active ? s.memory() : std::vector<Memory>{};
  std::vector<double> slots(40, 0.0);
  for (size_t k = 0; k < mine.size() && k < 8; ++k) {
    const Memory& e = mine[k];
    const double v[5] = {1.0, static_cast<double>(e.params), static_cast<double>(e.grads),
                         static_cast<double>(e.optimizer),
                         static_cast<double>(m.rise[e.device & 7] + e.buffers)};
    std::copy(v, v + 5, slots.begin() + static_cast<std::ptrdiff_t>(5 * k));
  }
  Tensor all = zeros({world.size() * 40}, TensorOptions{DType::f64});
  world.allgather(all, tensor<double>(slots, Shape{40}, TensorOptions{DType::f64}))->wait();
  const std::vector<double> v = all.to_vector<double>();
  for (size_t e = 0; e < v.size(); e += 5) {
    if (v[e] == 0.0) continue;  // an unused slot
    Memory mem;
    mem.params = static_cast<int64_t>(v[e + 1]);
    mem.grads = static_cast<int64_t>(v[e + 2]);
    mem.optimizer = static_cast<int64_t>(v[e + 3]);
    mem.rest = static_cast<int64_t>(v[e + 4]);
    row.memory.push_back(mem);
  }
  return row;
}

// Every strategy's steps interleaved -- step i of each, in an order reversed every other step --
// so the machine's drift and noise fall on all of them alike.
std::vector<Row> measure(ProcessGroup& world, const Config& c, std::vector<Strategy>& strategies) {
  std::vector<Measured> measured(strategies.size());
  for (int step = 0; step < c.warmup + c.steps; ++step) {
    for (size_t k = 0; k < strategies.size(); ++k) {
      const size_t j = step % 2 == 0 ? k : strategies.size() - 1 - k;
      measure_step(world, c, strategies[j], step, measured[j]);
    }
  }
  std::vector<Row> rows;
  for (size_t j = 0; j < strategies.size(); ++j)
    rows.push_back(summarise(world, c, strategies[j], measured[j]));
  return rows;
}

// ---- the strategies ----------------------------------------------------------------------------
// Each keeps its model and optimizer alive in the closures (shared_ptr), for the memory report.

Strategy single_device(const Config& c) {
  auto gpt = std::shared_ptr<nn::TinyGPT>(fresh_gpt(c));
  std::shared_ptr<optim::Optimizer> opt = adamw(gpt->parameters());
  Strategy s;
  s.name = "single";
  s.note = "1 device, the whole batch";
  s.on_rank0_only = true;
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    opt->zero_grad();
    Tensor loss = lm_loss((*gpt)(x), y);
    loss.backward();
    opt->step();
    return std::make_pair(loss.item<double>(), 0.0);
  };
  s.memory = [=] {
    return std::vector<Memory>{memory_of(gpt->parameters(), optimizer_state_bytes(*opt), 0)};
  };
  s.memory_formula = zero_memory(0, static_cast<double>(tensor_bytes(gpt->parameters(), false)), 1, *gpt);
  return s;
}

Strategy data_parallel(const Config& c, int n, double param_bytes) {
  auto gpt = std::shared_ptr<nn::TinyGPT>(fresh_gpt(c));
  std::vector<Device> devices;
  for (int d = 0; d < n; ++d) devices.push_back(Device::cpu(d));
  auto dp = std::make_shared<DataParallel>(*gpt, devices);
  std::shared_ptr<optim::Optimizer> opt = adamw(gpt->parameters());
  Strategy s;
  s.name = "dp";
  s.note = str_cat(n, " devices, 1 process");
  s.on_rank0_only = true;
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    opt->zero_grad();
    Tensor loss = lm_loss((*dp)(x), y);
    loss.backward();
    opt->step();
    return std::make_pair(loss.item<double>(), 0.0);
  };
  s.memory = [=] {
    std::vector<Memory> m{memory_of(gpt->parameters(), optimizer_state_bytes(*opt), 0)};
    for (int d = 1; d < n; ++d) m.push_back(memory_of({}, 0, d));  // replicas live only during the step
    return m;
  };
  // Device copies, not a ProcessGroup, counted by Tensor::copy_ (cross_device_copy_bytes()).
  // Per step: the parameters (and buffers) replicated from device 0 to the N - 1 others and their
  // gradients reduce-added back; the tokens (int64) scattered, the logits (f32) gathered onto
  // device 0 and their gradient scattered back by the gather's backward, (N-1)/N of each moving.
  // The mean over the N devices, like the per-rank figures of the other strategies.
  int64_t buffer_bytes = 0;
  for (const Tensor& b : gpt->buffers()) buffer_bytes += static_cast<int64_t>(b.nbytes());
  const double tokens = static_cast<double>(c.global_batch * c.seq);
  const double io = tokens * 8.0 + 2.0 * tokens * static_cast<double>(c.vocab) * 4.0;
  s.predicted_bytes =
      ((n - 1.0) * (2.0 * param_bytes + static_cast<double>(buffer_bytes)) + (n - 1.0) / n * io) / n;
  s.moved = [n] { return std::make_pair(static_cast<double>(cross_device_copy_bytes()) / n, 0.0); };
  s.slack_per_call = 0;  // bytes copied are exact
  return s;
}

Strategy ddp(const Config& c, ProcessGroup& pg, double param_bytes, bool zero) {
  auto gpt = std::shared_ptr<nn::TinyGPT>(fresh_gpt(c));
  auto model = std::make_shared<DistributedDataParallel>(*gpt, pg);
  const int n = pg.size(), r = pg.rank();
  const int64_t per_rank = c.global_batch / n;
  Strategy s;
  s.name = zero ? "ddp+zero1" : "ddp";
  s.note = zero ? "AdamW state sharded (flat)" : "bucketed all-reduce";
  s.groups = {pg};
  const double share = (n - 1.0) / n;
  s.predicted_bytes = 2 * share * param_bytes + (zero ? share * param_bytes : 0.0);
  if (zero) s.slack_per_call = 0.5 + 4.0 * n;  // the flat shards are padded to N equal parts
  s.memory_formula = zero_memory(zero ? 1 : 0, param_bytes, n, *gpt);
  std::shared_ptr<optim::Optimizer> opt;
  std::shared_ptr<parallel::ZeroRedundancyOptimizer> zero_opt;
  if (zero) {
    parallel::ZeroOptions options;
    options.partition = parallel::ZeroPartition::Flat;
    zero_opt = std::make_shared<parallel::ZeroRedundancyOptimizer>(
        model->parameters(), pg, [](std::vector<Tensor> shard) { return adamw(std::move(shard)); }, options);
  } else {
    opt = adamw(model->parameters());
  }
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    if (zero_opt)
      zero_opt->zero_grad();
    else
      opt->zero_grad();
    Tensor loss = lm_loss((*model)(x.narrow(0, r * per_rank, per_rank)), y.narrow(0, r * per_rank, per_rank));
    loss.backward();
    if (zero_opt)
      zero_opt->step();
    else
      opt->step();
    return std::make_pair(loss.item<double>() / n, 0.0);
  };
  s.memory = [=] {
    const int64_t state = zero_opt ? zero_opt->state_bytes() : optimizer_state_bytes(*opt);
    Memory m = memory_of(gpt->parameters(), state, 0);
    m.buffers = model->bucket_bytes();
    return std::vector<Memory>{m};
  };
  return s;
}

// ZeRO-2 without DDP: each gradient bucket reduce-scattered during backward into the rank's shard,
// AdamW on the shard, parameters all-gathered after the step (parallel/zero/zero2.h).
Strategy zero2(const Config& c, ProcessGroup& pg, double param_bytes) {
  auto gpt = std::shared_ptr<nn::TinyGPT>(fresh_gpt(c));
  const int n = pg.size(), r = pg.rank();
  const int64_t per_rank = c.global_batch / n;
  parallel::ZeroOptions options;
  options.stage = parallel::ZeroStage::Gradients;
  auto opt = std::make_shared<parallel::ZeroRedundancyOptimizer>(
      gpt->parameters(), pg, [](std::vector<Tensor> shard) { return adamw(std::move(shard)); }, options);
  Strategy s;
  s.name = "zero2";
  s.note = "grads reduce-scattered in backward";
  s.groups = {pg};
  // A reduce-scatter of the gradients and an all-gather of the parameters: (N-1)/N P each, the
  // same total as DDP's all-reduce. Each bucket is padded to a multiple of N elements.
  const double share = (n - 1.0) / n;
  s.predicted_bytes = 2 * share * param_bytes;
  s.slack_per_call = 0.5 + 4.0 * n;
  s.memory_formula = zero_memory(2, param_bytes, n, *gpt);
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    opt->zero_grad();
    Tensor loss = lm_loss((*gpt)(x.narrow(0, r * per_rank, per_rank)), y.narrow(0, r * per_rank, per_rank));
    loss.backward();
    opt->step();
    return std::make_pair(loss.item<double>() / n, 0.0);
  };
  s.memory = [=] {
    Memory m = memory_of(gpt->parameters(), opt->state_bytes(), 0);
    m.grads += static_cast<int64_t>(opt->gradient_reducer()->grad_shard().nbytes());  // .grad is freed
    return std::vector<Memory>{m};
  };
  return s;
}

// FullyShardedDataParallel (ZeRO-3), one unit per TransformerBlock; the root unit holds the
// embeddings, the last LayerNorm and the LM head (`root_bytes`). With `checkpoint`, every block's
// activations are recomputed in backward (GPTConfig::checkpoint_activations), the unit gathered
// again for the recompute.
Strategy fsdp(const Config& c, ProcessGroup& pg, double param_bytes, double root_bytes, bool checkpoint) {
  // The FSDP object refers to the model (its hooks): destroyed first, members in reverse order.
  struct Run {
    std::unique_ptr<nn::TinyGPT> gpt;
    std::unique_ptr<FullyShardedDataParallel> sharded;
    std::unique_ptr<optim::Optimizer> opt;
  };
  auto run = std::make_shared<Run>();
  run->gpt = fresh_gpt(c, checkpoint);
  FSDPOptions options;
  options.auto_wrap = AutoWrapPolicy::module_types_of({"TransformerBlock"});
  run->sharded = std::make_unique<FullyShardedDataParallel>(*run->gpt, pg, options);
  run->opt = adamw(run->sharded->parameters());
  const int n = pg.size(), r = pg.rank();
  const int64_t per_rank = c.global_batch / n;
  Strategy s;
  s.name = checkpoint ? "fsdp+ac" : "fsdp";
  s.note = checkpoint ? "ZeRO-3 + activation checkpointing" : "ZeRO-3, a unit per block";
  s.groups = {pg};
  // Every block unit is all-gathered for its forward, again for its backward, and its gradient
  // reduce-scattered: 3 (N-1)/N of its bytes, against DDP's 2. The root unit stays gathered from
  // its forward through its backward: gathered once, 2 (N-1)/N. Units are padded to N elements.
  const double share = (n - 1.0) / n;
  s.predicted_bytes = share * (3.0 * param_bytes - root_bytes);
  s.slack_per_call = 0.5 + 4.0 * n;
  s.memory_formula = zero_memory(3, param_bytes, n, *run->gpt);
  // In flight at once: the root (gathered all step) and two blocks -- the one computing and the
  // one prefetched -- each padded to a multiple of N elements.
  const double block_bytes = (param_bytes - root_bytes) / static_cast<double>(c.layers);
  s.memory_formula->gathered = root_bytes + 2.0 * block_bytes + 3.0 * 4.0 * n;
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    run->opt->zero_grad();
    Tensor loss =
        lm_loss((*run->sharded)(x.narrow(0, r * per_rank, per_rank)), y.narrow(0, r * per_rank, per_rank));
    loss.backward();
    run->opt->step();
    return std::make_pair(loss.item<double>() / n, 0.0);
  };
  s.memory = [=] {
    return std::vector<Memory>{memory_of(run->sharded->parameters(), optimizer_state_bytes(*run->opt), 0)};
  };
  s.gathered_peak = [=] { return static_cast<double>(run->sharded->stats().peak_gathered_bytes); };
  return s;
}

// Tensor parallelism over `tensor` (and, for the hybrid, DDP over `data`).
Strategy tensor_parallel(const Config& c, ProcessGroup tensor, ProcessGroup data, const std::string& name) {
  auto full = fresh_gpt(c);
  auto tp = std::make_shared<TensorParallelGPT>(*full, tensor);
  const int t = tensor.size(), d = data.defined() ? data.size() : 1, dr = data.defined() ? data.rank() : 0;
  const int64_t per_replica = c.global_batch / d;
  std::shared_ptr<DistributedDataParallel> replica;
  if (data.defined()) replica = std::make_shared<DistributedDataParallel>(*tp, data);
  std::shared_ptr<optim::Optimizer> opt = adamw(replica ? replica->parameters() : tp->parameters());
  Strategy s;
  s.name = name;
  s.note = data.defined() ? str_cat("DDP over ", d, " x TP over ", t)
                          : str_cat(c.heads / t, c.heads / t == 1 ? " head" : " heads", " per rank");
  s.groups = {tensor};
  if (data.defined()) s.groups.push_back(data);
  // Per block: two all-reduces of [b, T, C] forward (after attention and MLP), two backward.
  const double act = static_cast<double>(per_replica * c.seq * c.embd) * 4.0;
  s.predicted_bytes = static_cast<double>(c.layers) * 4.0 * 2.0 * (t - 1.0) / t * act;
  if (data.defined())
    s.predicted_bytes += 2.0 * (d - 1.0) / d * static_cast<double>(tensor_bytes(tp->parameters(), false));
  const int world = t * d;
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    opt->zero_grad();
    Tensor xs = x.narrow(0, dr * per_replica, per_replica), ys = y.narrow(0, dr * per_replica, per_replica);
    Tensor loss = lm_loss(replica ? (*replica)(xs) : (*tp)(xs), ys);
    loss.backward();
    opt->step();
    return std::make_pair(loss.item<double>() / world, 0.0);  // the replicas' mean, over all ranks
  };
  s.memory = [=] {
    Memory m = memory_of(tp->parameters(), optimizer_state_bytes(*opt), 0);
    if (replica) m.buffers = replica->bucket_bytes();
    return std::vector<Memory>{m};
  };
  return s;
}

// Context parallelism over every rank: each holds T'/N positions of every sequence of the whole
// batch (T' = T padded to the layout's chunks), the model whole; DDP averages the gradients. With
// `sharded`, FSDP (a unit per block, as `fsdp`) over the same ranks in place of DDP.
Strategy context_parallel(const Config& c, ProcessGroup& pg, double param_bytes, double root_bytes,
                          ContextAttention attention, bool sharded = false) {
  struct Run {  // destroyed bottom-up: the optimizer, FSDP or DDP, then the models they refer to
    std::unique_ptr<nn::TinyGPT> gpt;
    std::unique_ptr<ContextParallelGPT> cp;
    std::unique_ptr<DistributedDataParallel> ddp;
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    std::unique_ptr<optim::Optimizer> opt;
  };
  auto run = std::make_shared<Run>();
  run->gpt = fresh_gpt(c);
  ContextParallelOptions options;
  options.attention = attention;
  run->cp = std::make_unique<ContextParallelGPT>(*run->gpt, pg, options);
  if (sharded) {
    FSDPOptions units;
    units.auto_wrap = AutoWrapPolicy::module_types_of({"TransformerBlock"});
    run->fsdp = std::make_unique<FullyShardedDataParallel>(*run->cp, pg, units);
    run->opt = adamw(run->fsdp->parameters());
  } else {
    run->ddp = std::make_unique<DistributedDataParallel>(*run->cp, pg);
    run->opt = adamw(run->ddp->parameters());
  }
  const int n = pg.size();
  const int64_t padded = context_padded_length(c.seq, n, run->cp->layout());
  Strategy s;
  const bool ring = attention == ContextAttention::ring;
  s.name = str_cat(ring ? "cp-ring" : "cp-ulysses", sharded ? "+fsdp" : "");
  s.note = str_cat(padded / n, " positions per rank", ring ? " (zigzag)" : "");
  s.groups = {pg};
  // DDP's all-reduce, plus per layer and rank, with E the elements of one rank's K (B T'/N C):
  //   ring:    forward K and V over N-1 hops, 2 (N-1) E; backward the same plus the dK and dV
  //            accumulators over N hops (f32), 2 N E: ring_attention.h's formula;
  //   Ulysses: 4 all-to-alls forward (q, k, v, out) and 4 backward, (N-1)/N of E each.
  const double share = (n - 1.0) / n;
  const double e_bytes = static_cast<double>(c.global_batch * (padded / n) * c.embd) * 4.0;
  const double per_layer = n == 1 ? 0.0 : ring ? (4.0 * (n - 1) + 2.0 * n) * e_bytes : 8.0 * share * e_bytes;
  // DDP's all-reduce moves 2 (N-1)/N of the parameters; FSDP 3 (N-1)/N less the root's once (fsdp).
  s.predicted_bytes = (sharded ? share * (3.0 * param_bytes - root_bytes) : 2 * share * param_bytes) +
                      static_cast<double>(c.layers) * per_layer;
  if (sharded) s.slack_per_call = 0.5 + 4.0 * n;  // units padded to N elements
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    run->opt->zero_grad();
    ContextBatch b = run->cp->context_parallel_batch(x, y);
    Tensor logits = run->fsdp ? (*run->cp)(b.inputs) : (*run->ddp)(b.inputs);  // FSDP: hooks on cp
    CrossEntropyOptions sum;
    sum.reduction = Reduction::Sum;
    // This rank's tokens' summed loss x N / (all the batch's tokens): DDP's average over the N
    // ranks is then the mean loss, and so are the returned shares summed.
    Tensor loss = mul(nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), b.targets.reshape({-1}), sum),
                      static_cast<double>(n) / static_cast<double>(b.real_tokens));
    loss.backward();
    run->opt->step();
    return std::make_pair(loss.item<double>() / n, 0.0);
  };
  s.memory = [=] {
    if (run->fsdp)
      return std::vector<Memory>{memory_of(run->fsdp->parameters(), optimizer_state_bytes(*run->opt), 0)};
    Memory m = memory_of(run->gpt->parameters(), optimizer_state_bytes(*run->opt), 0);
    m.buffers = run->ddp->bucket_bytes();
    return std::vector<Memory>{m};
  };
  return s;
}

Strategy pipeline(const Config& c, ProcessGroup& pg, PipelineSchedule schedule) {
  auto gpt = std::shared_ptr<nn::TinyGPT>(fresh_gpt(c));
  std::shared_ptr<nn::Sequential> layers = gpt->as_sequential();
  std::shared_ptr<nn::Sequential> stage = pipeline_stage(*layers, pg.rank(), pg.size());
  auto pipe = std::make_shared<Pipeline>(stage, pg, lm_loss, schedule);
  std::shared_ptr<optim::Optimizer> opt = adamw(stage->parameters());
  const int p = pg.size();
  Strategy s;
  s.name = schedule == PipelineSchedule::GPipe                   ? "pp-gpipe"
           : schedule == PipelineSchedule::OneForwardOneBackward ? "pp-1f1b"
                                                                 : "pp-zbh1";
  s.note = str_cat(p, " stages, m = ", c.micro_batches);
  s.groups = {pg};
  // p - 1 boundaries, each the whole batch's [B, T, C] forward and its gradient backward; every
  // one of the 2m tensors crossing a boundary is preceded by its 64-byte header (8 int64: ndim,
  // dtype and 6 dims, parallel/pipeline/pipeline.cpp's send_tensor).
  const int m = c.micro_batches;
  const double act = static_cast<double>(c.global_batch * c.seq * c.embd) * 4.0;
  const double headers = 2.0 * m * 64.0;
  s.predicted_bytes = (p - 1.0) / p * (2.0 * act + headers);
  s.step = [=, &c](int i) {
    auto [x, y] = batch(c, i);
    opt->zero_grad();
    PipelineStepResult r =
        pipe->train_step(pipe->is_first() ? x : Tensor(), pipe->is_last() ? y : Tensor(), m);
    opt->step();
    return std::make_pair(r.loss, r.bubble());
  };
  s.memory = [=] {
    return std::vector<Memory>{memory_of(stage->parameters(), optimizer_state_bytes(*opt), 0)};
  };
  s.keep_alive = {gpt, layers};  // the stage's first and last layers are views of gpt
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"Every parallelism strategy on one TinyGPT and one global batch"};
  app.add_option("--layers", c.layers, "transformer blocks");
  app.add_option("--embd", c.embd, "n_embd");
  app.add_option("--heads", c.heads, "attention heads (must divide by N for tp)");
  app.add_option("--seq", c.seq, "tokens per sequence");
  app.add_option("--global-batch", c.global_batch, "sequences per step over all ranks (divisible by N)");
  app.add_option("--micro-batches", c.micro_batches, "pipeline micro-batches");
  app.add_option("--dp-devices", c.dp_devices, "devices of the dp run (default: N)");
  app.add_option("--steps", c.steps, "timed steps");
  app.add_option("--warmup", c.warmup, "untimed steps first");
  app.add_option("--json", c.json, "write the results here");
  app.add_option("--memory-cap-mb", c.memory_cap_mb,
                 "mark the strategies whose fullest device's peak exceeds this many MB");
  CLI11_PARSE(app, argc, argv);
  try {
    bench::reexec_with_one_thread(argv, "bench_parallelism");  // one core per rank (see the top)
    // DataParallel runs N threads in rank 0's process, and mpirun binds each rank to one core
    // when N <= 2 (OpenMPI's default): all of them would share that core. Undo the binding
    // (mpirun --bind-to none) before MPI starts its threads; the OS spreads the ranks itself.
    cpu_set_t every_cpu;
    CPU_ZERO(&every_cpu);
    for (long cpu = 0; cpu < sysconf(_SC_NPROCESSORS_ONLN) && cpu < CPU_SETSIZE; ++cpu)
      CPU_SET(cpu, &every_cpu);
    sched_setaffinity(0, sizeof every_cpu, &every_cpu);
    InitOptions init;
    init.device = Device::cpu(0);
    ProcessGroup world = init_process_group(init);
    const int n = world.size();
    MG_CHECK(c.global_batch % n == 0, "--global-batch ", c.global_batch, " must divide by the ", n, " ranks");
    MG_CHECK(c.steps >= 1 && c.warmup >= 0 && c.micro_batches >= 1,
             "--steps >= 1, --warmup >= 0, --micro-batches >= 1");
    const double param_bytes = static_cast<double>(fresh_gpt(c)->num_parameters()) * 4.0;
    double root_bytes = 0;  // FSDP's root unit: every parameter outside the blocks h.0, h.1, ...
    for (const auto& [name, p] : fresh_gpt(c)->named_parameters())
      if (name.rfind("h.", 0) != 0) root_bytes += static_cast<double>(p.numel()) * 4.0;

    std::vector<Strategy> strategies;
    auto add = [&](Strategy s) { strategies.push_back(std::move(s)); };
    add(single_device(c));
    const int dp_devices = c.dp_devices > 0 ? c.dp_devices : n;
    if (dp_devices > 1) add(data_parallel(c, dp_devices, param_bytes));
    add(ddp(c, world, param_bytes, false));
    add(ddp(c, world, param_bytes, true));
    add(zero2(c, world, param_bytes));
    add(fsdp(c, world, param_bytes, root_bytes, false));
    add(fsdp(c, world, param_bytes, root_bytes, true));
    if (c.heads % n == 0) add(tensor_parallel(c, world, ProcessGroup(), "tp"));
    if (n <= c.layers + 2 && (c.global_batch % c.micro_batches) == 0) {
      add(pipeline(c, world, PipelineSchedule::GPipe));
      add(pipeline(c, world, PipelineSchedule::OneForwardOneBackward));
      add(pipeline(c, world, PipelineSchedule::ZeroBubbleH1));
    }
    if (n >= 4 && n % 2 == 0 && c.heads % 2 == 0 && c.global_batch % (n / 2) == 0) {
      GroupGrid grid = new_group_grid(world, 2);  // rank = data_rank * 2 + tensor_rank
      add(tensor_parallel(c, grid.tensor, grid.data, str_cat("dp", n / 2, "xtp2")));
    }
    add(context_parallel(c, world, param_bytes, root_bytes, ContextAttention::ring));
    if (c.heads % n == 0) add(context_parallel(c, world, param_bytes, root_bytes, ContextAttention::ulysses));
    add(context_parallel(c, world, param_bytes, root_bytes, ContextAttention::ring, /*sharded=*/true));
    for (Strategy& s : strategies) {
      if (s.moved) continue;
      s.moved = [groups = s.groups] {
        double bytes = 0, calls = 0;
        for (const ProcessGroup& g : groups) {
          bytes += static_cast<double>(g.requested_traffic().bytes);
          calls += static_cast<double>(g.requested_traffic().calls);
        }
        return std::make_pair(bytes, calls);
      };
    }
    std::vector<Row> rows = measure(world, c, strategies);
    // Every strategy computes the same mathematics: a loss curve off single's by more than
    // rounding is a bug (exit 3, as bench_dp_vs_ddp does).
    const double tolerance = 1e-4;
    std::string differ;
    for (Row& r : rows) {
      for (size_t i = 0; i < r.losses.size(); ++i)
        r.loss_diff =
            std::max(r.loss_diff, std::fabs(r.losses[i] - rows[0].losses[i]) / std::fabs(rows[0].losses[i]));
      if (!(r.loss_diff <= tolerance))
        differ += str_cat(differ.empty() ? "" : ", ", r.name, " by ", r.loss_diff);
    }
    // Every strategy's bytes against its formula, to the byte (each call's rounding, ZeRO's padding).
    std::string off;
    for (const Row& r : rows) {
      if (!(std::fabs(r.counted_bytes - r.predicted_bytes) <= r.slack_bytes))
        off += str_cat(off.empty() ? "" : ", ", r.name, " moved ", format_fixed(r.counted_bytes, 1),
                       " bytes/step, the formula says ", format_fixed(r.predicted_bytes, 1),
                       " (allowed difference ", format_fixed(r.slack_bytes, 1), ")");
    }
    // The data-parallel family's memory against the ZeRO formulas, on every rank.
    for (const Row& r : rows) {
      if (!r.memory_formula) continue;
      const MemoryFormula& f = *r.memory_formula;
      auto check = [&](const char* what, double measured, double formula) {
        if (!(std::fabs(measured - formula) <= f.slack))
          off += str_cat(off.empty() ? "" : ", ", r.name, " keeps ", format_fixed(measured, 0), " bytes of ",
                         what, ", the formula ", f.text, " says ", format_fixed(formula, 0),
                         " (allowed difference ", format_fixed(f.slack, 0), ")");
      };
      for (const Memory& m : r.memory) {
        check("parameters", static_cast<double>(m.params), f.params);
        check("gradients", static_cast<double>(m.grads), f.grads);
        check("optimizer state", static_cast<double>(m.optimizer), f.optimizer);
      }
      if (f.gathered > 0 && r.gathered_peak > f.gathered)
        off += str_cat(off.empty() ? "" : ", ", r.name, " had ", format_fixed(r.gathered_peak, 0),
                       " bytes of units gathered at once, more than the root + 2 blocks (",
                       format_fixed(f.gathered, 0), ")");
    }
    if (world.is_main()) {
      print_table(c, n, rows, param_bytes);
      if (!c.json.empty()) {
        write_json(c, n, rows, param_bytes);
        std::printf("wrote %s\n", c.json.c_str());
      }
    }
    world.barrier()->wait();
    if (!off.empty()) {
      if (world.is_main())
        std::fprintf(stderr, "bench_parallelism: bytes moved or kept DIFFER from the formula: %s\n",
                     off.c_str());
      return 4;
    }
    if (!differ.empty()) {
      if (world.is_main())
        std::fprintf(stderr, "bench_parallelism: loss curves DIFFER from single's (> %.0e): %s\n", tolerance,
                     differ.c_str());
      return 3;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_parallelism: %s\n", e.what());
    return 1;
  }
}
#endif
