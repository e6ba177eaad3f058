// Tensor parallelism under `mpiexec -n K` (K = 2 and 4): every rank builds the tensor-parallel
// layers and, after the same seed, the single-device layers they split; forward, the gradients
// (each rank's slice of the single-device gradient), the input gradient and 10 AdamW steps must
// agree.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <vector>

#include "multigrad.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/tensor_parallel/tensor_parallel.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;
using mg::testing::adamw;
using mg::testing::sgd_momentum;

namespace {

constexpr int64_t kFeatures = 8, kHidden = 16, kBatch = 6;

std::pair<Tensor, Tensor> batch(int step) {
  manual_seed(500 + static_cast<uint64_t>(step));
  return {randn({kBatch, kFeatures}), randint(0, kFeatures, {kBatch})};
}

}  // namespace

TEST_CASE("TensorParallelMLP equals the single-device MLP: forward, gradients, 10 AdamW steps",
          "[mpi][tensor-parallel]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int64_t r = pg.rank(), n = pg.size();
  const int64_t h = kHidden / n;
  manual_seed(42);
  nn::MLP single(kFeatures, {kHidden}, kFeatures);
  manual_seed(42);
  TensorParallelMLP tp(kFeatures, kHidden, pg);
  auto& up = dynamic_cast<nn::Linear&>(single.layers.child("0"));
  auto& down = dynamic_cast<nn::Linear&>(single.layers.child("2"));

  // Forward and the gradients of one step.
  auto [x, y] = batch(0);
  Tensor x_single = x.clone().set_requires_grad(true), x_tp = x.clone().set_requires_grad(true);
  Tensor out_single = single(x_single), out_tp = tp(x_tp);
  testing::require_close(out_tp, out_single, 1e-5);
  nn::cross_entropy(out_single, y).backward();
  nn::cross_entropy(out_tp, y).backward();
  testing::require_close(x_tp.grad(), x_single.grad(), 1e-5);  // f's backward all-reduced the input gradient
  testing::require_close(tp.up->weight.grad(), up.weight.grad().narrow(0, r * h, h), 1e-5);
  testing::require_close(tp.up->bias.grad(), up.bias.grad().narrow(0, r * h, h), 1e-5);
  testing::require_close(tp.down->weight.grad(), down.weight.grad().narrow(1, r * h, h), 1e-5);
  testing::require_close(tp.down->bias.grad(), down.bias.grad(), 1e-5);

  // 10 AdamW steps each: every rank's slices follow the single model's.
  auto opt_single = adamw(single.parameters());
  auto opt_tp = adamw(tp.parameters());
  for (int s = 1; s <= 10; ++s) {
    auto [xs, ys] = batch(s);
    opt_single->zero_grad();
    opt_tp->zero_grad();
    nn::cross_entropy(single(xs), ys).backward();
    nn::cross_entropy(tp(xs), ys).backward();
    opt_single->step();
    opt_tp->step();
  }
  testing::require_close(tp.up->weight, up.weight.narrow(0, r * h, h), 1e-5);
  testing::require_close(tp.up->bias, up.bias.narrow(0, r * h, h), 1e-5);
  testing::require_close(tp.down->weight, down.weight.narrow(1, r * h, h), 1e-5);
  testing::require_close(tp.down->bias, down.bias, 1e-5);
}

TEST_CASE("ColumnParallelLinear with gather_output and RowParallelLinear on the full input equal Linear",
          "[mpi][tensor-parallel]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int64_t n = pg.size();
  auto [x, y] = batch(0);
  (void)y;
  manual_seed(7);
  nn::Linear column_single(kFeatures, 4 * n);
  manual_seed(7);
  ColumnParallelLinear column(kFeatures, 4 * n, pg, true, /*gather_output=*/true);
  Tensor a = x.clone().set_requires_grad(true), b = x.clone().set_requires_grad(true);
  Tensor out_single = column_single(a), out = column(b);
  testing::require_close(out, out_single, 1e-5);
  (out_single * out_single).sum().backward();
  (out * out).sum().backward();
  testing::require_close(b.grad(), a.grad(), 1e-5);

  manual_seed(9);
  nn::Linear row_single(4 * n, 5);
  manual_seed(9);
  RowParallelLinear row(4 * n, 5, pg, true, /*input_is_parallel=*/false);
  manual_seed(3);
  Tensor wide = randn({kBatch, 4 * n});
  Tensor c = wide.clone().set_requires_grad(true), d = wide.clone().set_requires_grad(true);
  Tensor row_out_single = row_single(c), row_out = row(d);
  testing::require_close(row_out, row_out_single, 1e-5);
  (row_out_single * row_out_single).sum().backward();
  (row_out * row_out).sum().backward();
  testing::require_close(d.grad(), c.grad(), 1e-5);
}

