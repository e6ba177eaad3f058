// train_gpt_parallel: a byte-level TinyGPT trained on a text file, split across the ranks the way
// --strategy says. Every strategy computes the same steps, so rank 0 prints the same losses
// (to rounding) whichever you pick: try them side by side.
//
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy ddp     data parallel
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy zero    + AdamW state sharded (ZeRO-1)
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy zero2   grads sharded too, no DDP (ZeRO-2)
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy fsdp    parameters sharded too (ZeRO-3)
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy tp      heads and MLP split (Megatron)
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy pp      4 micro-batches through 2 stages (1F1B)
//   mpirun -np 4 build/examples/train_gpt_parallel --strategy hybrid  DDP over 2 replicas x TP over 2
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy cp      each sequence split over the ranks
//                                                                     (ring attention, zigzag layout)
//   mpirun -np 2 build/examples/train_gpt_parallel --strategy ulysses the same with Ulysses' all-to-alls
//   mpirun -np 4 build/examples/train_gpt_parallel --strategy cp --cp 2   DDP over 2 x context over 2
//   mpirun -np 4 build/examples/train_gpt_parallel --strategy cp --cp 2 --cp-fsdp   FSDP over all 4 instead
//   mpirun -np 4 build/examples/train_gpt_parallel --strategy cp --cp 2 --tp 2      tensor pairs x context
//   over 2
//
// Add --checkpoint-activations (ddp, zero, zero2, fsdp) to recompute each block's activations in backward.
// (as root: mpirun --allow-run-as-root --oversubscribe ...). Without mpirun it runs on one rank.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "multigrad.h"

using namespace mg;
using namespace mg::parallel;

