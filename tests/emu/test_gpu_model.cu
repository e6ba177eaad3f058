// The GPU roofline (cuda_emu/gpu_model.h) and its GPUs (cuda_emu/gpu_spec.h): PREDICTED times for
// work the tracer counts, on the H200 unless a case names another GPU.
//
// The expected values below are worked by hand from the published figures (the arithmetic is in
// each comment), not by calling the model's formulas; the rest are properties every prediction
// must have. docs/performance-model.md explains the model. Pure arithmetic: runs in milliseconds.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_emu/gpu_model.h"
#include "cuda_emu/gpu_spec.h"

using mg_emu::blocks_per_sm;
using mg_emu::GpuSpec;
using mg_emu::KernelWork;
using mg_emu::predict;
using mg_emu::Prediction;

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kLaunch = 2.433e-6;  // h200_sxm().launch_latency_s (RRZE gpu-small-kernels fit)

// A copy of `bytes`: every byte loaded once and stored once, `load_width` bytes per thread per
// load, coalesced (a warp's request is 32 x load_width bytes), 256-thread blocks.
KernelWork copy_work(double bytes, int load_width, uint64_t blocks) {
  KernelWork w;
  w.blocks = blocks;
  w.threads_per_block = 256;
  w.dram_bytes = 2 * bytes;                              // read + write, nothing reused
  w.l2_sectors = 2 * bytes / 32;                         // loads + stores
  w.global_load_requests = bytes / (32.0 * load_width);  // one request per warp-wide load
  w.global_load_sectors = bytes / 32;
  return w;
}

// A read-only pass (a reduction) over `bytes`, one load per thread.
KernelWork read_work(double bytes, int load_width) {
  KernelWork w;
  w.threads_per_block = 256;
  w.blocks = static_cast<uint64_t>(bytes / load_width / 256);
  w.dram_bytes = bytes;
  w.l2_sectors = bytes / 32;
  w.global_load_requests = bytes / (32.0 * load_width);
  w.global_load_sectors = bytes / 32;
  return w;
}

// `blocks` blocks of 1024 threads of 64 registers (one block per SM), each warp making 100 round
// trips of 4 sectors, every sector an L1 hit.
KernelWork l1_round_trips(uint64_t blocks) {
  KernelWork w;
  w.blocks = blocks;
  w.threads_per_block = 1024;
  w.registers_per_thread = 64;
  w.global_load_requests = 100.0 * 32 * static_cast<double>(blocks);
  w.global_load_sectors = 4 * w.global_load_requests;
  w.l1_hit_sectors = w.global_load_sectors;
  w.load_round_trips = w.global_load_requests;
  return w;
}

double limit(const Prediction& p, const std::string& name) {
  for (const mg_emu::Limit& l : p.limits)
    if (name == l.name) return l.seconds;
  FAIL("no limit named " << name);
  return 0;
}

}  // namespace

TEST_CASE("gpu model, H200: occupancy as the occupancy calculator computes it", "[gpu_model]") {
  // Warps: 64 per SM. 1024 threads = 32 warps -> 2 blocks; 256 threads = 8 warps -> 8 blocks.
  CHECK(blocks_per_sm(1024, 0, 0) == 2);
  CHECK(blocks_per_sm(256, 0, 0) == 8);
  // 100 threads still take 4 whole warps: 64 / 4 = 16 blocks.
  CHECK(blocks_per_sm(100, 0, 0) == 16);
  // 32-thread blocks: 64 by warps, but at most 32 blocks per SM.
  CHECK(blocks_per_sm(32, 0, 0) == 32);
  // Shared memory: 64 KB + 1 KB reserved = 65 KB a block; 228 KB / 65 KB = 3.5 -> 3.
  CHECK(blocks_per_sm(256, 64 * 1024, 0) == 3);
  // 100 KB + 1 KB = 101 KB -> 2; 113 KB + 1 KB = 114 KB -> exactly 2; 114 KB + 1 KB -> 1.
  CHECK(blocks_per_sm(128, 100 * 1024, 0) == 2);
  CHECK(blocks_per_sm(128, 113 * 1024, 0) == 2);
  CHECK(blocks_per_sm(128, 114 * 1024, 0) == 1);
  // The largest opt-in block: 227 KB (+ 1 KB reserved = the SM's 228 KB).
  CHECK(blocks_per_sm(128, 227 * 1024, 0) == 1);
  // Registers: 64 a thread = 2048 a warp; a sub-partition's 16384 hold 8 warps, the SM 32:
  // 256-thread blocks (8 warps) -> 4, 1024-thread blocks (32 warps) -> 1.
  CHECK(blocks_per_sm(256, 0, 64) == 4);
  CHECK(blocks_per_sm(1024, 0, 64) == 1);
  // 32 registers: 1024 a warp, 16 warps a sub-partition, 64 an SM: no longer the limit.
  CHECK(blocks_per_sm(256, 0, 32) == 8);
  // 40 registers: 1280 a warp, 12 warps a sub-partition, 48 an SM -> 6 blocks of 8 warps.
  CHECK(blocks_per_sm(256, 0, 40) == 6);
}

