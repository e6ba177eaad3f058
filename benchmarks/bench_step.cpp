// bench_step: train one model for a fixed number of steps, and write down everything another
// framework needs to run the very same work: the initial weights, every batch, the settings, and
// multigrad's own per-step times and losses.
//
//   build/benchmarks/bench_step --model mlp|mlp-small|cnn [--device auto|cpu|cuda] [--batch N]
//       [--steps N] [--warmup N] [--threads N] [--lr X] [--momentum X] [--seed N]
//       [--unique-batches N] [--out-dir DIR] [--json PATH] [--quick]
//
// Why: bench_vs_torch races libtorch inside one process, which needs libtorch at build time and
// covers the CPU only. A GPU machine has PyTorch in Python instead, so scripts/bench_vs_pytorch
// runs this binary, loads the files it wrote, trains the same architecture in PyTorch from the
// same weights on the same batches with the same optimizer, and compares times and loss curves.
// Any other framework can do the same from the three files below.
//
// It writes to --out-dir DIR (default: a new folder under $TMPDIR, printed):
//   init.safetensors   every parameter and buffer by its state_dict name ("layers.0.weight",
//                      "bn1.running_mean", "bn1.num_batches_tracked"), as initialised
//   data.safetensors   x: f32 [warmup + steps, batch, <sample shape>], y: i64 [warmup + steps, batch]
//   final.safetensors  every parameter and buffer after the last step (BatchNorm's running stats
//                      and num_batches_tracked included), to compare the end state too
//   multigrad.json     the settings, each step's time (ms) and loss, the median step time after
//                      the warm-up; --json PATH (or $MG_BENCH_OUT_DIR/bench_step.json) gets a copy
//
// One step i, as PyTorch users write it:
//   loss = cross_entropy(model(x[i]), y[i]); opt.zero_grad(); loss.backward(); opt.step();
// with SGD (momentum, no dampening, no weight decay) and zero_grad setting gradients to none
// (PyTorch 2's default). The clock runs from before the forward to after the step, on CUDA
// after a device synchronize; loss.item() is read after the clock stops. The whole x and y go
// to the device before the first step, so no step includes a host-to-device copy.
//
// Models (lr defaults as in bench_vs_torch: 0.05 for the MLPs, 0.01 for the CNN, whose curve at
// 0.05 turns chaotic on random data and amplifies float rounding):
//   mlp-small  MLP 784-256-10,       batch 256 by default (nn/zoo.h)
//   mlp        MLP 784-256-128-10,   batch 256
//   cnn        FashionCNN, dropout 0 (another framework's dropout masks could not match), batch 128
//
// Data: randn images and uniform labels in [0, 10). With --unique-batches K (default 4) step i
// uses batch i % K, so the loss falls as the model memorises them and the curve shows training;
// K = 0 draws a new batch for every step. The file holds every step's batch either way.
// Seeds: the model is initialised after manual_seed(seed), the data drawn after
// manual_seed(seed + 1).
//
// Device: cpu, cuda (enables the CUDA backend, as MG_CUDA_BACKEND=1 would, and uses cuda:0; fails
// with the reason when this build has no CUDA or no GPU is usable), or auto (the default: cuda
// when this build has CUDA and sees a GPU, else cpu). --threads (default: all cores) goes to
// OpenMP and OpenBLAS.
//
// --quick: mlp-small (unless --model is given), 3 warm-up + 10 timed steps; what
// scripts/gpu-check runs.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "core/cuda_allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"
#include "core/files.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/sgd.h"

#ifdef MG_HAS_CLI11
#include <CLI/CLI.hpp>
#endif
#ifdef MG_HAS_OPENBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif

#include <sys/stat.h>
#include <unistd.h>

using mg::bench::cpu_model;
using mg::bench::load_average;
using mg::bench::median;
using mg::bench::utc_now;

namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string model;  // "": mlp-small
  std::string device = "auto";
  int64_t batch = 0;  // 0: the model's default
  int steps = 0;      // 0: 40, --quick 10
  int warmup = -1;    // -1: 5, --quick 3
  int threads = 0;    // 0: all cores
  double lr = 0;      // 0: the model's default
  double momentum = 0.9;
  uint64_t seed = 0;
  int unique_batches = 4;
  std::string out_dir;
  std::string json_path;
  bool quick = false;
};

// ---- command line: CLI11 when the build has it, else a small parser over the same table -------

struct FlagSpec {
  std::string name;  // "--model"
  std::string type;  // what the value looks like in --help ("INT"); "" for switches
  std::string help;
  std::function<void(const std::string&)> set;  // switches get ""
  bool is_switch = false;
};

