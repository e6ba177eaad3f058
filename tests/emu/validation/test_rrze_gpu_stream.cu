// The performance model (cuda_emu/gpu_model.h) against GPU timings measured by others: RRZE-HPC's
// gpu-benches `gpu-stream` read kernel, swept over block sizes at two blocks per SM, on a GH200 and
// on an A100 80GB (result files gpu-stream/gh200.txt and gpu-stream/a100_80.txt, commit 1038c5d).
//
// The kernel (gpu-stream/main.cu, read_kernel): one thread per element of 2^28 doubles (2 GiB), each
// thread one 8-byte load, a grid of N / block + 1 blocks, and a dynamic shared-memory "spoiler"
// sized so that only two blocks fit an SM. Its work is declared here as the tracer would count it:
// one warp request of 8 sectors per 32 elements, one round trip per warp, every byte from DRAM.
//
// The GH200 rows of 64-512 threads are the ones the loaded DRAM latency was calibrated on
// (gpu_spec.cpp), so they agree by construction; the GH200's wider blocks and every A100 row are
// held out. The band below holds what the model achieves today (measured / predicted 0.90-1.03),
// so a model change that makes it worse fails; docs/performance-model.md has the table.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "cuda_emu/gpu_model.h"
#include "cuda_emu/gpu_spec.h"
#include "validation.h"

namespace {

struct Row {
  int block;             // threads per block
  double measured_gbps;  // the result file's "read" column
};

// The read kernel's work at one block size, as the tracer counts it.
mg_emu::KernelWork read_kernel(const mg_emu::GpuSpec& gpu, int block) {
  const double n = 256.0 * 1024 * 1024;  // doubles (max_buffer_size)
  mg_emu::KernelWork w;
  w.blocks = static_cast<uint64_t>(n) / static_cast<uint64_t>(block) + 1;
  w.threads_per_block = block;
  w.shared_bytes_per_block = gpu.shared_per_sm / 2 - gpu.shared_reserved_per_block;  // the spoiler
  w.dram_bytes = 8 * n;
  w.l2_sectors = 8 * n / 32;
  w.global_load_requests = n / 32;
  w.global_load_sectors = 8 * n / 32;
  w.load_round_trips = n / 32;  // one per warp
  return w;
}

// Every row: the measured time (2 GiB at the file's GB/s) and the model's.
std::vector<validation::Row> sweep(const mg_emu::GpuSpec& gpu, const std::vector<Row>& rows) {
  std::vector<validation::Row> out;
  for (const Row& r : rows) {
    const mg_emu::KernelWork w = read_kernel(gpu, r.block);
    const mg_emu::Prediction p = mg_emu::predict(w, gpu);
    CHECK(p.blocks_per_sm == 2);
    out.push_back(
        {std::to_string(r.block) + " threads", w.dram_bytes / (r.measured_gbps * 1e9), p.seconds, p.binding});
  }
  return out;
}

}  // namespace

TEST_CASE("model validation: RRZE gpu-stream's read kernel on a GH200 and an A100",
          "[gpu_model][validation]") {
  // The GH200 of gpu-stream/gh200.txt: the H200's GH100 die with 4.0 TB/s of HBM3 (96 GB).
  mg_emu::GpuSpec gh200 = mg_emu::h200_sxm();
  gh200.name = "NVIDIA GH200 (H200 spec, 4.0 TB/s HBM3)";
  gh200.hbm_bytes_per_s = 4.0e12;
  const validation::Summary gh = validation::report("gpu-stream read, gpu-stream/gh200.txt", gh200,
                                                    sweep(gh200, {{64, 245},
                                                                  {128, 486},
                                                                  {256, 935},
                                                                  {384, 1320},
                                                                  {512, 1715},
                                                                  {640, 2009},
                                                                  {768, 2314},
                                                                  {1024, 2775}}));
  const validation::Summary a100 =
      validation::report("gpu-stream read, gpu-stream/a100_80.txt (held out)", mg_emu::a100_sxm(),
                         sweep(mg_emu::a100_sxm(), {{64, 166},
                                                    {128, 323},
                                                    {256, 615},
                                                    {384, 872},
                                                    {512, 1119},
                                                    {640, 1306},
                                                    {768, 1491},
                                                    {1024, 1776}}));
  // The issue's band is 0.67-1.5; this is what the model does today, every row.
  validation::hold(gh, 0.90, 1.18, 0.95);  // in time; in bandwidth 0.85-1.10, as before
  validation::hold(a100, 0.90, 1.18, 0.95);
}
