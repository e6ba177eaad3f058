// bench_vs_torch: one CPU training step of multigrad beside the same step in libtorch.
//
//   build/benchmarks/bench_vs_torch [--quick] [--steps N] [--warmup N] [--threads N] [--json PATH]
//
// Why: "as fast as PyTorch" is the only ceiling a training step has. Both frameworks run in this
// one process, on the same OpenBLAS and the same libgomp (libtorch 1.13 from Debian links both),
// with the same thread count, so the comparison is of the frameworks and not of the machine.
//
// For each model:
//   1. build it in multigrad (manual_seed(seed)) and the same architecture in libtorch, and copy
//      every multigrad parameter and buffer into the libtorch module: identical starting weights;
//   2. draw a few batches of synthetic data (fixed seed) once and share them, as tensors of
//      identical values, between the two;
//   3. train both with SGD (momentum 0.9; lr 0.05 for the MLPs, 0.01 for the CNN, whose
//      curve at 0.05 turns chaotic after ~15 steps on random data and then amplifies
//      float rounding into visible loss differences), cross-entropy, gradients reset to "none"
//      before each backward (mg's zero_grad; libtorch's grads are reset by hand, PyTorch 2's
//      default), one step of each in turn, alternating which goes first;
//   4. report the median per-step time of each after the warm-up steps, the median of the
//      per-step ratios mg/torch (paired steps ran back to back, so machine noise mostly cancels),
//      and the largest |loss_mg - loss_torch| over the whole curve. Starting from the same
//      weights on the same data, the curves must agree to float rounding.
//
// Models: the 784-256-10 MLP at batch 256 (the floor: multigrad no slower than libtorch),
// the zoo MLP 784-256-128-10 at batch 256, and the zoo FashionCNN at batch 128 with dropout 0 in
// both (the two frameworks' dropout masks come from different generators, so with dropout the
// loss curves could not be compared).
//
// Threads: --threads (default: all cores) goes to omp_set_num_threads, openblas_set_num_threads
// and torch::set_num_threads; the values each library then reports are printed. Run with
// OPENBLAS_CORETYPE set as scripts/common.sh does (Debian's OpenBLAS may otherwise pick its slow
// Prescott kernels on virtual machines); the core OpenBLAS uses is printed.
//
// glibc malloc: libtorch allocates CPU tensors with plain malloc. With glibc's default dynamic
// mmap threshold, large blocks are returned to the kernel on free and page-faulted in again on
// the next step, which made libtorch's CNN step ~3.7x slower here (docs/architecture.md). We
// raise the mmap and trim thresholds before anything runs so libtorch is measured at its best;
// multigrad's own caching allocator does not depend on them.
//
// JSON goes to --json PATH, or else to $MG_BENCH_OUT_DIR/bench_vs_torch.json when that is set.
#include <malloc.h>
#include <omp.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/sgd.h"

#ifdef MG_HAS_OPENBLAS
#include <cblas.h>
#endif

using mg::bench::cpu_model;
using mg::bench::load_average;
using mg::bench::median;
using mg::bench::utc_now;

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  bool quick = false;
  int steps = 0;   // 0: the default for the mode
  int warmup = 0;  // 0: the default for the mode
  int threads = 0;
  std::string json_path;
  bool print_losses = false;
};

// ---- helpers ----------------------------------------------------------------------------------

std::string blas_info() {
#ifdef MG_HAS_OPENBLAS
  return std::string("OpenBLAS ") + openblas_get_config() + ", core " + openblas_get_corename() + ", " +
         std::to_string(openblas_get_num_threads()) + " threads";
#else
  return "multigrad without OpenBLAS (gemm_blocked); libtorch uses its own BLAS";
#endif
}

// A contiguous copy of a multigrad tensor as a libtorch tensor (f32 or i64).
torch::Tensor to_torch(const mg::Tensor& t) {
  mg::Tensor c = t.detach().contiguous();
  std::vector<int64_t> sizes(c.shape().begin(), c.shape().end());
  if (c.dtype() == mg::DType::f32) return torch::from_blob(c.data<float>(), sizes, torch::kFloat32).clone();
  MG_CHECK(c.dtype() == mg::DType::i64, "bench_vs_torch: to_torch supports f32 and i64, got ",
           mg::dtype_name(c.dtype()));
  return torch::from_blob(c.data<int64_t>(), sizes, torch::kInt64).clone();
}

