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
//   bench_dp_vs_ddp --model cnn --modes single,ddp --sweep-buckets 0.25,1,4,25 --bucket-cap-mb auto
//
// --bucket-cap-mb auto: DDP chooses its cap from the measured link (bucket_autotune.h), told the
// backward duration this rank measured on its own share (two passes before DDP is built). The
// sweep always adds an "auto" row, so where auto lands among the fixed caps shows. --no-overlap:
// one bucket for everything, reduced when backward is over (DDP without overlap). --launcher: the
// command that starts the N ranks (default mpiexec -n N), e.g. across scripts/cluster nodes.
// --wire-interface eth0: each node's first rank reads that interface's tx_bytes around the timed
// steps, giving bytes on the wire per step (scripts/bench-links runs all of it on shaped links).
//
// Output: a table, and with --json a file that scripts/plot_bench turns into charts.
//
// --comm-hook fp16|bf16|powersgd (--powersgd-rank R): DDP averages each bucket through that
// communication hook (comm_hooks.h, powersgd.h); the bytes DDP all-reduced per step are then the
// compressed ones, and the verdict shows how far the lossy gradients moved DDP's parameters
// without failing on it.
//
// The parts: bench_dp_vs_ddp_common.h (Config, Result, who offers what), _workload.cpp, _runs.cpp,
// _report.cpp; this file has the flags and main().
#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)
#include <CLI/CLI.hpp>
#endif

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_dp_vs_ddp_common.h"
#include "core/cuda_runtime.h"
#include "multigrad.h"

#if !defined(MG_HAS_CLI11) || !defined(MG_HAS_NLOHMANN_JSON)
int main() {
  std::printf(
      "bench_dp_vs_ddp needs CLI11 and nlohmann-json (apt-get install libcli11-dev nlohmann-json3-dev)\n");
  return 77;
}
#else

using namespace mg;
using namespace mg::bench_dp_vs_ddp;

