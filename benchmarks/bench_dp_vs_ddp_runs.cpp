// bench_dp_vs_ddp's runs, one per mode: one device (timed, and untimed over the DP/DDP shares for
// models with batch statistics), DataParallel in this process, and DDP -- one rank of it under
// mpiexec (or --launcher), and the launcher that starts the ranks and reads rank 0's result.
#include "bench_dp_vs_ddp_common.h"

#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "bench_common.h"
#include "core/allocator.h"
#include "core/autocast.h"
#include "ddp_step_stats.h"
#include "parallel/data_parallel/comm_hooks.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/powersgd.h"

namespace mg::bench_dp_vs_ddp {

namespace {

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

}  // namespace

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

namespace {

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

// For --bucket-cap-mb auto: this rank's backward on its share of step 0's batch, the faster of
// two passes after a warm-up (gradients cleared again: training starts from the same state), the
// slowest rank's value on every rank.
double local_backward_ms(const Config& c, nn::Module& model, parallel::ProcessGroup& pg, int64_t per_rank) {
  auto [x, y] = global_batch(c, 0);
  x = x.narrow(0, pg.rank() * per_rank, per_rank).to(pg.device());
  y = y.narrow(0, pg.rank() * per_rank, per_rank).to(pg.device());
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    Tensor loss;
    {
      AutocastGuard autocast(DType::bf16, c.precision == "bf16");
      loss = loss_of(model(x), y);
    }
    auto t0 = Clock::now();
    loss.backward();
    const double ms = ms_since(t0);
    if (pass > 0) best = pass == 1 ? ms : std::min(best, ms);
  }
  model.zero_grad();
  Tensor slowest = full({1}, best, TensorOptions{DType::f64});
  pg.allreduce(slowest, parallel::ReduceOp::Max)->wait();
  return slowest.item<double>();
}

// --comm-hook: how DDP averages each gradient bucket (comm_hooks.h, powersgd.h). PowerSGD
// compresses from step --powersgd-start on (default: the first timed step, so every timed step is
// compressed and ReducerStats::bytes counts P and Q, not the gradients).
void register_comm_hook(const Config& c, parallel::DistributedDataParallel& ddp, parallel::ProcessGroup& pg) {
  auto group = std::make_shared<parallel::ProcessGroup>(pg);
  if (c.comm_hook == "fp16") ddp.register_comm_hook(group, parallel::fp16_compress_hook);
  if (c.comm_hook == "bf16") ddp.register_comm_hook(group, parallel::bf16_compress_hook);
  if (c.comm_hook == "powersgd") {
    parallel::PowerSGDOptions options;
    options.matrix_approximation_rank = c.powersgd_rank;
    options.start_powerSGD_iter = c.powersgd_start >= 0 ? c.powersgd_start : c.warmup;
    ddp.register_comm_hook(std::make_shared<parallel::PowerSGDState>(pg, options), parallel::powersgd_hook);
  }
}

}  // namespace

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
  if (c.no_overlap) options.bucket_cap_mb = options.first_bucket_cap_mb = 1e6;  // one bucket: after backward
  if (c.bucket_cap_auto) {
    options.bucket_cap_auto = true;
    options.bucket_cap_auto_backward_ms = local_backward_ms(c, *model, pg, per_rank);
  }
  parallel::DistributedDataParallel ddp(*model, pg, options);
  register_comm_hook(c, ddp, pg);
  optim::SGD opt(ddp.parameters(), sgd_options(c));
  Result r;
  r.mode = "ddp";
  r.devices = pg.size();
  PhaseTimer timer;
  reset_cpu_device_peak(device.index);
  std::vector<double> step_ms;
  // Bytes on the wire: one rank per node reads its node's counter (the others would count it twice).
  const bool reads_wire = !c.wire_interface.empty() && parallel::detect_launch().local_rank == 0;
  int64_t wire_start = 0;
  for (int s = 0; s < c.warmup + c.steps; ++s) {
    if (s == c.warmup) {
      ddp.reset_stats();
      if (reads_wire) wire_start = bench::interface_tx_bytes(c.wire_interface);
    }
    auto [x, y] = global_batch(c, s);
    x = x.narrow(0, pg.rank() * per_rank, per_rank).to(device);
    y = y.narrow(0, pg.rank() * per_rank, per_rank).to(device);
    pg.barrier()->wait();  // steps start together, so the step time is the slowest rank's
    StepTimes t = timed_step([&](const Tensor& in) { return ddp(in); }, opt, x, y, c.precision == "bf16");
    // The global loss (mean over ranks), comparable with the other modes.
    Tensor global_loss = t.loss.detach().reshape({1}).clone();
    pg.allreduce(global_loss, parallel::ReduceOp::Avg)->wait();
    r.losses.push_back(global_loss.item<double>());
    if (s >= c.warmup) {
      timer.add(t.forward, t.backward, t.optimizer, t.total);
      step_ms.push_back(t.total);
    }
  }
  Tensor wire = full(
      {1}, reads_wire ? static_cast<double>(bench::interface_tx_bytes(c.wire_interface) - wire_start) : 0.0,
      TensorOptions{DType::f64});
  pg.allreduce(wire, parallel::ReduceOp::Sum)->wait();
  if (!c.wire_interface.empty()) r.wire_bytes_per_step = wire.item<double>() / c.steps;
  Tensor percentiles = full({2}, 0.0, TensorOptions{DType::f64});
  percentiles.data<double>()[0] = bench::percentile(step_ms, 0.5);
  percentiles.data<double>()[1] = bench::percentile(step_ms, 0.95);
  Tensor all_percentiles = zeros({pg.size(), 2}, TensorOptions{DType::f64});
  pg.allgather(all_percentiles, percentiles)->wait();
  for (int rank = 0; rank < pg.size(); ++rank) {
    r.rank_step_p50_ms.push_back(all_percentiles.data<double>()[2 * rank]);
    r.rank_step_p95_ms.push_back(all_percentiles.data<double>()[2 * rank + 1]);
  }
  for (const Tensor& p : model->parameters()) r.gradient_bytes += static_cast<int64_t>(p.nbytes());
  r.comm_hook = c.comm_hook == "powersgd" ? str_cat("powersgd rank ", c.powersgd_rank) : c.comm_hook;
  r.allreduced_bytes_per_step = static_cast<double>(ddp.stats().bytes) / c.steps;
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
  r.bucket_cap_mb = ddp.options().bucket_cap_mb;
  r.first_bucket_cap_mb = ddp.options().first_bucket_cap_mb;
  r.note = str_cat(ddp.bucket_layout().size(), " buckets of at most ", r.bucket_cap_mb, " MB, ", c.algo,
                   c.no_overlap ? ", no overlap (reduced after backward)" : "",
                   c.comm_hook != "none" ? ", comm hook " + r.comm_hook : "");
  if (c.bucket_cap_auto) r.bucket_choice = ddp.bucket_cap_choice().summary();
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
  std::string command = c.launcher;
  if (command.empty()) {
    command = "mpiexec -n " + std::to_string(c.devices);
    if (std::system("mpiexec --version 2>/dev/null | grep -Eq 'Open MPI|OpenRTE'") == 0) {
      command += " --oversubscribe";
      if (geteuid() == 0) command += " --allow-run-as-root";
    }
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

}  // namespace mg::bench_dp_vs_ddp

#endif  // MG_HAS_CLI11 && MG_HAS_NLOHMANN_JSON