TEST_CASE("tensor-parallel layers refuse sizes that do not divide", "[mpi][tensor-parallel]") {
  ProcessGroup pg = testing::mpi_test_group();
  if (pg.size() == 1) return;
  const int64_t odd = pg.size() * 3 + 1;
  REQUIRE_THROWS_WITH(
      ColumnParallelLinear(4, odd, pg),
      Catch::Contains("out_features " + std::to_string(odd) + " do not divide over the group's"));
  REQUIRE_THROWS_WITH(RowParallelLinear(odd, 4, pg), Catch::Contains("in_features"));
}

TEST_CASE("hybrid: DDP over data groups x tensor parallelism over tensor groups equals one device",
          "[mpi][tensor-parallel][hybrid]") {
  ProcessGroup pg = testing::mpi_test_group();
  if (pg.size() != 4) return;              // a 2 x 2 grid: rank = data_rank * 2 + tensor_rank
  GroupGrid grid = new_group_grid(pg, 2);  // a 2 x 2 grid: rank = data_rank * 2 + tensor_rank
  ProcessGroup tensor_group = grid.tensor, data_group = grid.data;
  const int tensor_rank = grid.tensor_rank, data_rank = grid.data_rank;
  REQUIRE(tensor_group.rank() == tensor_rank);
  REQUIRE(data_group.rank() == data_rank);
  const int64_t h = kHidden / 2;

  manual_seed(42);
  nn::MLP single(kFeatures, {kHidden}, kFeatures);
  manual_seed(42);
  TensorParallelMLP tp(kFeatures, kHidden, tensor_group);
  const Device device = pg.device();  // CUDA under MG_TEST_DEVICE=cuda: both subgroups over NCCL
  single.to(device);
  tp.to(device);
  DistributedDataParallel ddp(tp, data_group);  // each replica: both tensor ranks of one data rank
  auto opt_single = adamw(single.parameters());
  auto opt = adamw(ddp.parameters());
  for (int s = 0; s < 5; ++s) {
    // The global batch is 2 x kBatch rows; data rank d trains on rows [d * kBatch, (d + 1) * kBatch).
    manual_seed(900 + static_cast<uint64_t>(s));
    Tensor x = randn({2 * kBatch, kFeatures}).to(device);
    Tensor y = randint(0, kFeatures, {2 * kBatch}).to(device);
    opt_single->zero_grad();
    nn::cross_entropy(single(x), y).backward();
    opt_single->step();
    opt->zero_grad();
    nn::cross_entropy(ddp(x.narrow(0, data_rank * kBatch, kBatch)), y.narrow(0, data_rank * kBatch, kBatch))
        .backward();
    opt->step();
  }
  auto& up = dynamic_cast<nn::Linear&>(single.layers.child("0"));
  auto& down = dynamic_cast<nn::Linear&>(single.layers.child("2"));
  testing::require_close(tp.up->weight, up.weight.narrow(0, tensor_rank * h, h), 1e-5);
  testing::require_close(tp.up->bias, up.bias.narrow(0, tensor_rank * h, h), 1e-5);
  testing::require_close(tp.down->weight, down.weight.narrow(1, tensor_rank * h, h), 1e-5);
  testing::require_close(tp.down->bias, down.bias, 1e-5);
}

