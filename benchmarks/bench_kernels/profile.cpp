// bench_kernels --profile: every row's call traced by the CUDA emulator and predicted on a GPU (the
// H200 unless --gpu names another: cuda_emu/gpu_spec.h).
//
// In the emulation build bench_kernels links libmultigrad_traced, whose kernels report every
// access to the emulator (cuda_emu/profiler.h). With --profile, median_seconds() (bench_kernels.h)
// does not time: it runs the call once between profile::begin() and profile::end(), tracing the
// first --profile-blocks blocks of each launch (at least two whole rows of a 2-D grid) and
// skipping the rest, and returns the GPU model's predicted time (cuda_emu/gpu_model.h). The
// family then attaches the counters to its row with take_profile(ideal bytes, CUDA-core FLOPs),
// and main.cpp prints them as the profile table. Every time here is a PREDICTION.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "bench_kernels.h"

#if defined(MG_CUDA_EMULATE)
#include "cuda_emu/emulator.h"
#include "cuda_emu/gpu_model.h"
#include "cuda_emu/profile_report.h"
#include "cuda_emu/profiler.h"
#endif

namespace mg::bench {

#if defined(MG_CUDA_EMULATE)
namespace {

namespace profile = mg_emu::profile;

const mg_emu::GpuSpec* g_gpu = &mg_emu::h200_sxm();  // --gpu
bool g_count_instructions = true;                    // off: --no-instructions
uint64_t g_host_syncs = 0;  // the host synchronisations of the last traced call (emulator.h: Counters)

std::vector<profile::LaunchProfile>& last_launches() {
  static std::vector<profile::LaunchProfile> launches;
  return launches;
}

// Runs fn between profile::begin(options) and profile::end(); its launches become last_launches()
// and the times the host waited for the device in it g_host_syncs.
void run_traced(const std::function<void()>& fn, const profile::Options& options) {
  cudaDeviceSynchronize();
  const uint64_t syncs_before = mg_emu::counters().host_syncs;
  profile::begin(options);
  try {
    fn();
  } catch (...) {
    profile::end();
    throw;
  }
  g_host_syncs = mg_emu::counters().host_syncs - syncs_before;  // fn's own, not end()'s wait
  last_launches() = profile::end();
}

double threads_of(const profile::LaunchProfile& l) {
  return static_cast<double>(l.blocks) * l.block.x * l.block.y * l.block.z;
}

}  // namespace

void set_profile_instructions(bool on) { g_count_instructions = on; }

std::string set_profile_gpu(const std::string& key) {
  try {
    g_gpu = &mg_emu::find_gpu_spec(key);
  } catch (const std::invalid_argument& e) {
    throw Error(str_cat("bench_kernels --gpu: ", e.what()));
  }
  return g_gpu->name;
}

double profiled_seconds(const std::function<void()>& fn, const BenchOptions& o) {
  MG_CHECK(profile::available(),
           "bench_kernels --profile: this binary's kernels are not instrumented (it must link "
           "libmultigrad_traced: the emulation build's bench_kernels does)");
  profile::Options options;
  options.max_traced_blocks = static_cast<uint64_t>(o.profile_blocks);
  options.min_traced_rows = 2;
  options.skip_untraced_blocks = true;
  options.gpu = g_gpu;
  options.count_instructions = g_count_instructions;
  run_traced(fn, options);
  if (o.profile_sites) {
    profile::print_sites(stdout, last_launches());
    for (const auto& l : last_launches()) {
      profile::print_instructions(stdout, l.instructions);
      const mg_emu::KernelWork w = profile::work_of(l, 0);
      profile::print_limits(stdout, mg_emu::predict(w, *g_gpu), w);
    }
  }
  return take_profile(0, 0).predicted_seconds;
}

ProfileRow profile_step(const std::function<void()>& fn, bool sites) {
  MG_CHECK(profile::available(), "bench_kernels --profile: this binary's kernels are not instrumented");
  profile::Options options;  // every block traced and run: the step must compute right
  options.gpu = g_gpu;
  options.count_instructions = g_count_instructions;
  run_traced(fn, options);
  if (sites) profile::print_sites(stdout, last_launches());
  return take_profile(0, 0);
}

ProfileRow take_profile(double ideal_bytes, double fp32_flops) {
  ProfileRow p;
  const std::vector<profile::LaunchProfile>& launches = last_launches();
  p.valid = true;
  p.launches = static_cast<int>(launches.size());
  p.ideal_bytes = ideal_bytes;
  p.fp32_flops = fp32_flops;
  double all_threads = 0;
  for (const auto& l : launches) all_threads += threads_of(l);
  double ideal_seconds = 0, slowest = -1;
  std::vector<mg_emu::Prediction> predictions;                          // one a launch
  std::map<std::string, std::pair<bool, profile::AccessCounts>> sites;  // "where space op" -> counts
  for (const auto& l : launches) {
    p.blocks += static_cast<double>(l.blocks);
    p.library_calls += l.library ? 1 : 0;
    p.launch_seconds += g_gpu->launch_latency_s;
    p.traced_blocks += static_cast<double>(l.traced_blocks);
    p.load_requests += l.global_load.requests;
    p.load_sectors += l.global_load.sectors;
    p.load_bytes += l.global_load.bytes;
    p.store_requests += l.global_store.requests;
    p.store_sectors += l.global_store.sectors;
    p.store_bytes += l.global_store.bytes;
    p.atomic_lanes += l.global_atomic.lanes;
    for (const profile::AccessCounts* c : {&l.shared_load, &l.shared_store, &l.shared_atomic}) {
      p.shared_requests += c->requests;
      p.shared_wavefronts += c->wavefronts;
      p.shared_ideal_wavefronts += c->ideal_wavefronts;
    }
    if (std::find(p.kernels.begin(), p.kernels.end(), l.kernel) == p.kernels.end())
      p.kernels.push_back(l.kernel);
    p.mma += l.mma;
    p.tensor_flops += l.tensor_flops;
    p.dram_bytes += l.dram_bytes_lru();
    p.l1_hit_sectors += l.l1_hit_sectors;
    p.l1_pending_sectors += l.l1_pending_sectors;
    p.l2_sectors += l.l2_sectors;
    p.warp_instructions += profile::work_of(l, 0).warp_instructions;
    if (l.instructions.counted) {
      p.issued_instructions += l.instructions.total();
      ++p.counted_launches;
    }
    p.dram_bytes_first_touch += l.dram_bytes_first_touch();
    const double share = all_threads > 0 ? fp32_flops * threads_of(l) / all_threads : 0;
    const mg_emu::Prediction pred = mg_emu::predict(profile::work_of(l, share), *g_gpu);
    predictions.push_back(pred);
    ideal_seconds += pred.ideal_seconds;
    if (pred.seconds > slowest) {
      slowest = pred.seconds;
      p.binding = pred.binding;
    }
    for (const profile::SiteCounts& s : l.sites) {  // one line per instruction, its instances merged
      if (s.counts.requests == 0 || s.space == profile::Space::none) continue;
      const std::string key =
          s.where + (s.space == profile::Space::global ? " global " : " shared ") + profile::name_of(s.op);
      profile::AccessCounts scaled = s.counts;
      for (double* v : {&scaled.requests, &scaled.sectors, &scaled.wavefronts}) *v *= l.scale;
      auto& [global, counts] = sites[key];
      global = s.space == profile::Space::global;
      counts.add(scaled);
    }
  }
  std::vector<std::pair<double, std::string>> worst;
  for (const auto& [key, site] : sites) {
    const auto& [global, c] = site;
    char text[64];
    std::snprintf(text, sizeof text, ": %.2f %s/req", (global ? c.sectors : c.wavefronts) / c.requests,
                  global ? "sectors" : "wavefronts");
    worst.emplace_back(c.sectors + c.wavefronts, key + text);
  }
  // The launches one after another, and the host waiting for the device in between (a result
  // copied back, as cross-entropy's count of rows is), as a training step is priced.
  p.predicted_seconds = mg_emu::predict_step_seconds(predictions, g_host_syncs, *g_gpu);
  p.host_syncs = static_cast<double>(g_host_syncs);
  p.sync_seconds = p.host_syncs * g_gpu->host_sync_s;
  p.roofline_fraction = p.predicted_seconds > 0 ? ideal_seconds / p.predicted_seconds : 0;
  std::sort(worst.begin(), worst.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < worst.size() && i < 3; ++i) p.worst_sites.push_back(worst[i].second);
  return p;
}

#else  // a real GPU build: nothing is traced

void set_profile_instructions(bool) {}

std::string set_profile_gpu(const std::string&) {
  throw Error(
      "bench_kernels --gpu chooses the GPU --profile predicts for: run the emulation build's "
      "build-emu/benchmarks/bench_kernels --profile --gpu NAME");
}

double profiled_seconds(const std::function<void()>&, const BenchOptions&) {
  throw Error(
      "bench_kernels --profile counts accesses under the CUDA emulator: run the emulation build's "
      "build-emu/benchmarks/bench_kernels --profile");
}
ProfileRow take_profile(double, double) { return ProfileRow{}; }
ProfileRow profile_step(const std::function<void()>&, bool) { return ProfileRow{}; }

#endif

}  // namespace mg::bench
