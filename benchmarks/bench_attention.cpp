// bench_attention: one forward and backward of causal scaled_dot_product_attention on the CPU,
// fused (kernels/cpu/attention.cpp) against the composed path (matmul, mul, where, softmax,
// matmul), time and the allocator's peak bytes.
//
//   build/benchmarks/bench_attention [--quick] [--repeats N] [--heads H] [--dim D] [--t T ...]
//   build/benchmarks/bench_attention --gpt [--batch B] [--attention fused|composed|both] [--t T ...]
//
// Default: B = 1, H = 12, D = 64 (GPT-2 small's heads), T = 256, 1024, 2048, causal, f32, 1 warmup
// + 5 timed rounds. --quick: T = 256 and 1024, 1 + 2 rounds. The exit status is 1 when the two
// paths' outputs differ by more than 1e-4 relative.
//
// Method: the machine is shared and noisy, so the two paths alternate within each round (A B,
// then B A in the next round) and each time is the median over the rounds. Peak bytes: the
// CPU allocator's peak over the forward and backward, minus what was live before (q, k, v, the
// upstream gradient): what the attention itself allocates, scores included for the composed path.
// "model GFLOP/s" counts the useful work, 4 T^2 D H / 2 forward and 8 T^2 D H / 2 backward
// (causal halves both); the fused backward does more (it rebuilds P and dP in two passes).
//
// --gpt: GPT-2 small (TinyGPT: 12 layers, 12 heads, 768 wide, vocab 50257) at B = 1 (--batch),
// one forward and backward of the cross-entropy per T, with the fused and the composed attention
// (GPTConfig::attention; --attention picks one): the bytes live after forward beyond what was live
// before (the activations kept for backward), and the peak during the step. Parameters are counted
// apart. Beside them: kept bytes per token (constant in T when nothing grows with T^2), and kept
// bytes in units of one [B, H, T, T] f32 matrix per layer (12 x 4 B H T^2): what the composed path
// adds over the fused one, divided by it, says how many score-sized tensors each layer keeps.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_common.h"
#include "multigrad.h"

using namespace mg;

namespace {

struct Sample {
  double seconds = 0;
  int64_t peak_bytes = 0;
};

Sample run_once(bool fused, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& w, Tensor* out) {
  for (const Tensor* t : {&q, &k, &v}) const_cast<Tensor*>(t)->set_grad(Tensor());
  const int64_t before = cpu_device_memory(0).live_bytes;
  reset_cpu_device_peak(0);
  const auto start = std::chrono::steady_clock::now();
  {
    const AttentionOptions opt{true, 0.0, std::nullopt};
    Tensor y = fused ? scaled_dot_product_attention(q, k, v, opt)
                     : scaled_dot_product_attention_composed(q, k, v, opt);
    sum(mul(y, w)).backward();
    if (out != nullptr) *out = y.detach();
  }
  const auto stop = std::chrono::steady_clock::now();
  return {std::chrono::duration<double>(stop - start).count(), cpu_device_memory(0).peak_bytes - before};
}

double rel_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> u = a.to_vector<double>(), v = b.to_vector<double>();
  double worst = 0, scale = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    worst = std::max(worst, std::abs(u[i] - v[i]));
    scale = std::max(scale, std::abs(v[i]));
  }
  return worst / std::max(scale, 1e-30);
}