namespace {

nn::GPTConfig tiny_gpt_config() {
  nn::GPTConfig c;
  c.vocab_size = 17;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 4;  // divides over 2 and 4 ranks
  c.n_embd = 16;
  return c;
}

std::pair<Tensor, Tensor> token_batch(int step, const nn::GPTConfig& c, Device device) {
  manual_seed(700 + static_cast<uint64_t>(step));
  Tensor x = randint(0, c.vocab_size, {3, c.block_size}), y = randint(0, c.vocab_size, {3, c.block_size});
  return {x.to(device), y.to(device)};
}

Tensor lm_loss(const Tensor& logits, const Tensor& targets) {
  return nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

// Rank r's rows of c_attn's [3C, C] weight (or [3C] bias): its slice of each of q, k and v.
Tensor qkv_rows(const Tensor& full, int64_t r, int64_t n) {
  const int64_t C = full.size(0) / 3, mine = C / n;
  return cat({full.narrow(0, r * mine, mine), full.narrow(0, C + r * mine, mine),
              full.narrow(0, 2 * C + r * mine, mine)},
             0);
}

void require_block_matches(TensorParallelBlock& tp, nn::TransformerBlock& single, int64_t r, int64_t n,
                           bool gradients, double rtol) {
  auto value = [gradients](const Tensor& t) { return gradients ? t.grad() : t; };
  auto close = [&](const char* what, const Tensor& mine, const Tensor& reference) {
    INFO(what << (gradients ? " (gradient)" : " (value)"));
    testing::require_close(value(mine), reference, rtol);
  };
  const int64_t C = single.n_embd, c = C / n, f = 4 * C / n;
  close("ln_1.weight", tp.ln_1.weight, value(single.ln_1.weight));
  close("attn.c_attn.weight", tp.attn->c_attn->weight, qkv_rows(value(single.attn.c_attn.weight), r, n));
  if (gradients) {
    close("attn.c_attn.bias", tp.attn->c_attn->bias, qkv_rows(value(single.attn.c_attn.bias), r, n));
  } else {
    // The key bias adds q . b_k to every score of a query, which softmax ignores: its gradient is
    // zero up to rounding, and AdamW turns that noise into steps of size lr. Compare q and v.
    const Tensor mine = qkv_rows(single.attn.c_attn.bias, r, n);
    const int64_t third = mine.size(0) / 3;
    close("attn.c_attn.bias (q)", tp.attn->c_attn->bias.narrow(0, 0, third), mine.narrow(0, 0, third));
    close("attn.c_attn.bias (v)", tp.attn->c_attn->bias.narrow(0, 2 * third, third),
          mine.narrow(0, 2 * third, third));
  }
  close("attn.c_proj.weight", tp.attn->c_proj->weight, value(single.attn.c_proj.weight).narrow(1, r * c, c));
  close("attn.c_proj.bias", tp.attn->c_proj->bias, value(single.attn.c_proj.bias));
  close("mlp.c_fc.weight", tp.mlp->c_fc->weight, value(single.mlp.c_fc.weight).narrow(0, r * f, f));
  close("mlp.c_proj.weight", tp.mlp->c_proj->weight, value(single.mlp.c_proj.weight).narrow(1, r * f, f));
  close("ln_2.bias", tp.ln_2.bias, value(single.ln_2.bias));
}

}  // namespace

TEST_CASE("TensorParallelGPT equals TinyGPT: logits, gradients, 10 AdamW steps",
          "[mpi][tensor-parallel][gpt]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int64_t r = pg.rank(), n = pg.size();
  const nn::GPTConfig config = tiny_gpt_config();
  const Device device = pg.device();  // CUDA under MG_TEST_DEVICE=cuda: NCCL carries f and g
  manual_seed(42);
  nn::TinyGPT single(config);
  const GeneratorState after_single = generator_state();
  manual_seed(42);
  TensorParallelGPT tp(config, pg);
  // Building it drew exactly what TinyGPT draws: later random numbers are the same too.
  REQUIRE(generator_state().offset == after_single.offset);
  single.to(device);
  tp.to(device);
  REQUIRE(tp.h.size() == 2);
  REQUIRE((tp.num_parameters() < single.num_parameters() || n == 1));

  auto [x, y] = token_batch(0, config, device);
  Tensor logits_single = single(x), logits_tp = tp(x);
  testing::require_close(logits_tp, logits_single, 1e-5);
  lm_loss(logits_single, y).backward();
  lm_loss(logits_tp, y).backward();
  testing::require_close(tp.wte.weight.grad(), single.wte.weight.grad(),
                         1e-5);  // replicated: whole gradients
  testing::require_close(tp.wpe.weight.grad(), single.wpe.weight.grad(), 1e-5);
  testing::require_close(tp.lm_head.weight.grad(), single.lm_head.weight.grad(), 1e-5);
  for (size_t b = 0; b < 2; ++b)
    require_block_matches(dynamic_cast<TensorParallelBlock&>(tp.h[b]),
                          dynamic_cast<nn::TransformerBlock&>(single.h[b]), r, n, /*gradients=*/true, 1e-5);

  auto opt_single = adamw(single.parameters());
  auto opt_tp = adamw(tp.parameters());
  for (int s = 1; s <= 10; ++s) {
    auto [xs, ys] = token_batch(s, config, device);
    opt_single->zero_grad();
    opt_tp->zero_grad();
    lm_loss(single(xs), ys).backward();
    lm_loss(tp(xs), ys).backward();
    opt_single->step();
    opt_tp->step();
  }
  for (size_t b = 0; b < 2; ++b)
    require_block_matches(dynamic_cast<TensorParallelBlock&>(tp.h[b]),
                          dynamic_cast<nn::TransformerBlock&>(single.h[b]), r, n, /*gradients=*/false, 1e-5);
  testing::require_close(tp.wte.weight, single.wte.weight, 1e-5);
  auto [held_out, unused] = token_batch(99, config, device);
  (void)unused;
  NoGradGuard no_grad;
  testing::require_close(tp(held_out), single(held_out), 1e-4);
}

TEST_CASE("TensorParallelGPT refuses heads that do not divide", "[mpi][tensor-parallel][gpt]") {
  ProcessGroup pg = testing::mpi_test_group();
  if (pg.size() == 1) return;
  nn::GPTConfig c = tiny_gpt_config();
  c.n_head = 1;
  c.n_embd = 4 * pg.size();
  REQUIRE_THROWS_WITH(TensorParallelGPT(c, pg), Catch::Contains("n_head 1 does not divide over the group's"));
}

// ---- activation checkpointing: the recompute re-runs the forward's all-reduces in backward ----
namespace {

std::vector<std::vector<float>> parameter_gradients(const nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    out.push_back(p.grad().to(Device::cpu()).to_vector<float>());
  }
  return out;
}

// Every parameter (or its gradient) of `got` equal to `want`'s: bitwise on the CPU. On a GPU the
// embedding's backward adds its rows with atomics (two runs of one model differ there): gradients
// to 1e-6, and values to 1e-4 -- AdamW turns the rounding noise of the key bias's gradient (zero
// up to rounding, see require_block_matches) into steps of size lr.
void require_same(const nn::Module& got, const nn::Module& want, bool gradients, Device device) {
  const auto a = got.named_parameters(), b = want.named_parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(b[i].first << (gradients ? " (gradient)" : " (value)"));
    const Tensor u = gradients ? a[i].second.grad() : a[i].second,
                 v = gradients ? b[i].second.grad() : b[i].second;
    REQUIRE(u.defined());
    if (device.is_cpu())
      CHECK(u.to_vector<float>() == v.to_vector<float>());
    else
      testing::require_close(u, v, gradients ? 1e-6 : 1e-4);
  }
}

}  // namespace