namespace {

// A flag's value that cannot be used: exit status 2, like CLI11's own parse errors' usage lines.
struct BadFlag : std::runtime_error {
  using std::runtime_error::runtime_error;
};

void check_flag(bool ok, const std::string& message) {
  if (!ok) throw BadFlag(message);
}

// The items of a comma-separated list; an empty item (",," or a trailing comma) is refused.
std::vector<std::string> list_items(const std::string& flag, const std::string& text) {
  std::vector<std::string> items;
  const std::string list = text + ",";
  for (size_t start = 0, comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1) {
    check_flag(comma > start, str_cat(flag, " has an empty item in '", text, "'"));
    items.push_back(list.substr(start, comma - start));
  }
  return items;
}

// "25", "0.5": a finite number of MB > 0 (and at most 1 TiB: no bucket is bigger). strtod alone
// takes "inf" and "nan", which ended in a JSON type error or an undefined cast in DDP.
double megabytes(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double mb = std::strtod(text.c_str(), &end);
  check_flag(
      !text.empty() && end != text.c_str() && *end == '\0' && std::isfinite(mb) && mb > 0 && mb <= 1 << 20,
      str_cat(flag, " must be a finite number of MB in (0, 1048576], got '", text, "'"));
  return mb;
}

// Every flag the launcher checks before any run starts: a bad value costs no training time.
void check_flags(Config& c, const std::string& bucket_cap_text) {
  check_flag(!c.modes.empty(), "--modes must name at least one of single, dp, ddp, got ''");
  for (const std::string& mode : list_items("--modes", c.modes))
    check_flag(mode == "single" || mode == "dp" || mode == "ddp",
               str_cat("--modes: unknown mode '", mode, "' (single, dp or ddp)"));
  c.bucket_cap_auto = bucket_cap_text == "auto";
  if (!c.bucket_cap_auto) c.bucket_cap_mb = megabytes("--bucket-cap-mb", bucket_cap_text);
  check_flag(
      std::isfinite(c.first_bucket_cap_mb) && c.first_bucket_cap_mb > 0 && c.first_bucket_cap_mb <= 1 << 20,
      str_cat("--first-bucket-cap-mb must be a finite number of MB in (0, 1048576], got ",
              c.first_bucket_cap_mb));
  if (!c.sweep_buckets.empty())
    for (const std::string& item : list_items("--sweep-buckets", c.sweep_buckets))
      if (item != "auto" && item != "no-overlap") megabytes("--sweep-buckets", item);
  if (!c.json_path.empty()) {
    // Writable now, not only after the runs: opened for appending (nothing it holds is lost), and
    // removed again if this made it.
    std::error_code error;
    const bool existed = std::filesystem::exists(c.json_path, error);
    check_flag(!std::filesystem::is_directory(c.json_path, error),
               str_cat("--json ", c.json_path, " is a directory"));
    check_flag(static_cast<bool>(std::ofstream(c.json_path, std::ios::app)),
               str_cat("--json: cannot write ", c.json_path, ": ", std::strerror(errno)));
    if (!existed) std::filesystem::remove(c.json_path, error);
  }
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
  std::string bucket_cap_text = "25";
  app.add_option("--bucket-cap-mb", bucket_cap_text,
                 "DDP bucket size in MB, or auto (from the measured link)");
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
  app.add_option(
      "--sweep-buckets", c.sweep_buckets,
      "comma-separated bucket caps in MB (and auto, no-overlap): one DDP run each; auto is always added");
  app.add_flag("--predict", c.predict, "predict DP and DDP at 2-64 devices from this run (scaling_model.h)");
  app.add_flag("--no-overlap", c.no_overlap, "DDP with one bucket, all-reduced only after backward");
  app.add_option("--launcher", c.launcher, "the command that starts the DDP ranks (default: mpiexec -n N)");
  app.add_option("--wire-interface", c.wire_interface,
                 "measure bytes sent per step on this interface (eth0)");
  app.add_option("--comm-hook", c.comm_hook, "DDP gradient communication: none, fp16, bf16 or powersgd");
  app.add_option("--powersgd-rank", c.powersgd_rank,
                 "with --comm-hook powersgd: the matrix approximation rank");
  app.add_option("--powersgd-start", c.powersgd_start,
                 "with --comm-hook powersgd: the first compressed step (default: the first timed step)");
  CLI11_PARSE(app, argc, argv);

  try {
    check_flags(c, bucket_cap_text);
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
    MG_CHECK(
        c.comm_hook == "none" || c.comm_hook == "fp16" || c.comm_hook == "bf16" || c.comm_hook == "powersgd",
        "--comm-hook must be none, fp16, bf16 or powersgd, got '", c.comm_hook, "'");
    MG_CHECK(c.powersgd_rank >= 1, "--powersgd-rank must be >= 1, got ", c.powersgd_rank);
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
      if (c.role != "ddp-worker" && parallel::detect_launch().rank == 0) {
        print_table(c, {r}, {Agreement{}}, false);
        print_ddp_details(r);
      }
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
    for (Result& r : results)
      if (r.mode == "ddp" && single != nullptr) r.predicted_step_ms = predicted_ddp_step_ms(c, *single, r);
    print_table(c, results, agreement, batch_statistics);
    for (const Result& r : results)
      if (r.mode == "ddp") print_ddp_details(r);
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
      std::printf("dp vs ddp: the largest relative parameter difference is %s (%s %s)\n",
                  format_sci(diff).c_str(),
                  lossy_comm_hook(c) ? "not checked: lossy hook; tolerance" : "tolerance",
                  format_sci(agreement_tolerance(c)).c_str());
      if (!(diff <= agreement_tolerance(c)) && !lossy_comm_hook(c))
        dp_vs_ddp = str_cat("DIFFER by ", format_sci(diff), " (> ", format_sci(agreement_tolerance(c)), ")");
    }

    json sweep = json::array();
    if (!c.sweep_buckets.empty()) sweep = run_bucket_sweep(c, forwarded, single);
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
      std::ofstream file(c.json_path);
      file << out.dump(2) << "\n";
      file.close();
      MG_CHECK(!file.fail(), "cannot write ", c.json_path, ": ", std::strerror(errno));
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
  } catch (const BadFlag& e) {
    std::fprintf(stderr, "bench_dp_vs_ddp: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_dp_vs_ddp: %s\n", e.what());
    return 1;
  }
}

#endif
