// Fused attention in a few lines: GPT's causal self-attention written with
// nn::scaled_dot_product_attention, one forward and backward, checked against the composed path
// (matmul, where, softmax, matmul) and with the allocator's peak bytes of each printed.
//
//   build/examples/attention [T]        (default T = 1024; B = 1, 12 heads of 64: GPT-2 small)
//
// The q, k, v heads are strided views of c_attn's output ([B, T, H, D] transposed to
// [B, H, T, D]); the fused kernel reads them in place. See docs/attention.md.
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "multigrad.h"

using namespace mg;

namespace {

struct Result {
  Tensor y, grad_x;
  double seconds;
  int64_t peak_bytes;
};

Result attention_step(bool fused, nn::Linear& c_attn, const Tensor& x0, int64_t H, double dropout_p) {
  const int64_t B = x0.size(0), T = x0.size(1), C = x0.size(2), D = C / H;
  Tensor x = x0.detach().clone();
  x.set_requires_grad(true);
  const int64_t before = cpu_device_memory(0).live_bytes;
  reset_cpu_device_peak(0);
  const auto start = std::chrono::steady_clock::now();
  std::vector<Tensor> qkv = split(c_attn(x), C, /*dim=*/2);
  auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };
  const AttentionOptions options{/*causal=*/true, dropout_p, std::nullopt};
  set_generator_state({42, 0});  // the same dropout mask for both paths
  Tensor y =
      fused ? nn::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), options)
            : scaled_dot_product_attention_composed(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), options);
  sum(mul(y, y)).backward();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {y.detach(), x.grad(), seconds, cpu_device_memory(0).peak_bytes - before};
}

double max_abs_diff(const Tensor& a, const Tensor& b) { return max(abs(sub(a, b))).item<double>(); }

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int64_t B = 1, H = 12, C = 768;
  manual_seed(0);
  nn::Linear c_attn(C, 3 * C);
  const Tensor x = randn({B, T, C});
  for (double p : {0.0, 0.1}) {
    const Result fused = attention_step(true, c_attn, x, H, p);
    const Result composed = attention_step(false, c_attn, x, H, p);
    std::printf(
        "T = %lld, dropout %.1f: fused %.3f s, peak %.1f MiB | composed %.3f s, peak %.1f MiB | "
        "max |dy| %.2e, max |dx| %.2e\n",
        static_cast<long long>(T), p, fused.seconds, fused.peak_bytes / 1048576.0, composed.seconds,
        composed.peak_bytes / 1048576.0, max_abs_diff(fused.y, composed.y),
        max_abs_diff(fused.grad_x, composed.grad_x));
  }
  return 0;
}
