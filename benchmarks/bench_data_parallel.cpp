// bench_data_parallel: what DataParallel costs, phase by phase, on the Fashion-MNIST CNN.
//
//   build/benchmarks/bench_data_parallel [--quick] [--devices 1,2,4] [--batch 128] [--rounds N]
//                                        [--json PATH]
//
// One training step (forward, cross-entropy, backward, AdamW) of nn::FashionCNN on a fixed
// synthetic batch, for each device count: 1 = the plain module on one device (the baseline
// and the ceiling), N > 1 = parallel::DataParallel over N devices (every GPU's index when the
// build has CUDA devices, else logical CPU devices cpu:0..N-1). Columns: samples/s, the
// ratio to one device, and the step split into DataParallel's forward phases (scatter,
// replicate, replicas, gather: DataParallel::last_timings()), the backward and the
// optimizer step, in ms.
//
// The ceiling is stated, not assumed: one device running the same global batch. Logical CPU
// devices share the machine's cores, so on a CPU-only machine the best DataParallel can do is
// 1.0x; what remains below it is DataParallel's own overhead (copies, threads, the per-chunk
// loss of GEMM efficiency). On N GPUs the ideal is Nx.
//
// Method: the machine is noisy, so configurations interleave: every round runs `steps` steps
// of each configuration in turn (the first one rotates), and each number is the median over
// rounds after one warmup round. The JSON (--json PATH, or $MG_BENCH_OUT_DIR/
// bench_data_parallel.json) holds the same table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/clock.h"
#include "core/cuda_runtime.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "parallel/data_parallel/data_parallel.h"

using namespace mg;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
  std::vector<int> device_counts = {1, 2};
  bool devices_given = false;  // --devices: a count above the GPUs found is then an error
  int64_t batch = 128;
  int rounds = 7;
  int steps = 3;  // steps per configuration per round
  std::string json_path;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One configuration: a model (identical start for every configuration), maybe wrapped in
// DataParallel, its optimizer, and the per-round timings.
struct Config {
  int num_devices = 1;
  std::vector<Device> devices;
  std::shared_ptr<nn::FashionCNN> model;
  std::unique_ptr<parallel::DataParallel> dp;
  std::unique_ptr<optim::AdamW> opt;
  std::vector<double> step_ms, scatter_ms, replicate_ms, apply_ms, gather_ms, backward_ms, optim_ms;

  void run_round(const Tensor& x, const Tensor& y, int steps, bool record) {
    double step = 0, scatter = 0, replicate = 0, apply = 0, gather = 0, backward = 0, optim = 0;
    for (int s = 0; s < steps; ++s) {
      const auto start = Clock::now();
      Tensor out = dp ? (*dp)(x) : model->forward(x);
      const double forward = ms_since(start);
      if (dp) {
        const parallel::DataParallelTimings& t = dp->last_timings();
        scatter += t.scatter_ms;
        replicate += t.replicate_ms;
        apply += t.apply_ms;
        gather += t.gather_ms;
      } else {
        apply += forward;
      }
      auto phase = Clock::now();
      Tensor loss = cross_entropy(out, y);
      opt->zero_grad();
      loss.backward();
      backward += ms_since(phase);
      phase = Clock::now();
      opt->step();
      optim += ms_since(phase);
      step += ms_since(start);
    }
    if (!record) return;
    const double n = steps;
    step_ms.push_back(step / n);
    scatter_ms.push_back(scatter / n);
    replicate_ms.push_back(replicate / n);
    apply_ms.push_back(apply / n);
    gather_ms.push_back(gather / n);
    backward_ms.push_back(backward / n);
    optim_ms.push_back(optim / n);
  }
};

