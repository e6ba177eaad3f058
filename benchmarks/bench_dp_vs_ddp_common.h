// bench_dp_vs_ddp's shared vocabulary: the run's Config (its flags), one mode's Result (what the
// report prints and --json writes; a DDP worker hands it to the launcher as JSON), and the
// functions each part of the benchmark offers the others. The parts, one concept per file:
//   bench_dp_vs_ddp_workload.cpp  the model, the data, the loss, one timed step
//   bench_dp_vs_ddp_runs.cpp      one run per mode: single, single over shares, dp, a ddp rank, the launch
//   bench_dp_vs_ddp_report.cpp    the verdict, the table, the bucket sweep, the scaling model's predictions
//   bench_dp_vs_ddp.cpp           the flags and main()
#pragma once

#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "multigrad.h"
#include "optim/sgd.h"
#include "parallel/comm/process_group.h"
#include "scaling_model.h"

namespace mg::bench_dp_vs_ddp {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

using mg::ms_since;

// 3.1e-07: two significant digits, for differences that span many orders of magnitude.
inline std::string format_sci(double x) {
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
  std::string data = "synthetic";  // or "fashion": real Fashion-MNIST images (mlp, cnn, resnet)
  std::string precision = "f32";   // or "bf16" (autocast)
  std::string json_path;
  std::string role = "launcher";  // or "ddp-worker"
  std::string result_file;
  std::string work_dir;
  double lr = 0.01;
  std::string sweep_buckets;       // "1,5,25,100": DDP step vs bucket size
  bool bucket_cap_auto = false;    // --bucket-cap-mb auto (bucket_autotune.h)
  bool no_overlap = false;         // one bucket, reduced after backward
  std::string launcher;            // starts the DDP ranks; default "mpiexec -n N"
  std::string wire_interface;      // e.g. eth0: bytes on the wire per step from its counters
  bool predict = false;            // the scaling model (scaling_model.h)
  std::string comm_hook = "none";  // DDP's bucket averaging: none, fp16, bf16 or powersgd (comm_hooks.h)
  int64_t powersgd_rank = 1;       // with powersgd: the matrix approximation rank
  int64_t powersgd_start = -1;     // with powersgd: first compressed step (-1: the first timed one)
};

inline json config_json(const Config& c) {
  return {{"model", c.model},
          {"devices", c.devices},
          {"global_batch", c.global_batch},
          {"steps", c.steps},
          {"warmup", c.warmup},
          {"bucket_cap_mb", c.bucket_cap_mb},
          {"first_bucket_cap_mb", c.first_bucket_cap_mb},
          {"bucket_cap_auto", c.bucket_cap_auto},
          {"no_overlap", c.no_overlap},
          {"launcher", c.launcher},
          {"algo", c.algo},
          {"device_type", c.device_type},
          {"lr", c.lr},
          {"data", c.data},
          {"precision", c.precision},
          {"comm_hook", c.comm_hook},
          {"powersgd_rank", c.powersgd_rank}};
}

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
  double bucket_cap_mb = 0, first_bucket_cap_mb = 0;
  // ddp: each rank's step time p50 and p95 (ms), the bytes its nodes sent per step on
  // --wire-interface (summed over nodes; -1: not measured), all gradients' bytes, the α-β model's
  // step time (0: not predicted), and with --bucket-cap-mb auto what DDP chose.
  std::vector<double> rank_step_p50_ms, rank_step_p95_ms;
  double wire_bytes_per_step = -1;
  int64_t gradient_bytes = 0;
  double predicted_step_ms = 0;
  std::string bucket_choice;
  // ddp: the communication hook ("none", "fp16", "bf16", "powersgd rank R") and the bytes DDP
  // all-reduced per timed step (ReducerStats::bytes: with a hook, the compressed size).
  std::string comm_hook;
  double allreduced_bytes_per_step = 0;

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
    j["first_bucket_cap_mb"] = first_bucket_cap_mb;
    j["rank_step_p50_ms"] = rank_step_p50_ms;
    j["rank_step_p95_ms"] = rank_step_p95_ms;
    j["wire_bytes_per_step"] = wire_bytes_per_step;
    j["gradient_bytes"] = gradient_bytes;
    j["predicted_step_ms"] = predicted_step_ms;
    j["bucket_choice"] = bucket_choice;
    j["comm_hook"] = comm_hook;
    j["allreduced_bytes_per_step"] = allreduced_bytes_per_step;
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
    r.first_bucket_cap_mb = j.value("first_bucket_cap_mb", 0.0);
    r.rank_step_p50_ms = j.value("rank_step_p50_ms", std::vector<double>{});
    r.rank_step_p95_ms = j.value("rank_step_p95_ms", std::vector<double>{});
    r.wire_bytes_per_step = j.value("wire_bytes_per_step", -1.0);
    r.gradient_bytes = j.value("gradient_bytes", int64_t{0});
    r.predicted_step_ms = j.value("predicted_step_ms", 0.0);
    r.bucket_choice = j.value("bucket_choice", std::string());
    r.comm_hook = j.value("comm_hook", std::string());
    r.allreduced_bytes_per_step = j.value("allreduced_bytes_per_step", 0.0);
    return r;
  }
};