TEST_CASE("gpu model, H200: launches that cannot run are refused", "[gpu_model]") {
  CHECK_THROWS_AS(blocks_per_sm(0, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(blocks_per_sm(1025, 0, 0), std::invalid_argument);
  CHECK_THROWS_AS(blocks_per_sm(128, 227 * 1024 + 1, 0), std::invalid_argument);
  CHECK_THROWS_AS(blocks_per_sm(128, 0, 256), std::invalid_argument);
  // 1024 threads need <= 64 registers: 72 x 32 = 2304 a warp, x 32 warps = 73728 > 65536.
  CHECK_THROWS_AS(blocks_per_sm(1024, 0, 72), std::invalid_argument);
  KernelWork none;
  none.threads_per_block = 128;  // 0 blocks
  CHECK_THROWS_AS(predict(none), std::invalid_argument);
  KernelWork negative;
  negative.blocks = 1;
  negative.threads_per_block = 32;
  negative.dram_bytes = -1;
  CHECK_THROWS_AS(predict(negative), std::invalid_argument);
}

TEST_CASE("gpu model, H200: a 1 GiB copy with 16-byte loads at full occupancy is DRAM-bound", "[gpu_model]") {
  // 2^30 / 16 bytes a thread / 256 threads = 262144 blocks.
  const Prediction p = predict(copy_work(GiB, 16, 262144));
  CHECK(p.binding == "DRAM");
  CHECK(p.blocks_per_sm == 8);
  CHECK(p.active_sms == 132);
  CHECK(p.waves == Approx(248.24).epsilon(1e-4));  // 262144 / (132 x 8)
  // 2 GiB at the sustained 3.888 TB/s (0.81 of the 4.8 TB/s peak) = 552.34 us, plus the 2.43 us
  // launch: 554.77 us.
  CHECK(p.seconds == Approx(554.77e-6).epsilon(1e-4));
  CHECK(limit(p, "DRAM") == Approx(552.34e-6).epsilon(1e-4));
  // L2: 2 GiB / 9.78 TB/s = 219.6 us. Latency: one round trip a warp, 249 waves; at the loaded
  // latency of u = 0 (538 ns) that is 134 us, which would move 2 GiB at 16 TB/s: u is capped at 1,
  // a round trip takes 538 + 215 = 753 ns, 249 x 753 ns = 187.5 us.
  CHECK(limit(p, "L2") == Approx(219.6e-6).epsilon(1e-3));
  CHECK(limit(p, "latency (bytes in flight)") == Approx(187.5e-6).epsilon(1e-3));
  CHECK(p.dram_utilisation == 1);
  CHECK(p.load_latency_seconds == Approx(753e-9));
  // Little's law: 8448 warps x 512 bytes = 4.33 MB in flight / 753 ns = 5.7 TB/s -> capped at the
  // sustained HBM rate.
  CHECK(p.bytes_in_flight == Approx(8448.0 * 512));
  CHECK(p.achievable_bytes_per_s == Approx(3.888e12));
  CHECK(p.roofline_fraction == Approx(552.34 / 554.77).epsilon(1e-3));
}

TEST_CASE("gpu model, H200: the same copy in a 24-block grid is bound by bytes in flight", "[gpu_model]") {
  const Prediction full = predict(copy_work(GiB, 16, 262144));
  const Prediction small = predict(copy_work(GiB, 16, 24));
  CHECK(small.binding == "latency (bytes in flight)");
  CHECK(small.active_sms == 24);
  CHECK(small.resident_warps == 24 * 8);
  // 2^21 requests over 192 warps = 10922.7 round trips each. The time T solves
  // T = 10922.7 x (538 ns + 215 ns x u), u = 2 GiB / (T x 4.8 TB/s): T = 6.050 ms, u = 0.0739,
  // a round trip 553.9 ns (+ the launch).
  CHECK(small.seconds == Approx(6.0500e-3 + kLaunch).epsilon(1e-3));
  CHECK(small.dram_utilisation == Approx(0.07395).epsilon(1e-3));
  // 192 warps x 512 bytes = 98 KB in flight: 98304 / 553.9 ns = 177.5 GB/s of the 4.8 TB/s.
  CHECK(small.achievable_bytes_per_s == Approx(177.5e9).epsilon(1e-3));
  CHECK(small.seconds >= 4 * full.seconds);
  // Four times the warps (1024-thread blocks): four times the bytes in flight, 2730.7 round trips a
  // warp; the busier DRAM (u = 0.274) lengthens each: T = 1.630 ms, 3.71x faster, not 4x.
  KernelWork wide = copy_work(GiB, 16, 24);
  wide.threads_per_block = 1024;
  const Prediction w = predict(wide);
  CHECK(w.binding == "latency (bytes in flight)");
  CHECK((w.seconds - kLaunch) == Approx(1.6302e-3).epsilon(1e-3));
  CHECK(w.dram_utilisation == Approx(0.2744).epsilon(1e-3));
}

TEST_CASE("gpu model, H200: 4-byte loads at one request per warp cannot fill HBM; 16-byte loads can",
          "[gpu_model]") {
  // A 1 GiB read. DRAM bound: 2^30 / 3.888 TB/s (sustained) = 276.2 us.
  const Prediction narrow = predict(read_work(GiB, 4));
  const Prediction wide = predict(read_work(GiB, 16));
  CHECK(limit(narrow, "DRAM") == Approx(276.2e-6).epsilon(1e-3));
  // 4-byte loads: 1048576 blocks / 1056 a wave = 993 waves x 1 round trip. T = 993 x (538 ns +
  // 215 ns x u), u = 1 GiB / (T x 4.8 TB/s): T = 612.2 us, u = 0.365, a round trip 616.6 ns. So
  // 8448 warps x 128 bytes = 1.08 MB in flight / 616.6 ns = 1.75 TB/s < 3.888 TB/s.
  CHECK(narrow.binding == "latency (bytes in flight)");
  CHECK(narrow.achievable_bytes_per_s == Approx(1.7538e12).epsilon(1e-3));
  CHECK(limit(narrow, "latency (bytes in flight)") == Approx(612.24e-6).epsilon(1e-3));
  CHECK(narrow.roofline_fraction == Approx(276.2 / (612.24 + 2.43)).epsilon(2e-3));
  // 16-byte loads: 4 times the bytes a request; 249 waves of one round trip: DRAM binds.
  CHECK(wide.binding == "DRAM");
  CHECK(wide.seconds < narrow.seconds);
}

TEST_CASE("gpu model, H200: a 4096^3 bf16 GEMM is tensor-bound, its L2 re-reads overlapping imperfectly",
          "[gpu_model]") {
  KernelWork w;
  w.blocks = 1024;  // 128 x 128 output tiles
  w.threads_per_block = 256;
  w.shared_bytes_per_block = 64 * 1024;       // -> 3 blocks per SM
  w.tensor_flops = 2.0 * 4096 * 4096 * 4096;  // 137.4 GFLOP
  w.dram_bytes = 3.0 * 4096 * 4096 * 2;       // A, B read and C written once: 100.7 MB
  w.l2_sectors = GiB / 32;                    // tiles re-read from L2: 1 GiB (modest)
  w.global_load_requests = GiB / 512;         // 16-byte cp.async: 512 bytes a request
  w.global_load_sectors = GiB / 32;
  const Prediction p = predict(w);
  CHECK(p.binding == "tensor");
  CHECK(p.blocks_per_sm == 3);
  // 137.44 GFLOP / 989 TFLOPS = 138.97 us; the busiest SM runs ceil(1024 / 132) = 8 blocks, not
  // 7.76: x 1.031 = 143.31 us. Its tiles' L2 re-reads (109.8 us, below) overlap it imperfectly:
  // sqrt(143.31^2 + 109.8^2) = 180.54 us; + 2.43 us launch = 182.97 us.
  CHECK(limit(p, "tensor") == Approx(143.31e-6).epsilon(1e-3));
  CHECK(p.overlap_seconds == Approx(180.54e-6).epsilon(1e-3));
  CHECK(p.seconds == Approx(182.97e-6).epsilon(1e-3));
  CHECK(p.roofline_fraction == Approx(138.97 / 182.97).epsilon(2e-3));
  // The others stay below: DRAM 25.9 us (at 3.888 TB/s), L2 109.8 us; latency: 9.375% of the loaded bytes
  // from DRAM, the rest from L2 (141.6 ns): 0.09375 x 538 + 0.90625 x 141.6 = 178.8 ns at u = 0, and 256
  // round trips x 3 waves = 768 of them: T = 768 x (178.8 ns + 0.09375 x 215 ns x u) with u = 100.7 MB / (T
  // x 4.8 TB/s): T = 139.6 us (u = 0.150).
  CHECK(limit(p, "DRAM") == Approx(25.89e-6).epsilon(1e-3));
  CHECK(limit(p, "L2") == Approx(109.8e-6).epsilon(1e-3));
  CHECK(limit(p, "latency (bytes in flight)") == Approx(139.61e-6).epsilon(2e-3));
}

TEST_CASE("gpu model, H200: a 1-block launch with trivial work costs the launch latency", "[gpu_model]") {
  KernelWork w;
  w.blocks = 1;
  w.threads_per_block = 32;
  w.dram_bytes = 4;  // one 4-byte store
  w.l2_sectors = 1;
  w.fp32_flops = 64;
  const Prediction p = predict(w);
  CHECK(p.binding == "launch");
  CHECK(p.seconds == Approx(kLaunch).epsilon(1e-3));
  CHECK(p.active_sms == 1);
  CHECK(p.roofline_fraction < 1e-3);
  // One load from DRAM as well (32 more DRAM bytes): one round trip at the loaded latency of an idle
  // DRAM (36 bytes in 538 ns: u = 1.4e-5), 538 ns, added to the launch.
  w.global_load_requests = 1;
  w.global_load_sectors = 1;
  w.dram_bytes += 32;
  CHECK(predict(w).seconds == Approx(kLaunch + 538e-9).epsilon(1e-3));
}

TEST_CASE("gpu model, H200: wave quantisation and a small grid's share of the SMs", "[gpu_model]") {
  GpuSpec no_launch = mg_emu::h200_sxm();
  no_launch.launch_latency_s = 0;
  no_launch.fp32_sustained_fraction = 1;  // the peak: this case is about waves
  // One block per SM (1024 threads, 120 KB of shared memory), 1 GFLOP of FP32 each.
  auto grid = [&](uint64_t blocks) {
    KernelWork w;
    w.blocks = blocks;
    w.threads_per_block = 1024;
    w.shared_bytes_per_block = 120 * 1024;
    w.fp32_flops = 1e9 * static_cast<double>(blocks);
    return predict(w, no_launch);
  };
  const Prediction one_wave = grid(132), tail = grid(133), two_waves = grid(264);
  CHECK(one_wave.blocks_per_sm == 1);
  CHECK(one_wave.binding == "fp32");
  // 132 GFLOP / 66.9 TFLOPS (132 x 128 x 2 x 1.98 GHz) = 1.973 ms; 133 blocks: a second wave of one
  // block doubles it. (The FMAs fill the 4 schedulers exactly as much: a tie, named fp32.)
  CHECK(one_wave.seconds == Approx(1.973e-3).epsilon(1e-3));
  CHECK(tail.waves == Approx(133.0 / 132));
  CHECK(tail.seconds == Approx(2 * one_wave.seconds));
  CHECK(two_waves.seconds == Approx(tail.seconds));
  CHECK(tail.roofline_fraction == Approx(133.0 / 264));

  // 24 blocks doing the work of 132: only 24 SMs' share of the FP32 peak, 132 / 24 = 5.5x slower.
  KernelWork w;
  w.blocks = 24;
  w.threads_per_block = 256;
  w.fp32_flops = 132e9;
  const Prediction few = predict(w, no_launch);
  CHECK(few.active_sms == 24);
  CHECK(few.seconds == Approx(5.5 * one_wave.seconds));
  // The same for shared memory: one wavefront per SM per clock. 24 SMs x 1.98 GHz for 1e9
  // wavefronts = 21.04 ms.
  KernelWork s;
  s.blocks = 24;
  s.threads_per_block = 256;
  s.shared_wavefronts = 1e9;
  const Prediction sp = predict(s, no_launch);
  CHECK(sp.binding == "L1/shared");
  CHECK(sp.seconds == Approx(1e9 / (24 * 1.98e9)).epsilon(1e-9));
  // Latency-bound blocks quantise by whole waves too: 264 blocks of 2 per SM are one wave,
  // 265 are two.
  auto loads = [&](uint64_t blocks) {
    KernelWork l;
    l.blocks = blocks;
    l.threads_per_block = 1024;
    l.global_load_requests = 32.0 * 100 * static_cast<double>(blocks);  // 100 round trips a warp
    l.global_load_sectors = 4 * l.global_load_requests;
    l.dram_bytes = 128 * l.global_load_requests;
    return predict(l, no_launch);
  };
  // 264 blocks: 100 round trips, T = 100 x (538 ns + 215 ns x u), u = 108 MB / (T x 4.8 TB/s):
  // T = 61.66 us. 265 blocks: 200 round trips for 0.4% more bytes, T = 116.0 us (u = 0.195).
  CHECK(loads(264).binding == "latency (bytes in flight)");
  CHECK(loads(264).seconds == Approx(61.656e-6).epsilon(1e-3));
  CHECK(loads(265).seconds == Approx(115.98e-6).epsilon(1e-3));
}

TEST_CASE("gpu model, H200: properties of every prediction", "[gpu_model]") {
  std::mt19937_64 rng(20261202);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto log_uniform = [&](double lo, double hi) { return std::exp(uniform(std::log(lo), std::log(hi))); };
  const int threads[] = {32, 64, 96, 128, 256, 384, 512, 1000, 1024};
  for (int i = 0; i < 2000; ++i) {
    KernelWork w;
    w.blocks = static_cast<uint64_t>(log_uniform(1, 1e7));
    w.threads_per_block = threads[i % 9];
    w.shared_bytes_per_block = static_cast<uint64_t>(uniform(0, 227 * 1024)) * (i % 3 == 0);
    w.registers_per_thread = (i % 4 == 0) ? 32 : 0;
    const bool zero = i % 7 == 0;  // some launches do (almost) nothing
    w.dram_bytes = zero ? 0 : log_uniform(1, 1e11);
    w.l2_sectors = zero ? 0 : log_uniform(1, 1e10);
    w.global_load_requests = zero ? 0 : log_uniform(1, 1e9);
    w.global_load_sectors = w.global_load_requests * uniform(1, 16);
    w.shared_wavefronts = (i % 2) ? log_uniform(1, 1e10) : 0;
    w.l1_wavefronts = (i % 3) ? w.global_load_requests * uniform(1, 4) : 0;
    w.fp32_flops = (i % 3) ? log_uniform(1, 1e13) : 0;
    w.tensor_flops = (i % 5) ? 0 : log_uniform(1, 1e14);
    w.warp_instructions = (i % 6) ? log_uniform(1, 1e10) : 0;
    w.l1_hit_sectors = w.global_load_sectors * uniform(0, 1);
    w.l1_pending_sectors = (i % 2) ? w.l1_hit_sectors * uniform(0, 1) : 0;
    const Prediction p = predict(w);
    INFO("case " << i << ": " << mg_emu::describe(p));
    REQUIRE(p.limits.size() == 10);
    CHECK(p.seconds >= kLaunch + p.overlap_seconds * (1 - 1e-12));
    CHECK(p.roofline_fraction >= 0);
    CHECK(p.roofline_fraction <= 1);
    CHECK(p.seconds >= kLaunch);
    double largest = 0;
    std::string largest_name;
    for (const mg_emu::Limit& l : p.limits) {
      CHECK(l.seconds >= 0);
      CHECK(p.seconds >= l.seconds);
      if (l.seconds > largest) largest = l.seconds, largest_name = l.name;
    }
    CHECK(p.binding == largest_name);
    CHECK(p.blocks_per_sm >= 1);
    CHECK(p.blocks_per_sm <= 32);
    CHECK(p.waves * 132 * p.blocks_per_sm == Approx(static_cast<double>(w.blocks)));
    // More DRAM bytes, or more FLOPs, never make a launch faster.
    KernelWork more = w;
    more.dram_bytes = 2 * w.dram_bytes + 1;
    more.fp32_flops = 2 * w.fp32_flops + 1;
    CHECK(predict(more).seconds >= p.seconds);
    // Nor does an L1 hit that turns out to be pending (waiting for another warp's fetch).
    KernelWork pending = w;
    pending.l1_pending_sectors = w.l1_hit_sectors;
    CHECK(predict(pending).seconds >= p.seconds * (1 - 1e-12));
  }
}

TEST_CASE("gpu model, H200: a step is its launches plus its host synchronisations", "[gpu_model]") {
  const Prediction a = predict(copy_work(GiB, 16, 262144));
  const Prediction b = predict(copy_work(GiB, 16, 24));
  // 554.77 us + 6.052 ms + 3 synchronisations x 10 us (the stated assumption).
  CHECK(mg_emu::predict_step_seconds({a, b}, 3) == Approx(554.77e-6 + 6.0524e-3 + 30e-6).epsilon(1e-3));
  CHECK(mg_emu::predict_step_seconds({}, 0) == 0);
  const std::string line = mg_emu::describe(a);
  CHECK(line.find("predicted 554.7") == 0);
  CHECK(line.find("bound by DRAM") != std::string::npos);
}

TEST_CASE("gpu model, H200: every load between the FMAs takes an issue slot below the FP32 peak",
          "[gpu_model]") {
  // 4e9 FFMA warp instructions (2.56e11 FLOPs) and 1e9 other counted warp instructions (loads), on
  // 1056 blocks (8 per SM, one wave: no quantisation). FP32: 2.56e11 / 66.9 TFLOPS = 3.826 ms. Issue:
  // 5e9 / (4 x 132 x 1.98 GHz) = 4.783 ms: issue binds, the FP32 units busy 80% of the time.
  GpuSpec at_peak = mg_emu::h200_sxm();
  at_peak.fp32_sustained_fraction = 1;  // FP32 at its datasheet peak (the next case prices less)
  KernelWork w;
  w.blocks = 1056;
  w.threads_per_block = 256;
  w.fp32_flops = 2.0 * 32 * 4e9;
  w.warp_instructions = 1e9;
  Prediction p = predict(w, at_peak);
  CHECK(limit(p, "fp32") == Approx(3.826e-3).epsilon(1e-3));
  CHECK(limit(p, "issue") == Approx(4.783e-3).epsilon(1e-3));
  CHECK(p.binding == "issue");
  // Without the loads the FMAs alone fill the 4 schedulers exactly as the FP32 lanes (128 lanes =
  // 4 warps a clock): 4e9 / (4 x 132 x 1.98e9) = 3.826 ms, the FP32 limit; the tie is named fp32.
  w.warp_instructions = 0;
  p = predict(w, at_peak);
  CHECK(limit(p, "issue") == Approx(3.826e-3).epsilon(1e-3));
  CHECK(p.binding == "fp32");
}

TEST_CASE(
    "gpu model: FP32 at its sustained share -- an FFMA stream at that share of the peak, other "
    "instructions added to it",
    "[gpu_model]") {
  // The H200 sustains 0.63 of its FP32 peak (RRZE's gpu-roofline). 1056 blocks (8 per SM, one
  // wave). 2.0908e9 FFMA warp instructions fill the 128 FP32 lanes of 132 SMs (4 warp
  // instructions a clock) at 1.98 GHz for exactly 2 ms at the peak: at 0.63 of it, 3.175 ms.
  const mg_emu::GpuSpec& h200 = mg_emu::h200_sxm();
  REQUIRE(h200.fp32_sustained_fraction == 0.63);
  const double two_ms = 4.0 * 132 * 1.98e9 * 2e-3;
  KernelWork w;
  w.blocks = 1056;
  w.threads_per_block = 256;
  w.issued_instructions = w.fp32_instructions = two_ms;
  CHECK(limit(predict(w), "issue") == Approx(2e-3 / 0.63).epsilon(1e-6));
  // Half as many other instructions again (1 ms of issue) do not hide in the FFMAs' stalls.
  w.issued_instructions = 1.5 * two_ms;
  CHECK(limit(predict(w), "issue") == Approx(2e-3 / 0.63 + 1e-3).epsilon(1e-6));
  // Declared FLOPs instead of a count: the fp32 limit is priced at the same rate.
  KernelWork declared;
  declared.blocks = 1056;
  declared.threads_per_block = 256;
  declared.fp32_flops = 2.0 * 32 * two_ms;
  CHECK(limit(predict(declared), "fp32") == Approx(2e-3 / 0.63).epsilon(1e-6));
  // The A100 sustains its peak (f = 1): a scheduler issues another instruction while its FFMA holds
  // the 16-lane pipe for a second clock, so 1.1975e9 FFMAs (3.93 ms on 108 SMs x 1.41 GHz) and as
  // many other instructions take no longer than the FFMAs alone.
  const mg_emu::GpuSpec& a100 = mg_emu::find_gpu_spec("a100");
  KernelWork a;
  a.blocks = 108 * 8;
  a.threads_per_block = 256;
  a.fp32_instructions = 1.1975e9;
  a.issued_instructions = 2 * 1.1975e9;
  CHECK(limit(predict(a, a100), "issue") == Approx(1.1975e9 / (2 * 108 * a100.clock_hz)).epsilon(1e-3));
  // A share outside (0, 1] is refused, naming it.
  mg_emu::GpuSpec broken = h200;
  broken.fp32_sustained_fraction = 0;
  CHECK_THROWS_WITH(predict(w, broken), Catch::Contains("fp32_sustained_fraction"));
}

TEST_CASE("gpu model: counted instructions -- the schedulers, or the pipe behind them that is busiest",
          "[gpu_model]") {
  // 1056 blocks (8 per SM, one wave). 2.0908e9 warp instructions fill 4 schedulers x 132 SMs x
  // 1.98 GHz for exactly 2 ms. Counted, they replace warp_instructions + fp32_flops / 64.
  KernelWork w;
  w.blocks = 1056;
  w.threads_per_block = 256;
  w.issued_instructions = 4.0 * 132 * 1.98e9 * 2e-3;
  w.warp_instructions = 1e12;  // ignored once instructions are counted
  Prediction p = predict(w);
  CHECK(limit(p, "issue") == Approx(2e-3).epsilon(1e-6));
  // Half of them integer: the integer pipe has 64 lanes an SM, 2 warp instructions a clock, so
  // 1.0454e9 of them take 2 ms too -- a tie; all of them integer, 4 ms.
  w.integer_instructions = w.issued_instructions / 2;
  CHECK(limit(predict(w), "issue") == Approx(2e-3).epsilon(1e-6));
  w.integer_instructions = w.issued_instructions;
  CHECK(limit(predict(w), "issue") == Approx(4e-3).epsilon(1e-6));
  // A quarter of them conversions or MUFU (16 lanes: half a warp instruction a clock): 4 ms.
  w.integer_instructions = 0;
  w.quarter_rate_instructions = w.issued_instructions / 4;
  CHECK(limit(predict(w), "issue") == Approx(4e-3).epsilon(1e-6));
  // FP32 on an A100 (64 FP32 lanes an SM: 2 FFMA warp instructions a clock, not 4): 1.1975e9
  // FFMAs on 108 SMs x 1.41 GHz take 1.1975e9 / (2 x 108 x 1.41e9) = 3.93 ms, while the schedulers
  // alone would take half that (19.5 TFLOPS is 64.03 lanes: within 0.1 %).
  w.quarter_rate_instructions = 0;
  w.blocks = 108 * 8;
  w.issued_instructions = w.fp32_instructions = 1.1975e9;
  const mg_emu::GpuSpec& a100 = mg_emu::find_gpu_spec("a100");
  CHECK(limit(predict(w, a100), "issue") == Approx(1.1975e9 / (2 * 108 * a100.clock_hz)).epsilon(1e-3));
}

// ---- the other GPUs -------------------------------------------------------------------------------

TEST_CASE("gpu model: memory and compute overlap as (m^p + c^p)^(1/p), not as the larger", "[gpu_model]") {
  const mg_emu::GpuSpec& gpu = mg_emu::h200_sxm();
  REQUIRE(gpu.overlap_exponent == 2);
  // 1 ms of DRAM at the sustained 3.888 TB/s, and 1 ms of issue: 4 warp instructions a clock on
  // each of 132 SMs at 1.98 GHz. 8 blocks per SM, ten waves: nothing quantised, no loads to wait for.
  KernelWork w;
  w.blocks = 132 * 8 * 10;
  w.threads_per_block = 256;
  w.dram_bytes = 1e-3 * gpu.hbm_bytes_per_s * gpu.hbm_sustained_fraction;
  w.issued_instructions = 1e-3 * 4 * 132 * gpu.clock_hz;
  Prediction p = predict(w, gpu);
  CHECK(p.binding == "DRAM");  // a tie names the unit listed first
  CHECK(p.overlap_seconds == Approx(std::sqrt(2.0) * 1e-3));
  CHECK(p.seconds == Approx(gpu.launch_latency_s + std::sqrt(2.0) * 1e-3));

  // A third of the issue: the larger and 5 % more, sqrt(1 + 1/9).
  w.issued_instructions /= 3;
  p = predict(w, gpu);
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 1e-3 * std::sqrt(1 + 1.0 / 9)));

  // No compute at all: the DRAM time alone. Perfect overlap (a large exponent): the larger.
  w.issued_instructions = 0;
  CHECK(predict(w, gpu).seconds == Approx(gpu.launch_latency_s + 1e-3));
  mg_emu::GpuSpec perfect = gpu;
  perfect.overlap_exponent = 1000;
  w.issued_instructions = 1e-3 * 4 * 132 * gpu.clock_hz;
  CHECK(predict(w, perfect).seconds == Approx(gpu.launch_latency_s + 1e-3).epsilon(1e-3));
}

