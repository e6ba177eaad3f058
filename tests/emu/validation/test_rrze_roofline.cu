// The performance model against RRZE-HPC's gpu-benches `gpu-roofline` sweep, measured on an H200
// and on an A100 SXM4 40GB (result files gpu-roofline/h200.txt and alex_a100_40.txt, commit
// e4e93a3; the benchmark is GPL-3.0: the kernel below is our own, written from its description).
//
// The kernel walks from memory-bound to compute-bound: blocks of 256 threads, 8 per SM (one full
// wave: 1056 blocks on an H200, 864 on an A100); each thread streams 4,000 floats of two arrays
// (stride 256, so a warp reads 128 contiguous bytes), two elements at a time, and spends N
// dependent FMAs on each element (two independent chains per thread). FLOPs: 2 + 2N per element.
// The measured figure is the source's: 1000 back-to-back launches timed together, as GB/s of
// the two arrays and GFLOP/s.
//
// Here the first 2 blocks are traced (every block reads its own data: no reuse to model) and the
// launch predicted with its FLOPs declared. The runs were in float (the file's 0.25 FLOP/byte at
// N = 0 is 2 FLOPs per 8 bytes).
//
// What the rows say (docs/performance-model.md): the A100 reaches its FP32 peak at large N and
// the model agrees; the H200 tops out at 63 % of its 66.9 TFLOP/s peak, the sustained share its
// spec carries. Where memory and compute meet (N = 24-56) both GPUs are slower than either limit
// alone: the two overlap imperfectly, as the spec's overlap exponent says (fitted on the H200
// rows, held out on the A100's).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "validation.h"

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 4000;  // elements of each array
constexpr uint64_t kTracedBlocks = 2;

template <int kFmas>
__global__ void roofline(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out) {
  const int64_t first = threadIdx.x + int64_t{blockIdx.x} * kThreads * kPerThread;
  float sum = 0;
  for (int i = 0; i < kPerThread; i += 2) {
    const float a0 = a[first + int64_t{i} * kThreads], b0 = b[first + int64_t{i} * kThreads];
    const float a1 = a[first + int64_t{i + 1} * kThreads], b1 = b[first + int64_t{i + 1} * kThreads];
    float v0 = a0 - b0, v1 = a1 - b1;
    for (int n = 0; n < kFmas; ++n) {
      v0 = v0 * a0 - b0;
      v1 = v1 * a1 - b1;
    }
    sum += v0 + v1;
  }
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

struct Point {
  int fmas;
  double measured_gbps;
};

template <int kFmas>
validation::Row run(const mg_emu::GpuSpec& gpu, double measured_gbps, float* a, float* b, float* out) {
  const unsigned blocks = static_cast<unsigned>(gpu.sms) * 8;
  const double elements = double(blocks) * kThreads * kPerThread;  // of each array
  const mg_emu::Prediction p =
      validation::traced_launch(gpu, kTracedBlocks, (2.0 + 2.0 * kFmas) * elements,
                                [&] { roofline<kFmas><<<blocks, kThreads>>>(a, b, out); });
  CHECK(p.blocks_per_sm == 8);
  return {"N=" + std::to_string(kFmas), 2 * 4 * elements / (measured_gbps * 1e9), p.seconds, p.binding};
}

// The rows of one GPU: N and the measured GB/s, for the N instantiated below.
std::vector<validation::Row> sweep(const mg_emu::GpuSpec& gpu, const std::vector<double>& gbps) {
  // Only the traced blocks' data is allocated: the skipped blocks never touch theirs.
  const size_t n = kTracedBlocks * kThreads * kPerThread;
  float *a = nullptr, *b = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(&a, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&b, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, static_cast<size_t>(gpu.sms) * 8 * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemset(a, 0, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemset(b, 0, n * sizeof(float)) == cudaSuccess);
  std::vector<validation::Row> rows = {run<0>(gpu, gbps[0], a, b, out),   run<24>(gpu, gbps[1], a, b, out),
                                       run<40>(gpu, gbps[2], a, b, out),  run<56>(gpu, gbps[3], a, b, out),
                                       run<128>(gpu, gbps[4], a, b, out), run<256>(gpu, gbps[5], a, b, out)};
  cudaFree(a);
  cudaFree(b);
  cudaFree(out);
  return rows;
}

}  // namespace

TEST_CASE("model validation: RRZE gpu-roofline on an H200 and an A100 40GB", "[gpu_model][validation]") {
  // The A100 of alex_a100_40.txt: the 80 GB part's chip with 40 GB of HBM2 at 1.555 TB/s.
  mg_emu::GpuSpec a100_40 = mg_emu::a100_sxm();
  a100_40.name = "NVIDIA A100 SXM4 40GB (A100 spec, 1.555 TB/s HBM2)";
  a100_40.hbm_bytes_per_s = 1.555e12;
  // GB/s at N =                                                 0     24    40    56    128   256
  const validation::Summary h200 =
      validation::report("gpu-roofline, gpu-roofline/h200.txt", mg_emu::h200_sxm(),
                         sweep(mg_emu::h200_sxm(), {3759, 3629, 2690, 2029, 1213, 642}));
  const validation::Summary a100 = validation::report("gpu-roofline, gpu-roofline/alex_a100_40.txt", a100_40,
                                                      sweep(a100_40, {1372, 1322, 1284, 1150, 554, 291}));
  // With memory and compute overlapping as the overlap exponent says (2, the best fit to the H200
  // rows at 2.1; 2026-12-06): the A100's rows are held out. Before, with the larger of the two
  // limits, DRAM tied N = 0-56 at one predicted time: H200 0.97-1.38 (0.99), A100 0.96-1.15 (0.85).
  // The H200's sustained FP32 share (0.63, gpu_spec.cpp) is read from the N = 256 row, so N = 128
  // and 256 agree by construction.
  if (validation::instructions_counted()) {
    validation::hold(h200, 0.85, 1.15, 0.95);  // today: 0.89-1.10, 1.00 (issue counted from the PTX)
    validation::hold(a100, 0.78, 1.10, 0.95);  // today: 0.82-1.01, 1.00
  } else {
    validation::hold(h200, 0.88, 1.22, 0.95);  // without nvcc: 0.93-1.16, 1.00
    validation::hold(a100, 0.78, 1.10, 0.95);  // 0.83-1.02, 1.00
  }
}
