// The GPUs the performance model (cuda_emu/gpu_model.h) can predict for, each described by the
// published figures it needs: SMs and clock, memory bandwidths and latencies, compute peaks, the
// occupancy rules of its compute capability, and the launch overhead. Every figure carries its
// source in gpu_spec.cpp (docs/performance-model.md repeats them with links); a figure nobody has
// published for that part is borrowed from the closest part that has one, and says so.
//
// The emulated device itself is always an H200 (cudaGetDeviceProperties says so): the spec only
// chooses which GPU the counted work is priced on, so the same trace can be predicted for each.
//   const GpuSpec& a100 = find_gpu_spec("a100");
//   Prediction p = predict(work, a100);   // p.gpu == "NVIDIA A100 SXM4 80GB"
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mg_emu {

struct GpuSpec {
  std::string key;   // what --gpu and MG_EMU_GPU take: "h200", "h100", "a100", "a6000"
  std::string name;  // what predictions print: "NVIDIA H200 SXM"
  int cc_major = 9, cc_minor = 0;

  // ---- the chip ---------------------------------------------------------------------------------
  int sms = 132;
  double clock_hz = 1.98e9;  // the boost clock the peaks below are computed at

  // ---- memory -----------------------------------------------------------------------------------
  double hbm_bytes_per_s = 4.8e12;  // DRAM (HBM or GDDR) peak
  // The share of that peak a streaming kernel sustains (refresh, page and read/write turnaround
  // cost the rest): the DRAM limit and the bytes latency can move are priced at this rate.
  double hbm_sustained_fraction = 0.81;
  double hbm_capacity_bytes = 141e9;
  double l2_capacity_bytes = 50.0 * 1024 * 1024;  // the tracer's L2 takes its size from here
  int l2_ways = 16;  // lines of 128 bytes per hashed set of the tracer's L2 (cache_model.cpp)
  uint64_t l1_shared_bytes_per_sm = 256 * 1024;  // the unified L1 / shared-memory array of an SM
  double l2_bytes_per_s = 9.78e12;               // measured: no vendor publishes it
  double dram_latency_s = 348e-9;                // unloaded pointer chase
  // Under load a DRAM round trip takes longer: dram_loaded_latency_s + dram_latency_per_utilisation_s
  // x u, u = the launch's DRAM bytes per second / hbm_bytes_per_s (calibrated on the H200's die).
  double dram_loaded_latency_s = 538e-9;
  double dram_latency_per_utilisation_s = 215e-9;
  double l2_latency_s = 141.6e-9;  // L2 hit, near partition
  double l1_latency_s = 16.2e-9;   // L1 hit
  int sector_bytes = 32;

  // ---- compute ----------------------------------------------------------------------------------
  double fp32_flops_per_s = 66.9e12;  // CUDA cores, FMA = 2 FLOPs
  // The share of that peak a stream of independent FFMAs sustains, measured (register-file
  // operand bandwidth; on GA102 and Hopper SMs the second FP32 datapath, which few streams keep
  // busy): the FP32 limit is priced at this rate.
  double fp32_sustained_fraction = 0.63;
  double tensor_flops_per_s = 989e12;             // dense BF16/FP16 with FP32 accumulation
  double shared_wavefronts_per_sm_per_clock = 1;  // 32 banks x 4 bytes
  double issue_per_sm_per_clock = 4;              // 4 warp schedulers, one warp instruction a clock each
  double int32_lanes_per_sm = 64;                 // 32-bit integer add/compare/logic results a clock
  double sfu_lanes_per_sm = 16;                   // conversions and special functions a clock
  // How well the memory system's work and the SM's pipes overlap: a launch that needs m seconds of
  // DRAM or L2 and c of instruction issue, FP32 or tensor cores takes (m^p + c^p)^(1/p), not
  // max(m, c) (p = infinity: perfect overlap). Fitted on RRZE's gpu-roofline sweep of an H200.
  double overlap_exponent = 2;

  // ---- occupancy (the compute capability's limits, as the toolkit's cuda_occupancy.h has them) --
  int warp_size = 32;
  int max_threads_per_block = 1024;
  int max_threads_per_sm = 2048;
  int max_blocks_per_sm = 32;
  int registers_per_sm = 65536;
  int registers_per_block = 65536;
  int max_registers_per_thread = 255;
  int register_alloc_unit = 256;
  int sub_partitions = 4;
  uint64_t shared_per_sm = 228 * 1024;         // the largest shared-memory carveout
  uint64_t shared_max_per_block = 227 * 1024;  // opt-in maximum per block
  uint64_t shared_reserved_per_block = 1024;   // reserved by the driver per block (sm_80 and later)
  uint64_t shared_alloc_unit = 128;

  // ---- the host ---------------------------------------------------------------------------------
  double launch_latency_s = 2.433e-6;  // per kernel, back to back on one stream
  double host_sync_s = 10e-6;          // ASSUMED device idle time per host synchronisation
};

// The published instances (gpu_spec.cpp has every figure's source).
const GpuSpec& h200_sxm();
const GpuSpec& h100_sxm();
const GpuSpec& a100_sxm();
const GpuSpec& rtx_a6000();

// Every instance, H200 first.
const std::vector<const GpuSpec*>& gpu_specs();
// "h200, h100, a100, a6000": for messages.
std::string gpu_spec_keys();
// The instance whose key is `key` (case-insensitive); std::invalid_argument naming the choices
// otherwise.
const GpuSpec& find_gpu_spec(const std::string& key);
// The spec MG_EMU_GPU names (the H200 when unset or empty); std::invalid_argument for an unknown
// name. What the profiler's report at exit (MG_EMU_PROFILE) and bench_kernels default to.
const GpuSpec& default_gpu_spec();

}  // namespace mg_emu
