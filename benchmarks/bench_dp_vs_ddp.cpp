// bench_dp_vs_ddp: the same model, the same global batch, the same optimizer, trained three ways:
//
//   single  one device, the whole global batch
//   dp      DataParallel over N devices in one process (scatter → replicate → apply → gather)
//   ddp     DistributedDataParallel over N processes (this binary relaunches itself under mpiexec)
//
// and reported side by side: samples/s, scaling efficiency vs single, where a step's time goes
// (forward / backward / communication / exposed communication / optimizer), each device's peak
// memory (DataParallel's device-0 imbalance shows here), and whether the three runs end with the
// same parameters (they should, up to summation order, unless the model normalises per chunk).
//
// On a machine without GPUs the devices are logical CPU devices, one core each: the benchmark
// pins every device (thread or process) to one BLAS/OpenMP thread, so "N devices" really is N
// cores and the single-device baseline is one core. --device-type cuda uses GPUs when the
// build has CUDA tensors.
//
//   build/benchmarks/bench_dp_vs_ddp --model cnn --devices 2 --global-batch 128 --steps 20
//   build/benchmarks/bench_dp_vs_ddp --model mlp --algo ring --json dp_vs_ddp.json
//   mpirun -np 2 build/benchmarks/bench_dp_vs_ddp --model mlp     (DDP only, launched by mpirun)
//
// Output: a table, and with --json a file that scripts/plot_bench turns into charts.
#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#endif

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "core/cuda_runtime.h"
#include "core/safetensors.h"
#include "data/fashion_mnist.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/sgd.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "scaling_model.h"

#if !defined(MG_HAS_CLI11) || !defined(MG_HAS_NLOHMANN_JSON)
int main() {
  std::printf(
      "bench_dp_vs_ddp needs CLI11 and nlohmann-json (apt-get install libcli11-dev nlohmann-json3-dev)\n");
  return 77;
}
#else

using namespace mg;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// 3.1e-07: two significant digits, for differences that span many orders of magnitude.
std::string format_sci(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1e", x);
  return text;
}

struct Config {
  std::string model = "mlp";
  int devices = 0;  // 0: every GPU, or 2 logical CPU devices
  int64_t global_batch = 128;
  int steps = 20;
  int warmup = 3;
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  std::string algo = "native";
  std::string device_type = "auto";  // cuda when this build has CUDA tensors and a GPU, else cpu
  std::string modes = "single,dp,ddp";
  std::string data = "synthetic";
  std::string precision =
      "f32";  // or "bf16" (autocast)  // or "fashion": real Fashion-MNIST images (mlp, cnn, resnet)
  std::string json_path;
  std::string role = "launcher";  // or "ddp-worker"
  std::string result_file;
  std::string work_dir;
  double lr = 0.01;
  std::string sweep_buckets;  // "1,5,25,100": DDP step vs bucket size
  bool predict = false;       // the scaling model (scaling_model.h)
};

json config_json(const Config& c) {
  return {{"model", c.model},
          {"devices", c.devices},
          {"global_batch", c.global_batch},
          {"steps", c.steps},
          {"warmup", c.warmup},
          {"bucket_cap_mb", c.bucket_cap_mb},
          {"first_bucket_cap_mb", c.first_bucket_cap_mb},
          {"algo", c.algo},
          {"device_type", c.device_type},
          {"lr", c.lr},
          {"data", c.data},
          {"precision", c.precision}};
}

// ---- the workload: model, data, loss -------------------------------------------------------------

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

// ---- one mode's measurements ----------------------------------------------------------------------

struct Result {
  std::string mode;
  int devices = 1;
  double step_ms = 0, forward_ms = 0, backward_ms = 0, comm_ms = 0, exposed_ms = 0, optimizer_ms = 0;
  double samples_per_s = 0;
  std::vector<double> peak_mb;  // per device
  std::vector<double> losses;   // per step (all steps, warm-up included)
  std::string params_file;
  std::string note;
  // single: when each gradient became ready in the last backward (fraction of backward, bytes).
  std::vector<std::pair<double, int64_t> > gradient_arrivals;
  int64_t batch_io_bytes = 0;
  // ddp: the link measured by all-reducing 8 B and 4 MiB (latency s, inverse bandwidth s/B).
  double link_alpha_s = 0, link_beta_s_per_byte = 0;
  double bucket_cap_mb = 0;