// Copies every parameter and buffer of `from` into `to`, pairing them by registration order
// (both modules register their layers in the same order, and each layer its tensors in
// PyTorch's order: weight, bias, running_mean, running_var, num_batches_tracked).
void copy_weights(const mg::nn::Module& from, torch::nn::Module& to) {
  auto copy_list = [](const std::vector<mg::Tensor>& src, std::vector<torch::Tensor> dst, const char* what) {
    MG_CHECK(src.size() == dst.size(), "bench_vs_torch: multigrad model has ", src.size(), " ", what,
             ", libtorch model has ", dst.size());
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < src.size(); ++i) {
      torch::Tensor value = to_torch(src[i]);
      MG_CHECK(value.sizes() == dst[i].sizes(), "bench_vs_torch: ", what, " ", i, " has shape ",
               mg::shape_str(src[i].shape()), " in multigrad but ", dst[i].sizes(), " in libtorch");
      dst[i].copy_(value);
    }
  };
  copy_list(from.parameters(), to.parameters(), "parameters");
  copy_list(from.buffers(), to.buffers(), "buffers");
}

// ---- the libtorch twins of the multigrad models -------------------------------------------------

torch::nn::Sequential torch_mlp(int64_t in, const std::vector<int64_t>& hidden, int64_t out) {
  torch::nn::Sequential seq;
  int64_t width = in;
  for (int64_t h : hidden) {
    seq->push_back(torch::nn::Linear(width, h));
    seq->push_back(torch::nn::ReLU());
    width = h;
  }
  seq->push_back(torch::nn::Linear(width, out));
  return seq;
}

// nn::FashionCNN (nn/zoo.cpp) with dropout 0: 2 x (conv3x3 no bias + BN + ReLU + maxpool 2),
// Linear, ReLU, Linear.
struct TorchFashionCNNImpl : torch::nn::Module {
  explicit TorchFashionCNNImpl(const mg::nn::FashionCNNOptions& o)
      : conv1(register_module(
            "conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, o.channels1, 3).padding(1).bias(false)))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(o.channels1))),
        conv2(register_module(
            "conv2",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(o.channels1, o.channels2, 3).padding(1).bias(false)))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(o.channels2))),
        fc1(register_module("fc1", torch::nn::Linear(o.channels2 * 7 * 7, o.hidden))),
        fc2(register_module("fc2", torch::nn::Linear(o.hidden, o.num_classes))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    x = torch::max_pool2d(torch::relu(bn2(conv2(x))), 2);
    return fc2(torch::relu(fc1(x.flatten(1))));
  }

  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(TorchFashionCNN);

// ---- one comparison -----------------------------------------------------------------------------

struct Setup {
  std::string name;
  int64_t batch;
  double lr;
  mg::Shape sample_shape;                    // one input sample, e.g. {784} or {1, 28, 28}
  std::shared_ptr<mg::nn::Module> mg_model;  // already initialised (manual_seed before)
  std::shared_ptr<torch::nn::Module> torch_model;
  std::function<torch::Tensor(const torch::Tensor&)> torch_forward;
};

struct Result {
  std::string name;
  int64_t batch;
  double lr;
  double mg_ms, torch_ms, ratio;  // ratio: median over steps of mg/torch
  double max_loss_diff;
  float first_loss, last_loss;  // multigrad's, to show that it trains
};

Result compare(Setup& s, int warmup, int steps, double momentum, bool print_losses) {
  const double lr = s.lr;
  copy_weights(*s.mg_model, *s.torch_model);
  s.mg_model->train();
  s.torch_model->train();

  // A few fixed batches, cycled: the same values for both frameworks.
  constexpr int kBatches = 4;
  std::vector<mg::Tensor> mg_x, mg_y;
  std::vector<torch::Tensor> t_x, t_y;
  mg::manual_seed(1234);
  for (int b = 0; b < kBatches; ++b) {
    mg::Shape shape{s.batch};
    shape.insert(shape.end(), s.sample_shape.begin(), s.sample_shape.end());
    mg_x.push_back(mg::randn(shape));
    mg_y.push_back(mg::randint(0, 10, {s.batch}));
    t_x.push_back(to_torch(mg_x.back()));
    t_y.push_back(to_torch(mg_y.back()));
  }

  mg::optim::SGDOptions mg_sgd;
  mg_sgd.lr = lr;
  mg_sgd.momentum = momentum;
  mg::optim::SGD mg_opt(s.mg_model->parameters(), mg_sgd);
  torch::optim::SGD t_opt(s.torch_model->parameters(), torch::optim::SGDOptions(lr).momentum(momentum));

  auto mg_step = [&](int i) {
    mg::Tensor loss = mg::cross_entropy(s.mg_model->forward(mg_x[i % kBatches]), mg_y[i % kBatches]);
    mg_opt.zero_grad();
    loss.backward();
    mg_opt.step();
    return loss.item<float>();
  };
  auto torch_step = [&](int i) {
    torch::Tensor loss =
        torch::nn::functional::cross_entropy(s.torch_forward(t_x[i % kBatches]), t_y[i % kBatches]);
    for (torch::Tensor& p : s.torch_model->parameters()) p.mutable_grad() = torch::Tensor();
    loss.backward();
    t_opt.step();
    return loss.item<float>();
  };
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };

