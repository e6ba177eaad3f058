// bench_parallelism's output: the table it prints and the JSON it writes (bench_parallelism.h
// declares them; bench_parallelism.cpp measures the rows).
#if defined(MG_HAS_CLI11) && defined(MG_HAS_NLOHMANN_JSON)
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_common.h"
#include "bench_parallelism.h"

namespace mg::bench_parallelism {

double mb(double bytes) { return bytes / (1024.0 * 1024.0); }

// The fullest device of a row: the one that limits the model size.
Memory fullest(const Row& r) {
  Memory top;
  for (const Memory& m : r.memory)
    if (m.peak() > top.peak()) top = m;
  return top;
}

std::string format_fixed(double v, int digits) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", digits, v);
  return text;
}

void print_table(const Config& c, int world, const std::vector<Row>& rows, double param_bytes) {
  std::printf(
      "\nbench_parallelism: TinyGPT (%lld layers, %lld heads, n_embd %lld, T %lld, vocab %lld: %.2f MB of "
      "parameters), global batch %lld, AdamW, %d timed steps, N = %d ranks\n",
      static_cast<long long>(c.layers), static_cast<long long>(c.heads), static_cast<long long>(c.embd),
      static_cast<long long>(c.seq), static_cast<long long>(c.vocab), mb(param_bytes),
      static_cast<long long>(c.global_batch), c.steps, world);
  std::printf("%s, load %.2f, %s\n\n", bench::cpu_model().c_str(), bench::load_average(),
              bench::utc_now().c_str());
  const bool capped = c.memory_cap_mb > 0;
  std::printf("%-12s %9s %8s %7s | %7s %7s %7s %7s %7s%s | %9s %10s %8s | %7s | %9s  %s\n", "strategy",
              "samples/s", "vs single", "step ms", "params", "grads", "optim", "rest", "peak",
              capped ? "     cap" : "", "moved MB", "formula MB", "ratio", "bubble", "loss diff", "setup");
  const double base = rows.empty() ? 1.0 : rows[0].samples_per_s;
  for (const Row& r : rows) {
    const Memory top = fullest(r);
    const std::string cap = !capped ? "" : mb(top.peak()) > c.memory_cap_mb ? "    OVER" : "    fits";
    // Four digits: the check is to the byte, a rounded 100% would hide a small excess.
    const std::string ratio = r.predicted_bytes > 0
                                  ? str_cat(format_fixed(100.0 * r.counted_bytes / r.predicted_bytes, 2), "%")
                                  : "-";
    std::printf(
        "%-12s %9.1f %8.2fx %7.1f | %7.2f %7.2f %7.2f %7.2f %7.2f%s | %9s %10.3f %8s | %7.3f | %9.1e  %s\n",
        r.name.c_str(), r.samples_per_s, r.samples_per_s / base, r.step_ms, mb(top.params), mb(top.grads),
        mb(top.optimizer), mb(top.rest), mb(top.peak()), cap.c_str(),
        format_fixed(mb(r.counted_bytes), 3).c_str(), mb(r.predicted_bytes), ratio.c_str(), r.bubble,
        r.loss_diff, r.note.c_str());
  }
  std::printf(
      "\nmemory: MB on the fullest device: params, grads, optimizer state, and rest = the most one step "
      "raised\n"
      "the device's memory (activations, temporaries, communication buffers), plus DDP's buckets (kept "
      "between\nsteps). The strategies' steps interleave.\n"
      "moved MB: per rank per step, what the collectives were asked to move "
      "(ProcessGroup::requested_traffic(),\n"
      "the ring algorithms' bytes, a figure per call and not a link measurement); for dp the bytes "
      "Tensor::to\n"
      "copied between devices (cross_device_copy_bytes()), the mean over the devices. formula MB: the same "
      "from\n"
      "the model's sizes alone (docs/model-parallel.md); they must agree to the byte (rounding and ZeRO's\n"
      "padding aside) or the run fails. loss diff: the largest relative difference from single's loss over\n"
      "the timed steps.\n");
  if (capped)
    std::printf("cap: OVER when the fullest device's peak exceeds --memory-cap-mb %.1f MB.\n",
                c.memory_cap_mb);

  // The data-parallel family against the ZeRO formulas, f32 + AdamW: bytes per parameter.
  std::printf(
      "\nmemory against the ZeRO paper's formulas (f32 training: 4 B weights + 4 B gradients + 8 B AdamW "
      "moments per\nparameter), MB on the fullest device, measured (formula):\n");
  std::printf("%-10s %-11s | %17s %17s %17s | %17s | %7s %7s\n", "strategy", "bytes/param", "params", "grads",
              "optim", "gathered in flight", "rest", "peak");
  for (const Row& r : rows) {
    if (!r.memory_formula) continue;
    const MemoryFormula& f = *r.memory_formula;
    const Memory top = fullest(r);
    auto pair = [](double measured, double formula) {
      char text[64];
      std::snprintf(text, sizeof text, "%7.3f (%7.3f)", mb(measured), mb(formula));
      return std::string(text);
    };
    const std::string gathered = f.gathered > 0 ? pair(r.gathered_peak, f.gathered) : "-";
    std::printf("%-10s %-11s | %17s %17s %17s | %17s | %7.2f %7.2f\n", r.name.c_str(), f.text.c_str(),
                pair(top.params, f.params).c_str(), pair(top.grads, f.grads).c_str(),
                pair(top.optimizer, f.optimizer).c_str(), gathered.c_str(), mb(top.rest), mb(top.peak()));
  }
  std::printf(
      "gathered in flight: FSDP's most full-unit bytes alive at once (FSDPStats::peak_gathered_bytes), part "
      "of rest;\nits formula: the root unit (embeddings, ln_f, lm_head: gathered all step) + 2 blocks (the "
      "one computing,\nthe one prefetched). Each measured figure must equal its formula up to the shards' "
      "padding and AdamW's\n8-byte step counters, or the run fails.\n");
}

