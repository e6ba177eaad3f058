// An H200 roofline: turns what one kernel launch asks of the GPU (counted by the access tracer,
// cuda_emu/profiler.h, or declared by the caller) into a PREDICTED time on an NVIDIA H200 SXM, the
// limit that binds, and how close that is to the roofline. Nothing here is measured on a GPU: every
// output is a prediction from published figures and public microbenchmarks, and is labelled so.
//
// The model (docs/performance-model.md explains it, with the sources of every constant):
//   * lower bounds on the time: DRAM bytes / HBM bandwidth, L2 sectors x 32 / L2 bandwidth,
//     shared-memory wavefronts / (one wavefront per SM per clock), FP32 FLOPs / the CUDA-core peak,
//     tensor FLOPs / the dense BF16/FP16 tensor-core peak;
//   * the per-SM ones (shared, FP32, tensor) are quantised over the 132 SMs: the busiest SM runs
//     ceil(blocks / 132) blocks, so a grid of fewer than 132 blocks gets only its SMs' share;
//   * latency (Little's law): each resident warp's memory round trips come one after another
//     (counted by the tracer: loads issued together share one, a cp.async pipeline n deep hides
//     n - 1 of n; without its count, ASSUMED one per load request), wave after wave;
//   * plus the launch latency.
// Occupancy follows NVIDIA's occupancy calculator (cuda_occupancy.h of the CUDA toolkit) for
// compute capability 9.0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mg_emu {

// What one launch asks of the GPU: counted by the tracer, or declared.
struct KernelWork {
  uint64_t blocks = 0;                  // grid size (all blocks, not only the traced sample)
  int threads_per_block = 0;            // 1..1024
  uint64_t shared_bytes_per_block = 0;  // static + dynamic, without the driver's 1 KB (added here)
  int registers_per_thread = 0;         // 0 = unknown: not a limit on occupancy
  double dram_bytes = 0;                // DRAM traffic predicted by the L2 model (reads + writes)
  double l2_sectors = 0;            // 32-byte sectors the SMs request from L2 (global loads+stores+atomics)
  double global_load_requests = 0;  // warp-level requests
  double global_load_sectors = 0;   // sectors of those requests (for bytes in flight)
  double load_round_trips = -1;     // memory round trips summed over warps (the tracer's
                                    // LaunchProfile::load_round_trips); < 0: one per load request
  double shared_wavefronts = 0;     // shared-memory wavefronts (loads, stores, atomics)
  double fp32_flops = 0;            // CUDA-core FLOPs (declared by the caller; an FMA = 2)
  double tensor_flops = 0;          // tensor-core FLOPs (bf16/f16 mma: counted)
  double atomics = 0;               // global atomic operations (lane-level): informational,
                                    // their traffic is in l2_sectors (see the doc)
};

struct Limit {
  const char* name;  // "DRAM", "L2", "shared", "fp32", "tensor", "latency (bytes in flight)", "launch"
  double seconds;    // predicted lower bound on the launch's time from this limit alone
};

// A PREDICTION for one launch on an H200 SXM (not a measurement).
struct Prediction {
  double seconds = 0;            // predicted time of the launch, launch overhead included
  std::string binding;           // name of the largest limit
  double roofline_fraction = 0;  // ideal roofline time (max of DRAM/L2/shared/fp32/tensor at full-GPU
                                 // rates: no quantisation, latency or launch) / seconds; in [0, 1]
  int blocks_per_sm = 0;         // occupancy
  int active_sms = 0;            // min(132, blocks)
  double waves = 0;              // blocks / (132 * blocks_per_sm)
  std::vector<Limit> limits;     // every limit's time, for the table, in the order of the names above