TEST_CASE("gpu model: one block per SM with barriers waits for its loads, then works", "[gpu_model]") {
  const mg_emu::GpuSpec& gpu = mg_emu::h200_sxm();
  // 1024 threads of 64 registers: one block per SM (65,536 registers); 1,320 blocks, ten waves.
  // Each warp makes 100 round trips, all served by L1 (16.2 ns): 100 x 10 waves x 16.2 ns =
  // 16.2 us on the critical path. 50 us of shared-memory wavefronts (one a clock per SM).
  KernelWork w = l1_round_trips(1320);
  w.shared_wavefronts = 50e-6 * 132 * gpu.clock_hz;
  w.barriers = 10.0 * 1320;
  Prediction p = predict(w, gpu);
  REQUIRE(p.blocks_per_sm == 1);
  CHECK(limit(p, "latency (bytes in flight)") == Approx(16.2e-6));
  CHECK(limit(p, "L1/shared") == Approx(50e-6));
  // The barriers keep the block's warps in step and no other block shares the SM: they add.
  CHECK(p.binding == std::string("latency + SM (warps waiting together)"));
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 66.2e-6));
  // Without barriers the warps hide one another's waits: the larger alone.
  w.barriers = 0;
  p = predict(w, gpu);
  CHECK(p.binding == std::string("L1/shared"));
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 50e-6));
  // Two blocks per SM (32 registers): one block works while the other waits.
  w.barriers = 10.0 * 1320;
  w.registers_per_thread = 32;
  p = predict(w, gpu);
  REQUIRE(p.blocks_per_sm == 2);
  CHECK(p.binding == std::string("L1/shared"));
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 50e-6));
}