// ---- bench_dp_vs_ddp_workload.cpp: the same work in every mode ------------------------------------

std::shared_ptr<nn::Module> make_model(const std::string& name);
optim::SGDOptions sgd_options(const Config& c);
bool has_batch_statistics(nn::Module& model);
std::pair<Tensor, Tensor> global_batch(const Config& c, int step);
Tensor loss_of(const Tensor& out, const Tensor& y);
Device device_of(const Config& c, int index);

// One training step, timed phase by phase. `before_backward` runs just before loss.backward().
struct StepTimes {
  double forward = 0, backward = 0, optimizer = 0, total = 0;  // ms
  Tensor output, loss;
};
StepTimes timed_step(const std::function<Tensor(const Tensor&)>& forward, optim::Optimizer& opt,
                     const Tensor& x, const Tensor& y, bool bf16,
                     const std::function<void()>& before_backward = nullptr);
double peak_mb_of(Device device);
std::string save_params(const Config& c, const std::string& mode, nn::Module& model);

// ---- bench_dp_vs_ddp_runs.cpp: one run per mode ---------------------------------------------------

Result run_single(const Config& c);
Result run_single_over_shares(const Config& c);
Result run_dp(const Config& c);
Result run_ddp_rank(const Config& c);
Result launch_ddp(const Config& c, const std::vector<std::string>& forwarded_args);

// ---- bench_dp_vs_ddp_report.cpp: verdict, table, sweep, prediction --------------------------------

// How a parallel mode's final parameters compare with one device's.
struct Agreement {
  double vs_single = -1;  // max relative difference to one device on the whole batch (-1: not compared)
  double vs_shares = -1;  // ... to one device over the same N shares (models with batch statistics)
  std::string verdict = "-";
  bool differs = false;  // beyond rounding: DP or DDP is wrong
};

double max_relative_difference(const std::string& a_path, const std::string& b_path);
double agreement_tolerance(const Config& c);
// Whether DDP's communication hook changes the gradients (fp16, bf16, PowerSGD): then the
// verdict shows how far DDP's parameters moved but does not fail.
bool lossy_comm_hook(const Config& c);
std::vector<Agreement> compare_with_single(const Config& c, const std::vector<Result>& results,
                                           const Result* single, const Result* reference);
void print_table(const Config& c, const std::vector<Result>& results, const std::vector<Agreement>& agreement,
                 bool batch_statistics);
void print_ddp_details(const Result& r);
std::vector<std::string> without_options(const std::vector<std::string>& args,
                                         const std::vector<std::string>& keys);
double predicted_ddp_step_ms(const Config& c, const Result& single, const Result& ddp);
json run_bucket_sweep(const Config& c, const std::vector<std::string>& forwarded, const Result* single);
json predict_scaling(const Config& c, const std::vector<Result>& results);

}  // namespace mg::bench_dp_vs_ddp

#endif  // MG_HAS_CLI11 && MG_HAS_NLOHMANN_JSON