TEST_CASE("TensorParallelMLP in a checkpoint equals it without; backward re-runs its all-reduce",
          "[mpi][tensor-parallel][checkpoint]") {
  ProcessGroup pg = testing::mpi_test_group();
  const Device device = pg.device();
  // Two blocks in a row, the first checkpointed: backward all-reduces the second's input gradient
  // (f), then recomputes the first (g's all-reduce), then all-reduces its input gradient (f) -- the
  // same order on every rank, or the ranks would pair different all-reduces and hang.
  manual_seed(42);
  TensorParallelMLP first(kFeatures, kHidden, pg), second(kFeatures, kHidden, pg);
  manual_seed(42);
  TensorParallelMLP first_checkpointed(kFeatures, kHidden, pg), second_checkpointed(kFeatures, kHidden, pg);
  for (nn::Module* m :
       {static_cast<nn::Module*>(&first), static_cast<nn::Module*>(&second),
        static_cast<nn::Module*>(&first_checkpointed), static_cast<nn::Module*>(&second_checkpointed)})
    m->to(device);
  const Tensor x = batch(0).first.to(device), y = batch(0).second.to(device);
  // Returns the collectives one step issued.
  auto step = [&](TensorParallelMLP& a, TensorParallelMLP& b, bool checkpointed, Tensor& input) {
    input = x.clone().set_requires_grad(true);
    pg.reset_requested_traffic();
    Tensor h = checkpointed ? nn::checkpoint_module(a, input) : a(input);
    nn::cross_entropy(b(relu(h)), y).backward();
    return pg.requested_traffic().calls;
  };
  Tensor x_plain, x_checkpointed;
  const int64_t plain_calls = step(first, second, false, x_plain);
  const int64_t checkpointed_calls = step(first_checkpointed, second_checkpointed, true, x_checkpointed);
  CHECK(plain_calls == 4);                       // per block: g forward, f backward
  CHECK(checkpointed_calls == plain_calls + 1);  // + the first block's g again, in the recompute
  CHECK(x_checkpointed.grad().to(Device::cpu()).to_vector<float>() ==
        x_plain.grad().to(Device::cpu()).to_vector<float>());
  CHECK(parameter_gradients(first_checkpointed) == parameter_gradients(first));
  CHECK(parameter_gradients(second_checkpointed) == parameter_gradients(second));
}

