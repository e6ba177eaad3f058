// The profiler's report (profile_report.h).
#include "cuda_emu/profile_report.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

namespace mg_emu::profile {

KernelWork work_of(const LaunchProfile& l, double fp32_flops) {
  KernelWork w;
  if (l.library) {  // a cuBLAS/cuDNN call: its FLOPs and ideal bytes over a full GPU
    w.blocks = 132;
    w.threads_per_block = 256;
    w.dram_bytes = l.dram_bytes_lru();
    w.l2_sectors = w.dram_bytes / 32;
    w.fp32_flops = l.fp32_flops;
    w.tensor_flops = l.tensor_flops;
    w.load_round_trips = 0;
    return w;
  }
  w.blocks = l.blocks;
  w.threads_per_block = static_cast<int>(l.block.x * l.block.y * l.block.z);
  w.shared_bytes_per_block = l.shared_bytes_per_block;
  w.dram_bytes = l.dram_bytes_lru();
  w.l2_sectors = l.l2_sectors;  // after the L1s (cache_model.h)
  w.global_load_requests = l.global_load.requests;
  w.global_load_sectors = l.global_load.sectors;
  w.l1_hit_sectors = l.l1_hit_sectors;
  w.l1_pending_sectors = l.l1_pending_sectors;
  w.load_round_trips = l.load_round_trips;
  w.barriers = l.barriers;
  w.shared_wavefronts = l.shared_load.wavefronts + l.shared_store.wavefronts + l.shared_atomic.wavefronts;
  w.l1_wavefronts = l.global_load.wavefronts + l.global_store.wavefronts + l.global_atomic.wavefronts;
  // Every warp request is one instruction; a cp.async is in both global_load and shared_store.
  w.warp_instructions = l.global_load.requests + l.global_store.requests + l.global_atomic.requests +
                        l.shared_load.requests + l.shared_store.requests + l.shared_atomic.requests -
                        l.cp_async + l.mma;
  w.fp32_flops = fp32_flops;
  w.tensor_flops = l.tensor_flops;
  w.atomics = l.global_atomic.lanes;
  if (l.instructions.counted) {
    using K = InstructionKind;
    const InstructionMix& m = l.instructions;
    w.issued_instructions = m.total();
    w.fp32_instructions = m.of(K::fp32);
    w.integer_instructions = m.of(K::integer);
    w.quarter_rate_instructions = m.of(K::conversion) + m.of(K::special);
    w.registers_per_thread = m.registers_per_thread;
    w.warp_cycles = m.warp_cycles;
    // Round trips from the PTX's dataflow (an unrolled loop's loads together), the tracer's
    // cp.async waits beside them.
    if (m.load_round_trips >= 0) w.load_round_trips = m.load_round_trips + l.async_round_trips;
    w.local_bytes = static_cast<double>(m.stack_bytes) * static_cast<double>(w.blocks) * w.threads_per_block;
  }
  return w;
}

void print_instructions(std::FILE* out, const InstructionMix& m) {
  if (!m.counted) {
    if (!m.why.empty()) std::fprintf(out, "    %-14s not counted: %s\n", "instructions", m.why.c_str());
    return;
  }
  const double total = m.total();
  std::fprintf(out, "    %-14s %12.0f warp instructions from %s", "instructions", total, m.source.c_str());
  if (m.registers_per_thread > 0) std::fprintf(out, ", %d registers/thread", m.registers_per_thread);
  if (m.stack_bytes > 0)  // local memory: a copied argument or array indexed at run time, or spills
    std::fprintf(out, ", a %d-byte stack frame/thread in LOCAL MEMORY", m.stack_bytes);
  std::fprintf(out, ":");
  for (size_t k = 0; k < kInstructionKinds; ++k)
    if (total > 0 && m.warp_instructions[k] >= 0.005 * total)
      std::fprintf(out, " %s %.0f%%", name_of(static_cast<InstructionKind>(k)),
                   100 * m.warp_instructions[k] / total);
  if (total > 0 && m.inherited > 0)
    std::fprintf(out, " (%.0f%% counted without an anchor)", 100 * m.inherited / total);
  std::fprintf(out, "\n");
}

void print_sites(std::FILE* out, const std::vector<LaunchProfile>& launches, int indent) {
  const int in = indent, in2 = indent + 2;
  for (const auto& l : launches) {
    if (l.library) {
      std::fprintf(out, "%*slaunch %s (library call: %.3g FLOPs, %.3g bytes)\n", in, "", l.kernel.c_str(),
                   l.fp32_flops + l.tensor_flops, l.dram_bytes_lru());
      continue;
    }
    std::fprintf(out,
                 "%*slaunch %s grid %ux%ux%u block %ux%ux%u, %llu of %llu blocks traced, DRAM %.3g bytes\n",
                 in, "", l.kernel.c_str(), l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z,
                 static_cast<unsigned long long>(l.traced_blocks), static_cast<unsigned long long>(l.blocks),
                 l.dram_bytes_lru());
    for (const SiteCounts& s : l.sites) {
      const AccessCounts& c = s.counts;
      if (s.space == Space::global)
        std::fprintf(out, "%*s%-44s global %-8s %10.0f requests %6.2f sectors/req %4.0f%% efficiency\n", in2,
                     "", s.where.c_str(), name_of(s.op), c.requests, c.sectors / c.requests,
                     c.sectors > 0 ? 100 * c.bytes / (32 * c.sectors) : 0.0);
      else if (s.space == Space::shared)
        std::fprintf(out, "%*s%-44s shared %-8s %10.0f requests %6.2f wavefronts/req (%.2f of ideal)\n", in2,
                     "", s.where.c_str(), name_of(s.op), c.requests, c.wavefronts / c.requests,
                     c.ideal_wavefronts > 0 ? c.wavefronts / c.ideal_wavefronts : 0.0);
      else
        std::fprintf(out, "%*s%-44s %-15s %10.0f instructions\n", in2, "", s.where.c_str(), name_of(s.op),
                     c.requests);
    }
  }
}

void print_limits(std::FILE* out, const Prediction& p, const KernelWork& w, int indent) {
  std::vector<Limit> limits = p.limits;
  std::stable_sort(limits.begin(), limits.end(),
                   [](const Limit& a, const Limit& b) { return a.seconds > b.seconds; });
  std::fprintf(out, "%*slimits (predicted, us):", indent, "");
  bool first = true;
  for (const Limit& l : limits) {
    if (l.seconds <= 0) continue;
    std::fprintf(out, "%s %s %.2f", first ? "" : ",", l.name, l.seconds * 1e6);
    first = false;
  }
  std::fprintf(out, "; memory and SM overlapped %.2f\n", p.overlap_seconds * 1e6);
  std::fprintf(out,
               "%*s%d blocks/SM, %d resident warps, %.4g round trips, %.0f bytes in flight, a round trip "
               "%.0f ns; sectors loaded %.4g, L1 hits %.4g (%.4g pending), to L2 %.4g; DRAM %.4g bytes\n",
               indent, "", p.blocks_per_sm, p.resident_warps,
               w.load_round_trips >= 0 ? w.load_round_trips : w.global_load_requests, p.bytes_in_flight,
               p.load_latency_seconds * 1e9, w.global_load_sectors, w.l1_hit_sectors, w.l1_pending_sectors,
               w.l2_sectors, w.dram_bytes);
}

namespace {

// The launch's counts (already scaled to the whole grid when only its first blocks were traced).
void print_counts(std::FILE* out, const char* what, const AccessCounts& c, bool shared) {
  if (c.requests == 0) return;
  if (shared)
    std::fprintf(out, "    %-14s %12.0f requests %8.0f wavefronts (%.2f per request, %.2fx the ideal %.0f)\n",
                 what, c.requests, c.wavefronts, c.wavefronts / c.requests,
                 c.ideal_wavefronts > 0 ? c.wavefronts / c.ideal_wavefronts : 0.0, c.ideal_wavefronts);
  else
    std::fprintf(out,
                 "    %-14s %12.0f requests %8.0f sectors (%.2f per request, %.0f%% of their bytes used)\n",
                 what, c.requests, c.sectors, c.sectors / c.requests,
                 c.sectors > 0 ? 100 * c.bytes / (32 * c.sectors) : 0.0);
}

}  // namespace

void print_report(std::FILE* out, const std::vector<LaunchProfile>& launches, bool sites) {
  const GpuSpec& gpu = default_gpu_spec();
  std::fprintf(
      out,
      "\n== cuda_emu profile: %zu launch%s (counts from the emulator's access tracer; times on an %s "
      "are PREDICTIONS of cuda_emu/gpu_model.h, not measurements) ==\n",
      launches.size(), launches.size() == 1 ? "" : "es", gpu.name.c_str());
  for (size_t i = 0; i < launches.size(); ++i) {
    const LaunchProfile& l = launches[i];
    const KernelWork w = work_of(l, 0);
    const Prediction p = predict(w, gpu);
    if (l.library) {
      std::fprintf(out, "[%zu] %s (library call): predicted on %s: %.2f us\n", i, l.kernel.c_str(),
                   gpu.name.c_str(), p.seconds * 1e6);
      continue;
    }
    std::fprintf(out, "[%zu] %s  grid (%u,%u,%u) block (%u,%u,%u)  shared %llu B/block", i, l.kernel.c_str(),
                 l.grid.x, l.grid.y, l.grid.z, l.block.x, l.block.y, l.block.z,
                 static_cast<unsigned long long>(l.shared_bytes_per_block));
    if (l.traced_blocks < l.blocks)
      std::fprintf(out, "  (%llu of %llu blocks traced, counts scaled to the grid)",
                   static_cast<unsigned long long>(l.traced_blocks),
                   static_cast<unsigned long long>(l.blocks));
    std::fprintf(out, "\n");
    print_counts(out, "global loads", l.global_load, false);
    print_counts(out, "global stores", l.global_store, false);
    print_counts(out, "global atomics", l.global_atomic, false);
    print_counts(out, "shared loads", l.shared_load, true);
    print_counts(out, "shared stores", l.shared_store, true);
    print_counts(out, "shared atomics", l.shared_atomic, true);
    std::fprintf(out, "    %-14s %12.0f bytes (through an L2 of %.0f MiB)\n", "DRAM", l.dram_bytes_lru(),
                 gpu.l2_capacity_bytes / (1024 * 1024));
    print_instructions(out, l.instructions);
    std::fprintf(out, "    predicted on %s: %.2f us, bound by %s (%.0f%% of the roofline)\n",
                 gpu.name.c_str(), p.seconds * 1e6, p.binding.c_str(), 100 * p.roofline_fraction);
    print_limits(out, p, w);
  }
  if (sites) {
    std::fprintf(out, "-- every instruction, per launch --\n");
    print_sites(out, launches, 2);
  }
}

namespace {

bool g_report_sites = false;

void report_at_exit() {
  const std::vector<LaunchProfile> launches = end();
  print_report(stderr, launches, g_report_sites);
}

}  // namespace

void start_from_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* v = std::getenv("MG_EMU_PROFILE");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "0") == 0) return;
    if (!available()) {
      std::fprintf(stderr,
                   "cuda_emu: MG_EMU_PROFILE is set, but this program's kernels are not instrumented: build "
                   "them with `mg-nvcc --profile` (or link libmultigrad_traced); nothing is profiled\n");
      return;
    }
    g_report_sites = std::strcmp(v, "sites") == 0;
    Options options;
    try {
      options.gpu = &default_gpu_spec();  // MG_EMU_GPU: which GPU the report predicts for
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "cuda_emu: %s\n", e.what());
      std::exit(2);
    }
    if (const char* b = std::getenv("MG_EMU_PROFILE_BLOCKS"))
      options.max_traced_blocks = std::strtoull(b, nullptr, 10);
    begin(options);
    std::atexit(report_at_exit);
  });
}

}  // namespace mg_emu::profile
