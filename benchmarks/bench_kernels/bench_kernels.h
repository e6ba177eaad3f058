// bench_kernels: every CUDA kernel family measured against the ceiling of the same run.
//
// One executable, one file per family (benchmarks/bench_kernels/*.cpp|*.cu, globbed by
// benchmarks/CMakeLists.txt in CUDA builds):
//   main.cpp          flags, the copy-bandwidth ceiling, the table and the JSON file
//   memory_bound.cpp  elementwise, casts, reductions, softmax, layer_norm, cross-entropy:
//                     achieved GB/s and the ratio to a large device-to-device copy
//   layers.cpp        embedding, pooling, dropout, the fused optimizers, layer_norm and softmax
//                     backward, im2col/col2im: the same, against the same copy
//   bandwidth_row.h   what those two share: buffers, inputs, the CPU check and the timing
//   gemm_ladder.cpp   the hand-written GEMM ladder against cuBLAS at the same shapes (TFLOP/s)
//   conv.cpp          cuDNN against im2col + GEMM for conv2d forward and backward
//   allocator.cpp     the caching allocator against raw cudaMalloc/cudaFree
//   profile.cpp       --profile: the tracer's counters and the GPU model's predictions
// This header is the contract between them: each family returns rows, main prints them.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"

namespace mg::bench {

struct BenchOptions {
  bool quick = false;  // a few small sizes and few repetitions: scripts/gpu-check runs this
  bool check = false;  // correctness only: tiny sizes, one call each (the CUDA emulation's ctest
                       // runs this; its times mean nothing there). Implies quick.
  int device = 0;      // physical CUDA device
  int warmup = 3;
  int repeats = 20;
  // --profile (the CUDA emulation build only): no timing; each timed call runs once under the
  // emulator's access tracer (cuda_emu/profiler.h) and its time is the GPU model's PREDICTION for
  // the GPU --gpu names (cuda_emu/gpu_spec.h: h200, the default, h100, a100, a6000).
  bool profile = false;
  std::string profile_gpu = "h200";
  int profile_blocks = 132;          // blocks traced per launch (the first ones; the rest are skipped)
  bool profile_sites = false;        // --profile-sites: every launch and every instruction it traced
  bool profile_instructions = true;  // the issue limit from nvcc's PTX (ptx_count.h); off: --no-instructions
};

// What --profile counted for one row's call and what the GPU model predicts (profile.cpp).
struct ProfileRow {
  bool valid = false;
  int launches = 0;
  double blocks = 0, traced_blocks = 0;
  double load_requests = 0, load_sectors = 0, load_bytes = 0;  // global loads (cp.async included)
  double store_requests = 0, store_sectors = 0, store_bytes = 0;
  double atomic_lanes = 0;
  double shared_requests = 0, shared_wavefronts = 0, shared_ideal_wavefronts = 0;
  double mma = 0;
  double dram_bytes = 0;              // LRU L2 model (the first-touch figure is below)
  double dram_bytes_first_touch = 0;  // unbounded L2
  double l1_hit_sectors = 0;          // load sectors the L1 model served
  double l1_pending_sectors = 0;      // of those, hits on a sector another warp had just missed
  double l2_sectors = 0;              // sectors that reached L2 (after the L1s)
  double warp_instructions = 0;       // memory and mma warp requests the tracer counted
  double issued_instructions = 0;     // every warp instruction, counted from the PTX (ptx_count.h)
  int counted_launches = 0;           // launches whose instructions were counted (nvcc found)
  double ideal_bytes = 0;             // declared: every input read once, every output written once
  double fp32_flops = 0, tensor_flops = 0;
  double predicted_seconds = 0, roofline_fraction = 0;
  std::string binding;
  // What the prediction adds up beside the launches' own times.
  double library_calls = 0;              // cuBLAS / cuDNN calls, priced at their roofline
  double host_syncs = 0;                 // the host waited for the device
  double launch_seconds = 0;             // the launches' latency, part of predicted_seconds
  double sync_seconds = 0;               // the host synchronisations', part of predicted_seconds
  std::vector<std::string> worst_sites;  // the instructions with the most sectors / wavefronts
  std::vector<std::string> kernels;      // the launches' kernel (or library call) names, in order, once each
};

// One measured line of the table. `achieved` and `ceiling` share `unit` ("GB/s", "TFLOP/s",
// "us"); ratio = achieved / ceiling for throughputs (for "us" rows: ceiling / achieved, so a
// ratio above 1 always means "better than the reference").
struct KernelResult {
  std::string family;     // "elementwise", "gemm", "conv", "allocator", ...
  std::string kernel;     // "add f32 contiguous", "ladder/register_tiled", "cudnn fwd", ...
  std::string dtype;      // "f32", "bf16", ...
  std::string shape;      // "64M", "4096x4096x4096", "N64 C64 H56 W56 K64 3x3"
  double seconds = 0;     // median time of one call
  double achieved = 0;    // in `unit`
  double ceiling = 0;     // the reference measured in the same run, in `unit`
  std::string reference;  // what the ceiling is: "d2d copy", "cuBLAS", "cudaMalloc/cudaFree"
  std::string unit;
  double ratio = 0;
  double max_rel_error = -1;  // of the result against its reference where checked, else -1
  // Added fields (each with a default, so families that do not set them keep compiling):
  double tolerance = -1;  // max_rel_error above this (or NaN) makes the row WRONG and the exit status 1;
                          // < 0: the family judged correctness itself (see `failed`) or not at all
  bool failed = false;    // the family's own verdict that this row's result is wrong (exit status 1)
  double floor = 0;       // the ratio the issue asks of this row (e.g. 0.8); 0: none. A ratio below
                          // it is reported ("below"), not an error
  std::string note;       // optional remark printed under the table (e.g. "includes a stream sync")
  ProfileRow profile;     // --profile only
};

// --profile: the GPU the predictions are for, by its cuda_emu/gpu_spec.h key; throws mg::Error naming
// the choices for an unknown one, and in a build without the emulator (profile.cpp). Returns its name.
std::string set_profile_gpu(const std::string& key);
// --instructions: count every traced launch's instructions from nvcc's PTX (profile.cpp).
void set_profile_instructions(bool on);
// --profile: runs fn once under the tracer; returns the predicted seconds (profile.cpp).
double profiled_seconds(const std::function<void()>& fn, const BenchOptions& o);
// --profile: one training step (fn) traced whole, every block, with the host synchronisations it
// makes; its predicted time (kernels + library calls + launches + syncs) in `predicted_seconds`.
ProfileRow profile_step(const std::function<void()>& fn, bool print_sites = false);
// The counters of the last profiled call with the row's declared ideal bytes and CUDA-core FLOPs
// (profile.cpp). The prediction includes them.
ProfileRow take_profile(double ideal_bytes, double fp32_flops);

// The tolerance of a row reduction of `len` floats (softmax's sum, layer_norm's mean and variance)
// checked against its CPU twin, which sums in another order: rounding errors of either sign grow
// like sqrt(len) units of 2^-24, so 4 sqrt(len) 2^-24, and never below 1e-5. Rows of 32768 get
// 4.3e-5: an H200 measured 1.003e-5 to 1.03e-5 there (2026-12-04), over the flat 1e-5 used before.
inline double row_sum_tolerance(int64_t len) {
  return std::max(1e-5, 4.0 * std::sqrt(static_cast<double>(len)) * 0x1p-24);
}

// max |out - ref| / max |ref| of a result copied back to the host; NaN anywhere in out gives NaN.
inline double max_rel_error(const std::vector<float>& out, const std::vector<float>& ref) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (std::isnan(out[i])) return NAN;
    diff = std::max(diff, std::fabs(double(out[i]) - ref[i]));
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

// Ceilings measured once by main.cpp before the families run.
struct Ceilings {
  double copy_gbps = 0;  // cudaMemcpyAsync device->device of a large buffer: bytes read + written / s
};

// Median time of fn() in seconds, measured with CUDA events on the current stream of the current
// device (fn must enqueue its work there: the legacy default stream 0 unless it says otherwise).
inline double median_seconds(const std::function<void()>& fn, const BenchOptions& o,
                             cudaStream_t stream = nullptr) {
  if (o.profile) return profiled_seconds(fn, o);
  auto ok = [](cudaError_t e) { MG_CHECK(e == cudaSuccess, "bench_kernels: ", cudaGetErrorString(e)); };
  for (int i = 0; i < o.warmup; ++i) fn();
  ok(cudaStreamSynchronize(stream));
  cudaEvent_t start, stop;
  ok(cudaEventCreate(&start));
  ok(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int i = 0; i < std::max(1, o.repeats); ++i) {
    ok(cudaEventRecord(start, stream));
    fn();
    ok(cudaEventRecord(stop, stream));
    ok(cudaEventSynchronize(stop));
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms * 1e-3);
  }
  ok(cudaEventDestroy(start));
  ok(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// The families register themselves, so main.cpp needs no list of them and a family file can be
// added or left out without touching it. In a family file, at namespace scope:
//
//   static const mg::bench::RegisterFamily kRegistered("gemm", 20, bench_gemm_ladder);
//
// main.cpp runs them in ascending `order` (its --family flag picks some by name).
using FamilyFn = std::function<std::vector<KernelResult>(const BenchOptions&, const Ceilings&)>;
struct Family {
  std::string name;
  int order = 0;
  FamilyFn run;
};
inline std::vector<Family>& registered_families() {
  static std::vector<Family> families;
  return families;
}
struct RegisterFamily {
  RegisterFamily(std::string name, int order, FamilyFn run) {
    registered_families().push_back(Family{std::move(name), order, std::move(run)});
  }
};

}  // namespace mg::bench
