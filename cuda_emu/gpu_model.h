// A GPU roofline: turns what one kernel launch asks of the GPU (counted by the access tracer,
// cuda_emu/profiler.h, or declared by the caller) into a PREDICTED time on one GPU described by a
// GpuSpec (cuda_emu/gpu_spec.h: the H200 SXM by default, or an H100, A100 or RTX A6000), the limit
// that binds, and how close that is to the roofline. Nothing here is measured on a GPU: every
// output is a prediction from published figures and public microbenchmarks, and is labelled so.
//
// The model (docs/performance-model.md explains it, with the sources of every constant):
//   * lower bounds on the time: DRAM bytes / the HBM bandwidth a stream sustains, L2 sectors
//     (after the L1s) x 32 / L2 bandwidth, L1/shared wavefronts (shared memory's and the global
//     requests' passes through the same 128-byte-a-clock array) / (one per SM per clock), FP32
//     FLOPs / the CUDA-core peak, tensor FLOPs / the dense BF16/FP16 tensor-core peak;
//   * instruction issue: warp instructions (the counted ones above, plus one FFMA per 64 declared
//     FP32 FLOPs) / (4 schedulers x SMs x clock): the cap below the FP32 peak that any load, store
//     or mma between the FMAs imposes. Address and integer arithmetic, branches and conversions
//     are not counted (the tracer sees memory, not registers), so this too is a lower bound;
//   * the per-SM ones (L1/shared, FP32, tensor, issue) are quantised over the SMs (132 on an H200): the
//     busiest SM runs ceil(blocks / SMs) blocks, so a grid of fewer blocks than SMs gets only its
//     SMs' share;
//   * latency (Little's law): each resident warp's memory round trips come one after another
//     (counted by the tracer: loads issued together share one, a cp.async pipeline n deep hides
//     n - 1 of n; without its count, ASSUMED one per load request), wave after wave, each taking
//     the L1, L2 or DRAM latency by the share of sectors each served, the DRAM one loaded (it grows
//     with the DRAM bandwidth the launch uses, as calibrated on RRZE's occupancy sweep);
//   * a warp's own path: per basic block of its PTX, the longer of its instructions (one a clock)
//     and its chain of dependent latencies (an FFMA's 4 clocks, a shared load's 30), as if the warp
//     ran alone, wave after wave (counted with the PTX only);
//   * blocks in barrier-separated phases: the SM idles while all its resident blocks wait for their
//     loads at once (one block: the round trips and the SM's work add up; more: a closed queue,
//     the machine-repairman model, says how often all of them wait);
//   * memory and compute overlap imperfectly: the memory system's limit m (DRAM, L2) and the SM
//     pipes' c (issue, FP32, tensor) together take (m^p + c^p)^(1/p), GpuSpec::overlap_exponent;
//   * plus the launch latency.
// Occupancy follows NVIDIA's occupancy calculator (cuda_occupancy.h of the CUDA toolkit) with the
// spec's compute-capability limits.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emu/gpu_spec.h"

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
  double l1_hit_sectors = 0;        // of those, sectors an SM's L1 served (the tracer's cache model)
  double l1_pending_sectors = 0;    // of the hits, sectors still on their way from L2 (another
                                    // warp's same instruction missed them): they wait as L2 hits
  double load_round_trips = -1;     // memory round trips summed over warps (the tracer's
                                    // LaunchProfile::load_round_trips); < 0: one per load request
  double barriers = 0;              // __syncthreads() passed, summed over the blocks (the
                                    // tracer's LaunchProfile::barriers)
  double shared_wavefronts = 0;     // shared-memory wavefronts (loads, stores, atomics)
  double l1_wavefronts = 0;         // global requests' passes through the SM's L1 data array, which
                                    // shared memory also uses: per request, the most sectors
                                    // in one of the 4 places of a 128-byte line (at least 1)
  double warp_instructions = 0;     // warp instructions counted besides FP32 arithmetic: global and
                                    // shared requests, ldmatrix, cp.async, mma (the tracer's counts)
  // Counted from the kernel's PTX (profiler.h: InstructionMix), 0 when not counted. When
  // issued_instructions > 0 it replaces warp_instructions + fp32_flops / 64 in the issue limit, and
  // the pipes behind the schedulers bound it too: FP32, integer, and the quarter-rate conversion
  // and special-function units.
  double issued_instructions = 0;        // every kind
  double fp32_instructions = 0;          // FFMA, FADD, FMUL, FSETP
  double integer_instructions = 0;       // IADD3, IMAD, LOP3, SHF, ISETP, SEL, ...
  double quarter_rate_instructions = 0;  // conversions and MUFU
  // A warp's own clocks, summed over every warp of the grid (InstructionMix::warp_cycles): per
  // block run, the longer of its instructions and its chain of dependent ones. 0: not counted.
  double warp_cycles = 0;
  double fp32_flops = 0;    // CUDA-core FLOPs (declared by the caller; an FMA = 2)
  double tensor_flops = 0;  // tensor-core FLOPs (bf16/f16 mma: counted)
  double atomics = 0;       // global atomic operations (lane-level): informational,
                            // their traffic is in l2_sectors (see the doc)
  // Stack frames in local memory (ptxas -v's "bytes stack frame" x every thread of the grid, 0 when
  // not counted): each thread writes its frame at least once, and the frames of a grid outgrow
  // the L1s, so they are priced as L2 and DRAM traffic beside dram_bytes -- an upper bound on DRAM,
  // as the L2 keeps some. On the H200 a 200-byte frame made a relu move 627 MB, not 134.
  double local_bytes = 0;
};

