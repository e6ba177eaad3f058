// bench_parallelism's vocabulary: the configuration, the model and batches every strategy shares,
// what one strategy is (Strategy) and what it measured (Row, Memory), and the ZeRO stages' memory
// formulas the data-parallel family is checked against. Only benchmarks/bench_parallelism.cpp
// includes it (split out to keep that file readable).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "multigrad.h"

namespace mg::bench_parallelism {

using parallel::ProcessGroup;

struct Config {
  int64_t layers = 4, embd = 128, heads = 4, seq = 64, vocab = 65;
  int64_t global_batch = 16;
  int micro_batches = 4;
  int dp_devices = 0;  // 0: N
  int steps = 10, warmup = 2;
  double memory_cap_mb = 0;  // 0: no cap
  std::string json;
};

inline nn::GPTConfig gpt_config(const Config& c) {
  nn::GPTConfig g;
  g.vocab_size = c.vocab;
  g.block_size = c.seq;
  g.n_layer = c.layers;
  g.n_head = c.heads;
  g.n_embd = c.embd;
  g.dropout = 0.0;
  return g;
}

// Every strategy starts from the same weights: the TinyGPT drawn after manual_seed(1).
// `checkpoint_activations` recomputes each block in backward (the weights are the same).
inline std::unique_ptr<nn::TinyGPT> fresh_gpt(const Config& c, bool checkpoint_activations = false) {
  manual_seed(1);
  nn::GPTConfig g = gpt_config(c);
  g.checkpoint_activations = checkpoint_activations;
  return std::make_unique<nn::TinyGPT>(g);
}

// Step s's batch, the same on every rank: inputs [B, T] and next-token targets [B, T].
inline std::pair<Tensor, Tensor> batch(const Config& c, int step) {
  manual_seed(1000 + static_cast<uint64_t>(step));
  Tensor tokens = randint(0, c.vocab, {c.global_batch, c.seq + 1});
  return {tokens.narrow(1, 0, c.seq).contiguous(), tokens.narrow(1, 1, c.seq).contiguous()};
}

inline Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  return nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

inline std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  optim::AdamWOptions o;
  o.lr = 1e-3;
  return std::make_unique<optim::AdamW>(std::move(params), o);
}

inline int64_t tensor_bytes(const std::vector<Tensor>& ts, bool grads) {
  int64_t bytes = 0;
  for (const Tensor& t : ts) {
    const Tensor& x = grads ? t.grad() : t;
    if (x.defined()) bytes += static_cast<int64_t>(x.nbytes());
  }
  return bytes;
}

inline int64_t optimizer_state_bytes(const optim::Optimizer& opt) {
  int64_t bytes = 0;
  for (int64_t i = 0; i < opt.num_params(); ++i)
    for (const auto& [name, t] : opt.state(i)) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

// One rank's (or one logical device's) memory at the end of the run, bytes.
// `rest`: the most a step of this strategy raised the device's memory above where it started
// (activations, temporaries, communication buffers, the gradients being rebuilt), plus
// `buffers`: communication buffers that outlive the steps and so never show as a rise (DDP's
// buckets, P bytes, allocated when DDP is built).
struct Memory {
  int device = 0;
  int64_t params = 0, grads = 0, optimizer = 0, rest = 0, buffers = 0;
  int64_t peak() const { return params + grads + optimizer + rest; }
};

// What a rank of a data-parallel strategy keeps, by the formula (bytes): f32 parameters, f32
// gradients and AdamW's two f32 moments, each whole or 1/N. `slack`: what a measurement may exceed
// or fall short of it by (the flat shards' padding, AdamW's 8-byte step counters).
struct MemoryFormula {
  std::string text;  // bytes per parameter, e.g. "4+(4+8)/N"
  double params = 0, grads = 0, optimizer = 0, slack = 0;
  double gathered = 0;  // FSDP: the most gathered unit bytes alive at once (root + 2 blocks)
};

// What one strategy does on this rank: a training step (returning this rank's share of the
// global loss: the shares sum to it over the ranks; and the step's bubble, pipelines only), the
// groups whose traffic it uses, and its memory afterwards.
struct Strategy {
  std::string name, note;
  bool on_rank0_only = false;  // single and dp: the other ranks wait
  std::function<std::pair<double, double>(int step)> step;
  std::vector<ProcessGroup> groups;
  std::function<std::vector<Memory>()> memory;  // one entry per device this rank drives
  // What this rank has moved so far (bytes, calls): the groups' requested traffic by default.
  std::function<std::pair<double, double>()> moved;
  double predicted_bytes = 0;  // per rank per step (mean over ranks), from the formula
  // What the count may differ from the formula by, per call: each call's figure is rounded to
  // whole bytes; a flat ZeRO shard pads the gradients to a multiple of N elements.
  double slack_per_call = 0.5;
  std::optional<MemoryFormula> memory_formula;     // the data-parallel family
  std::function<double()> gathered_peak;           // FSDP: FSDPStats::peak_gathered_bytes
  std::vector<std::shared_ptr<void> > keep_alive;  // what the modules refer to
};

struct Row {
  std::string name, note;
  double step_ms = 0, samples_per_s = 0, bubble = 0, counted_bytes = 0, counted_calls = 0,
         predicted_bytes = 0;
  double slack_bytes = 0;      // |counted - predicted| allowed (per rank per step)
  std::vector<Memory> memory;  // every device of every rank, rank order
  std::vector<double> losses;
  double loss_diff = 0;  // largest |loss - single's loss| / single's loss over the steps
  std::optional<MemoryFormula> memory_formula;
  double gathered_peak = 0;  // FSDP: the most gathered bytes alive at once, the largest over the ranks
};

inline Memory memory_of(const std::vector<Tensor>& params, int64_t optimizer_bytes, int device_index) {
  Memory m;
  m.device = device_index;
  m.params = tensor_bytes(params, false);
  m.grads = tensor_bytes(params, true);
  m.optimizer = optimizer_bytes;
  return m;
}

// The ZeRO stages' memory per rank for f32 training with AdamW (the paper's mixed-precision
// (2+2+K)Ψ with 4-byte weights and gradients and K = 8 bytes of moments): stage 0 is DDP (4+4+8
// bytes per parameter), 1 shards the optimizer state, 2 the gradients too, 3 the parameters too.
// The slack: each flat shard (a ZeRO bucket or an FSDP unit: at most one per parameter tensor)
// is padded by fewer than N elements in each of the four kinds, and AdamW keeps an 8-byte step
// counter per tensor it steps.
inline MemoryFormula zero_memory(int stage, double param_bytes, int n, const nn::Module& model) {
  static const char* const kText[] = {"4+4+8", "4+4+8/N", "4+(4+8)/N", "(4+4+8)/N"};
  MemoryFormula f;
  f.text = kText[stage];
  f.params = stage >= 3 ? param_bytes / n : param_bytes;
  f.grads = stage >= 2 ? param_bytes / n : param_bytes;
  f.optimizer = 2.0 * (stage >= 1 ? param_bytes / n : param_bytes);
  f.slack = static_cast<double>(model.parameters().size()) * (8.0 + 4.0 * 4.0 * n);
  return f;
}

// ---- the output (bench_parallelism_report.cpp) -----------------------------------------------
double mb(double bytes);
Memory fullest(const Row& r);  // the fullest device of a row: the one that limits the model size
std::string format_fixed(double v, int digits);
void print_table(const Config& c, int world, const std::vector<Row>& rows, double param_bytes);
void write_json(const Config& c, int world, const std::vector<Row>& rows, double param_bytes);  // to c.json

}  // namespace mg::bench_parallelism
