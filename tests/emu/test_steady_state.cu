// What one training step costs the device, counted by the emulator (cuda_emu/emulator.h):
// kernel launches, host synchronisations, cudaMalloc calls and bytes copied host <-> device,
// for every model of the zoo (nn/zoo.h: MLP, FashionCNN, ResNetSmall, TinyGPT), each an AdamW
// step at small shapes. After warm-up a step must allocate nothing (the caching allocator serves
// every tensor) and synchronise the host only where the loop asks for it (reading the loss). The
// cross-entropy's divisor stays on the device, and its target check is copied back without
// waiting (24 bytes, core/cuda_device_checks.h), as are the embeddings' index checks (16 bytes
// per lookup): a bad target or index is reported at that same loss read.
// Runs on the CPU under the emulator only (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <catch2/catch.hpp>

#include <cstdio>
#include <memory>
#include <vector>

#include "cuda_emu/emulator.h"
#include "multigrad.h"

using namespace mg;

namespace {

struct PerStep {
  double launches, syncs, mallocs, h2d, d2h;
};

// Runs `warmup` steps, then counts `steps` more.
template <class Step>
PerStep count_steps(Step&& step, int warmup, int steps) {
  for (int s = 0; s < warmup; ++s) step();
  const mg_emu::Counters before = mg_emu::counters();
  for (int s = 0; s < steps; ++s) step();
  const mg_emu::Counters after = mg_emu::counters();
  const double n = steps;
  PerStep p{double(after.kernel_launches - before.kernel_launches) / n,
            double(after.host_syncs - before.host_syncs) / n,
            double(after.device_mallocs - before.device_mallocs) / n,
            double(after.bytes_host_to_device - before.bytes_host_to_device) / n,
            double(after.bytes_device_to_host - before.bytes_device_to_host) / n};
  std::printf(
      "per step: %.1f kernel launches, %.1f host syncs, %.1f cudaMalloc, %.0f bytes H2D, %.0f bytes D2H\n",
      p.launches, p.syncs, p.mallocs, p.h2d, p.d2h);
  return p;
}

// One AdamW training step of `model` on cuda:0: forward, cross-entropy (logits flattened to
// [rows, classes]), backward, step, and the loss read.
template <class Model>
PerStep count_training_steps(Model& model, const Tensor& x, const Tensor& y) {
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3;
  adamw.weight_decay = 0.01;
  optim::AdamW opt(model.parameters(), adamw);
  return count_steps(
      [&] {
        opt.zero_grad();
        Tensor logits = model(x);
        Tensor loss = nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
        loss.backward();
        opt.step();
        return loss.item<double>();  // the one read the loop asks for
      },
      3, 5);
}

// What every model's step must satisfy: nothing allocated, the host waits once (the loss read), and
// the only bytes copied back are the loss and the deferred checks' words, copied without waiting:
// the cross-entropy's three, and two (first bad position, its value) per embedding lookup.
void check_steady(const PerStep& p, int embedding_lookups = 0) {
  CHECK(p.mallocs == 0);
  CHECK(p.syncs == 1);  // the loss read
  CHECK(p.d2h == sizeof(float) + (3 + 2 * embedding_lookups) * sizeof(unsigned long long));
  CHECK(p.launches > 0);
}

}  // namespace

TEST_CASE("a steady-state training step on cuda:0 makes no cudaMalloc and syncs only to read the loss",
          "[emu][counters]") {
  const Device dev = Device::cuda(0);
  manual_seed(3);
  nn::MLP model(32, std::vector<int64_t>{64, 64}, 10);
  model.to(dev);
  manual_seed(4);
  const Tensor x = randn({16, 32}).to(dev);
  const Tensor y = randint(0, 10, {16}).to(dev);
  check_steady(count_training_steps(model, x, y));
}