TEST_CASE("gpu model: an L1 hit pending on another warp's fetch waits as long as an L2 hit", "[gpu_model]") {
  const mg_emu::GpuSpec& gpu = mg_emu::h200_sxm();
  // 132 blocks of 1024 threads (one wave, one block per SM), no barriers. Each warp makes 100
  // round trips of 4 sectors, every sector an L1 hit: 100 x 16.2 ns = 1.62 us on the critical path.
  KernelWork w = l1_round_trips(132);
  const auto latency = [&] { return limit(predict(w, gpu), "latency (bytes in flight)"); };
  CHECK(latency() == Approx(100 * 16.2e-9));
  // Half of the hits were on sectors another warp's same instruction had just missed: those wait
  // for L2 (141.6 ns). 100 x (0.5 x 16.2 + 0.5 x 141.6) ns = 7.89 us.
  w.l1_pending_sectors = w.l1_hit_sectors / 2;
  CHECK(latency() == Approx(100 * (0.5 * 16.2e-9 + 0.5 * 141.6e-9)));
  // All pending: every round trip an L2 hit's, as if there were no L1 (the L2 traffic is not).
  w.l1_pending_sectors = w.l1_hit_sectors;
  CHECK(latency() == Approx(100 * 141.6e-9));

  // The warps wait for the fetch together, so with one block on the SM nothing works meanwhile:
  // 50 us of shared wavefronts and the 14.16 us of round trips add up -- with the instructions
  // counted (issued_instructions > 0), whose round trips see an unrolled loop's loads together.
  w.shared_wavefronts = 50e-6 * 132 * gpu.clock_hz;
  CHECK(predict(w, gpu).binding == std::string("L1/shared"));  // not counted: the tracer's round trips
  w.issued_instructions = 1;
  Prediction p = predict(w, gpu);
  CHECK(p.binding == std::string("latency + SM (warps waiting together)"));
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 50e-6 + 100 * 141.6e-9));
  // Half the sectors pending, a pending request in every other round trip: half of them waited
  // by the block, each for an L2 latency (its slowest load): 50 + 0.5 x 14.16 us.
  w.l1_pending_sectors = w.l1_hit_sectors / 2;
  CHECK(predict(w, gpu).seconds == Approx(gpu.launch_latency_s + 50e-6 + 0.5 * 100 * 141.6e-9));
  // Two blocks per SM (32 registers, 264 blocks: still one wave, each SM's shared work 50 us):
  // every round trip pending, each block waits L = 14.16 us and works c = 25 us; the SM idles
  // when both wait: r = c / L, busy = 1 - 1 / (1 + 2r + 2r^2) (two machines, one repairman).
  w = l1_round_trips(264);
  w.registers_per_thread = 32;
  w.l1_pending_sectors = w.l1_hit_sectors;
  w.shared_wavefronts = 50e-6 * 132 * gpu.clock_hz;
  w.issued_instructions = 1;
  p = predict(w, gpu);
  REQUIRE(p.blocks_per_sm == 2);
  const double r = 25e-6 / (100 * 141.6e-9);
  CHECK(p.binding == std::string("latency + SM (warps waiting together)"));
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 50e-6 / (1 - 1 / (1 + 2 * r + 2 * r * r))));  // 55.1 us
}