  std::vector<double> mg_s, torch_s, ratios;
  Result r{s.name, s.batch, lr, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < warmup + steps; ++i) {
    float loss_mg = 0, loss_torch = 0;
    double t_mg = 0, t_torch = 0;
    auto run_mg = [&] {
      auto t0 = Clock::now();
      loss_mg = mg_step(i);
      t_mg = seconds(t0, Clock::now());
    };
    auto run_torch = [&] {
      auto t0 = Clock::now();
      loss_torch = torch_step(i);
      t_torch = seconds(t0, Clock::now());
    };
    if (i % 2 == 0) {
      run_mg();
      run_torch();
    } else {
      run_torch();
      run_mg();
    }
    if (print_losses) std::printf("  step %3d  loss mg %.7f  torch %.7f\n", i, loss_mg, loss_torch);
    if (i == 0) r.first_loss = loss_mg;
    r.last_loss = loss_mg;
    r.max_loss_diff = std::max(r.max_loss_diff, static_cast<double>(std::fabs(loss_mg - loss_torch)));
    if (i >= warmup) {
      mg_s.push_back(t_mg);
      torch_s.push_back(t_torch);
      ratios.push_back(t_mg / t_torch);
    }
  }
  r.mg_ms = 1e3 * median(mg_s);
  r.torch_ms = 1e3 * median(torch_s);
  r.ratio = median(ratios);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  CLI::App app{"multigrad vs libtorch: one CPU training step, same weights, data and threads"};
  app.add_flag("--quick", f.quick, "3 warm-up + 10 timed steps per model");
  app.add_option("--steps", f.steps, "timed steps per model (default 40, --quick 10)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--warmup", f.warmup, "untimed steps first (default 5, --quick 3)")
      ->check(CLI::Range(0, 100000));
  app.add_option("--threads", f.threads, "threads for both frameworks (default: all cores)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--json", f.json_path, "write the table as JSON here");
  app.add_flag("--print-losses", f.print_losses, "print both loss curves, step by step");
  CLI11_PARSE(app, argc, argv);

  try {
    // Before any allocation of consequence: keep large blocks in the heap (see the top comment).
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);

    const int steps = f.steps > 0 ? f.steps : (f.quick ? 10 : 40);
    const int warmup = f.warmup > 0 ? f.warmup : (f.quick ? 3 : 5);
    const int threads =
        f.threads > 0 ? f.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(threads);
#ifdef MG_HAS_OPENBLAS
    openblas_set_num_threads(threads);
#endif
    torch::set_num_threads(threads);
    const double momentum = 0.9;
    const char* coretype = std::getenv("OPENBLAS_CORETYPE");
    const double load_before = load_average();

    std::printf("bench_vs_torch  %s  cpu: %s  load average %.2f\n", utc_now().c_str(), cpu_model().c_str(),
                load_before);
    std::printf("threads: OpenMP %d, torch %d; BLAS: %s; OPENBLAS_CORETYPE=%s\n", omp_get_max_threads(),
                torch::get_num_threads(), blas_info().c_str(), coretype ? coretype : "(unset)");
    std::printf("SGD momentum %.1f, %d warm-up + %d timed steps per model, median; libtorch %s\n\n", momentum,
                warmup, steps, TORCH_VERSION);

