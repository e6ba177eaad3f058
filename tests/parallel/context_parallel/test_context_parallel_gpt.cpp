// A context-parallel TinyGPT under `mpiexec -n K` (K = 2, 3, 4) against the same TinyGPT trained
// in one process: 10 AdamW steps on the same batches, every loss and every parameter compared
// after the last step. The sequence length is 9, which divides neither into K nor into the
// zigzag's 2K chunks, so every run pads (and the padding must not reach the loss). Each variant:
// ring attention in the zigzag and in the contiguous layout, Ulysses where the 4 heads divide
// over K, and at K = 4 a 2 x 2 mesh (DDP over 2 data groups x context parallel over 2 ranks);
// and FSDP sharding over the whole world in place of DDP, at K ranks and on the 2 x 2 mesh; and at
// K = 4 tensor parallelism over pairs x context parallelism over the other dimension.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "multigrad.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

namespace {

constexpr int kSteps = 10;
constexpr int64_t kRows = 4, kSeq = 9;

nn::GPTConfig tiny_gpt_config() {
  nn::GPTConfig c;
  c.vocab_size = 19;
  c.block_size = kSeq;  // the padded positions lie past it: they take the last embedding row
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  return c;
}

std::pair<Tensor, Tensor> token_batch(int step, const nn::GPTConfig& c, Device device) {
  manual_seed(900 + static_cast<uint64_t>(step));
  Tensor x = randint(0, c.vocab_size, {kRows, kSeq}), y = randint(0, c.vocab_size, {kRows, kSeq});
  return {x.to(device), y.to(device)};
}

optim::AdamWOptions adamw() {
  optim::AdamWOptions o;
  o.lr = 1e-2;
  return o;
}

// One process over the whole batch: the losses of kSteps steps, and the model after them.
std::vector<double> train_single(nn::TinyGPT& gpt, Device device) {
  optim::AdamW opt(gpt.parameters(), adamw());
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = token_batch(step, gpt.config, device);
    opt.zero_grad();
    Tensor logits = gpt(x);
    Tensor loss = nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// How the copies of the model on the world's ranks are kept equal.
enum class Replication {
  ddp,   // whole parameters everywhere, gradients all-reduced (DistributedDataParallel)
  fsdp,  // every parameter sharded over the whole world (FullyShardedDataParallel)
};

// What training left: the losses and the trained parameters, named as in TinyGPT.
struct Trained {
  std::vector<double> losses;
  StateDict parameters;
};

// FSDP's usual units: one per TransformerBlock (ContextParallelGPT runs a block's computation
// itself, through the block's hooks), the root holding the embeddings, ln_f and the head.
FSDPOptions context_parallel_fsdp_options() {
  FSDPOptions o;
  o.auto_wrap = AutoWrapPolicy::module_types_of({"TransformerBlock"});
  return o;
}

// The same steps context-parallel over `context` (and data-parallel over the world's other
// dimension when `data_groups` > 1): each rank's loss is its tokens' summed cross-entropy scaled
// so that the average over the world (DDP's all-reduce or FSDP's reduce-scatter, both over every
// rank) is the mean over the batch; the printed loss is the sum of the ranks' shares, all-reduced.
Trained train_context_parallel(nn::TinyGPT& gpt, ProcessGroup world, const GroupGrid& grid,
                               ContextParallelOptions options, Replication replication) {
  const Device device = world.device();
  ContextParallelGPT cp(gpt, grid.tensor, options);
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  if (replication == Replication::ddp)
    ddp = std::make_unique<DistributedDataParallel>(cp, world);
  else
    fsdp = std::make_unique<FullyShardedDataParallel>(cp, world, context_parallel_fsdp_options());
  optim::AdamW opt(ddp ? ddp->parameters() : fsdp->parameters(), adamw());
  const int64_t rows = kRows / grid.data_size, first_row = grid.data_rank * rows;
  Trained trained;
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = token_batch(step, gpt.config, device);
    ContextBatch batch =
        cp.context_parallel_batch(x.narrow(0, first_row, rows), y.narrow(0, first_row, rows));
    opt.zero_grad();
    Tensor logits = ddp ? (*ddp)(batch.inputs) : (*fsdp)(batch.inputs);
    CrossEntropyOptions sum;
    sum.reduction = Reduction::Sum;
    Tensor loss_sum =
        nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1}), sum);
    Tensor loss = mul(loss_sum, double(grid.tensor_size) / double(batch.real_tokens));
    loss.backward();
    opt.step();
    Tensor global = full({1}, loss.item<double>() / world.size(), TensorOptions{DType::f64});
    world.allreduce(global)->wait();
    trained.losses.push_back(global.item<double>());
  }
  if (fsdp) {
    const std::string prefix = "gpt.";  // ContextParallelGPT registers the TinyGPT's parameters so
    for (const auto& [name, t] : full_state_dict(*fsdp, -1))
      if (name.compare(0, prefix.size(), prefix) == 0) trained.parameters[name.substr(prefix.size())] = t;
  } else {
    for (const auto& [name, t] : gpt.named_parameters()) trained.parameters[name] = t;
  }
  return trained;
}