TEST_CASE("gpu specs: every instance is found by its key, and an unknown one is refused by name",
          "[gpu_model]") {
  CHECK(mg_emu::gpu_specs().size() == 4);
  for (const GpuSpec* g : mg_emu::gpu_specs()) CHECK(&mg_emu::find_gpu_spec(g->key) == g);
  CHECK(mg_emu::find_gpu_spec("A100").name == "NVIDIA A100 SXM4 80GB");  // keys are case-insensitive
  try {
    mg_emu::find_gpu_spec("v100");
    FAIL("v100 was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()) == "unknown GPU 'v100': the performance model knows h200, h100, a100, a6000");
  }
}

TEST_CASE("gpu specs: the peaks agree with SMs x lanes x clock", "[gpu_model]") {
  // FP32 lanes per SM: 128 on Hopper and GA102, 64 on GA100 (the whitepapers); an FMA is 2 FLOPs.
  const std::pair<const GpuSpec*, int> lanes[] = {{&mg_emu::h200_sxm(), 128},
                                                  {&mg_emu::h100_sxm(), 128},
                                                  {&mg_emu::a100_sxm(), 64},
                                                  {&mg_emu::rtx_a6000(), 128}};
  for (const auto& [g, per_sm] : lanes) {
    INFO(g->name);
    CHECK(g->fp32_flops_per_s == Approx(g->sms * per_sm * 2 * g->clock_hz).epsilon(0.01));
  }
}

TEST_CASE("gpu model: occupancy follows each compute capability's limits", "[gpu_model]") {
  const GpuSpec& a100 = mg_emu::a100_sxm();
  const GpuSpec& a6000 = mg_emu::rtx_a6000();
  // 8.0: 164 KB of shared memory per SM. 64 KB blocks: (64 + 1) KB each, 164 / 65 = 2 (the H200: 3).
  CHECK(blocks_per_sm(256, 64 * 1024, 0, a100) == 2);
  CHECK(blocks_per_sm(256, 64 * 1024, 0) == 3);
  // 163 KB is the most a block may have there.
  CHECK(blocks_per_sm(128, 163 * 1024, 0, a100) == 1);
  CHECK_THROWS_AS(blocks_per_sm(128, 163 * 1024 + 1, 0, a100), std::invalid_argument);
  // 8.6: 1536 threads per SM: one 1024-thread block, six 256-thread ones; 16 blocks at most.
  CHECK(blocks_per_sm(1024, 0, 0, a6000) == 1);
  CHECK(blocks_per_sm(256, 0, 0, a6000) == 6);
  CHECK(blocks_per_sm(32, 0, 0, a6000) == 16);
  // 100 KB per SM, 99 per block: 48 KB blocks take (48 + 1) KB, two fit.
  CHECK(blocks_per_sm(128, 48 * 1024, 0, a6000) == 2);
  CHECK_THROWS_AS(blocks_per_sm(128, 99 * 1024 + 1, 0, a6000), std::invalid_argument);
}

TEST_CASE("gpu model: the same copy on each GPU is bound by its DRAM, and says which GPU", "[gpu_model]") {
  // 1 GiB copied with 16-byte lanes over 262,144 blocks: 2 GiB of DRAM traffic at each part's
  // sustained rate (its peak x the share gpu_spec.cpp sources).
  const KernelWork w = copy_work(GiB, 16, 262144);
  const std::pair<const GpuSpec*, double> expected[] = {
      {&mg_emu::h200_sxm(), 2 * GiB / 3.888e12},          // 552.3 us
      {&mg_emu::h100_sxm(), 2 * GiB / (3.35e12 * 0.81)},  // 791.4 us
      {&mg_emu::a100_sxm(), 2 * GiB / 1.731e12},          // 1.241 ms
      {&mg_emu::rtx_a6000(), 2 * GiB / 750.3e9}};         // 2.862 ms (768 x 680 / 696)
  for (const auto& [g, dram] : expected) {
    const Prediction p = predict(w, *g);
    INFO(g->name);
    CHECK(p.gpu == g->name);
    CHECK(p.binding == "DRAM");
    CHECK(p.seconds == Approx(dram + kLaunch).epsilon(1e-3));
    CHECK(mg_emu::describe(p).find("on an " + g->name + " (bound by DRAM") != std::string::npos);
  }
}

TEST_CASE("gpu model: a 4096^3 bf16 GEMM's tensor work on the A100 and the A6000", "[gpu_model]") {
  KernelWork w;
  w.blocks = 1024;  // 128 x 128 tiles, four per SM or more: quantisation below 1%
  w.threads_per_block = 128;
  w.tensor_flops = 2.0 * 4096 * 4096 * 4096;  // 137.4 GFLOP
  const GpuSpec& a100 = mg_emu::a100_sxm();
  const GpuSpec& a6000 = mg_emu::rtx_a6000();
  // 137.4e9 / 312e12 = 440.5 us; 1024 blocks on 108 SMs: the busiest runs 10, 10 x 108 / 1024 = 1.0547.
  CHECK(limit(predict(w, a100), "tensor") == Approx(440.5e-6 * 1.0547).epsilon(1e-3));
  // 137.4e9 / 154.8e12 = 887.9 us; on 84 SMs the busiest runs 13, 13 x 84 / 1024 = 1.0664.
  CHECK(limit(predict(w, a6000), "tensor") == Approx(887.9e-6 * 1.0664).epsilon(1e-3));
}

TEST_CASE("gpu specs: MG_EMU_GPU picks the default, and an unknown one is an error naming it",
          "[gpu_model]") {
  CHECK(setenv("MG_EMU_GPU", "a6000", 1) == 0);
  CHECK(&mg_emu::default_gpu_spec() == &mg_emu::rtx_a6000());
  CHECK(setenv("MG_EMU_GPU", "", 1) == 0);
  CHECK(&mg_emu::default_gpu_spec() == &mg_emu::h200_sxm());
  CHECK(setenv("MG_EMU_GPU", "b200", 1) == 0);
  CHECK_THROWS_WITH(mg_emu::default_gpu_spec(), Catch::Contains("MG_EMU_GPU: unknown GPU 'b200'"));
  unsetenv("MG_EMU_GPU");
}