namespace {

struct Flags {
  std::string strategy = "ddp", text = "README.md";
  bool checkpoint_activations = false;
  int steps = 30;
  int cp = 0;            // cp, ulysses: ranks per context group (0: all of them)
  bool cp_fsdp = false;  // cp, ulysses: FSDP over every rank in place of DDP
  int tp = 1;            // cp: tensor-parallel ranks per context rank (ranks = cp x tp)
  int64_t batch = 8, seq = 64;
};

// `rows` random windows of the text, the same on every rank: inputs [rows, seq] and the next
// bytes as targets.
std::pair<Tensor, Tensor> windows(const std::vector<int64_t>& bytes, int64_t rows, int64_t seq, int step) {
  manual_seed(10'000 + static_cast<uint64_t>(step));
  const std::vector<int64_t> starts =
      randint(0, static_cast<int64_t>(bytes.size()) - seq - 1, {rows}).to_vector<int64_t>();
  std::vector<int64_t> x, y;
  for (int64_t s : starts) {
    x.insert(x.end(), bytes.begin() + s, bytes.begin() + s + seq);
    y.insert(y.end(), bytes.begin() + s + 1, bytes.begin() + s + seq + 1);
  }
  return {tensor<int64_t>(x, {rows, seq}, {DType::i64}), tensor<int64_t>(y, {rows, seq}, {DType::i64})};
}

Tensor next_byte_loss(const Tensor& logits, const Tensor& targets) {
  return nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"TinyGPT trained data-, tensor-, pipeline-parallel or hybrid"};
  app.add_option("--strategy", f.strategy, "ddp, zero, zero2, fsdp, tp, pp, hybrid, cp or ulysses");
  app.add_flag("--checkpoint-activations", f.checkpoint_activations,
               "recompute each block's activations in backward instead of keeping them");
  app.add_option("--text", f.text, "the text to learn (bytes)");
  app.add_option("--steps", f.steps, "training steps");
  app.add_option("--batch", f.batch, "sequences per step, over all ranks");
  app.add_option("--cp", f.cp,
                 "cp, ulysses: ranks that split each sequence (the rest is data parallel; default all)");
  app.add_option("--tp", f.tp,
                 "cp: split every block's heads and MLP over this many ranks as well (tensor parallelism; "
                 "the ranks must be --cp x --tp)");
  app.add_flag("--cp-fsdp", f.cp_fsdp,
               "cp, ulysses: shard the parameters over every rank with FSDP (one unit per block) instead of "
               "replicating them with DDP");
  CLI11_PARSE(app, argc, argv);
  try {
    InitOptions init;
    init.device = Device::cpu();
    // The flags first, on every rank (each error names its flag): --batch 0 trained on nothing and
    // printed "loss -nan", 3000000000 grew without bound, a directory as --text failed with
    // "basic_filebuf::underflow".
    MG_CHECK(f.batch >= 1 && f.batch <= 65536, "--batch must be from 1 to 65536 sequences, got ", f.batch);
    MG_CHECK(f.steps >= 1 && f.steps <= 100000000, "--steps must be from 1 to 100000000, got ", f.steps);
    std::error_code error;
    MG_CHECK(std::filesystem::is_regular_file(f.text, error), "--text ", f.text, " is not a regular file");
    MG_CHECK(std::filesystem::file_size(f.text, error) <= (uint64_t(1) << 30) && !error, "--text ", f.text,
             " is over 1 GiB (or its size cannot be read)");
    ProcessGroup world = init_process_group(init);
    const int n = world.size(), rank = world.rank();
    std::ifstream in(f.text, std::ios::binary);
    MG_CHECK(in.good(), "train_gpt_parallel: cannot read --text ", f.text);
    std::vector<int64_t> bytes;
    for (auto it = std::istreambuf_iterator<char>(in); it != std::istreambuf_iterator<char>(); ++it)
      bytes.push_back(static_cast<unsigned char>(*it));
    MG_CHECK(static_cast<int64_t>(bytes.size()) > f.seq + 1, "train_gpt_parallel: ", f.text, " is too short");

    nn::GPTConfig config;
    config.vocab_size = 256;  // bytes: no tokenizer needed
    config.block_size = f.seq;
    config.n_layer = 2;
    config.n_head = 4;
    config.n_embd = 64;
    config.checkpoint_activations = f.checkpoint_activations;
    manual_seed(1);  // the same initial weights on every rank, whatever the strategy
    nn::TinyGPT gpt(config);

    // What this rank trains, on which rows of each global batch, and with which optimizer.
    std::shared_ptr<nn::Module> model;                   // called on this rank's rows (dp, zero, tp, hybrid)
    std::shared_ptr<Pipeline> pipeline;                  // pp
    std::vector<Tensor> params;                          // what this rank's optimizer updates
    int64_t rows = f.batch, first_row = 0;               // this rank's rows of the global batch
    double loss_weight = 1.0 / n;                        // the ranks' weighted losses sum to the global loss
    std::shared_ptr<nn::Sequential> layers;              // pp: the GPT as a Sequential (views of gpt)
    std::shared_ptr<TensorParallelGPT> tensor_parallel;  // hybrid, cp with --tp: what DDP wraps
    std::shared_ptr<ContextParallelGPT> context;         // cp, ulysses: what DDP (or FSDP) wraps
    ProcessGroup context_group;                          // cp, ulysses: the ranks that split a sequence
    std::shared_ptr<FullyShardedDataParallel> fsdp;  // declared after gpt and context, destroyed before them
    int64_t context_size = 1;                        // cp, ulysses: ranks per sequence
    MG_CHECK(f.tp == 1 || (f.strategy == "cp" && !f.cp_fsdp),
             "--tp goes with --strategy cp (ring attention), without --cp-fsdp");
    MG_CHECK(!f.cp_fsdp || f.strategy == "cp" || f.strategy == "ulysses",
             "--cp-fsdp goes with --strategy cp or ulysses (--strategy fsdp shards a whole-sequence model)");
    MG_CHECK(f.batch % n == 0 || f.strategy == "cp" || f.strategy == "ulysses", "--batch ", f.batch,
             " must divide by the ", n, " ranks");
    if (f.strategy == "zero2") {  // no DDP: ZeRO-2 reduce-scatters the gradients itself
      model = std::shared_ptr<nn::Module>(&gpt, [](nn::Module*) {});
      params = gpt.parameters();
      rows = f.batch / n;
      first_row = rank * rows;
    } else if (f.strategy == "fsdp") {  // one unit per block, the root keeps the embeddings and head
      FSDPOptions options;
      options.auto_wrap = AutoWrapPolicy::module_types_of({"TransformerBlock"});
      fsdp = std::make_shared<FullyShardedDataParallel>(gpt, world, options);
      model = std::shared_ptr<nn::Module>(&gpt, [](nn::Module*) {});  // FSDP's hooks are on gpt itself
      params = fsdp->parameters();                                    // this rank's shards
      rows = f.batch / n;
      first_row = rank * rows;
    } else if (f.strategy == "ddp" || f.strategy == "zero") {
      auto ddp = std::make_shared<DistributedDataParallel>(gpt, world);
      model = ddp;
      params = ddp->parameters();
      rows = f.batch / n;
      first_row = rank * rows;
    } else if (f.strategy == "tp") {
      model = std::make_shared<TensorParallelGPT>(gpt, world);
      params = model->parameters();
    } else if (f.strategy == "hybrid") {
      MG_CHECK(n % 2 == 0, "--strategy hybrid needs an even number of ranks (pairs of tensor ranks)");
      GroupGrid grid = new_group_grid(world, 2);  // tensor pairs {0,1} {2,3}..., data groups across them
      tensor_parallel = std::make_shared<TensorParallelGPT>(gpt, grid.tensor);
      model = std::make_shared<DistributedDataParallel>(*tensor_parallel, grid.data);
      params = model->parameters();
      rows = f.batch / (n / 2);  // each replica (pair of tensor ranks) trains on its rows
      first_row = grid.data_rank * rows;
    } else if (f.strategy == "pp") {
      layers = gpt.as_sequential();
      auto stage = pipeline_stage(*layers, rank, n);
      pipeline = std::make_shared<Pipeline>(stage, world, next_byte_loss);
      params = stage->parameters();
      loss_weight = 1.0;  // only the last stage has the loss
    } else if (f.strategy == "cp" && f.tp > 1) {
      // Tensor groups of --tp consecutive ranks split the heads and MLP features; the ranks that
      // hold the same shards (one per tensor group) split each sequence and average their
      // gradients (DDP over them): a --cp x --tp mesh, no data dimension.
      context_size = f.cp > 0 ? f.cp : n / f.tp;
      MG_CHECK(context_size * f.tp == n, "--cp ", context_size, " x --tp ", f.tp, " must be the ", n,
               " ranks");
      GroupGrid grid = new_group_grid(world, f.tp);  // .data: the ranks with this rank's tensor shards
      context_group = grid.data;
      tensor_parallel = std::make_shared<TensorParallelGPT>(gpt, grid.tensor, context_group);
      model = std::make_shared<DistributedDataParallel>(*tensor_parallel, context_group);
      params = model->parameters();  // every rank takes the whole batch; loss_weight stays 1/n
    } else if (f.strategy == "cp" || f.strategy == "ulysses") {
      // Context groups of --cp consecutive ranks split each sequence; data groups across them
      // split the batch. Every rank holds the whole model, so DDP averages the gradients over
      // all of them (context_parallel_gpt.h says why that is the gradient of the global loss).
      context_size = f.cp > 0 ? f.cp : n;
      MG_CHECK(context_size <= n && n % context_size == 0, "--cp ", context_size, " must divide the ", n,
               " ranks");
      GroupGrid grid = new_group_grid(world, static_cast<int>(context_size));  // .tensor: the context group
      ContextParallelOptions options;
      options.attention = f.strategy == "cp" ? ContextAttention::ring : ContextAttention::ulysses;
      context = std::make_shared<ContextParallelGPT>(gpt, grid.tensor, options);
      context_group = grid.tensor;
      if (f.cp_fsdp) {  // every rank's gradients are partial in both dimensions: shard over all
        FSDPOptions sharding;
        sharding.auto_wrap = AutoWrapPolicy::module_types_of({"TransformerBlock"});
        fsdp = std::make_shared<FullyShardedDataParallel>(*context, world, sharding);
        model = std::shared_ptr<nn::Module>(context.get(), [](nn::Module*) {});  // FSDP's hooks are on it
        params = fsdp->parameters();
      } else {
        model = std::make_shared<DistributedDataParallel>(*context, world);
        params = model->parameters();
      }
      MG_CHECK(f.batch % grid.data_size == 0, "--batch ", f.batch, " must divide by the ", grid.data_size,
               " data groups");
      rows = f.batch / grid.data_size;
      first_row = grid.data_rank * rows;
    } else {
      throw Error("--strategy must be ddp, zero, zero2, fsdp, tp, pp, hybrid, cp or ulysses, got '" +
                  f.strategy + "'");
    }

    optim::AdamWOptions adamw;
    adamw.lr = 3e-3;
    std::unique_ptr<optim::Optimizer> opt;
    std::unique_ptr<parallel::ZeroRedundancyOptimizer> zero;
    if (f.strategy == "zero" || f.strategy == "zero2") {
      ZeroOptions options;
      if (f.strategy == "zero2") options.stage = ZeroStage::Gradients;
      zero = std::make_unique<parallel::ZeroRedundancyOptimizer>(
          params, world,
          [&](std::vector<Tensor> shard) { return std::make_unique<optim::AdamW>(shard, adamw); }, options);
    } else
      opt = std::make_unique<optim::AdamW>(params, adamw);

    int64_t mine = 0;
    for (const Tensor& p : params) mine += p.numel();
    if (rank == 0)
      std::printf("train_gpt_parallel: --strategy %s on %d ranks, %lld of the %lld parameters on rank 0\n",
                  f.strategy.c_str(), n, static_cast<long long>(mine),
                  static_cast<long long>(gpt.num_parameters()));
    for (int step = 0; step < f.steps; ++step) {
      auto [x, y] = windows(bytes, f.batch, f.seq, step);
      double loss = 0;
      if (zero)
        zero->zero_grad();
      else
        opt->zero_grad();
      if (pipeline) {
        loss =
            pipeline->train_step(pipeline->is_first() ? x : Tensor(), pipeline->is_last() ? y : Tensor(), 4)
                .loss;
      } else if (context_group.defined()) {
        // This rank's positions of its rows (padded to the layout's chunks; padding has no loss).
        // Its share: its tokens' summed loss x (ranks per sequence) / (tokens in its rows), so
        // that the ranks' shares, averaged over the world (as DDP averages their gradients), are
        // the mean over the global batch.
        ContextBatch batch =
            context
                ? context->context_parallel_batch(x.narrow(0, first_row, rows), y.narrow(0, first_row, rows))
                : context_parallel_batch(x, y, context_group, ContextLayout::zigzag, config.block_size);
        Tensor logits = (*model)(batch.inputs);
        CrossEntropyOptions sum;
        sum.reduction = Reduction::Sum;
        Tensor l =
            mul(nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), batch.targets.reshape({-1}), sum),
                double(context_size) / double(batch.real_tokens));
        l.backward();
        loss = l.item<double>();
      } else {
        Tensor l = next_byte_loss((*model)(x.narrow(0, first_row, rows)), y.narrow(0, first_row, rows));
        l.backward();
        loss = l.item<double>();
      }
      if (zero)
        zero->step();
      else
        opt->step();
      Tensor global = full({1}, loss * loss_weight, TensorOptions{DType::f64});
      world.allreduce(global)->wait();
      if (rank == 0 && (step % 5 == 0 || step == f.steps - 1))
        std::printf("step %3d  loss %.6f\n", step, global.item<double>());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_gpt_parallel: %s\n", e.what());
    return 1;
  }
}