TEST_CASE("zoo steady state: FashionCNN (conv, BatchNorm, max pool, dropout) on cuda:0", "[emu][counters]") {
  const Device dev = Device::cuda(0);
  manual_seed(3);
  nn::FashionCNNOptions options;
  options.channels1 = 4;
  options.channels2 = 8;
  options.hidden = 16;
  nn::FashionCNN model(options);
  model.to(dev);
  manual_seed(4);
  const Tensor x = randn({4, 1, 28, 28}).to(dev);
  const Tensor y = randint(0, 10, {4}).to(dev);
  check_steady(count_training_steps(model, x, y));
}

TEST_CASE("zoo steady state: ResNetSmall (BasicBlocks, downsample shortcuts, average pool) on cuda:0",
          "[emu][counters]") {
  const Device dev = Device::cuda(0);
  manual_seed(3);
  nn::ResNetOptions options;
  options.widths = {4, 8, 8};
  nn::ResNetSmall model(options);
  model.to(dev);
  manual_seed(4);
  const Tensor x = randn({2, 1, 16, 16}).to(dev);
  const Tensor y = randint(0, 10, {2}).to(dev);
  check_steady(count_training_steps(model, x, y));
}

TEST_CASE("TinyGPT's fused attention launches fewer kernels than the composed ops, and stays steady",
          "[emu][counters]") {
  const Device dev = Device::cuda(0);
  nn::GPTConfig config;
  config.vocab_size = 65, config.block_size = 16, config.n_layer = 2, config.n_head = 2, config.n_embd = 32;
  config.dropout = 0.1;  // attention dropout inside the fused kernel, a mask tensor in the composed path
  manual_seed(4);
  const Tensor idx = randint(0, config.vocab_size, {2, 16}).to(dev);
  const Tensor targets = randint(0, config.vocab_size, {2, 16}).to(dev);
  double launches[2];
  for (nn::AttentionImpl impl : {nn::AttentionImpl::fused, nn::AttentionImpl::composed}) {
    config.attention = impl;
    manual_seed(3);
    nn::TinyGPT model(config);
    model.to(dev);
    std::printf("%s attention: ", impl == nn::AttentionImpl::fused ? "fused" : "composed");
    const PerStep p = count_training_steps(model, idx, targets);
    check_steady(p, /*embedding_lookups=*/2);
    launches[impl == nn::AttentionImpl::fused ? 0 : 1] = p.launches;
  }
  // Per layer the fused path launches 1 kernel forward and 2 backward (dQ with delta, dK/dV); the
  // composed path a GEMM, the scale, the mask, the softmax, the dropout and a GEMM forward, and their
  // backward. 15 launches per layer fewer (2 layers).
  CHECK(launches[1] - launches[0] == 30);
}

TEST_CASE("zoo steady state: TinyGPT (embeddings, attention, layer norm, GELU) on cuda:0",
          "[emu][counters]") {
  const Device dev = Device::cuda(0);
  manual_seed(3);
  nn::GPTConfig config;
  config.vocab_size = 65;
  config.block_size = 16;
  config.n_layer = 1;
  config.n_head = 2;
  config.n_embd = 32;
  nn::TinyGPT model(config);
  model.to(dev);
  manual_seed(4);
  const Tensor idx = randint(0, config.vocab_size, {2, 8}).to(dev);
  const Tensor targets = randint(0, config.vocab_size, {2, 8}).to(dev);
  check_steady(count_training_steps(model, idx, targets), /*embedding_lookups=*/2);  // wte, wpe

  // A token id past the vocabulary: the step runs on without waiting, and the loss read reports it.
  const Tensor bad =
      tensor<int64_t>({3, 1, 65, 2, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8}).reshape({2, 8}).to(dev);
  const mg_emu::Counters before = mg_emu::counters();
  Tensor logits = model(bad);
  Tensor loss = nn::cross_entropy(logits.reshape({-1, config.vocab_size}), targets.reshape({-1}));
  loss.backward();
  CHECK(mg_emu::counters().host_syncs == before.host_syncs);
  CHECK_THROWS_WITH(loss.item<double>(), Catch::Contains("embedding: index 65 at position 2") &&
                                             Catch::Contains("next synchronisation"));
}