  json to_json() const {
    json j = {{"mode", mode},
              {"devices", devices},
              {"step_ms", step_ms},
              {"forward_ms", forward_ms},
              {"backward_ms", backward_ms},
              {"comm_ms", comm_ms},
              {"exposed_ms", exposed_ms},
              {"optimizer_ms", optimizer_ms},
              {"samples_per_s", samples_per_s},
              {"peak_mb", peak_mb},
              {"losses", losses},
              {"params_file", params_file},
              {"note", note}};
    j["gradient_arrivals"] = gradient_arrivals;
    j["batch_io_bytes"] = batch_io_bytes;
    j["link_alpha_s"] = link_alpha_s;
    j["link_beta_s_per_byte"] = link_beta_s_per_byte;
    j["bucket_cap_mb"] = bucket_cap_mb;
    return j;
  }
  static Result from_json(const json& j) {
    Result r;
    r.mode = j.at("mode");
    r.devices = j.at("devices");
    r.step_ms = j.at("step_ms");
    r.forward_ms = j.at("forward_ms");
    r.backward_ms = j.at("backward_ms");
    r.comm_ms = j.at("comm_ms");
    r.exposed_ms = j.at("exposed_ms");
    r.optimizer_ms = j.at("optimizer_ms");
    r.samples_per_s = j.at("samples_per_s");
    r.peak_mb = j.at("peak_mb").get<std::vector<double> >();
    r.losses = j.at("losses").get<std::vector<double> >();
    r.params_file = j.at("params_file");
    r.note = j.at("note");
    r.gradient_arrivals = j.at("gradient_arrivals").get<std::vector<std::pair<double, int64_t> > >();
    r.batch_io_bytes = j.at("batch_io_bytes");
    r.link_alpha_s = j.at("link_alpha_s");
    r.link_beta_s_per_byte = j.at("link_beta_s_per_byte");
    r.bucket_cap_mb = j.at("bucket_cap_mb");
    return r;
  }
};

// Accumulates per-step phase times over the timed steps.
struct PhaseTimer {
  double forward = 0, backward = 0, optimizer = 0, comm = 0, exposed = 0, total = 0;
  int steps = 0;
  void add(double f, double b, double o, double all) {
    forward += f;
    backward += b;
    optimizer += o;
    total += all;
    steps += 1;
  }
  void finish(Result& r, int64_t global_batch) const {
    r.forward_ms = forward / steps;
    r.backward_ms = backward / steps;
    r.optimizer_ms = optimizer / steps;
    r.comm_ms = comm / steps;
    r.exposed_ms = exposed / steps;
    r.step_ms = total / steps;
    r.samples_per_s = static_cast<double>(global_batch) / (r.step_ms / 1000.0);
  }
};

// One training step, timed phase by phase. `before_backward` runs just before loss.backward().
struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0, total = 0;  // ms
  Tensor output, loss;
};
StepTimes timed_step(const std::function<Tensor(const Tensor&)>& forward, optim::Optimizer& opt,
                     const Tensor& x, const Tensor& y, bool bf16,
                     const std::function<void()>& before_backward = nullptr) {
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

Result run_single(const Config& c) {
  Result r;
  r.mode = "single";
  Device device = device_of(c, 0);
  auto model = make_model(c.model);
  model->to(device);
  optim::SGD opt(model->parameters(), sgd_options(c));
  PhaseTimer timer;
  reset_cpu_device_peak(device.index);
  // When does each gradient become ready during backward? (The scaling model needs it.)
  Clock::time_point backward_start;
  std::vector<std::pair<double, int64_t> > arrivals;  // (ms since backward start, bytes)
  for (Tensor& p : model->parameters()) {
    int64_t bytes = static_cast<int64_t>(p.nbytes());
    p.register_post_accumulate_grad_hook([&arrivals, &backward_start, bytes](const Tensor&) {
      arrivals.emplace_back(ms_since(backward_start), bytes);
    });
  }
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    auto [x, y] = global_batch(c, s);
    x = x.to(device);
    y = y.to(device);
    StepTimes t = timed_step([&](const Tensor& in) { return (*model)(in); }, opt, x, y, c.precision == "bf16",
                             [&] {
                               arrivals.clear();
                               backward_start = Clock::now();
                             });
    r.batch_io_bytes = static_cast<int64_t>(x.nbytes() + y.nbytes() + t.output.nbytes());
    r.gradient_arrivals.clear();
    for (auto& [ms, bytes] : arrivals) r.gradient_arrivals.emplace_back(ms / t.backward, bytes);
    r.losses.push_back(t.loss.item<double>());
    if (s >= c.warmup) timer.add(t.forward, t.backward, t.optimizer, t.total);
  }
  timer.finish(r, c.global_batch);
  r.peak_mb = {peak_mb_of(device)};
  r.params_file = save_params(c, "single", *model);
  return r;
}