    std::vector<Setup> setups;
    {
      mg::manual_seed(0);
      auto mlp = std::make_shared<mg::nn::MLP>(784, std::vector<int64_t>{256}, 10);
      auto t = torch_mlp(784, {256}, 10);
      setups.push_back(
          {"MLP 784-256-10", 256, 0.05, {784}, mlp, t.ptr(), [t](const torch::Tensor& x) mutable {
             return t->forward(x);
           }});
    }
    {
      mg::manual_seed(0);
      auto mlp = std::make_shared<mg::nn::MLP>(784, std::vector<int64_t>{256, 128}, 10);
      auto t = torch_mlp(784, {256, 128}, 10);
      setups.push_back(
          {"MLP 784-256-128-10", 256, 0.05, {784}, mlp, t.ptr(), [t](const torch::Tensor& x) mutable {
             return t->forward(x);
           }});
    }
    {
      mg::manual_seed(0);
      mg::nn::FashionCNNOptions o;
      o.dropout = 0;
      auto cnn = std::make_shared<mg::nn::FashionCNN>(o);
      TorchFashionCNN t(o);
      setups.push_back({"FashionCNN (dropout 0)",
                        128,
                        0.01,
                        {1, 28, 28},
                        cnn,
                        t.ptr(),
                        [t](const torch::Tensor& x) mutable { return t->forward(x); }});
    }

    std::vector<Result> results;
    std::printf("%-24s %6s %6s %12s %15s %10s %12s %14s\n", "model", "batch", "lr", "mg ms/step",
                "torch ms/step", "mg/torch", "max|dloss|", "mg loss");
    for (Setup& s : setups) {
      Result r = compare(s, warmup, steps, momentum, f.print_losses);
      std::printf("%-24s %6lld %6.2f %12.2f %15.2f %10.3f %12.2e %7.3f->%.3f\n", r.name.c_str(),
                  static_cast<long long>(r.batch), r.lr, r.mg_ms, r.torch_ms, r.ratio, r.max_loss_diff,
                  r.first_loss, r.last_loss);
      std::fflush(stdout);
      results.push_back(r);
    }
    const double load_after = load_average();
    std::printf(
        "\nmg/torch: median over steps of (mg step time / the torch step run next to it); < 1 means "
        "multigrad is faster. load average after: %.2f\n",
        load_after);

    std::string json_path = f.json_path;
    if (json_path.empty())
      if (const char* dir = std::getenv("MG_BENCH_OUT_DIR"))
        json_path = std::string(dir) + "/bench_vs_torch.json";
    if (!json_path.empty()) {
      nlohmann::json j;
      j["benchmark"] = "bench_vs_torch";
      j["date_utc"] = utc_now();
      j["machine"] = {{"cpu", cpu_model()},
                      {"threads", threads},
                      {"omp_threads", omp_get_max_threads()},
                      {"torch_threads", torch::get_num_threads()},
                      {"blas", blas_info()},
                      {"openblas_coretype", coretype ? coretype : ""},
                      {"loadavg_before", load_before},
                      {"loadavg_after", load_after}};
      j["settings"] = {{"optimizer", "SGD"},
                       {"momentum", momentum},
                       {"warmup", warmup},
                       {"steps", steps},
                       {"libtorch", TORCH_VERSION}};
      j["rows"] = nlohmann::json::array();
      for (const Result& r : results)
        j["rows"].push_back({{"model", r.name},
                             {"batch", r.batch},
                             {"lr", r.lr},
                             {"mg_ms_per_step", r.mg_ms},
                             {"torch_ms_per_step", r.torch_ms},
                             {"ratio_mg_over_torch", r.ratio},
                             {"max_abs_loss_diff", r.max_loss_diff},
                             {"mg_first_loss", r.first_loss},
                             {"mg_last_loss", r.last_loss}});
      std::ofstream(json_path) << j.dump(2) << "\n";
      std::printf("json: %s\n", json_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_vs_torch: %s\n", e.what());
    return 1;
  }
}
