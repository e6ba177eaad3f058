// bench_dp_vs_ddp's report: the verdict (do DP and DDP end where one device computing the same
// gradients ends?), the table, each DDP run's details, the bucket-size sweep, and the α-β scaling
// model's predictions (scaling_model.h) beside what was measured.
#include "bench_dp_vs_ddp_common.h"

#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/safetensors.h"

namespace mg::bench_dp_vs_ddp {
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

bool lossy_comm_hook(const Config& c) { return c.comm_hook != "none"; }

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
      // A lossy communication hook changes DDP's gradients on purpose: how far its parameters
      // move from one device's is what it costs, shown but not a failure (scripts/bench-comm-hooks
      // measures that cost in accuracy).
      if (r.mode == "ddp" && lossy_comm_hook(c)) {
        a.differs = false;
        a.verdict = str_cat("differ by ", format_sci(diff), " (", c.comm_hook, " hook: lossy, not checked)");
      }
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
        bool is_flag = key == "--predict" || key == "--no-overlap";
        if (!is_flag && i + 1 < args.size()) ++i;  // its value
      } else if (args[i].rfind(key + "=", 0) == 0) {
        drop = true;
      }
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

namespace {

// The scaling model's workload: one device's measured phases and gradient arrivals (`single`).
bench::Workload workload_of(const Config& c, const Result& single) {
  bench::Workload w;
  w.forward_s = single.forward_ms / 1000;
  w.backward_s = single.backward_ms / 1000;
  w.optimizer_s = single.optimizer_ms / 1000;
  w.gradients = single.gradient_arrivals;
  w.batch_io_bytes = single.batch_io_bytes;
  w.bucket_cap_mb = c.bucket_cap_mb;
  w.first_bucket_cap_mb = c.first_bucket_cap_mb;
  return w;
}

}  // namespace

// The α-β model's step time for one DDP run: `single`'s compute, the run's own caps and the link
// it measured (0 when it measured none). N ranks on fewer cores than N share them: each rank's
// compute then takes N / cores times its share (4 ranks on 2 cores compute like 2).
double predicted_ddp_step_ms(const Config& c, const Result& single, const Result& ddp) {
  if (ddp.link_beta_s_per_byte <= 0 || single.gradient_arrivals.empty()) return 0;
  bench::Workload w = workload_of(c, single);
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  const double sharing = std::max(1.0, ddp.devices / cores);
  w.forward_s *= sharing;
  w.backward_s *= sharing;
  w.optimizer_s *= sharing;
  w.bucket_cap_mb = ddp.bucket_cap_mb;
  w.first_bucket_cap_mb = ddp.first_bucket_cap_mb > 0 ? ddp.first_bucket_cap_mb : c.first_bucket_cap_mb;
  // A compressing hook sends fewer bytes: each bucket's all-reduce is charged the measured
  // fraction. Scaling the caps by the same fraction keeps the buckets the Reducer forms from the
  // gradients' full sizes. PowerSGD's second all-reduce per bucket and its matrix products are
  // not in the model.
  if (ddp.allreduced_bytes_per_step > 0 && ddp.gradient_bytes > 0 && !ddp.comm_hook.empty() &&
      ddp.comm_hook != "none") {
    const double sent = ddp.allreduced_bytes_per_step / static_cast<double>(ddp.gradient_bytes);
    for (auto& gradient : w.gradients)
      gradient.second = std::max<int64_t>(1, std::llround(static_cast<double>(gradient.second) * sent));
    w.bucket_cap_mb *= sent;
    w.first_bucket_cap_mb *= sent;
  }
  bench::Link link{"measured", ddp.link_alpha_s, ddp.link_beta_s_per_byte};
  return bench::predict_ddp(w, link, ddp.devices).step_s * 1000;
}

// A DDP run's per-rank step percentiles, bytes on the wire, prediction and bucket choice.
void print_ddp_details(const Result& r) {
  std::string ranks;
  for (size_t i = 0; i < r.rank_step_p50_ms.size(); ++i) {
    char text[64];
    std::snprintf(text, sizeof text, "%srank %zu %.2f/%.2f", i ? ", " : "", i, r.rank_step_p50_ms[i],
                  r.rank_step_p95_ms[i]);
    ranks += text;
  }
  std::printf("ddp step p50/p95 ms: %s\n", ranks.c_str());
  if (!r.comm_hook.empty() && r.comm_hook != "none")
    std::printf("ddp comm hook %s: %.0f bytes all-reduced per step (gradients %lld bytes: %.1fx less)\n",
                r.comm_hook.c_str(), r.allreduced_bytes_per_step, static_cast<long long>(r.gradient_bytes),
                r.allreduced_bytes_per_step > 0 ? r.gradient_bytes / r.allreduced_bytes_per_step : 0.0);
  if (r.wire_bytes_per_step >= 0)
    std::printf("ddp bytes on the wire per step (all nodes' tx): %.0f; gradients %lld bytes\n",
                r.wire_bytes_per_step, static_cast<long long>(r.gradient_bytes));
  if (r.predicted_step_ms > 0)
    std::printf("ddp alpha-beta model: %.2f ms predicted, %.2f ms measured (prediction %+.0f%%)\n",
                r.predicted_step_ms, r.step_ms, 100 * (r.predicted_step_ms - r.step_ms) / r.step_ms);
  if (!r.bucket_choice.empty()) std::printf("ddp %s\n", r.bucket_choice.c_str());
}