// The reference for models with batch statistics: one device, each global batch cut into the same
// N shares DataParallel scatters (ceil(B / N) rows each, the last one possibly smaller) and DDP's
// ranks take, each share's forward normalised with its own statistics, the loss the share-size
// weighted mean of the shares' losses -- so the gradient is exactly what DP and DDP compute, and
// the final parameters must agree to rounding. Not timed: it only answers "is DP/DDP right?".
Result run_single_over_shares(const Config& c) {
  Result r;
  r.mode = "single-shares";
  Device device = device_of(c, 0);
  auto model = make_model(c.model);
  model->to(device);
  optim::SGD opt(model->parameters(), sgd_options(c));
  const int64_t share_rows = (c.global_batch + c.devices - 1) / c.devices;
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    auto [x, y] = global_batch(c, s);
    x = x.to(device);
    y = y.to(device);
    Tensor loss;
    {
      AutocastGuard autocast(DType::bf16, c.precision == "bf16");
      for (int64_t start = 0; start < c.global_batch; start += share_rows) {
        const int64_t rows = std::min(share_rows, c.global_batch - start);
        Tensor share_loss = loss_of((*model)(x.narrow(0, start, rows)), y.narrow(0, start, rows)) *
                            (static_cast<double>(rows) / static_cast<double>(c.global_batch));
        loss = loss.defined() ? loss + share_loss : share_loss;
      }
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
    r.losses.push_back(loss.item<double>());
  }
  r.params_file = save_params(c, r.mode, *model);
  return r;
}

Result run_dp(const Config& c) {
  Result r;
  r.mode = "dp";
  r.devices = c.devices;
  std::vector<Device> devices;
  for (int i = 0; i < c.devices; ++i) devices.push_back(device_of(c, i));
  auto model = make_model(c.model);
  model->to(devices[0]);
  parallel::DataParallel dp(*model, devices);
  optim::SGD opt(model->parameters(), sgd_options(c));
  PhaseTimer timer;
  for (Device d : devices) reset_cpu_device_peak(d.index);
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    auto [x, y] = global_batch(c, s);
    x = x.to(devices[0]);
    y = y.to(devices[0]);
    StepTimes t = timed_step([&](const Tensor& in) { return dp(in); }, opt, x, y, c.precision == "bf16");
    r.losses.push_back(t.loss.item<double>());
    if (s < c.warmup) continue;
    timer.add(t.forward, t.backward, t.optimizer, t.total);
    // DataParallel's communication is the data movement of forward (scatter, replicate, gather);
    // nothing of it overlaps with compute, so all of it is exposed. (Backward's reduce-add onto
    // device 0 is inside backward_ms.)
    const auto& phases = dp.last_timings();
    double comm = phases.scatter_ms + phases.replicate_ms + phases.gather_ms;
    timer.comm += comm;
    timer.exposed += comm;
  }
  timer.finish(r, c.global_batch);
  for (Device d : devices) r.peak_mb.push_back(peak_mb_of(d));
  r.params_file = save_params(c, "dp", *model);
  return r;
}

// α and β of the link as the native all-reduce sees it: median times of 8 B and 4 MiB, solved
// from T = 2(N−1)α + 2(N−1)/N·S·β (scaling_model.h).
void measure_link(parallel::ProcessGroup& pg, Result& r) {
  if (pg.size() < 2) return;
  auto median_seconds = [&](int64_t elements, int iterations) {
    Tensor t = zeros({elements});
    std::vector<double> times;
    for (int i = 0; i < iterations; ++i) {
      pg.barrier()->wait();
      auto t0 = Clock::now();
      pg.allreduce(t)->wait();
      times.push_back(ms_since(t0) / 1000.0);
    }
    std::sort(times.begin(), times.end());
    Tensor median = full({1}, times[times.size() / 2], TensorOptions{DType::f64});
    pg.allreduce(median, parallel::ReduceOp::Max)->wait();
    return median.item<double>();
  };
  const int n = pg.size();
  const double small = median_seconds(2, 21);
  const double big_bytes = 4.0 * 1024 * 1024;
  const double big = median_seconds(1 << 20, 9);
  r.link_alpha_s = small / (2.0 * (n - 1));
  r.link_beta_s_per_byte = std::max(big - small, 0.0) / (2.0 * (n - 1) / n * big_bytes);
}