int to_int(const std::string& flag, const std::string& text, long long lo, long long hi) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MG_CHECK(used == text.size() && !text.empty() && v >= lo && v <= hi, flag, ": expected an integer in [", lo,
           ", ", hi, "], got '", text, "'");
  return static_cast<int>(v);
}

double to_double(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MG_CHECK(used == text.size() && !text.empty() && v >= 0, flag, ": expected a number >= 0, got '", text,
           "'");
  return v;
}

std::vector<FlagSpec> flag_table(Flags& f) {
  auto oneof = [](const std::string& flag, const std::string& v, std::vector<std::string> allowed) {
    MG_CHECK(std::find(allowed.begin(), allowed.end(), v) != allowed.end(), flag, ": unknown value '", v,
             "'");
    return v;
  };
  return {
      {"--model", "NAME", "mlp-small (784-256-10), mlp (784-256-128-10) or cnn (FashionCNN, dropout 0)",
       [&f, oneof](const std::string& v) {
         f.model = oneof("--model", v, {"mlp-small", "mlp", "cnn"});
       }},
      {"--device", "NAME", "auto (cuda if this build has CUDA and sees a GPU), cpu or cuda (cuda:0)",
       [&f, oneof](const std::string& v) {
         f.device = oneof("--device", v, {"auto", "cpu", "cuda"});
       }},
      {"--batch", "INT", "samples per step (default: 256 for the MLPs, 128 for the CNN)",
       [&f](const std::string& v) { f.batch = to_int("--batch", v, 1, 1 << 20); }},
      {"--steps", "INT", "timed steps after the warm-up (default 40, --quick 10)",
       [&f](const std::string& v) { f.steps = to_int("--steps", v, 1, 100000); }},
      {"--warmup", "INT", "untimed steps first (default 5, --quick 3)",
       [&f](const std::string& v) { f.warmup = to_int("--warmup", v, 0, 100000); }},
      {"--threads", "INT", "CPU threads for OpenMP and OpenBLAS (default: all cores)",
       [&f](const std::string& v) { f.threads = to_int("--threads", v, 1, 1024); }},
      {"--lr", "X", "SGD learning rate (default: 0.05 for the MLPs, 0.01 for the CNN)",
       [&f](const std::string& v) { f.lr = to_double("--lr", v); }},
      {"--momentum", "X", "SGD momentum (default 0.9)",
       [&f](const std::string& v) { f.momentum = to_double("--momentum", v); }},
      {"--seed", "INT", "model seed; the data use seed + 1 (default 0)",
       [&f](const std::string& v) {
         f.seed = static_cast<uint64_t>(to_int("--seed", v, 0, (1LL << 31) - 1));
       }},
      {"--unique-batches", "INT", "distinct batches, cycled (default 4; 0: a new batch every step)",
       [&f](const std::string& v) { f.unique_batches = to_int("--unique-batches", v, 0, 100000); }},
      {"--out-dir", "DIR",
       "folder for {init,data,final}.safetensors, multigrad.json (default: a new temp dir)",
       [&f](const std::string& v) { f.out_dir = v; }},
      {"--json", "PATH",
       "also write multigrad.json here (default: $MG_BENCH_OUT_DIR/bench_step.json when set)",
       [&f](const std::string& v) { f.json_path = v; }},
      {"--quick", "", "3 warm-up + 10 timed steps (mlp-small unless --model is given)",
       [&f](const std::string&) { f.quick = true; }, true},
  };
}

// Returns -1 to go on, else the exit code (help printed, or a bad command line).
int parse_flags(int argc, char** argv, Flags& f) {
  std::vector<FlagSpec> table = flag_table(f);
  const char* about = "Train one model for a fixed number of steps; write its init, data, times and losses";
#ifdef MG_HAS_CLI11
  CLI::App app{about};
  for (FlagSpec& s : table) {
    if (s.is_switch)
      app.add_flag_function(
          s.name, [set = s.set](int64_t) { set(""); }, s.help);
    else
      app.add_option_function<std::string>(s.name, s.set, s.help)->type_name(s.type);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
#else
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::printf("%s\nOptions:\n", about);
      for (const FlagSpec& s : table)
        std::printf("  %-24s %s\n", (s.name + " " + s.type).c_str(), s.help.c_str());
      return 0;
    }
    std::string name = arg, value;
    const size_t eq = arg.find('=');
    if (eq != std::string::npos) name = arg.substr(0, eq), value = arg.substr(eq + 1);
    auto it = std::find_if(table.begin(), table.end(), [&](const FlagSpec& s) { return s.name == name; });
    MG_CHECK(it != table.end(), "unknown option '", arg, "' (--help lists them)");
    if (!it->is_switch && eq == std::string::npos) {
      MG_CHECK(i + 1 < argc, name, " needs a value");
      value = argv[++i];
    }
    it->set(value);
  }
