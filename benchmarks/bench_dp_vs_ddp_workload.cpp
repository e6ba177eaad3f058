// bench_dp_vs_ddp's workload: the model, each step's global batch and the loss -- identical in
// every mode and on every rank, so the modes' final parameters can be compared -- and one
// training step timed phase by phase.
#include "bench_dp_vs_ddp_common.h"

#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/safetensors.h"
#include "data/fashion_mnist.h"
#include "nn/zoo.h"

namespace mg::bench_dp_vs_ddp {

std::shared_ptr<nn::Module> make_model(const std::string& name) {
  manual_seed(1234);  // identical initial parameters in every mode and on every rank
  if (name == "mlp") return std::make_shared<nn::MLP>(784, std::vector<int64_t>{256, 128}, 10);
  // No dropout: its masks would differ between a thread per replica and a single device, and the
  // comparison of final parameters would then measure the noise instead of the parallelism.
  if (name == "cnn") {
    nn::FashionCNNOptions cnn;
    cnn.dropout = 0.0;
    return std::make_shared<nn::FashionCNN>(cnn);
  }
  if (name == "resnet") return std::make_shared<nn::ResNetSmall>();
  if (name == "gpt") {
    nn::GPTConfig gpt;
    gpt.block_size = 32;
    return std::make_shared<nn::TinyGPT>(gpt);
  }
  throw Error("--model must be mlp, cnn, resnet or gpt, got '" + name + "'");
}

// Every mode's optimizer: SGD with momentum 0.9 at --lr.
optim::SGDOptions sgd_options(const Config& c) {
  optim::SGDOptions sgd;
  sgd.lr = c.lr;
  sgd.momentum = 0.9;
  return sgd;
}

// Whether the model normalises with batch statistics (BatchNorm): then DataParallel and DDP, like
// PyTorch's, normalise each device's share of the batch with that share's statistics, and their
// training legitimately differs from one device normalising the whole batch.
bool has_batch_statistics(nn::Module& model) {
  for (auto& [name, module] : model.named_modules())
    if (dynamic_cast<nn::BatchNorm*>(module) != nullptr) return true;
  return false;
}

// Step `step`'s global batch: the same in every mode (the seed depends only on the step).
// With --data fashion, consecutive Fashion-MNIST training images instead (normalised).
std::pair<Tensor, Tensor> global_batch(const Config& c, int step) {
  if (c.data == "fashion") {
    static const data::FashionMNIST train(data::Split::Train);
    std::vector<int64_t> indices;
    for (int64_t i = 0; i < c.global_batch; ++i)
      indices.push_back((step * c.global_batch + i) % train.size());
    data::Batch batch = train.get_batch(indices);
    Tensor x = (batch.data - data::FashionMNIST::kMean) * (1.0 / data::FashionMNIST::kStd);
    if (c.model == "mlp") x = x.reshape({c.global_batch, 784});
    return {x, batch.target};
  }
  GeneratorState saved = generator_state();
  manual_seed(777 + static_cast<uint64_t>(step));
  Tensor x, y;
  if (c.model == "mlp") {
    x = randn({c.global_batch, 784});
    y = randint(0, 10, {c.global_batch});
  } else if (c.model == "gpt") {
    x = randint(0, 65, {c.global_batch, 32});
    y = randint(0, 65, {c.global_batch, 32});
  } else {
    x = randn({c.global_batch, 1, 28, 28});
    y = randint(0, 10, {c.global_batch});
  }
  set_generator_state(saved);
  return {x, y};
}

Tensor loss_of(const Tensor& out, const Tensor& y) {
  if (out.dim() == 3) return nn::cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
  return nn::cross_entropy(out, y);
}

Device device_of(const Config& c, int index) {
  return c.device_type == "cuda" ? Device::cuda(index) : Device::cpu(index);
}

StepTimes timed_step(const std::function<Tensor(const Tensor&)>& forward, optim::Optimizer& opt,
                     const Tensor& x, const Tensor& y, bool bf16,
                     const std::function<void()>& before_backward) {
  StepTimes t;
  auto t0 = Clock::now();
  {
    AutocastGuard autocast(DType::bf16, bf16);  // --precision bf16: matmul/conv in bf16, f32 accumulation
    t.output = forward(x);
    t.loss = loss_of(t.output, y);
  }
  t.forward = ms_since(t0);
  auto t1 = Clock::now();
  opt.zero_grad();
  if (before_backward) before_backward();
  t.loss.backward();
  t.backward = ms_since(t1);
  auto t2 = Clock::now();
  opt.step();
  t.optimizer = ms_since(t2);
  t.total = ms_since(t0);
  return t;
}

double peak_mb_of(Device device) {
  if (!device.is_cpu()) return 0;
  return static_cast<double>(cpu_device_memory(device.index).peak_bytes) / (1024.0 * 1024.0);
}

// The trainable parameters at the end of a run, for the comparison between modes. (Buffers are
// left out: BatchNorm's running statistics are per device in DataParallel and DDP, as in PyTorch,
// and never feed back into training-mode forward passes.)
std::string save_params(const Config& c, const std::string& mode, nn::Module& model) {
  std::string path = c.work_dir + "/" + mode + ".safetensors";
  StateDict params;
  for (auto& [name, tensor] : model.named_parameters()) params[name] = tensor;
  save_safetensors(path, params);
  return path;
}

}  // namespace mg::bench_dp_vs_ddp

#endif  // MG_HAS_CLI11 && MG_HAS_NLOHMANN_JSON