  // Beyond the tracer's interface: the Little's-law inputs, for the table and the doc.
  int resident_warps = 0;           // warps resident at once: min(blocks, 132 * blocks_per_sm) * warps/block
  double bytes_per_request = 0;     // global_load_sectors * 32 / global_load_requests
  double bytes_in_flight = 0;       // resident_warps * loaded bytes per round trip
  double load_latency_seconds = 0;  // the latency one load round trip is assumed to take
  double achievable_bytes_per_s = 0;  // bytes_in_flight / load latency, capped at the HBM bandwidth
  double ideal_seconds = 0;           // the ideal roofline time roofline_fraction divides
};

// Every constant of the model, each with its source (the doc's table repeats them with links).
// Peaks are the SXM part's; the H200 NVL (PCIe) has lower ones.
struct H200 {
  // ---- the chip ---------------------------------------------------------------------------------
  // 132 SMs: the H100 SXM5 configuration of the GH100 die (NVIDIA H100 Tensor Core GPU Architecture
  // whitepaper), which the H200 SXM keeps (16,896 FP32 lanes = 132 x 128 in vendor listings; the
  // emulator's cudaDeviceProp says 132 too).
  int sms = 132;
  // 1.98 GHz boost clock: the datasheet's 67 TFLOPS FP32 / (132 SMs x 128 FP32 lanes x 2 FLOP) =
  // 1.98e9, and the clock RRZE-HPC/gpu-benches gpu-latency reports on a GH200 (1980 MHz).
  double clock_hz = 1.98e9;

  // ---- memory ---------------------------------------------------------------------------------
  // HBM3e: 4.8 TB/s, 141 GB (NVIDIA H200 Tensor Core GPU datasheet). A peak: a streaming read
  // sustains about 3.9 TB/s on an H200 (RRZE-HPC/gpu-benches gpu-l2-cache/h200.txt, data sets
  // past the L2), so even a perfect copy reaches about 0.81 of this roofline.
  double hbm_bytes_per_s = 4.8e12;
  double hbm_capacity_bytes = 141e9;
  // L2: 50 MB (NVIDIA Hopper whitepaper for H100 SXM5; the emulator and the tracer's LRU use it).
  double l2_capacity_bytes = 50.0 * 1024 * 1024;
  // L2 bandwidth: NVIDIA publishes none. Measured on an H200: 9.78 TB/s, the median of the
  // RRZE-HPC/gpu-benches gpu-l2-cache benchmark's plateau for 8-40 MB data sets (9.48-10.25 TB/s;
  // file gpu-l2-cache/h200.txt, commit 1038c5d). A read figure; stores are assumed to cost the same.
  double l2_bytes_per_s = 9.78e12;
  // DRAM latency (unloaded, pointer chase): 689 cycles at 1980 MHz = 348 ns on a GH200
  // (RRZE-HPC/gpu-benches gpu-latency/gh200.txt, data sets of 230 MiB and more); markdewing/AI_kernels
  // latency/README.md measures 700 cycles on an H100 SXM. Under load the latency is higher, so the
  // latency limit is optimistic there (the doc's calibration: about 1.6x at low occupancy).
  double dram_latency_s = 348e-9;
  // L2 hit latency (near partition): 280 cycles = 141.6 ns on a GH200 (same gh200.txt, data sets
  // up to 24 MB); 291 cycles on an H100 SXM (markdewing/AI_kernels). The far L2 partition takes
  // 410-530 cycles (gh200.txt, 33-60 MB): not modelled.
  double l2_latency_s = 141.6e-9;
  int sector_bytes = 32;  // the unit of L1<->L2 traffic (CUDA C++ Best Practices Guide, coalescing)

  // ---- compute ----------------------------------------------------------------------------------
  // FP32 (CUDA cores): 67 TFLOPS (H200 datasheet, SXM).
  double fp32_flops_per_s = 67e12;
  // Tensor cores, BF16/FP16 dense: 989 TFLOPS. The datasheet's 1,979 TFLOPS is "with sparsity"
  // (2:4 structured sparsity doubles it); dense is half.
  double tensor_flops_per_s = 989e12;
  // Shared memory: 32 banks of 32 bits per clock per SM (CUDA C++ Programming Guide, shared
  // memory of compute capability 5.x and later; 9.0 is the same), i.e. one 128-byte wavefront per
  // SM per clock.
  double shared_wavefronts_per_sm_per_clock = 1;