// One rank of the DDP run (under mpiexec). Rank 0 writes the result file.
Result run_ddp_rank(const Config& c) {
  parallel::InitOptions init;
  if (c.device_type == "cpu") init.device = Device::cpu(0);  // cuda: cuda:<local rank>
  parallel::ProcessGroup pg = parallel::init_process_group(init);
  MG_CHECK(c.global_batch % pg.size() == 0, "--global-batch ", c.global_batch,
           " must divide by the world size ", pg.size());
  const int64_t per_rank = c.global_batch / pg.size();
  Device device = pg.device();
  auto model = make_model(c.model);
  model->to(device);
  parallel::DDPOptions options;
  options.bucket_cap_mb = c.bucket_cap_mb;
  options.first_bucket_cap_mb = c.first_bucket_cap_mb;
  options.algo = c.algo == "ring" ? parallel::AllreduceAlgo::Ring : parallel::AllreduceAlgo::Native;
  parallel::DistributedDataParallel ddp(*model, pg, options);
  optim::SGD opt(ddp.parameters(), sgd_options(c));
  Result r;
  r.mode = "ddp";
  r.devices = pg.size();
  PhaseTimer timer;
  reset_cpu_device_peak(device.index);
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    if (s == c.warmup) ddp.reset_stats();
    auto [x, y] = global_batch(c, s);
    x = x.narrow(0, pg.rank() * per_rank, per_rank).to(device);
    y = y.narrow(0, pg.rank() * per_rank, per_rank).to(device);
    pg.barrier()->wait();  // steps start together, so the step time is the slowest rank's
    StepTimes t = timed_step([&](const Tensor& in) { return ddp(in); }, opt, x, y, c.precision == "bf16");
    // The global loss (mean over ranks), comparable with the other modes.
    Tensor global_loss = t.loss.detach().reshape({1}).clone();
    pg.allreduce(global_loss, parallel::ReduceOp::Avg)->wait();
    r.losses.push_back(global_loss.item<double>());
    if (s >= c.warmup) timer.add(t.forward, t.backward, t.optimizer, t.total);
  }
  timer.comm = ddp.stats().comm_ms;
  timer.exposed = ddp.stats().exposed_ms;
  timer.finish(r, c.global_batch);
  // Each rank's peak, gathered to rank 0.
  Tensor mine = full({1}, peak_mb_of(device), TensorOptions{DType::f64});
  Tensor all = zeros({pg.size()}, TensorOptions{DType::f64});
  pg.allgather(all, mine)->wait();
  r.peak_mb = all.to_vector<double>();
  // The slowest rank's step time is the job's: average the phase times, take the max step time.
  Tensor step = full({1}, r.step_ms, TensorOptions{DType::f64});
  pg.allreduce(step, parallel::ReduceOp::Max)->wait();
  r.step_ms = step.item<double>();
  r.samples_per_s = static_cast<double>(c.global_batch) / (r.step_ms / 1000.0);
  r.note = str_cat(ddp.bucket_layout().size(), " buckets of at most ", c.bucket_cap_mb, " MB, ", c.algo);
  r.bucket_cap_mb = c.bucket_cap_mb;
  measure_link(pg, r);
  if (pg.is_main()) {
    r.params_file = save_params(c, "ddp", *model);
    if (!c.result_file.empty()) {
      std::ofstream out(c.result_file);
      out << r.to_json().dump(2);
    }
  }
  pg.barrier()->wait();
  return r;
}

// Relaunches this binary under mpiexec for the DDP mode and reads rank 0's result.
Result launch_ddp(const Config& c, const std::vector<std::string>& forwarded_args) {
  std::string result_file = c.work_dir + "/ddp_result.json";
  std::filesystem::remove(result_file);
  std::string command = "mpiexec -n " + std::to_string(c.devices);
  if (std::system("mpiexec --version 2>/dev/null | grep -Eq 'Open MPI|OpenRTE'") == 0) {
    command += " --oversubscribe";
    if (geteuid() == 0) command += " --allow-run-as-root";
  }
  command += " " + std::filesystem::read_symlink("/proc/self/exe").string();
  for (const auto& arg : forwarded_args) command += " '" + arg + "'";
  command += " --role ddp-worker --result-file '" + result_file + "' --work-dir '" + c.work_dir + "'";
  int status = std::system(command.c_str());
  MG_CHECK(status == 0 && std::filesystem::exists(result_file), "the DDP run failed (", command,
           " exited with status ", status, ")");
  std::ifstream in(result_file);
  return Result::from_json(json::parse(in));
}

// max over tensors of ‖a − b‖ / ‖b‖.
double max_relative_difference(const std::string& a_path, const std::string& b_path) {
  auto a = load_safetensors(a_path).tensors;
  auto b = load_safetensors(b_path).tensors;
  double worst = 0;
  for (auto& [name, tb] : b) {
    auto it = a.find(name);
    MG_CHECK(it != a.end(), "bench_dp_vs_ddp: '", name, "' missing from ", a_path);
    auto u = it->second.to_vector<double>(), v = tb.to_vector<double>();
    double diff = 0, norm = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      diff += (u[i] - v[i]) * (u[i] - v[i]);
      norm += v[i] * v[i];
    }
    worst = std::max(worst, std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30));
  }
  return worst;
}

// How a parallel mode's final parameters compare with one device's.
struct Agreement {
  double vs_single = -1;  // max relative difference to one device on the whole batch (-1: not compared)
  double vs_shares = -1;  // ... to one device over the same N shares (models with batch statistics)
  std::string verdict = "-";
  bool differs = false;  // beyond rounding: DP or DDP is wrong
};