bool ends_with(const std::string& name, const std::string& suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A trained parameter against the one-device model's (relative 1e-4). The key bias adds q . b_k to
// every score of a query, which softmax ignores: its gradient is zero up to rounding, and AdamW
// turns that noise into steps of size lr. Of c_attn's bias, only the q and v thirds are compared.
void require_same_parameter(const std::string& name, const Tensor& mine, const Tensor& want) {
  INFO(name);
  if (ends_with(name, "attn.c_attn.bias")) {
    const int64_t third = want.size(0) / 3;
    testing::require_close(mine.narrow(0, 0, third), want.narrow(0, 0, third), 1e-4);
    testing::require_close(mine.narrow(0, 2 * third, third), want.narrow(0, 2 * third, third), 1e-4);
    return;
  }
  testing::require_close(mine, want, 1e-4);
}

// Two TinyGPTs drawn alike on `device` (CUDA under MG_TEST_DEVICE=cuda, the NCCL variants), the
// first trained in one process: what every parallel run is compared with.
struct Twins {
  std::unique_ptr<nn::TinyGPT> single, parallel;
  std::vector<double> expected;  // single's losses
};

Twins draw_twins(Device device) {
  Twins t;
  manual_seed(5);
  t.single = std::make_unique<nn::TinyGPT>(tiny_gpt_config());
  manual_seed(5);
  t.parallel = std::make_unique<nn::TinyGPT>(tiny_gpt_config());
  t.single->to(device);
  t.parallel->to(device);
  t.expected = train_single(*t.single, device);
  return t;
}

void require_same_training(ProcessGroup world, int context_size, ContextParallelOptions options,
                           Replication replication = Replication::ddp) {
  Twins twins = draw_twins(world.device());
  const std::vector<double>& expected = twins.expected;
  const GroupGrid grid = new_group_grid(world, context_size);
  const Trained got = train_context_parallel(*twins.parallel, world, grid, options, replication);
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    REQUIRE(got.losses[size_t(step)] == Approx(expected[size_t(step)]).epsilon(1e-5));
  }
  for (const auto& [name, want] : twins.single->named_parameters()) {
    INFO(name);
    REQUIRE(got.parameters.count(name) == 1);
    require_same_parameter(name, got.parameters.at(name), want);
  }
}

}  // namespace

TEST_CASE("context-parallel TinyGPT with ring attention (zigzag) trains as one process",
          "[mpi][context-parallel]") {
  ProcessGroup world = testing::mpi_test_group();
  require_same_training(world, world.size(),
                        ContextParallelOptions{ContextAttention::ring, std::nullopt, nullptr});
}

TEST_CASE("context-parallel TinyGPT with ring attention (contiguous) trains as one process",
          "[mpi][context-parallel]") {
  ProcessGroup world = testing::mpi_test_group();
  require_same_training(world, world.size(),
                        ContextParallelOptions{ContextAttention::ring, ContextLayout::contiguous, nullptr});
}

TEST_CASE("context-parallel TinyGPT with Ulysses attention trains as one process",
          "[mpi][context-parallel]") {
  ProcessGroup world = testing::mpi_test_group();
  if (tiny_gpt_config().n_head % world.size() != 0) {
    // 4 heads over 3 ranks: refused with the reason.
    manual_seed(5);
    nn::TinyGPT gpt(tiny_gpt_config());
    REQUIRE_THROWS_WITH(
        ContextParallelGPT(gpt, world,
                           ContextParallelOptions{ContextAttention::ulysses, std::nullopt, nullptr}),
        Catch::Contains("n_head (4) divisible by the 3 ranks"));
    return;
  }
  require_same_training(world, world.size(),
                        ContextParallelOptions{ContextAttention::ulysses, std::nullopt, nullptr});
}

TEST_CASE("a 2 x 2 mesh: DDP over data groups x context parallel (ring, Ulysses) trains as one process",
          "[mpi][context-parallel][mesh]") {
  ProcessGroup world = testing::mpi_test_group();
  if (world.size() != 4) return;  // the mesh needs 4 ranks
  SECTION("ring") {
    require_same_training(world, 2, ContextParallelOptions{ContextAttention::ring, std::nullopt, nullptr});
  }
  SECTION("Ulysses") {
    require_same_training(world, 2, ContextParallelOptions{ContextAttention::ulysses, std::nullopt, nullptr});
  }
}