struct Limit {
  const char* name;  // "DRAM", "L2", "L1/shared", "fp32", "tensor", "issue", "latency (bytes in flight)",
                     // "latency (dependent instructions)", "latency + SM (warps waiting together)",
                     // "launch"
  double seconds;    // predicted lower bound on the launch's time from this limit alone
};

// A PREDICTION for one launch on one GPU (not a measurement).
struct Prediction {
  std::string gpu;               // the GpuSpec's name: "NVIDIA H200 SXM"
  double seconds = 0;            // predicted time of the launch, launch overhead included
  std::string binding;           // name of the largest limit
  double roofline_fraction = 0;  // ideal roofline time (max of DRAM/L2/L1-shared/fp32/tensor/issue at
                                 // full-GPU rates: no quantisation, latency or launch) / seconds; in [0, 1]
  int blocks_per_sm = 0;         // occupancy
  int active_sms = 0;            // min(SMs, blocks)
  double waves = 0;              // blocks / (SMs * blocks_per_sm)
  std::vector<Limit> limits;     // every limit's time, for the table, in the order of the names above

  // Beyond the tracer's interface: the Little's-law inputs, for the table and the doc.
  int resident_warps = 0;           // warps resident at once: min(blocks, SMs * blocks_per_sm) * warps/block
  double bytes_per_request = 0;     // global_load_sectors * 32 / global_load_requests
  double bytes_in_flight = 0;       // resident_warps * loaded bytes per round trip
  double load_latency_seconds = 0;  // one load round trip: L1, L2 and loaded DRAM latencies by share
  double dram_utilisation = 0;      // u of the loaded DRAM latency (gpu_spec.h), at the latency time
  double achievable_bytes_per_s = 0;  // bytes_in_flight / load latency, capped at the HBM bandwidth
  double ideal_seconds = 0;           // the ideal roofline time roofline_fraction divides
  // The memory system's and the SM pipes' limits together, as they overlap (GpuSpec::
  // overlap_exponent): at least the larger of the two; the prediction when it is the largest.
  double overlap_seconds = 0;
};

// Occupancy: resident blocks per SM for this block size, shared memory and register count, as the
// occupancy calculator computes it. Throws std::invalid_argument for a launch that cannot run
// there (threads outside 1..1024, more shared memory than a block may have, registers that do not
// fit).
int blocks_per_sm(int threads_per_block, uint64_t shared_bytes_per_block, int registers_per_thread,
                  const GpuSpec& gpu = h200_sxm());

// Predicts one launch on `gpu`. Throws std::invalid_argument for a launch that cannot run (0 blocks,
// or as blocks_per_sm says).
Prediction predict(const KernelWork& w, const GpuSpec& gpu = h200_sxm());

// A training step: the launches' predictions (each includes its launch latency) plus the host
// synchronisations (counted already by the emulator: mg_emu::counters().host_syncs), each costing
// gpu.host_sync_s of idle device. The step's launches are assumed to run one after another (one
// stream, no overlap between kernels).
double predict_step_seconds(const std::vector<Prediction>& launches, uint64_t host_syncs,
                            const GpuSpec& gpu = h200_sxm());

// One line for a report: "predicted 554.77 us on an NVIDIA H200 SXM (bound by DRAM; 1.00 of the
// roofline; 8 blocks/SM, 248.24 waves)".
std::string describe(const Prediction& p);

}  // namespace mg_emu