// GPT-2 small, one training step's kept and peak bytes.
void gpt_memory(const std::vector<int64_t>& lengths, int64_t B, const std::vector<nn::AttentionImpl>& impls) {
  const int64_t vocab = 50257;
  for (const int64_t T : lengths)
    for (const nn::AttentionImpl impl : impls) {
      const bool fused = impl == nn::AttentionImpl::fused;
      nn::GPTConfig cfg;
      cfg.attention = impl;
      cfg.vocab_size = vocab;
      cfg.block_size = T;
      cfg.n_layer = 12;
      cfg.n_head = 12;
      cfg.n_embd = 768;
      manual_seed(0);
      nn::TinyGPT model(cfg);
      const Tensor idx = randint(0, vocab, {B, T}), targets = randint(0, vocab, {B, T});
      const int64_t before = cpu_device_memory(0).live_bytes;
      reset_cpu_device_peak(0);
      const auto start = std::chrono::steady_clock::now();
      Tensor loss = cross_entropy(model(idx).reshape({B * T, vocab}), targets.reshape({B * T}));
      const int64_t kept = cpu_device_memory(0).live_bytes - before;
      loss.backward();
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double tokens = double(B) * double(T), score_matrices = 12.0 * 4 * 12 * double(B) * double(T) * T;
      std::printf(
          "GPT-2 small, %-9s B = %lld, T = %5lld: parameters and inputs %.0f MB, kept after forward %.0f MB "
          "(%.3f MB a token; %.2f score matrices a layer), peak %.0f MB above the parameters, step %.1f s\n",
          fused ? "fused," : "composed,", static_cast<long long>(B), static_cast<long long>(T), before / 1e6,
          kept / 1e6, kept / tokens / 1e6, kept / score_matrices,
          (cpu_device_memory(0).peak_bytes - before) / 1e6, seconds);
      std::fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, gpt = false;
  int repeats = 5;
  int64_t H = 12, D = 64, batch = 1;
  std::string attention = "both";
  std::vector<int64_t> lengths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--repeats" && i + 1 < argc) {
      repeats = std::atoi(argv[++i]);
    } else if (a == "--heads" && i + 1 < argc) {
      H = std::atoll(argv[++i]);
    } else if (a == "--dim" && i + 1 < argc) {
      D = std::atoll(argv[++i]);
    } else if (a == "--batch" && i + 1 < argc) {
      batch = std::atoll(argv[++i]);
    } else if (a == "--attention" && i + 1 < argc) {
      attention = argv[++i];
    } else if (a == "--gpt") {
      gpt = true;
    } else if (a == "--t" && i + 1 < argc) {
      lengths.push_back(std::atoll(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: %s [--quick | --gpt [--batch B] [--attention fused|composed|both]] [--repeats N] "
                   "[--heads H] [--dim D] [--t T ...]\n",
                   argv[0]);
      return 2;
    }
  }
  if (gpt) {
    std::vector<nn::AttentionImpl> impls;
    if (attention != "composed") impls.push_back(nn::AttentionImpl::fused);
    if (attention != "fused") impls.push_back(nn::AttentionImpl::composed);
    gpt_memory(lengths.empty() ? std::vector<int64_t>{256, 1024, 2048} : lengths, batch, impls);
    return 0;
  }
  if (quick) repeats = 2;
  if (lengths.empty())
    lengths = quick ? std::vector<int64_t>{256, 1024} : std::vector<int64_t>{256, 1024, 2048};

  std::printf("bench_attention: causal SDPA forward + backward, f32, B = 1, H = %lld, D = %lld\n",
              static_cast<long long>(H), static_cast<long long>(D));
  std::printf("%s | %s | load %.2f | %d timed rounds, A/B alternated, medians\n", bench::utc_now().c_str(),
              bench::cpu_model().c_str(), bench::load_average(), repeats);
  std::printf("%6s | %12s %12s %8s | %12s %12s %8s | %13s\n", "T", "fused s", "composed s", "speedup",
              "fused peak", "composed peak", "ratio", "fused GFLOP/s");
  int status = 0;
  for (const int64_t T : lengths) {
    manual_seed(1);
    Tensor q = randn({1, H, T, D}), k = randn({1, H, T, D}), v = randn({1, H, T, D}), w = randn({1, H, T, D});
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor out_fused, out_composed;
    run_once(true, q, k, v, w, &out_fused);  // warmup (and the outputs to compare)
    run_once(false, q, k, v, w, &out_composed);
    const double diff = rel_diff(out_fused, out_composed);
    if (!(diff < 1e-4)) status = 1;
    std::vector<double> fused_s, composed_s;
    int64_t fused_peak = 0, composed_peak = 0;
    for (int r = 0; r < repeats; ++r) {
      for (int leg = 0; leg < 2; ++leg) {
        const bool fused = (leg == 0) == (r % 2 == 0);
        const Sample s = run_once(fused, q, k, v, w, nullptr);
        (fused ? fused_s : composed_s).push_back(s.seconds);
        int64_t& peak = fused ? fused_peak : composed_peak;
        peak = std::max(peak, s.peak_bytes);
      }
    }
    const double tf = bench::median(fused_s), tc = bench::median(composed_s);
    const double flops =
        12.0 * static_cast<double>(T) * static_cast<double>(T) * static_cast<double>(D * H) / 2;
    std::printf("%6lld | %12.4f %12.4f %7.2fx | %9.1f MiB %9.1f MiB %7.1fx | %13.2f%s\n",
                static_cast<long long>(T), tf, tc, tc / tf, static_cast<double>(fused_peak) / (1 << 20),
                static_cast<double>(composed_peak) / (1 << 20),
                static_cast<double>(composed_peak) / static_cast<double>(std::max<int64_t>(fused_peak, 1)),
                flops / tf * 1e-9, diff < 1e-4 ? "" : "  OUTPUTS DIFFER");
    std::fflush(stdout);
  }
  std::printf("one [B, H, T, T] f32 score matrix: 4 H T^2 bytes (48 MiB at T = 1024 for H = 12)\n");
  return status;
}