#endif
  return -1;
}

// ---- small helpers ----------------------------------------------------------------------------

// A JSON string literal (the values here are names and paths: quotes, backslashes, controls).
std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A number as `fmt` prints it (%.9g round-trips a float). Without fmt: the shortest of %.15g and
// %.17g that reads back as the same double (0.9 stays "0.9").
std::string json_num(double v, const char* fmt = nullptr) {
  char buf[40];
  std::snprintf(buf, sizeof buf, fmt ? fmt : "%.15g", v);
  if (!fmt && std::strtod(buf, nullptr) != v) std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

template <class T>
std::string json_list(const std::vector<T>& v, const char* fmt) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_num(static_cast<double>(v[i]), fmt);
  return out + "]";
}

void make_dirs(const std::string& path) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos < path.size() && path[pos] != '/') continue;
    const std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST)
      throw mg::Error(mg::str_cat("cannot create folder ", prefix, ": ", std::strerror(errno)));
  }
}

std::string temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/mg_bench_step_XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  MG_CHECK(::mkdtemp(buf.data()) != nullptr, "mkdtemp(", pattern, ") failed: ", std::strerror(errno));
  return buf.data();
}

// ---- the run ------------------------------------------------------------------------------------

struct ModelSpec {
  std::string name, description;
  int64_t batch = 0;  // defaults, when --batch / --lr leave them open
  double lr = 0;
  mg::Shape sample_shape;  // one input sample
  std::function<std::shared_ptr<mg::nn::Module>()> make;
};

ModelSpec model_spec(const std::string& name) {
  ModelSpec s;
  s.name = name;
  if (name == "cnn") {
    s.description = "FashionCNN (dropout 0)";
    s.batch = 128;
    s.lr = 0.01;
    s.sample_shape = {1, 28, 28};
    s.make = [] {
      mg::nn::FashionCNNOptions o;
      o.dropout = 0;
      return std::make_shared<mg::nn::FashionCNN>(o);
    };
  } else {  // mlp-small, mlp
    const std::vector<int64_t> hidden =
        name == "mlp" ? std::vector<int64_t>{256, 128} : std::vector<int64_t>{256};
    s.description = name == "mlp" ? "MLP 784-256-128-10" : "MLP 784-256-10";
    s.batch = 256;
    s.lr = 0.05;
    s.sample_shape = {784};
    s.make = [hidden] { return std::make_shared<mg::nn::MLP>(784, hidden, 10); };
  }
  return s;
}

// Which device to run on: fails with the reason when cuda was asked for and cannot be had.
mg::Device pick_device(const std::string& requested) {
  if (requested == "cpu") return mg::Device::cpu(0);
  if (requested == "auto" && !(mg::cuda::built_with_cuda() && mg::cuda::device_count() > 0))
    return mg::Device::cpu(0);
  MG_CHECK(mg::cuda::built_with_cuda(), "--device cuda: this build has no CUDA (configure with ",
           "-DMG_CUDA=ON, as scripts/gpu-check does in build-gpu/)");
  MG_CHECK(mg::cuda::device_count() > 0, "--device cuda: ", mg::cuda::describe_devices());
  mg::cuda::enable_backend();
  return mg::Device::cuda(0);
}

