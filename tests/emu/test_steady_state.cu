// What one training step costs the device, counted by the emulator (cuda_emu/emulator.h):
// kernel launches, host synchronisations, cudaMalloc calls and bytes copied host <-> device.
// After warm-up a step must allocate nothing (the caching allocator serves every tensor) and
// synchronise the host only where the loop asks for it (reading the loss). The cross-entropy's
// divisor stays on the device, and its target check is copied back without waiting (24 bytes,
// core/cuda_device_checks.h): a bad target is reported at that same loss read.
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

}  // namespace

TEST_CASE("a steady-state training step on cuda:0 makes no cudaMalloc and syncs only to read the loss",
          "[emu][counters]") {
  const Device dev = Device::cuda(0);
  manual_seed(3);
  nn::MLP model(32, std::vector<int64_t>{64, 64}, 10);
  model.to(dev);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3;
  adamw.weight_decay = 0.01;
  optim::AdamW opt(model.parameters(), adamw);
  manual_seed(4);
  const Tensor x = randn({16, 32}).to(dev);
  const Tensor y = randint(0, 10, {16}).to(dev);
  const PerStep p = count_steps(
      [&] {
        opt.zero_grad();
        Tensor loss = nn::cross_entropy(model(x), y);
        loss.backward();
        opt.step();
        return loss.item<double>();  // the one read the loop asks for
      },
      3, 5);
  CHECK(p.mallocs == 0);
  CHECK(p.syncs == 1);                                             // the loss read
  CHECK(p.d2h == sizeof(float) + 3 * sizeof(unsigned long long));  // the loss and the check's words
  CHECK(p.launches > 0);
}