// Rounding alone (another summation order in the gradient reduction, carried through every step)
// stays below this. Measured on CPU devices, 2026-12-02, global batch 96, 20 steps, N = 2 and 3,
// native and ring all-reduce (the largest relative parameter difference from the reference):
//   f32:  mlp <= 9.1e-8, gpt <= 1.4e-6, cnn/resnet identical at N = 2.
//   bf16: mlp <= 9.3e-4, gpt <= 1.2e-2 (N = 3; 4.7e-3 at N = 2), cnn/resnet DP <= 1.3e-7. Under
//         autocast a gradient that differs in its last f32 bit can round a weight's bf16 copy the
//         other way, and the flip is carried by every later step: differences of 2^-8 per flipped
//         element, growing with the steps, where f32 stays at its own rounding.
// bf16: 2.5e-2, about twice the largest measured (gpt at N = 3). f32: 1e-4, 70x the largest
// measured, left for GPU runs whose library algorithms sum in an order that depends on the batch
// size (not measured here). The table and the runs: docs/benchmarks.md, "The verdict and its tolerances".
double agreement_tolerance(const Config& c) { return c.precision == "bf16" ? 2.5e-2 : 1e-4; }

// `reference` is the single-device run that computes the same gradients as the parallel modes:
// plain single, or single-shares when the model has batch statistics.
std::vector<Agreement> compare_with_single(const Config& c, const std::vector<Result>& results,
                                           const Result* single, const Result* reference) {
  std::vector<Agreement> out;
  for (const Result& r : results) {
    Agreement a;
    if (r.mode == "single") {
      a.verdict = "(reference)";
    } else if (reference != nullptr) {
      if (single != nullptr) a.vs_single = max_relative_difference(r.params_file, single->params_file);
      const double diff =
          reference == single
              ? a.vs_single
              : (a.vs_shares = max_relative_difference(r.params_file, reference->params_file));
      a.differs = !(diff <= agreement_tolerance(c));
      a.verdict =
          a.differs ? str_cat("DIFFER by ", format_sci(diff), " (> ", format_sci(agreement_tolerance(c)), ")")
          : diff == 0 ? std::string("identical (bitwise)")
                      : str_cat("agree to ", format_sci(diff));
    }
    out.push_back(a);
  }
  return out;
}

void print_table(const Config& c, const std::vector<Result>& results, const std::vector<Agreement>& agreement,
                 bool batch_statistics) {
  std::printf(
      "\nbench_dp_vs_ddp: model %s on %s data, global batch %lld, %d timed steps (+%d warm-up), %s devices, "
      "SGD momentum\n",
      c.model.c_str(), c.data.c_str(), static_cast<long long>(c.global_batch), c.steps, c.warmup,
      c.device_type.c_str());
  std::printf("%-7s %3s %10s %7s %9s %9s %9s %9s %9s %9s  %-22s %s\n", "mode", "N", "samples/s", "scale",
              "step ms", "fwd ms", "bwd ms", "comm ms", "exposed", "optim ms", "peak MB per device",
              "params vs single");
  double base = results.front().mode == "single" ? results.front().samples_per_s : 0;
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::string peaks;
    for (double p : r.peak_mb)
      peaks += str_cat(peaks.empty() ? "" : "/", static_cast<int64_t>(std::lround(p)));
    std::string scale =
        base > 0 ? str_cat(static_cast<int>(std::lround(100 * r.samples_per_s / base / r.devices)), "%")
                 : "-";
    std::printf("%-7s %3d %10.0f %7s %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f  %-22s %s\n", r.mode.c_str(),
                r.devices, r.samples_per_s, scale.c_str(), r.step_ms, r.forward_ms, r.backward_ms, r.comm_ms,
                r.exposed_ms, r.optimizer_ms, peaks.c_str(), agreement[i].verdict.c_str());
  }
  std::printf(
      "scale = samples/s ÷ (single's samples/s × N): 100%% is perfect scaling. comm for dp = scatter + "
      "replicate + gather (never overlapped); for ddp = bucket all-reduce busy time, of which 'exposed' "
      "was not hidden behind backward.\n");
  for (const Result& r : results)
    if (!r.note.empty()) std::printf("%s: %s\n", r.mode.c_str(), r.note.c_str());
  std::printf(
      "params vs single: the largest ||p - p_single|| / ||p_single|| over the parameters after the last "
      "step; rounding alone stays below %s.\n",
      format_sci(agreement_tolerance(c)).c_str());
  if (batch_statistics) {
    std::string whole;
    for (size_t i = 0; i < results.size(); ++i)
      if (agreement[i].vs_single >= 0)
        whole +=
            str_cat(whole.empty() ? "" : ", ", results[i].mode, " by ", format_sci(agreement[i].vs_single));
    std::printf(
        "  This model has BatchNorm: DP and DDP normalise each device's share of the batch with that share's "
        "own statistics, as in PyTorch, so the reference is one device normalising the same %d shares of "
        "each batch (the gradients DP and DDP compute).%s\n",
        c.devices,
        whole.empty() ? ""
                      : str_cat(" From one device normalising the whole batch they differ (", whole,
                                "): BatchNorm statistics are per device, as in PyTorch.")
                            .c_str());
  }
}