// DDP once per bucket cap: how bucket size trades latency (many small all-reduces) against
// overlap (one big all-reduce can only start when backward is over). An "auto" row is always
// added: the cap DDP chooses from the measured link, beside the fixed ones. The item "no-overlap"
// is one bucket reduced after backward (--no-overlap).
json run_bucket_sweep(const Config& c, const std::vector<std::string>& forwarded, const Result* single) {
  std::vector<std::string> items;
  std::string list = c.sweep_buckets + ",";
  for (size_t start = 0, comma; (comma = list.find(',', start)) != std::string::npos; start = comma + 1)
    if (comma > start) items.push_back(list.substr(start, comma - start));
  if (std::find(items.begin(), items.end(), "auto") == items.end()) items.push_back("auto");
  std::printf("\nDDP bucket-size sweep (%s, N=%d, %s):\n", c.model.c_str(), c.devices, c.algo.c_str());
  std::printf("%12s %8s %9s %9s %9s %9s %9s %9s %12s\n", "cap MB", "buckets", "step ms", "p95 max", "comm ms",
              "exposed", "exposed%", "model ms", "wire B/step");
  json rows = json::array();
  std::vector<Result> runs;
  for (const std::string& item : items) {
    Config one = c;
    one.bucket_cap_auto = item == "auto";
    one.no_overlap = item == "no-overlap";
    std::vector<std::string> args =
        without_options(forwarded, {"--bucket-cap-mb", "--modes", "--no-overlap"});
    if (!one.bucket_cap_auto && !one.no_overlap) {
      args = without_options(args, {"--first-bucket-cap-mb"});
      // A fixed cap below the first bucket's caps the first bucket too, or a model smaller than
      // the first cap (1 MB) would be one bucket at every cap of the sweep.
      one.bucket_cap_mb = std::stod(item);
      one.first_bucket_cap_mb = std::min(c.first_bucket_cap_mb, one.bucket_cap_mb);
      args.insert(args.end(), {"--first-bucket-cap-mb", str_cat(one.first_bucket_cap_mb)});
    }
    if (one.no_overlap) {
      args.push_back("--no-overlap");
    } else {
      args.push_back("--bucket-cap-mb");
      args.push_back(item);
    }
    Result r = launch_ddp(one, args);
    if (single != nullptr) r.predicted_step_ms = predicted_ddp_step_ms(c, *single, r);
    const double share = r.comm_ms > 0 ? 100.0 * r.exposed_ms / r.comm_ms : 0;
    const double p95 = r.rank_step_p95_ms.empty()
                           ? 0
                           : *std::max_element(r.rank_step_p95_ms.begin(), r.rank_step_p95_ms.end());
    char label[32];
    if (one.bucket_cap_auto)
      std::snprintf(label, sizeof label, "auto=%.3g", r.bucket_cap_mb);
    else
      std::snprintf(label, sizeof label, "%s", item.c_str());
    std::printf("%12s %8s %9.2f %9.2f %9.2f %9.2f %8.0f%% %9.2f %12.0f\n", label,
                r.note.substr(0, r.note.find(' ')).c_str(), r.step_ms, p95, r.comm_ms, r.exposed_ms, share,
                r.predicted_step_ms, r.wire_bytes_per_step);
    json row = r.to_json();
    row["exposed_share"] = share / 100.0;
    row["cap"] = item;
    rows.push_back(row);
    runs.push_back(r);
  }
  // Where auto landed: its step beside the best fixed cap's.
  const Result* best = nullptr;
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i] != "auto" && items[i] != "no-overlap" &&
        (best == nullptr || runs[i].step_ms < best->step_ms))
      best = &runs[i];
  const Result& automatic =
      runs[static_cast<size_t>(std::find(items.begin(), items.end(), "auto") - items.begin())];
  std::printf("auto: %s\n", automatic.bucket_choice.c_str());
  if (best != nullptr)
    std::printf("auto chose %.3g MB: step %.2f ms; the best fixed cap, %g MB: %.2f ms (auto %+.0f%%)\n",
                automatic.bucket_cap_mb, automatic.step_ms, best->bucket_cap_mb, best->step_ms,
                100 * (automatic.step_ms - best->step_ms) / best->step_ms);
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
  bench::Workload w = workload_of(c, *single);
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

}  // namespace mg::bench_dp_vs_ddp

#endif  // MG_HAS_CLI11 && MG_HAS_NLOHMANN_JSON