namespace {

nlohmann::json to_json(const Config& c, int world, const std::vector<Row>& rows, double param_bytes) {
  nlohmann::json j;
  j["benchmark"] = "bench_parallelism";
  j["config"] = {{"layers", c.layers},
                 {"embd", c.embd},
                 {"heads", c.heads},
                 {"seq", c.seq},
                 {"vocab", c.vocab},
                 {"global_batch", c.global_batch},
                 {"micro_batches", c.micro_batches},
                 {"steps", c.steps},
                 {"world", world},
                 {"param_bytes", param_bytes}};
  j["machine"] = {{"cpu", bench::cpu_model()},
                  {"cores", sysconf(_SC_NPROCESSORS_ONLN)},
                  {"load", bench::load_average()},
                  {"utc", bench::utc_now()}};
  for (const Row& r : rows) {
    nlohmann::json memory = nlohmann::json::array();
    for (const Memory& m : r.memory)
      memory.push_back({{"params", m.params},
                        {"grads", m.grads},
                        {"optimizer", m.optimizer},
                        {"rest", m.rest},
                        {"peak", m.peak()}});
    j["rows"].push_back(
        {{"strategy", r.name},
         {"note", r.note},
         {"step_ms", r.step_ms},
         {"samples_per_s", r.samples_per_s},
         {"memory", memory},
         // sent_bytes: requested_traffic() per rank (dp: bytes copied between devices, per device).
         {"sent_bytes", r.counted_bytes},
         {"counted_by", r.name == "dp" ? "cross_device_copy_bytes" : "requested_traffic"},
         {"calls", r.counted_calls},
         {"model_bytes", r.predicted_bytes},
         {"allowed_difference_bytes", r.slack_bytes},
         {"bubble", r.bubble},
         {"losses", r.losses},
         {"loss_diff", r.loss_diff}});
    if (r.memory_formula) {
      const MemoryFormula& f = *r.memory_formula;
      j["rows"].back()["memory_formula"] = {{"bytes_per_param", f.text},
                                            {"params", f.params},
                                            {"grads", f.grads},
                                            {"optimizer", f.optimizer},
                                            {"allowed_difference", f.slack},
                                            {"gathered", f.gathered},
                                            {"gathered_measured", r.gathered_peak}};
    }
    if (c.memory_cap_mb > 0) j["rows"].back()["over_cap"] = mb(fullest(r).peak()) > c.memory_cap_mb;
  }
  if (c.memory_cap_mb > 0) j["config"]["memory_cap_mb"] = c.memory_cap_mb;
  return j;
}

}  // namespace

void write_json(const Config& c, int world, const std::vector<Row>& rows, double param_bytes) {
  std::ofstream out(c.json);
  out << to_json(c, world, rows, param_bytes).dump(2) << "\n";
}

}  // namespace mg::bench_parallelism

#endif  // MG_HAS_CLI11 && MG_HAS_NLOHMANN_JSON