// `args` without the given options (as "--key value" or "--key=value"; flags have no value).
std::vector<std::string> without_options(const std::vector<std::string>& args,
                                         const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const auto& key : keys) {
      if (args[i] == key) {
        drop = true;
        bool is_flag = key == "--predict";
        if (!is_flag && i + 1 < args.size()) ++i;  // its value
      } else if (args[i].rfind(key + "=", 0) == 0) {
        drop = true;
      }
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

// DDP once per bucket cap: how bucket size trades latency (many small all-reduces) against
// overlap (one big all-reduce can only start when backward is over).
json run_bucket_sweep(const Config& c, const std::vector<std::string>& forwarded) {
  std::printf("\nDDP bucket-size sweep (%s, N=%d, %s):\n", c.model.c_str(), c.devices, c.algo.c_str());
  std::printf("%10s %8s %9s %9s %9s %9s\n", "cap MB", "buckets", "step ms", "comm ms", "exposed", "exposed%");
  json rows = json::array();
  std::string list = c.sweep_buckets + ",";
  for (size_t start = 0, comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1) {
    std::string item = list.substr(start, comma - start);
    if (item.empty()) continue;
    double cap = std::stod(item);
    Config one = c;
    one.bucket_cap_mb = cap;
    std::vector<std::string> args = without_options(forwarded, {"--bucket-cap-mb", "--modes"});
    args.push_back("--bucket-cap-mb");
    args.push_back(item);
    Result r = launch_ddp(one, args);
    double share = r.comm_ms > 0 ? 100.0 * r.exposed_ms / r.comm_ms : 0;
    std::printf("%10g %8s %9.2f %9.2f %9.2f %8.0f%%\n", cap, r.note.substr(0, r.note.find(' ')).c_str(),
                r.step_ms, r.comm_ms, r.exposed_ms, share);
    json row = r.to_json();
    row["exposed_share"] = share / 100.0;
    rows.push_back(row);
  }
  return rows;
}

// The scaling model fed with this run's single-device measurements; checked against the DDP and
// DP runs it could measure.
json predict_scaling(const Config& c, const std::vector<Result>& results) {
  const Result* single = nullptr;
  const Result* ddp = nullptr;
  const Result* dp = nullptr;
  for (const Result& r : results) {
    if (r.mode == "single") single = &r;
    if (r.mode == "ddp") ddp = &r;
    if (r.mode == "dp") dp = &r;
  }
  MG_CHECK(single != nullptr, "--predict needs the single mode (it measures the per-layer backward times)");
  bench::Workload w;
  w.forward_s = single->forward_ms / 1000;
  w.backward_s = single->backward_ms / 1000;
  w.optimizer_s = single->optimizer_ms / 1000;
  w.gradients = single->gradient_arrivals;
  w.batch_io_bytes = single->batch_io_bytes;
  w.bucket_cap_mb = c.bucket_cap_mb;
  w.first_bucket_cap_mb = c.first_bucket_cap_mb;
  std::vector<bench::Link> links = bench::link_presets();
  if (ddp != nullptr && ddp->link_beta_s_per_byte > 0)
    links.insert(links.begin(), {"measured here (MPI)", ddp->link_alpha_s, ddp->link_beta_s_per_byte});

  json out = json::array();
  std::printf(
      "\nPredicted step time (ms) and speedup over one device, global batch %lld (scaling_model.h):\n",
      static_cast<long long>(c.global_batch));
  const double one = (w.forward_s + w.backward_s + w.optimizer_s) * 1000;
  for (const bench::Link& link : links) {
    std::printf("  link: %s (alpha %.1f us, %.2f GB/s)\n", link.name.c_str(), link.alpha_s * 1e6,
                1e-9 / link.beta_s_per_byte);
    std::printf("  %5s %10s %8s %10s %8s %9s\n", "N", "DP ms", "DP x", "DDP ms", "DDP x", "exposed");
    for (int n : {2, 4, 8, 16, 32, 64}) {
      bench::Prediction pdp = bench::predict_dp(w, link, n), pddp = bench::predict_ddp(w, link, n);
      std::printf("  %5d %10.2f %8.2f %10.2f %8.2f %8.0f%%\n", n, pdp.step_s * 1000,
                  one / (pdp.step_s * 1000), pddp.step_s * 1000, one / (pddp.step_s * 1000),
                  pddp.comm_s > 0 ? 100 * pddp.exposed_s / pddp.comm_s : 0.0);
      out.push_back({{"link", link.name},
                     {"devices", n},
                     {"dp_step_ms", pdp.step_s * 1000},
                     {"ddp_step_ms", pddp.step_s * 1000},
                     {"ddp_exposed_ms", pddp.exposed_s * 1000},
                     {"ddp_comm_ms", pddp.comm_s * 1000}});
    }
  }
  // The model against what was measured at N = c.devices.
  if (ddp != nullptr && ddp->link_beta_s_per_byte > 0) {
    bench::Prediction p = bench::predict_ddp(w, links.front(), ddp->devices);
    std::printf("  check: DDP at N=%d predicted %.2f ms, measured %.2f ms (error %+.0f%%)\n", ddp->devices,
                p.step_s * 1000, ddp->step_ms, 100 * (p.step_s * 1000 - ddp->step_ms) / ddp->step_ms);
    out.push_back({{"check", "ddp"},
                   {"devices", ddp->devices},
                   {"predicted_ms", p.step_s * 1000},
                   {"measured_ms", ddp->step_ms}});
    if (dp != nullptr) {
      bench::Prediction q = bench::predict_dp(w, links.front(), dp->devices);
      std::printf(
          "  check: DP at N=%d predicted %.2f ms, measured %.2f ms (error %+.0f%%; on logical CPU devices "
          "DP's copies are memcpy, not the MPI link, and the model leaves out the per-step replica "
          "set-up)\n",
          dp->devices, q.step_s * 1000, dp->step_ms, 100 * (q.step_s * 1000 - dp->step_ms) / dp->step_ms);
      out.push_back({{"check", "dp"},
                     {"devices", dp->devices},
                     {"predicted_ms", q.step_s * 1000},
                     {"measured_ms", dp->step_ms}});
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"DataParallel vs DistributedDataParallel on the same model and global batch"};
  // A flag given twice takes its last value: scripts/run passes its defaults first and the user's
  // extra flags after them (./scripts/run --steps 50).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  Config c;
  app.add_option("--model", c.model, "mlp, cnn, resnet or gpt");
  app.add_option("--devices", c.devices, "N: devices for dp, ranks for ddp (0: all GPUs, or 2 CPU devices)");
  app.add_option("--global-batch", c.global_batch, "samples per step over all devices");
  app.add_option("--steps", c.steps, "timed steps");
  app.add_option("--warmup", c.warmup, "untimed steps first");
  app.add_option("--bucket-cap-mb", c.bucket_cap_mb, "DDP bucket size");
  app.add_option("--first-bucket-cap-mb", c.first_bucket_cap_mb, "DDP first bucket size");
  app.add_option("--algo", c.algo, "DDP all-reduce: native or ring");
  app.add_option("--device-type", c.device_type, "auto, cpu (logical devices, one core each) or cuda");
  app.add_option("--modes", c.modes, "comma-separated subset of single,dp,ddp");
  app.add_option("--data", c.data, "synthetic, or fashion (Fashion-MNIST training images; not with gpt)");
  app.add_option("--lr", c.lr, "SGD learning rate");
  app.add_option("--precision", c.precision,
                 "f32, or bf16 (autocast: matmul/conv in bf16 with f32 accumulation)");
  app.add_option("--json", c.json_path, "write the results here");
  app.add_option("--role", c.role, "internal: launcher or ddp-worker");
  app.add_option("--result-file", c.result_file, "internal: where a ddp worker writes rank 0's result");
  app.add_option("--work-dir", c.work_dir, "where final parameters are written (default: a temp dir)");
  app.add_option("--sweep-buckets", c.sweep_buckets, "comma-separated bucket caps in MB: one DDP run each");
  app.add_flag("--predict", c.predict, "predict DP and DDP at 2-64 devices from this run (scaling_model.h)");
  CLI11_PARSE(app, argc, argv);

  try {
    MG_CHECK(c.algo == "native" || c.algo == "ring", "--algo must be native or ring, got '", c.algo, "'");
    MG_CHECK(c.precision == "f32" || c.precision == "bf16", "--precision must be f32 or bf16, got '",
             c.precision, "'");
    if (c.device_type == "auto") c.device_type = cuda_backend() && cuda::device_count() > 0 ? "cuda" : "cpu";
    MG_CHECK(c.device_type == "cpu" || c.device_type == "cuda",
             "--device-type must be auto, cpu or cuda, got '", c.device_type, "'");
    if (c.devices == 0) c.devices = c.device_type == "cuda" ? cuda::device_count() : 2;
    MG_CHECK(c.devices >= 1, "--devices must be >= 1");
    MG_CHECK(c.data == "synthetic" || (c.data == "fashion" && c.model != "gpt"),
             "--data must be synthetic, or fashion with mlp/cnn/resnet; got '", c.data, "' with ", c.model);
    MG_CHECK(c.steps >= 1 && c.warmup >= 0, "--steps must be >= 1 and --warmup >= 0");
    // One core per device: a logical CPU device is one thread of BLAS/OpenMP, or "N devices"
    // would just be N threads fighting over the same cores. The variables must be set before
    // the libraries start, so the benchmark re-executes itself once with them.
    if (c.device_type == "cpu") bench::reexec_with_one_thread(argv, "bench_dp_vs_ddp");
    if (c.work_dir.empty()) {
      c.work_dir =
          (std::filesystem::temp_directory_path() / ("mg_bench_dp_vs_ddp_" + std::to_string(getpid())))
              .string();
    }
    std::filesystem::create_directories(c.work_dir);

    bool under_mpi = parallel::detect_launch().world_size > 1;
    if (c.role == "ddp-worker" || under_mpi) {
      Result r = run_ddp_rank(c);
      if (c.role != "ddp-worker" && parallel::detect_launch().rank == 0)
        print_table(c, {r}, {Agreement{}}, false);
      return 0;
    }

    // Flags to forward to the DDP workers: everything the user gave but the launcher-only ones.
    std::vector<std::string> forwarded = without_options(std::vector<std::string>(argv + 1, argv + argc),
                                                         {"--json", "--sweep-buckets", "--predict"});

    std::vector<Result> results;
    auto wants = [&](const std::string& mode) {
      return ("," + c.modes + ",").find("," + mode + ",") != std::string::npos;
    };
    if (wants("single")) results.push_back(run_single(c));
    if (wants("dp")) results.push_back(run_dp(c));
    if (wants("ddp")) results.push_back(launch_ddp(c, forwarded));

    // The verdict: do DP and DDP end where one device computing the same gradients ends? There is
    // always a reference: without `single` in --modes, one device still trains (untimed, not a row
    // of the table) so that `--modes dp,ddp` or `--modes ddp` cannot pass unchecked.
    const bool batch_statistics = has_batch_statistics(*make_model(c.model));
    const Result* single = !results.empty() && results.front().mode == "single" ? &results.front() : nullptr;
    const bool parallel_modes = results.size() > (single ? 1u : 0u);
    Result shares, untimed_single;
    if (single == nullptr && parallel_modes && !batch_statistics) {
      untimed_single = run_single(c);
      single = &untimed_single;
    }
    const Result* reference = single;
    if (batch_statistics && parallel_modes) {
      shares = run_single_over_shares(c);
      reference = &shares;
    }
    std::vector<Agreement> agreement = compare_with_single(c, results, single, reference);
    print_table(c, results, agreement, batch_statistics);
    if (single == &untimed_single)
      std::printf("The reference (one device, the whole batch) ran untimed: 'single' is not in --modes.\n");
    // DP and DDP compute the same gradients: they must also agree with each other.
    std::string dp_vs_ddp;
    const Result *dp = nullptr, *ddp = nullptr;
    for (const Result& r : results) {
      if (r.mode == "dp") dp = &r;
      if (r.mode == "ddp") ddp = &r;
    }
    if (dp != nullptr && ddp != nullptr) {
      const double diff = max_relative_difference(dp->params_file, ddp->params_file);
      std::printf("dp vs ddp: the largest relative parameter difference is %s (tolerance %s)\n",
                  format_sci(diff).c_str(), format_sci(agreement_tolerance(c)).c_str());
      if (!(diff <= agreement_tolerance(c)))
        dp_vs_ddp = str_cat("DIFFER by ", format_sci(diff), " (> ", format_sci(agreement_tolerance(c)), ")");
    }

    json sweep = json::array();
    if (!c.sweep_buckets.empty()) sweep = run_bucket_sweep(c, forwarded);
    json prediction = json::array();
    if (c.predict) prediction = predict_scaling(c, results);

    if (!c.json_path.empty()) {
      json out = {{"benchmark", "bench_dp_vs_ddp"}, {"config", config_json(c)}, {"results", json::array()}};
      for (size_t i = 0; i < results.size(); ++i) {
        json r = results[i].to_json();
        r["params_rel_diff_vs_single"] = agreement[i].vs_single;
        r["params_rel_diff_vs_single_over_shares"] = agreement[i].vs_shares;
        r["params_verdict"] = agreement[i].verdict;
        out["results"].push_back(r);
      }
      out["bucket_sweep"] = sweep;
      out["prediction"] = prediction;
      std::ofstream(c.json_path) << out.dump(2) << "\n";
      std::printf("wrote %s\n", c.json_path.c_str());
    }
    std::filesystem::remove_all(c.work_dir);
    for (size_t i = 0; i < results.size(); ++i) {
      if (agreement[i].differs) {
        std::fprintf(stderr, "bench_dp_vs_ddp: %s's parameters differ from one device's: %s\n",
                     results[i].mode.c_str(), agreement[i].verdict.c_str());
        return 3;
      }
    }
    if (!dp_vs_ddp.empty()) {
      std::fprintf(stderr, "bench_dp_vs_ddp: dp's and ddp's parameters differ from each other: %s\n",
                   dp_vs_ddp.c_str());
      return 3;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dp_vs_ddp: %s\n", e.what());
    return 1;
  }
}

#endif
