// The smallest complete training program: a two-layer MLP learns a noisy
// nonlinear function of 16 inputs, with nothing but tensors, autograd and a
// hand-written SGD-with-momentum step. Prints the loss as it goes down.
//
//   build/examples/train_mlp [--device auto|cpu|cuda:0] [--steps 300] [--batch 256] [--hidden 128]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "multigrad.h"

using namespace mg;

namespace {

struct Flags {
  std::string device = "auto";
  int steps = 300;
  int64_t batch = 256;
  int64_t hidden = 128;
  double lr = 0.05;
};

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      MG_CHECK(i + 1 < argc, "missing value after ", arg);
      return argv[++i];
    };
    if (arg == "--device")
      f.device = value();
    else if (arg == "--steps")
      f.steps = std::stoi(value());
    else if (arg == "--batch")
      f.batch = std::stoll(value());
    else if (arg == "--hidden")
      f.hidden = std::stoll(value());
    else if (arg == "--lr")
      f.lr = std::stod(value());
    else
      throw Error("unknown flag " + arg + " (expected --device, --steps, --batch, --hidden, --lr)");
  }
  return f;
}

// The best device this build can run on: a GPU needs both a device and the CUDA
// kernels (the CUDA backend registers itself when present).
Device pick_device(const std::string& requested) {
  if (requested != "auto") return Device::parse(requested);
  if (cuda::device_count() > 0 && cuda_backend() != nullptr) return Device::cuda(0);
  return Device::cpu(0);
}

// The target: y = 2 tanh(x.w1) + (x.w2)^2 / D + small noise, smooth but not linear.
void make_batch(int64_t batch, int64_t in_features, const Tensor& w1, const Tensor& w2, Device device,
                Tensor& x, Tensor& y) {
  x = randn({batch, in_features});
  Tensor a = matmul(x, w1), b = matmul(x, w2);
  y = add(add(mul(tanh(a), 2.0), div(square(b), static_cast<double>(in_features))),
          mul(randn({batch, 1}), 0.05));
  x = x.to(device);
  y = y.to(device);
}

// Kaiming-uniform init for a [fan_in, fan_out] weight, as a leaf that requires grad.
Tensor init_weight(int64_t fan_in, int64_t fan_out, Device device) {
  const double bound = std::sqrt(6.0 / static_cast<double>(fan_in));
  Tensor w = sub(mul(rand({fan_in, fan_out}), 2.0 * bound), bound).to(device);
  return w.set_requires_grad(true);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags flags = parse_flags(argc, argv);
    const Device device = pick_device(flags.device);
    const int64_t in_features = 16;
    std::printf("multigrad train_mlp: device %s (%s)\n", device.str().c_str(),
                cuda::describe_devices().c_str());
    std::printf("MLP %lld -> %lld -> %lld -> 1, batch %lld, %d steps, SGD lr %.3f momentum 0.9\n",
                static_cast<long long>(in_features), static_cast<long long>(flags.hidden),
                static_cast<long long>(flags.hidden), static_cast<long long>(flags.batch), flags.steps,
                flags.lr);

    manual_seed(1234);
    const Tensor target_w1 = randn({in_features, 1}), target_w2 = randn({in_features, 1});
    std::vector<Tensor> params = {init_weight(in_features, flags.hidden, device),
                                  zeros({flags.hidden}, {DType::f32, device, true}),
                                  init_weight(flags.hidden, flags.hidden, device),
                                  zeros({flags.hidden}, {DType::f32, device, true}),
                                  init_weight(flags.hidden, 1, device),
                                  zeros({1}, {DType::f32, device, true})};
    std::vector<Tensor> velocity;
    for (const Tensor& p : params) velocity.push_back(zeros_like(p));

    Tensor x_eval, y_eval;
    make_batch(4096, in_features, target_w1, target_w2, device, x_eval, y_eval);
    auto forward = [&](const Tensor& x) {
      Tensor h = relu(add(matmul(x, params[0]), params[1]));
      h = relu(add(matmul(h, params[2]), params[3]));
      return add(matmul(h, params[4]), params[5]);
    };
    auto eval_loss = [&]() {
      NoGradGuard no_grad;
      return mean(square(sub(forward(x_eval), y_eval))).item<double>();
    };

    const double initial = eval_loss();
    std::printf("%6s %12s %12s\n", "step", "train_mse", "eval_mse");
    std::printf("%6d %12s %12.5f\n", 0, "-", initial);
    const auto start = std::chrono::steady_clock::now();
    double last_eval = initial;
    for (int step = 1; step <= flags.steps; ++step) {
      Tensor x, y;
      make_batch(flags.batch, in_features, target_w1, target_w2, device, x, y);
      Tensor loss = mean(square(sub(forward(x), y)));
      for (Tensor& p : params) p.set_grad(Tensor());
      loss.backward();
      {
        NoGradGuard no_grad;  // the update itself is not part of the graph
        for (size_t i = 0; i < params.size(); ++i) {
          velocity[i].mul_(0.9).add_(params[i].grad());
          params[i].add_(velocity[i], -flags.lr);
        }
      }
      if (step % 50 == 0 || step == flags.steps) {
        last_eval = eval_loss();
        std::printf("%6d %12.5f %12.5f\n", step, loss.item<double>(), last_eval);
      }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("eval MSE %.5f -> %.5f (%.1fx lower) in %.2f s, %.0f samples/s\n", initial, last_eval,
                initial / last_eval, seconds, flags.steps * static_cast<double>(flags.batch) / seconds);
    if (!(last_eval < initial * 0.5)) {
      std::fprintf(stderr, "train_mlp: the loss did not go down enough (%.5f -> %.5f)\n", initial, last_eval);
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 1;
  }
}
