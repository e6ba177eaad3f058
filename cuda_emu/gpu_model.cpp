// The GPU roofline (cuda_emu/gpu_model.h): predicted times, never measured ones.
// docs/performance-model.md derives each step; cuda_emu/gpu_spec.cpp cites every constant.
#include "cuda_emu/gpu_model.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace mg_emu {

namespace {

uint64_t round_up(uint64_t x, uint64_t unit) { return (x + unit - 1) / unit * unit; }

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument("gpu model: " + what); }

void check_count(const char* name, double v) {
  if (!(v >= 0) || std::isinf(v)) invalid(std::string(name) + " must be a finite count >= 0");
}

// "2.43 us", "447.4 us", "3.82 ms".
std::string format_seconds(double s) {
  char buf[32];
  if (s < 1e-6)
    std::snprintf(buf, sizeof buf, "%.0f ns", s * 1e9);
  else if (s < 1e-3)
    std::snprintf(buf, sizeof buf, "%.2f us", s * 1e6);
  else if (s < 1)
    std::snprintf(buf, sizeof buf, "%.3f ms", s * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

}  // namespace

int blocks_per_sm(int threads_per_block, uint64_t shared_bytes_per_block, int registers_per_thread,
                  const GpuSpec& gpu) {
  if (threads_per_block < 1 || threads_per_block > gpu.max_threads_per_block)
    invalid("threads_per_block " + std::to_string(threads_per_block) + " is outside 1.." +
            std::to_string(gpu.max_threads_per_block));
  if (shared_bytes_per_block > gpu.shared_max_per_block)
    invalid("shared_bytes_per_block " + std::to_string(shared_bytes_per_block) + " is over the " +
            std::to_string(gpu.shared_max_per_block) + " bytes a block may have");
  if (registers_per_thread < 0 || registers_per_thread > gpu.max_registers_per_thread)
    invalid("registers_per_thread " + std::to_string(registers_per_thread) + " is outside 0.." +
            std::to_string(gpu.max_registers_per_thread));

  // Warps: a block takes whole warps; an SM holds max_threads_per_sm / 32 of them.
  const int warps_per_block = (threads_per_block + gpu.warp_size - 1) / gpu.warp_size;
  const int by_warps = gpu.max_threads_per_sm / gpu.warp_size / warps_per_block;

  // Shared memory: the block's bytes plus the driver's reserved 1 KB, in 128-byte units, out of the
  // SM's shared memory (228 KB on an H200; cuda_occupancy.h: cudaOccMaxBlocksPerSMSmemLimit with the largest
  // carveout).
  const uint64_t shared_allocated =
      round_up(shared_bytes_per_block + gpu.shared_reserved_per_block, gpu.shared_alloc_unit);
  const int by_shared = static_cast<int>(gpu.shared_per_sm / shared_allocated);

  // Registers: allocated per warp in 256-register units, in each of the 4 sub-partitions of the
  // register file (cuda_occupancy.h: cudaOccMaxBlocksPerSMRegsLimit). 0 = unknown: no limit.
  int by_registers = INT_MAX;
  if (registers_per_thread > 0) {
    const int per_warp = static_cast<int>(
        round_up(static_cast<uint64_t>(registers_per_thread) * gpu.warp_size, gpu.register_alloc_unit));
    const int warps_rounded = static_cast<int>(round_up(warps_per_block, gpu.sub_partitions));
    const int warps_per_sub_partition = gpu.registers_per_sm / gpu.sub_partitions / per_warp;
    by_registers = warps_per_sub_partition * gpu.sub_partitions / warps_per_block;
    if (static_cast<int64_t>(per_warp) * warps_rounded > gpu.registers_per_block || by_registers == 0)
      invalid(std::to_string(threads_per_block) + " threads of " + std::to_string(registers_per_thread) +
              " registers do not fit in one SM's " + std::to_string(gpu.registers_per_sm) + " registers");
  }
  return std::min({by_warps, by_shared, by_registers, gpu.max_blocks_per_sm});
}

Prediction predict(const KernelWork& w, const GpuSpec& gpu) {
  if (w.blocks == 0) invalid("a launch needs at least one block");
  check_count("dram_bytes", w.dram_bytes);
  check_count("l2_sectors", w.l2_sectors);
  check_count("local_bytes", w.local_bytes);
  check_count("global_load_requests", w.global_load_requests);
  check_count("global_load_sectors", w.global_load_sectors);
  check_count("shared_wavefronts", w.shared_wavefronts);
  check_count("l1_wavefronts", w.l1_wavefronts);
  check_count("fp32_flops", w.fp32_flops);
  check_count("warp_instructions", w.warp_instructions);
  check_count("issued_instructions", w.issued_instructions);
  check_count("fp32_instructions", w.fp32_instructions);
  check_count("integer_instructions", w.integer_instructions);
  check_count("quarter_rate_instructions", w.quarter_rate_instructions);
  check_count("tensor_flops", w.tensor_flops);
  check_count("atomics", w.atomics);
  check_count("l1_hit_sectors", w.l1_hit_sectors);
  check_count("l1_pending_sectors", w.l1_pending_sectors);
  check_count("warp_cycles", w.warp_cycles);
  check_count("barriers", w.barriers);

  if (!(gpu.overlap_exponent >= 1) || std::isinf(gpu.overlap_exponent))
    invalid(gpu.name + ": overlap_exponent must be a finite number >= 1");
  for (const double fraction : {gpu.hbm_sustained_fraction, gpu.fp32_sustained_fraction})
    if (!(fraction > 0 && fraction <= 1))
      invalid(gpu.name +
              ": a sustained fraction (hbm_sustained_fraction, fp32_sustained_fraction) must be in (0, 1]");

  Prediction p;
  p.gpu = gpu.name;
  const int k = blocks_per_sm(w.threads_per_block, w.shared_bytes_per_block, w.registers_per_thread, gpu);
  const uint64_t sms = static_cast<uint64_t>(gpu.sms);
  const uint64_t wave_blocks = sms * static_cast<uint64_t>(k);  // blocks resident at once, GPU-wide
  const double blocks = static_cast<double>(w.blocks);
  const int warps_per_block = (w.threads_per_block + gpu.warp_size - 1) / gpu.warp_size;
  p.blocks_per_sm = k;
  p.active_sms = static_cast<int>(std::min<uint64_t>(sms, w.blocks));
  p.waves = blocks / static_cast<double>(wave_blocks);

  // ---- throughput limits at full-GPU rates: the ideal roofline ----------------------------------
  // DRAM at the rate a stream sustains, not the datasheet peak (gpu_spec.h).
  const double sustained_hbm = gpu.hbm_bytes_per_s * gpu.hbm_sustained_fraction;
  const double dram = (w.dram_bytes + w.local_bytes) / sustained_hbm;
  const double l2 = (w.l2_sectors * gpu.sector_bytes + w.local_bytes) / gpu.l2_bytes_per_s;
  // L1 and shared memory are one array per SM, 128 bytes a clock: shared wavefronts and the global
  // requests' passes through it share the rate.
  const double shared_ideal = (w.shared_wavefronts + w.l1_wavefronts) /
                              (gpu.sms * gpu.clock_hz * gpu.shared_wavefronts_per_sm_per_clock);
  const double sustained_fp32 = gpu.fp32_flops_per_s * gpu.fp32_sustained_fraction;
  const double fp32_ideal = w.fp32_flops / sustained_fp32;
  const double tensor_ideal = w.tensor_flops / gpu.tensor_flops_per_s;
  // Issue: the counted warp instructions and one FFMA (32 lanes x 2 FLOPs) per 64 FP32 FLOPs; or,
  // with the PTX count, every instruction, and no pipe busier than its lanes allow (a warp
  // instruction takes warp_size / lanes clocks of its pipe). Where FP32 sustains only a fraction f
  // of its peak (gpu_spec.h), the scheduler stalls (1/f - 1) clocks for every clock the FP32 pipe
  // needs, and the other instructions cannot use those clocks: a pure FFMA stream then runs at f of
  // the peak, and the rest of the instructions add to it. With f = 1 (the A100) a scheduler issues
  // other instructions while its FFMA occupies the pipe, and the larger of the two binds.
  double issue_clocks =
      (w.warp_instructions + w.fp32_flops / (2.0 * gpu.warp_size)) / gpu.issue_per_sm_per_clock;
  if (w.issued_instructions > 0) {
    const double fp32_lanes = gpu.fp32_flops_per_s / (2.0 * gpu.sms * gpu.clock_hz);
    const double fp32_pipe_clocks = w.fp32_instructions * gpu.warp_size / fp32_lanes;
    const double stalls = fp32_pipe_clocks * (1.0 / gpu.fp32_sustained_fraction - 1.0);
    issue_clocks =
        std::max({w.issued_instructions / gpu.issue_per_sm_per_clock + stalls, fp32_pipe_clocks + stalls,
                  w.integer_instructions * gpu.warp_size / gpu.int32_lanes_per_sm,
                  w.quarter_rate_instructions * gpu.warp_size / gpu.sfu_lanes_per_sm});
  }
  const double issue_ideal = issue_clocks / (gpu.sms * gpu.clock_hz);
  p.ideal_seconds = std::max({dram, l2, shared_ideal, fp32_ideal, tensor_ideal, issue_ideal});

  // ---- per-SM units, quantised: the busiest SM runs ceil(blocks / SMs) blocks, each with
  // blocks-th of the work, at one SM's share of the peak. A grid of fewer blocks than SMs thus gets
  // active_sms / SMs of the GPU; on 132 SMs 133 blocks take as long as 264. ----------------------
  const double busiest_sm_blocks = static_cast<double>((w.blocks + sms - 1) / sms);
  const double quantisation = busiest_sm_blocks * gpu.sms / blocks;  // >= 1
  const double shared = shared_ideal * quantisation;
  const double fp32 = fp32_ideal * quantisation;
  const double tensor = tensor_ideal * quantisation;
  const double issue = issue_ideal * quantisation;

  // ---- latency (Little's law) -----------------------------------------------------------------
  // Resident warps: the blocks present at once (capped by the grid) times their warps. A warp's
  // loads are round trips one after the other -- as the tracer counts them (loads of different
  // instructions issued together share one; a cp.async pipeline n deep hides n - 1 of n), or,
  // without its count, ASSUMED one per load request -- and a block lasts (its warps' round trips)
  // x latency; blocks run in whole waves.
  const uint64_t resident_blocks = std::min<uint64_t>(w.blocks, wave_blocks);
  p.resident_warps = static_cast<int>(resident_blocks * static_cast<uint64_t>(warps_per_block));
  const double load_bytes = w.global_load_sectors * gpu.sector_bytes;
  p.bytes_per_request = w.global_load_requests > 0 ? load_bytes / w.global_load_requests : 0;
  const double round_trips = w.load_round_trips >= 0 ? w.load_round_trips : w.global_load_requests;
  p.bytes_in_flight = round_trips > 0 ? p.resident_warps * load_bytes / round_trips : 0;
  // A request served by L1 waits for L1, one that hits L2 for L2, one that misses for DRAM. The shares
  // of the loaded sectors: L1's from the tracer's cache model (less its pending hits, which wait
  // for the sector another warp's miss is bringing from L2), DRAM's from the L2 model's DRAM bytes
  // (which include the writes: an upper bound), L2's the rest.
  const double l1_share =
      w.global_load_sectors > 0
          ? std::min(1.0, std::max(0.0, w.l1_hit_sectors - w.l1_pending_sectors) / w.global_load_sectors)
          : 0;
  const double dram_share = load_bytes > 0 ? std::min(1.0 - l1_share, w.dram_bytes / load_bytes) : 1.0;
  const double l2_share = std::max(0.0, 1.0 - l1_share - dram_share);
  // Round trips on the critical path: each warp's, one after another, wave after wave. The DRAM
  // latency grows with the DRAM utilisation u = dram_bytes / (time x bandwidth), and the time is
  // the latency limit itself: T = R (f + g / T), f the latency at u = 0 and g / T its growth, so
  // T = (R f + sqrt((R f)^2 + 4 R g)) / 2, u capped at 1.
  const double round_trips_per_warp = round_trips / (blocks * warps_per_block);
  const double whole_waves = static_cast<double>((w.blocks + wave_blocks - 1) / wave_blocks);
  const double path = round_trips_per_warp * whole_waves;
  const double fixed =
      l1_share * gpu.l1_latency_s + l2_share * gpu.l2_latency_s + dram_share * gpu.dram_loaded_latency_s;
  const double growth = dram_share * gpu.dram_latency_per_utilisation_s * w.dram_bytes / gpu.hbm_bytes_per_s;
  double latency =
      path > 0 ? (path * fixed + std::sqrt(path * fixed * path * fixed + 4 * path * growth)) / 2 : 0;
  p.dram_utilisation = latency > 0 ? w.dram_bytes / (latency * gpu.hbm_bytes_per_s) : 0;
  if (p.dram_utilisation > 1) {  // the latency would outrun the bandwidth: u is 1 (DRAM binds anyway)
    p.dram_utilisation = 1;
    latency = path * (fixed + dram_share * gpu.dram_latency_per_utilisation_s);
  }
  p.load_latency_seconds = fixed + dram_share * gpu.dram_latency_per_utilisation_s * p.dram_utilisation;
  p.achievable_bytes_per_s =
      p.bytes_in_flight > 0 ? std::min(sustained_hbm, p.bytes_in_flight / p.load_latency_seconds) : 0;

  // ---- a warp's own path: its instructions and their dependent latencies, as if it ran alone
  // (ptx_chain.cpp), each warp's clocks one after another, wave after wave ----------------------
  const double warp_clocks = w.warp_cycles / (blocks * warps_per_block) * whole_waves;
  const double dependent = warp_clocks / gpu.clock_hz;

  // ---- blocks whose warps wait together --------------------------------------------------------
  // One block per SM in barrier-separated phases: a phase's loads must land before its work starts
  // (the barrier after them), and the next phase's loads wait for that work (the barrier after
  // it), so no warp of the block hides another's wait, and with no second block on the SM nothing
  // else does either: the round trips and the SM's work add up. (With two blocks or more, one
  // block's work is taken to hide the others' waits: a repairman model of barrier phases, below,
  // made the layer-norm and GEMM tile loops of the H200 run 1.5-1.8x too slow, 2026-12-06.)
  // Warps that read the same line at the same step wait together too, for the one that fetches
  // it (pending L1 hits), barriers or not: a round trip with a pending request in it is waited by
  // the whole block. The share of such round trips is taken as the pending requests (pending
  // sectors / sectors per request) per round trip, at most 1 -- with the instructions counted
  // only, whose round trips see an unrolled loop's loads go out together (the tracer's own count,
  // one per iteration, makes those waits too long already). A round trip lasts as long as its
  // slowest load, so one with a pending request waits an L2 latency at least. The SM idles while
  // all of its k blocks wait at once: each block alternates a wait of L and c of the SM's work,
  // c / L = r, k machines and one repairman (a closed queue with exponential times, ASSUMED),
  // the SM busy 1 - P0 of the time, P0 = 1 / sum over j = 0..k of k! / (k - j)! r^j. One block
  // (k = 1) gives the sum, L + c; many blocks, or a short wait, the work alone. Within 1 % of the
  // work it is not named: the work binds. ----
  const double sm_work = std::max({shared, fp32, tensor, issue});
  const double pending_requests =
      w.global_load_sectors > 0 ? w.l1_pending_sectors * w.global_load_requests / w.global_load_sectors : 0;
  const double pending_share =
      w.issued_instructions > 0 && round_trips > 0 ? std::min(1.0, pending_requests / round_trips) : 0;
  double waited = pending_share * std::max(latency, path * gpu.l2_latency_s);
  if (k == 1 && w.barriers > 0) waited = std::max(waited, latency);
  double phased = 0;
  if (waited > 0) {
    const double r = sm_work / (k * waited);
    double term = 1, sum = 1;
    for (int j = 1; j <= k && std::isfinite(sum); ++j) {
      term *= (k - j + 1) * r;
      sum += term;
    }
    const double busy = std::isfinite(sum) ? 1 - 1 / sum : 1;
    phased = busy > 0 ? sm_work / busy : waited;
    if (phased < 1.01 * sm_work) phased = 0;
  }

  p.limits = {{"DRAM", dram},
              {"L2", l2},
              {"L1/shared", shared},
              {"fp32", fp32},
              {"tensor", tensor},
              {"issue", issue},
              {"latency (bytes in flight)", latency},
              {"latency (dependent instructions)", dependent},
              {"latency + SM (warps waiting together)", phased},
              {"launch", gpu.launch_latency_s}};
  const Limit* largest = &p.limits[0];
  double work = 0;  // the largest limit but the launch: the launch adds to it
  for (const Limit& l : p.limits) {
    if (l.seconds > largest->seconds * (1 + 1e-12)) largest = &l;  // a tie names the earlier unit
    if (&l != &p.limits.back()) work = std::max(work, l.seconds);
  }
  // Memory and compute overlap, but not perfectly: an SM's warps hide one behind the other only
  // while some of them compute as others wait. The memory system's time m (DRAM, L2) and the SM's
  // pipes' c (issue, FP32, tensor) together take (m^p + c^p)^(1/p): max(m, c) where one dwarfs the
  // other, 2^(1/p) of it where they are equal.
  const double memory = std::max(dram, l2), compute = std::max({fp32, tensor, issue});
  const double larger = std::max(memory, compute);
  if (larger > 0) {
    const double q = gpu.overlap_exponent;
    p.overlap_seconds =
        larger * std::pow(std::pow(memory / larger, q) + std::pow(compute / larger, q), 1 / q);
    work = std::max(work, p.overlap_seconds);
  }
  p.binding = largest->name;
  p.seconds = gpu.launch_latency_s + work;
  p.roofline_fraction = p.seconds > 0 ? p.ideal_seconds / p.seconds : 0;
  return p;
}

double predict_step_seconds(const std::vector<Prediction>& launches, uint64_t host_syncs,
                            const GpuSpec& gpu) {
  double s = 0;
  for (const Prediction& p : launches) s += p.seconds;
  return s + static_cast<double>(host_syncs) * gpu.host_sync_s;
}

std::string describe(const Prediction& p) {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "predicted %s on an %s (bound by %s; %.2f of the roofline; %d blocks/SM, %.2f waves)",
                format_seconds(p.seconds).c_str(), p.gpu.c_str(), p.binding.c_str(), p.roofline_fraction,
                p.blocks_per_sm, p.waves);
  return buf;
}

}  // namespace mg_emu
