// The GPUs of cuda_emu/gpu_spec.h, every figure with its source. "RRZE" is RRZE-HPC/gpu-benches
// (commit 1038c5d): its gpu-latency, gpu-l2-cache, gpu-cache and gpu-small-kernels result files.
#include "cuda_emu/gpu_spec.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <stdexcept>

namespace mg_emu {

namespace {

GpuSpec make_h200() {
  GpuSpec g;
  g.key = "h200";
  g.name = "NVIDIA H200 SXM";
  g.cc_major = 9, g.cc_minor = 0;
  // 132 SMs: the H100 SXM5 configuration of the GH100 die (NVIDIA H100 Tensor Core GPU Architecture
  // whitepaper), which the H200 SXM keeps (16,896 FP32 lanes = 132 x 128 in vendor listings).
  g.sms = 132;
  // 1.98 GHz: the datasheet's 67 TFLOPS FP32 / (132 SMs x 128 lanes x 2 FLOP), and the clock RRZE's
  // gpu-latency reports on a GH200 (1980 MHz).
  g.clock_hz = 1.98e9;
  // HBM3e: 4.8 TB/s, 141 GB (NVIDIA H200 Tensor Core GPU datasheet). A peak: a streaming read
  // sustains 3.888 TB/s = 0.81 of it (RRZE gpu-l2-cache/h200.txt, the plateau of data sets from
  // 2.5 GB up; the first H200 run measured read+write streams at 3.3-3.4 TB/s, docs/gpu-h200.md).
  g.hbm_bytes_per_s = 4.8e12;
  g.hbm_sustained_fraction = 3.888 / 4.8;
  g.hbm_capacity_bytes = 141e9;
  // L2: 50 MB (NVIDIA Hopper whitepaper, H100 SXM5). L1 and shared memory: one 256 KB array per SM
  // (Hopper tuning guide), of which shared memory takes up to 228 KB.
  g.l2_capacity_bytes = 50.0 * 1024 * 1024;
  g.l1_shared_bytes_per_sm = 256 * 1024;
  // L2 organisation: ASSUMED for every GPU here, 16 lines of 128 bytes per set, the set chosen by a
  // hash of the address. NVIDIA publishes neither the ways nor the hash; 16 was set before the
  // comparison with RRZE's gpu-l2-cache sweep, not fitted to it (docs/performance-model.md gives the
  // rows at 8 and 32 ways too).
  g.l2_ways = 16;
  // L2 bandwidth: 9.78 TB/s, the median of RRZE gpu-l2-cache/h200.txt's plateau for 8-40 MB data
  // sets (9.48-10.25 TB/s). A read figure; stores are assumed to cost the same.
  g.l2_bytes_per_s = 9.78e12;
  // DRAM latency, unloaded: 689 cycles at 1980 MHz = 348 ns on a GH200 (RRZE gpu-latency/gh200.txt,
  // data sets of 230 MiB and more); markdewing/AI_kernels measures 700 cycles on an H100 SXM.
  g.dram_latency_s = 348e-9;
  // L2 hit latency, near partition: 280 cycles = 141.6 ns (gh200.txt, data sets up to 24 MB). The
  // far partition's 410-530 cycles (33-60 MB) are not modelled. L1 hit: 32 cycles = 16.2 ns
  // (gh200.txt, data sets up to 200 kB).
  g.l2_latency_s = 141.6e-9;
  g.l1_latency_s = 16.2e-9;
  // DRAM latency under load, CALIBRATED: RRZE gpu-stream/gh200.txt's read kernel (one 8-byte load
  // per thread, 2 blocks per SM, blocks of 64-512 threads) reaches 245-1715 GB/s, where Little's law
  // with the unloaded 348 ns gives 388-3107 GB/s. The latency each row implies (its bytes in flight /
  // its measured bandwidth) is 551, 556, 578 and 630 ns at DRAM utilisations u = 0.06, 0.12, 0.23
  // and 0.43 of the GH200's 4.0 TB/s: a line 538 ns + 215 ns x u through them (within 2%).
  g.dram_loaded_latency_s = 538e-9;
  g.dram_latency_per_utilisation_s = 215e-9;
  // FP32: 132 SMs x 128 lanes x 2 FLOPs x 1.98 GHz = 66.9 TFLOPS, the datasheet's "67 TFLOPS" before
  // rounding (kept exact so that FMAs alone fill the 4 schedulers exactly as they fill the FP32
  // lanes); tensor BF16/FP16 dense: 989 TFLOPS, half the datasheet's 1,979 "with sparsity".
  g.fp32_flops_per_s = 132.0 * 128 * 2 * 1.98e9;
  g.tensor_flops_per_s = 989e12;
  // Sustained FP32, CALIBRATED: RRZE gpu-roofline/h200.txt tops out at 42 TFLOP/s at 1980 MHz
  // (its 256 dependent FMAs a value, two chains a thread, every SM full): 0.63 of the peak.
  g.fp32_sustained_fraction = 0.63;
  // Memory and compute overlap, FITTED: (m^p + c^p)^(1/p) with p = 2 (GpuSpec's default, kept by
  // every GPU here): the least-squares p over the six rows of RRZE gpu-roofline/h200.txt is 2.1,
  // where N = 40's DRAM and issue limits (2.23 and 2.33 ms) measured 3.22 ms together. The A100's
  // rows (alex_a100_40.txt) are held out.
  // Instruction issue: 4 warp schedulers per SM, each issuing one warp instruction per clock (CUDA C++
  // Programming Guide, the compute capability 7.x-9.0 architecture sections; the Hopper and Ampere
  // whitepapers' SM diagrams: four partitions, one scheduler and dispatch unit each). The same on
  // every GPU here (the default of GpuSpec::issue_per_sm_per_clock). Behind the schedulers, per SM
  // per clock (the Programming Guide's table of arithmetic instruction throughputs, compute
  // capabilities 8.0, 8.6 and 9.0 alike): 64 results of 32-bit integer add, compare, logic and
  // multiply-add, 16 of type conversions and of special functions (GpuSpec's defaults).
  // Occupancy of compute capability 9.0 (CUDA C++ Programming Guide, "Technical Specifications per
  // Compute Capability"; cuda_occupancy.h): 2048 threads and 32 blocks per SM, 64K registers,
  // 228 KB of shared memory per SM, 227 KB per block, 1 KB reserved per block.
  g.max_threads_per_sm = 2048;
  g.max_blocks_per_sm = 32;
  g.shared_per_sm = 228 * 1024;
  g.shared_max_per_block = 227 * 1024;
  // Launch latency: 2.43 us per kernel when 10,000 tiny kernels are queued back to back (RRZE
  // gpu-small-kernels: the fit T = a + V/b to h200.txt gives a = 2433 ns). With CUDA graphs about
  // 1.3 us (h200_graph.txt); not modelled.
  g.launch_latency_s = 2.433e-6;
  // A host synchronisation: ASSUMED 10 us of device idle time. Public figures for a tiny launch +
  // synchronise are 4.7-7.1 us (JuliaGPU/CUDA.jl pull request 896, GPU unstated).
  g.host_sync_s = 10e-6;
  return g;
}

GpuSpec make_h100() {
  // The H100 SXM5 is the H200 SXM's die, SM count and clock with HBM3 instead of HBM3e.
  GpuSpec g = make_h200();
  g.key = "h100";
  g.name = "NVIDIA H100 SXM";
  // HBM3: 3.35 TB/s, 80 GB (NVIDIA H100 Tensor Core GPU datasheet, SXM). FP32 67 TFLOPS and dense
  // BF16 989 TFLOPS are the same datasheet's, equal to the H200's.
  g.hbm_bytes_per_s = 3.35e12;
  g.hbm_capacity_bytes = 80e9;
  // Sustained share of the HBM peak: BORROWED from the H200 (0.81, the same memory controllers; no
  // public H100 SXM sweep past the L2 was found; RRZE's H100 PCIe, with HBM2e at 2.0 TB/s, reads
  // at 0.98 of its peak, so this may be pessimistic).
  // L2 bandwidth and both latencies: BORROWED from the H200/GH200 measurements above (the same
  // GH100 die and L2 at the same clock; no public H100 SXM L2 sweep was found). markdewing/AI_kernels
  // measures 700 cycles of DRAM and 291 of L2 latency on an H100 SXM, within 2% and 4% of these.
  // The loaded DRAM latency: the H200 calibration's, as the unloaded one. Sustained FP32: BORROWED
  // from the H200 (0.63, the same SM at the same clock).
  return g;
}

GpuSpec make_a100() {
  GpuSpec g;
  g.key = "a100";
  g.name = "NVIDIA A100 SXM4 80GB";
  g.cc_major = 8, g.cc_minor = 0;
  // 108 SMs at 1410 MHz boost (NVIDIA A100 Tensor Core GPU Architecture whitepaper); 64 FP32 lanes
  // per SM: 108 x 64 x 2 x 1.41e9 = 19.5 TFLOPS, the datasheet's FP32 figure.
  g.sms = 108;
  g.clock_hz = 1.41e9;
  // HBM2e: 2,039 GB/s, 80 GB (A100 80GB datasheet, SXM); L2 40 MB (whitepaper). A streaming read
  // sustains 1,731 GB/s = 0.85 of it (RRZE gpu-l2-cache/a100_80.txt, data sets from 2.5 GB up).
  g.hbm_bytes_per_s = 2.039e12;
  g.hbm_sustained_fraction = 1.731 / 2.039;
  g.hbm_capacity_bytes = 80e9;
  g.l2_capacity_bytes = 40.0 * 1024 * 1024;
  g.l1_shared_bytes_per_sm = 192 * 1024;  // combined L1/shared per SM (A100 whitepaper)
  // L2 bandwidth: 5.41 TB/s, the median of RRZE gpu-l2-cache/a100_80.txt's plateau for 2-28 MB
  // data sets (5.26-5.48 TB/s).
  g.l2_bytes_per_s = 5.41e12;
  // Latencies (RRZE gpu-latency/a100_80.txt at 1410 MHz): DRAM 552 cycles = 391 ns (data sets of
  // 300 MB and more); L2 206 cycles = 145.9 ns (data sets up to 17 MB).
  g.dram_latency_s = 391e-9;
  g.l2_latency_s = 145.9e-9;
  g.l1_latency_s = 23.4e-9;  // 33 cycles (a100_80.txt, data sets up to 100 kB)
  // Loaded DRAM latency: ASSUMED to grow as the H200's calibration (above) does, in proportion to
  // the unloaded latency: 391 x 538 / 348 = 604 ns, plus 391 x 215 / 348 = 242 ns x u. Checked
  // against RRZE gpu-stream/a100_80.txt, which the calibration did not see (tests/emu/validation/).
  g.dram_loaded_latency_s = 391e-9 * 538.0 / 348.0;
  g.dram_latency_per_utilisation_s = 391e-9 * 215.0 / 348.0;
  // FP32 19.5 TFLOPS; tensor BF16/FP16 dense 312 TFLOPS (datasheet; 624 with sparsity).
  g.fp32_flops_per_s = 19.5e12;
  g.tensor_flops_per_s = 312e12;
  // Sustained FP32: the whole peak. RRZE gpu-roofline/alex_a100_40.txt (an A100 40GB, the same SM
  // and clock) reaches 19.0 TFLOP/s at 256 FMAs a value, and siboehm's cuBLAS SGEMM 19.0 at 4096^3
  // (SGEMM_CUDA README at c09b350): 0.98 of 19.5, where the other instructions' slots (the limits
  // section) account for the rest.
  g.fp32_sustained_fraction = 1.0;
  // Compute capability 8.0: 2048 threads and 32 blocks per SM, 64K registers, 164 KB of shared
  // memory per SM, 163 KB per block, 1 KB reserved per block (Programming Guide; cuda_occupancy.h).
  g.max_threads_per_sm = 2048;
  g.max_blocks_per_sm = 32;
  g.shared_per_sm = 164 * 1024;
  g.shared_max_per_block = 163 * 1024;
  // Launch latency: ASSUMED the H200's 2.43 us (RRZE's a100_80.txt small-kernel sweep has not been
  // fitted here).
  g.launch_latency_s = 2.433e-6;
  g.host_sync_s = 10e-6;
  return g;
}

GpuSpec make_a6000() {
  GpuSpec g;
  g.key = "a6000";
  g.name = "NVIDIA RTX A6000";
  g.cc_major = 8, g.cc_minor = 6;
  // GA102: 84 SMs at 1800 MHz boost, 128 FP32 lanes per SM: 84 x 128 x 2 x 1.8e9 = 38.7 TFLOPS,
  // the datasheet's FP32 figure (NVIDIA RTX A6000 datasheet; NVIDIA Ampere GA102 whitepaper).
  g.sms = 84;
  g.clock_hz = 1.80e9;
  // GDDR6: 768 GB/s, 48 GB (datasheet); L2 6 MB (GA102 whitepaper). Sustained share BORROWED from
  // the A40 (GA102 with 696 GB/s of GDDR6): RRZE gpu-stream/a40.txt reads 680 GB/s = 0.98 of it.
  g.hbm_bytes_per_s = 768e9;
  g.hbm_sustained_fraction = 680.0 / 696.0;
  g.hbm_capacity_bytes = 48e9;
  g.l2_capacity_bytes = 6.0 * 1024 * 1024;
  g.l1_shared_bytes_per_sm = 128 * 1024;  // combined L1/shared per SM (GA102 whitepaper)
  // L2 bandwidth: BORROWED from the A40 (the same GA102 die, 84 SMs, 1740 MHz): RRZE
  // gpu-cache/a40.txt reads 2.49 TB/s for 0.5-6.5 MB data sets with one block per SM, scaled to the
  // A6000's clock: 2.58 TB/s. One block per SM is a light load, so this may be low.
  g.l2_bytes_per_s = 2.58e12;
  // Latencies BORROWED from the A40 (RRZE gpu-latency/a40.txt): DRAM 556 cycles, L2 250 cycles,
  // taken at the A6000's 1.8 GHz: 309 ns and 139 ns.
  g.dram_latency_s = 309e-9;
  g.l2_latency_s = 139e-9;
  g.l1_latency_s = 18.3e-9;  // the A40's 33 cycles at 1.8 GHz
  // Loaded DRAM latency: ASSUMED to grow as the H200's calibration does (see the A100).
  g.dram_loaded_latency_s = 309e-9 * 538.0 / 348.0;
  g.dram_latency_per_utilisation_s = 309e-9 * 215.0 / 348.0;
  // FP32 38.7 TFLOPS; tensor FP16/BF16 with FP32 accumulation, dense: 154.8 TFLOPS (GA102
  // whitepaper's RTX A6000 column; 309.7 with sparsity).
  g.fp32_flops_per_s = 38.7e12;
  g.tensor_flops_per_s = 154.8e12;
  // Sustained FP32, CALIBRATED: the fastest FP32 GEMM published for the card, cuBLAS at 4096^3 in
  // siboehm's SGEMM_CUDA README (at 60cba6f), 23.25 TFLOP/s: 0.60 of the peak. (Its own ladder,
  // K1-K10, is held out.)
  g.fp32_sustained_fraction = 0.60;
  // Compute capability 8.6: 1536 threads and 16 blocks per SM, 64K registers, 100 KB of shared
  // memory per SM, 99 KB per block, 1 KB reserved per block (Programming Guide; cuda_occupancy.h).
  g.max_threads_per_sm = 1536;
  g.max_blocks_per_sm = 16;
  g.shared_per_sm = 100 * 1024;
  g.shared_max_per_block = 99 * 1024;
  // Launch latency: ASSUMED the H200's 2.43 us (RRZE's a40.txt small-kernel sweep has not been
  // fitted here).
  g.launch_latency_s = 2.433e-6;
  g.host_sync_s = 10e-6;
  return g;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return s;
}

}  // namespace

const GpuSpec& h200_sxm() {
  static const GpuSpec g = make_h200();
  return g;
}
const GpuSpec& h100_sxm() {
  static const GpuSpec g = make_h100();
  return g;
}
const GpuSpec& a100_sxm() {
  static const GpuSpec g = make_a100();
  return g;
}
const GpuSpec& rtx_a6000() {
  static const GpuSpec g = make_a6000();
  return g;
}

const std::vector<const GpuSpec*>& gpu_specs() {
  static const std::vector<const GpuSpec*> all = {&h200_sxm(), &h100_sxm(), &a100_sxm(), &rtx_a6000()};
  return all;
}

std::string gpu_spec_keys() {
  std::string s;
  for (const GpuSpec* g : gpu_specs()) s += (s.empty() ? "" : ", ") + g->key;
  return s;
}

const GpuSpec& find_gpu_spec(const std::string& key) {
  const std::string k = lower(key);
  for (const GpuSpec* g : gpu_specs())
    if (g->key == k) return *g;
  throw std::invalid_argument("unknown GPU '" + key + "': the performance model knows " + gpu_spec_keys());
}

const GpuSpec& default_gpu_spec() {
  const char* env = std::getenv("MG_EMU_GPU");
  if (env == nullptr || *env == '\0') return h200_sxm();
  try {
    return find_gpu_spec(env);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(std::string("MG_EMU_GPU: ") + e.what());
  }
}

}  // namespace mg_emu