TEST_CASE("FSDP over the world x context parallel (ring, Ulysses) trains as one process",
          "[mpi][context-parallel][mesh][fsdp]") {
  // Every rank's gradients are partial over the context group and over the data groups alike, so
  // FSDP shards over the whole world (torchtitan's dp_shard x cp): its reduce-scatter sums both.
  ProcessGroup world = testing::mpi_test_group();
  SECTION("context over the whole world, ring") {
    require_same_training(world, world.size(),
                          ContextParallelOptions{ContextAttention::ring, std::nullopt, nullptr},
                          Replication::fsdp);
  }
  if (world.size() == 4) {
    SECTION("a 2 x 2 mesh, ring") {
      require_same_training(world, 2, ContextParallelOptions{ContextAttention::ring, std::nullopt, nullptr},
                            Replication::fsdp);
    }
    SECTION("a 2 x 2 mesh, Ulysses") {
      require_same_training(world, 2,
                            ContextParallelOptions{ContextAttention::ulysses, std::nullopt, nullptr},
                            Replication::fsdp);
    }
  }
}

namespace {

// Tensor rank r's part of a single-device parameter (tensor_parallel_gpt.h's layout for T ranks).
Tensor tensor_shard(const std::string& name, const Tensor& full, int r, int T, int64_t C) {
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {
    const int64_t mine = C / T;  // q, k and v: three stacked [C, ...] blocks, this rank's rows of each
    return cat({full.narrow(0, r * mine, mine), full.narrow(0, C + r * mine, mine),
                full.narrow(0, 2 * C + r * mine, mine)},
               0);
  }
  if (ends_with(name, "attn.c_proj.weight")) return full.narrow(1, r * (C / T), C / T);
  if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias"))
    return full.narrow(0, r * (4 * C / T), 4 * C / T);
  if (ends_with(name, "mlp.c_proj.weight")) return full.narrow(1, r * (4 * C / T), 4 * C / T);
  return full;  // replicated
}

}  // namespace

TEST_CASE("a 2 x 2 mesh: tensor parallelism x context parallelism (ring) trains as one process",
          "[mpi][context-parallel][mesh][tensor-parallel]") {
  ProcessGroup world = testing::mpi_test_group();
  if (world.size() != 4) return;  // the mesh needs 4 ranks
  const nn::GPTConfig c = tiny_gpt_config();
  const Device device = world.device();
  Twins twins = draw_twins(device);

  // Tensor pairs {0, 1} and {2, 3} split the heads and MLP features; {0, 2} and {1, 3}, the ranks
  // holding the same shards, split each sequence and average their gradients (DDP).
  const GroupGrid grid = new_group_grid(world, 2);
  const ProcessGroup& context = grid.data;
  TensorParallelGPT tp(*twins.parallel, grid.tensor, context);
  tp.to(device);
  DistributedDataParallel ddp(tp, context);
  optim::AdamW opt(ddp.parameters(), adamw());
  for (int step = 0; step < kSteps; ++step) {
    INFO("step " << step);
    auto [x, y] = token_batch(step, c, device);
    ContextBatch batch = context_parallel_batch(x, y, context, ContextLayout::zigzag, c.block_size);
    opt.zero_grad();
    Tensor logits = ddp(batch.inputs);
    CrossEntropyOptions sum;
    sum.reduction = Reduction::Sum;
    Tensor loss =
        mul(nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1}), sum),
            double(context.size()) / double(batch.real_tokens));
    loss.backward();
    opt.step();
    Tensor global = full({1}, loss.item<double>() / world.size(), TensorOptions{DType::f64});
    world.allreduce(global)->wait();
    REQUIRE(global.item<double>() == Approx(twins.expected[size_t(step)]).epsilon(1e-5));
  }
  const auto reference = twins.single->named_parameters();
  const auto mine = tp.named_parameters();
  REQUIRE(mine.size() == reference.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string& name = mine[i].first;
    INFO(name);
    REQUIRE(name == reference[i].first);
    require_same_parameter(name, mine[i].second,
                           tensor_shard(name, reference[i].second, grid.tensor_rank, 2, c.n_embd));
  }
}

TEST_CASE("ContextParallelGPT refuses what it cannot do, with the reason", "[mpi][context-parallel]") {
  ProcessGroup world = testing::mpi_test_group();
  nn::GPTConfig c = tiny_gpt_config();
  c.dropout = 0.1;
  manual_seed(5);
  nn::TinyGPT with_dropout(c);
  REQUIRE_THROWS_WITH(ContextParallelGPT(with_dropout, world),
                      Catch::Contains("ring attention has no attention dropout"));
  manual_seed(5);
  nn::TinyGPT gpt(tiny_gpt_config());
  ContextParallelGPT cp(gpt, world);
  Tensor too_long = zeros({1, kSeq + 1}, TensorOptions{DType::i64});
  REQUIRE_THROWS_WITH(cp.context_parallel_batch(too_long, too_long), Catch::Contains("exceeds block_size 9"));
  REQUIRE_THROWS_WITH(
      ContextParallelGPT(gpt, world,
                         ContextParallelOptions{ContextAttention::ulysses, ContextLayout::zigzag, nullptr}),
      Catch::Contains("Ulysses attention takes the contiguous layout"));
}