std::vector<int> parse_counts(const std::string& text) {
  std::vector<int> counts;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const int n = std::stoi(item);
    MG_CHECK(n >= 1, "--devices: counts must be at least 1, got ", n);
    counts.push_back(n);
  }
  MG_CHECK(!counts.empty(), "--devices: expected a list like 1,2,4");
  return counts;
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      MG_CHECK(i + 1 < argc, "missing value after ", arg);
      return argv[++i];
    };
    if (arg == "--quick") {
      f.rounds = 3;
      f.steps = 2;
    } else if (arg == "--devices") {
      f.device_counts = parse_counts(value());
      f.devices_given = true;
    } else if (arg == "--batch") {
      f.batch = std::stoll(value());
    } else if (arg == "--rounds") {
      f.rounds = std::stoi(value());
    } else if (arg == "--json") {
      f.json_path = value();
    } else if (arg == "--help" || arg == "-h") {
      std::printf(
          "usage: bench_data_parallel [--quick] [--devices 1,2,4] [--batch N] [--rounds N] [--json PATH]\n");
      std::exit(0);
    } else {
      throw Error("unknown flag " + arg + " (expected --quick, --devices, --batch, --rounds, --json)");
    }
  }
  MG_CHECK(f.batch >= 1 && f.rounds >= 1, "--batch and --rounds must be at least 1");
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags flags = parse_flags(argc, argv);
    const bool gpus = cuda::device_count() > 0 && cuda_backend() != nullptr;
    std::vector<Config> configs;
    for (int n : flags.device_counts) {
      if (gpus && !flags.devices_given && n > cuda::device_count()) {  // the default 1,2 on one GPU
        std::printf(
            "bench_data_parallel: %d devices skipped: %d GPU(s) found (MG_VIRTUAL_GPUS=%d runs %d "
            "logical devices on one GPU)\n",
            n, cuda::device_count(), n, n);
        continue;
      }
      MG_CHECK(!gpus || n <= cuda::device_count(), "--devices: ", n, " devices asked, ", cuda::device_count(),
               " GPUs found");
      Config c;
      c.num_devices = n;
      for (int i = 0; i < n; ++i) c.devices.push_back(gpus ? Device::cuda(i) : Device::cpu(i));
      manual_seed(42);
      c.model = std::make_shared<nn::FashionCNN>();
      c.model->to(c.devices[0]);
      if (n > 1) c.dp = std::make_unique<parallel::DataParallel>(c.model, c.devices);
      c.opt = std::make_unique<optim::AdamW>(c.model->parameters(), optim::AdamWOptions{});
      configs.push_back(std::move(c));
    }
    manual_seed(1);
    const Device home = configs[0].devices[0];
    const Tensor x = randn({flags.batch, 1, 28, 28}).to(home);
    const Tensor y = randint(0, 10, {flags.batch}).to(home);

    std::printf("bench_data_parallel: FashionCNN, batch %lld, %s devices, %d rounds x %d steps (median)\n",
                static_cast<long long>(flags.batch), gpus ? "CUDA" : "logical CPU", flags.rounds,
                flags.steps);
    std::printf("ceiling: 1 device on the same global batch (%s)\n",
                gpus ? "ideal N GPUs = N x" : "logical CPU devices share the cores: ideal = 1.0 x");
    for (int round = 0; round <= flags.rounds; ++round) {  // round 0 is the warmup
      for (size_t k = 0; k < configs.size(); ++k) {
        Config& c = configs[(k + static_cast<size_t>(round)) % configs.size()];
        c.run_round(x, y, flags.steps, round > 0);
      }
    }

    const double base_ms = median(configs[0].step_ms);
    std::printf("\n%8s %10s %7s %9s %9s %10s %9s %9s %10s %9s\n", "devices", "samples/s", "vs 1", "step ms",
                "scatter", "replicate", "replicas", "gather", "backward", "optim");
    std::ostringstream json;
    json << "{\n  \"benchmark\": \"bench_data_parallel\",\n  \"model\": \"FashionCNN\",\n  \"batch\": "
         << flags.batch << ",\n  \"device_kind\": \"" << (gpus ? "cuda" : "cpu") << "\",\n  \"rows\": [";
    for (size_t k = 0; k < configs.size(); ++k) {
      const Config& c = configs[k];
      const double step = median(c.step_ms);
      const double rate = static_cast<double>(flags.batch) / (step / 1000.0);
      const double ratio = configs[0].num_devices == 1 ? base_ms / step : 0.0;
      std::printf("%8d %10.0f %6.2fx %9.2f %9.2f %10.2f %9.2f %9.2f %10.2f %9.2f\n", c.num_devices, rate,
                  ratio, step, median(c.scatter_ms), median(c.replicate_ms), median(c.apply_ms),
                  median(c.gather_ms), median(c.backward_ms), median(c.optim_ms));
      json << (k ? "," : "") << "\n    {\"devices\": " << c.num_devices << ", \"samples_per_s\": " << rate
           << ", \"ratio_to_one_device\": " << ratio << ", \"step_ms\": " << step
           << ", \"scatter_ms\": " << median(c.scatter_ms) << ", \"replicate_ms\": " << median(c.replicate_ms)
           << ", \"replicas_ms\": " << median(c.apply_ms) << ", \"gather_ms\": " << median(c.gather_ms)
           << ", \"backward_ms\": " << median(c.backward_ms) << ", \"optim_ms\": " << median(c.optim_ms)
           << "}";
    }
    json << "\n  ]\n}\n";
    std::printf(
        "(1 device: the plain module, its whole forward under \"replicas\"; backward includes the loss)\n");

    std::string json_path = flags.json_path;
    if (json_path.empty())
      if (const char* dir = std::getenv("MG_BENCH_OUT_DIR"); dir && *dir)
        json_path = std::string(dir) + "/bench_data_parallel.json";
    if (!json_path.empty()) {
      std::ofstream out(json_path);
      MG_CHECK(static_cast<bool>(out), "cannot write ", json_path);
      out << json.str();
      std::printf("json: %s\n", json_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data_parallel: %s\n", e.what());
    return 1;
  }
}