int run(Flags f) {
  if (f.model.empty()) f.model = "mlp-small";
  const ModelSpec spec = model_spec(f.model);
  const int steps = f.steps > 0 ? f.steps : (f.quick ? 10 : 40);
  const int warmup = f.warmup >= 0 ? f.warmup : (f.quick ? 3 : 5);
  const int total = warmup + steps;
  const int64_t batch = f.batch > 0 ? f.batch : spec.batch;
  const double lr = f.lr > 0 ? f.lr : spec.lr;
  const int threads =
      f.threads > 0 ? f.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
#ifdef MG_HAS_OPENBLAS
  openblas_set_num_threads(threads);
#endif
  const mg::Device device = pick_device(f.device);
  const std::string device_desc =
      device.is_cuda() ? mg::cuda::describe_devices() : mg::str_cat(cpu_model(), ", ", threads, " threads");
  const std::string out_dir = f.out_dir.empty() ? temp_dir() : f.out_dir;
  make_dirs(out_dir);

  // The model, and its initial state exactly as another framework must load it.
  mg::manual_seed(f.seed);
  std::shared_ptr<mg::nn::Module> model = spec.make();
  model->train();
  const mg::SafetensorsMetadata meta{{"model", spec.name}, {"written_by", "multigrad bench_step"}};
  mg::save_safetensors(out_dir + "/init.safetensors", model->state_dict(), meta);

  // The batches: K distinct ones, repeated to fill every step (K = 0: all distinct).
  mg::manual_seed(f.seed + 1);
  const int64_t distinct = f.unique_batches > 0 ? std::min(f.unique_batches, total) : total;
  mg::Shape x_shape{distinct, batch};
  x_shape.insert(x_shape.end(), spec.sample_shape.begin(), spec.sample_shape.end());
  mg::Tensor x_distinct = mg::randn(x_shape);
  mg::Tensor y_distinct = mg::randint(0, 10, {distinct, batch});
  std::vector<mg::Tensor> xs, ys;
  for (int i = 0; i < total; ++i) {
    xs.push_back(x_distinct.select(0, i % distinct));
    ys.push_back(y_distinct.select(0, i % distinct));
  }
  const mg::Tensor x_all = mg::stack(xs, 0), y_all = mg::stack(ys, 0);
  mg::save_safetensors(out_dir + "/data.safetensors", {{"x", x_all}, {"y", y_all}}, meta);

  // Everything on the device before the first step.
  model->to(device);
  const mg::Tensor x_dev = x_all.to(device), y_dev = y_all.to(device);
  mg::optim::SGDOptions sgd;
  sgd.lr = lr;
  sgd.momentum = f.momentum;
  mg::optim::SGD opt(model->parameters(), sgd);
  auto sync = [&] {
    if (device.is_cuda()) mg::cuda::synchronize_device(device.index);
  };
  sync();

  std::printf("bench_step %s: %s, batch %lld, %d warm-up + %d timed steps, SGD lr %g momentum %g, %s\n",
              spec.name.c_str(), spec.description.c_str(), static_cast<long long>(batch), warmup, steps, lr,
              f.momentum, device_desc.c_str());
  const double load_before = load_average();
  std::vector<double> times_ms;
  std::vector<float> losses;
  for (int i = 0; i < total; ++i) {
    const auto t0 = Clock::now();
    mg::Tensor loss = mg::cross_entropy(model->forward(x_dev.select(0, i)), y_dev.select(0, i));
    opt.zero_grad();
    loss.backward();
    opt.step();
    sync();
    times_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    losses.push_back(loss.item<float>());
  }
  const double load_after = load_average();
  mg::save_safetensors(out_dir + "/final.safetensors", model->state_dict(), meta);
  const double med = median(std::vector<double>(times_ms.begin() + warmup, times_ms.end()));
  std::printf("  median %.3f ms/step after warm-up; loss %.6f -> %.6f; load average %.2f -> %.2f\n", med,
              losses.front(), losses.back(), load_before, load_after);

  std::ostringstream j;
  j << "{\n  \"benchmark\": \"bench_step\",\n  \"framework\": \"multigrad\",\n  \"date_utc\": "
    << json_str(utc_now()) << ",\n  \"model\": " << json_str(spec.name)
    << ",\n  \"description\": " << json_str(spec.description)
    << ",\n  \"device\": " << json_str(device.is_cuda() ? "cuda" : "cpu")
    << ",\n  \"device_name\": " << json_str(device_desc) << ",\n  \"batch\": " << batch
    << ",\n  \"sample_shape\": " << json_list(spec.sample_shape, "%.0f") << ",\n  \"warmup\": " << warmup
    << ",\n  \"steps\": " << steps << ",\n  \"unique_batches\": " << distinct
    << ",\n  \"threads\": " << threads << ",\n  \"optimizer\": \"SGD\",\n  \"lr\": " << json_num(lr)
    << ",\n  \"momentum\": " << json_num(f.momentum) << ",\n  \"seed\": " << f.seed
    << ",\n  \"loadavg_before\": " << json_num(load_before, "%.2f")
    << ",\n  \"loadavg_after\": " << json_num(load_after, "%.2f")
    << ",\n  \"median_step_ms\": " << json_num(med) << ",\n  \"step_ms\": " << json_list(times_ms, "%.6g")
    << ",\n  \"losses\": " << json_list(losses, "%.9g") << ",\n  \"out_dir\": " << json_str(out_dir)
    << "\n}\n";
  mg::write_file_atomically(out_dir + "/multigrad.json", j.str());
  std::string json_path = f.json_path;
  if (json_path.empty())
    if (const char* dir = std::getenv("MG_BENCH_OUT_DIR")) json_path = std::string(dir) + "/bench_step.json";
  if (!json_path.empty()) mg::write_file_atomically(json_path, j.str());
  std::printf("  wrote %s/{init,data,final}.safetensors, multigrad.json%s%s\n", out_dir.c_str(),
              json_path.empty() ? "" : " and ", json_path.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Flags f;
    const int rc = parse_flags(argc, argv, f);
    if (rc >= 0) return rc;
    return run(f);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_step: %s\n", e.what());
    return 1;
  }
}