  // ---- occupancy (compute capability 9.0: CUDA C++ Programming Guide, "Technical Specifications
  // per Compute Capability", and the toolkit's cuda_occupancy.h, which the CUDA runtime's own
  // cudaOccupancyMaxActiveBlocksPerMultiprocessor arithmetic follows) --------------------------
  int warp_size = 32;
  int max_threads_per_block = 1024;
  int max_threads_per_sm = 2048;  // 64 warps
  int max_blocks_per_sm = 32;     // cuda_occupancy.h: cudaOccMaxBlocksPerMultiprocessor, major 9
  int registers_per_sm = 65536;   // 64K 32-bit registers
  int registers_per_block = 65536;
  int max_registers_per_thread = 255;
  int register_alloc_unit = 256;  // registers are allocated per warp in units of 256 (cuda_occupancy.h)
  int sub_partitions = 4;         // the register file is split over 4 SM sub-partitions (cuda_occupancy.h)
  uint64_t shared_per_sm = 228 * 1024;         // 228 KB per SM (the largest carveout)
  uint64_t shared_max_per_block = 227 * 1024;  // 227 KB opt-in per block
  uint64_t shared_reserved_per_block = 1024;   // 1 KB per block reserved by the driver (since sm_80)
  uint64_t shared_alloc_unit = 128;            // cuda_occupancy.h: cudaOccSMemAllocationGranularity

  // ---- the host ---------------------------------------------------------------------------------
  // Launch latency: 2.43 us per kernel when 10,000 tiny kernels are queued back to back on an H200
  // (RRZE-HPC/gpu-benches gpu-small-kernels: the fit T = a + V/b to h200.txt gives a = 2433 ns,
  // recorded in repeated-stream.svg). With CUDA graphs the same kernels take about 1.3 us each
  // (h200_graph.txt); not modelled.
  double launch_latency_s = 2.433e-6;
  // A host synchronisation (the host waits for the device, e.g. a loss read): ASSUMPTION, 10 us of
  // device idle time per synchronisation. Public measurements of a tiny launch + synchronise are
  // 4.7 us (spinning) to 7.1 us (blocking) (JuliaGPU/CUDA.jl pull request 896, GPU unstated); a
  // device-to-host copy and the host's turnaround add to it. No H200 figure was found.
  double host_sync_s = 10e-6;
};

// Occupancy: resident blocks per SM for this block size, shared memory and register count, as the
// occupancy calculator computes it. Throws std::invalid_argument for a launch that cannot run
// (threads outside 1..1024, more than 227 KB of shared memory, registers that do not fit).
int blocks_per_sm_h200(int threads_per_block, uint64_t shared_bytes_per_block, int registers_per_thread,
                       const H200& gpu = H200{});

// Predicts one launch. Throws std::invalid_argument for a launch that cannot run (0 blocks, or as
// blocks_per_sm_h200 says).
Prediction predict_h200(const KernelWork& w, const H200& gpu = H200{});

// A training step: the launches' predictions (each includes its launch latency) plus the host
// synchronisations (counted already by the emulator: mg_emu::counters().host_syncs), each costing
// gpu.host_sync_s of idle device. The step's launches are assumed to run one after another (one
// stream, no overlap between kernels).
double predict_step_seconds(const std::vector<Prediction>& launches, uint64_t host_syncs,
                            const H200& gpu = H200{});

// One line for a report: "predicted 449.82 us on an H200 (bound by DRAM; 0.99 of the roofline;
// 8 blocks/SM, 248.24 waves)".
std::string describe(const Prediction& p);

}  // namespace mg_emu