TEST_CASE("TensorParallelGPT with checkpoint_activations and dropout equals it without",
          "[mpi][tensor-parallel][gpt][checkpoint]") {
  ProcessGroup pg = testing::mpi_test_group();
  const Device device = pg.device();
  nn::GPTConfig config = tiny_gpt_config();
  config.dropout = 0.1;  // the recompute must replay every dropout mask, per-rank heads included
  manual_seed(42);
  TensorParallelGPT plain(config, pg);
  config.checkpoint_activations = true;
  manual_seed(42);
  TensorParallelGPT checkpointed(config, pg);
  plain.to(device);
  checkpointed.to(device);
  auto opt_plain = adamw(plain.parameters());
  auto opt_checkpointed = adamw(checkpointed.parameters());
  // Gradients bitwise equal at every step (see require_same), and the collectives: each block's two forward
  // all-reduces (the g's) run again in backward, nothing else is added.
  for (int s = 0; s < 3; ++s) {
    INFO("step " << s);
    const auto tokens = token_batch(s, config, device);
    const Tensor &xs = tokens.first, &ys = tokens.second;
    auto run = [&](TensorParallelGPT& model, optim::Optimizer& opt) {
      opt.zero_grad();
      manual_seed(800 + static_cast<uint64_t>(s));
      pg.reset_requested_traffic();
      lm_loss(model(xs), ys).backward();
      return std::make_pair(pg.requested_traffic().calls, generator_state().offset);
    };
    const auto [plain_calls, plain_offset] = run(plain, *opt_plain);
    const auto [checkpointed_calls, checkpointed_offset] = run(checkpointed, *opt_checkpointed);
    CHECK(plain_calls == 4 * config.n_layer);
    CHECK(checkpointed_calls == plain_calls + 2 * config.n_layer);
    CHECK(checkpointed_offset == plain_offset);  // the replay left the generator where it was
    require_same(checkpointed, plain, /*gradients=*/true, device);
    opt_plain->step();
    opt_checkpointed->step();
  }
  require_same(checkpointed, plain, /*gradients=*/false, device);
}
