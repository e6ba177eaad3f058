// bench_kernels family "step" (order 40): one AdamW training step of each model of the zoo on
// cuda:0 -- zero_grad, forward, cross-entropy, backward, step, and the loss read -- the way a
// training loop runs it, so that what is not a kernel shows too: launch latency and host
// synchronisations.
//
//   MLP          784 -> 256 -> 256 -> 10, batch 128
//   FashionCNN   the default widths (32, 64, hidden 128), batch 32 of 28 x 28
//   ResNetSmall  the default widths (16, 32, 64), batch 16 of 28 x 28
//   TinyGPT      vocab 256, context 64, 2 layers, 4 heads, n_embd 128, batch 8 x 64
//
// Timed (a GPU): the median step after warm-up, CUDA events around it; there is no ceiling, the
// rows are for the record (ratio 1). --profile (the emulation build): one step traced whole and
// PREDICTED on a GPU, the H200 by default (profile.cpp: profile_step): every kernel, each cuBLAS/cuDNN call
// at its roofline, each launch's latency and each host synchronisation. Not run under --check: the emulator's
// steady-state test (tests/emu/test_steady_state.cu) holds every model of the zoo to 0 cudaMalloc and 1 host
// synchronisation a step.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_kernels.h"
#include "multigrad.h"

namespace mg::bench {
namespace {

struct StepCase {
  std::string name, shape;
  std::shared_ptr<nn::Module> model;
  Tensor input, target;
};

std::vector<StepCase> zoo(const Device& dev) {
  std::vector<StepCase> cases;
  manual_seed(1);
  {
    auto m = std::make_shared<nn::MLP>(784, std::vector<int64_t>{256, 256}, 10);
    cases.push_back({"step MLP", "784-256-256-10 b128", m, randn({128, 784}), randint(0, 10, {128})});
  }
  {
    auto m = std::make_shared<nn::FashionCNN>(nn::FashionCNNOptions{});
    cases.push_back({"step FashionCNN", "b32 1x28x28", m, randn({32, 1, 28, 28}), randint(0, 10, {32})});
  }
  {
    auto m = std::make_shared<nn::ResNetSmall>(nn::ResNetOptions{});
    cases.push_back({"step ResNetSmall", "b16 1x28x28", m, randn({16, 1, 28, 28}), randint(0, 10, {16})});
  }
  {
    nn::GPTConfig config;
    config.vocab_size = 256;
    config.block_size = 64;
    config.n_layer = 2;
    config.n_head = 4;
    config.n_embd = 128;
    auto m = std::make_shared<nn::TinyGPT>(config);
    cases.push_back(
        {"step TinyGPT", "b8x64 L2 d128", m, randint(0, 256, {8, 64}), randint(0, 256, {8 * 64})});
  }
  for (StepCase& c : cases) {
    c.model->to(dev);
    c.input = c.input.to(dev);
    c.target = c.target.to(dev);
  }
  return cases;
}

std::vector<KernelResult> bench_step(const BenchOptions& o, const Ceilings&) {
  if (o.check) return {};  // tests/emu/test_steady_state.cu covers the step under the emulator
  const Device dev = Device::cuda(o.device);
  std::vector<KernelResult> rows;
  for (StepCase& c : zoo(dev)) {
    optim::AdamWOptions adamw;
    adamw.lr = 1e-4;
    optim::AdamW opt(c.model->parameters(), adamw);
    double loss_value = 0;
    auto step = [&] {
      opt.zero_grad();
      Tensor logits = (*c.model)(c.input);
      Tensor loss = nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), c.target);
      loss.backward();
      opt.step();
      loss_value = loss.item<double>();
    };
    for (int i = 0; i < 2; ++i) step();  // warm-up: the allocator's cache, cuBLAS handles, Adam state
    KernelResult r;
    r.family = "step";
    r.kernel = c.name;
    r.dtype = "f32";
    r.shape = c.shape;
    r.unit = "us";
    r.reference = "-";
    if (o.profile) {
      r.profile = profile_step(step, o.profile_sites);
      r.seconds = r.profile.predicted_seconds;
    } else {
      r.seconds = median_seconds(step, o);
    }
    r.achieved = r.ceiling = r.seconds * 1e6;
    r.ratio = 1;
    r.failed = !(loss_value == loss_value);  // a NaN loss: the step is broken
    rows.push_back(r);
  }
  return rows;
}

const RegisterFamily kRegistered("step", 40, bench_step);

}  // namespace
}  // namespace mg::bench
