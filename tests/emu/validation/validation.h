// The performance model against GPU timings measured by others (docs/performance-model.md,
// "Validation"): what every validation test shares -- a row (a published measurement and the
// model's prediction for the same launch on the same GPU), the printed table, the rank correlation
// within a sweep or ladder, and the band the ratios are held in.
//
// Each kernel here is re-created from its description in our own code (the sources are named
// in each file, with their licences); none is copied. Where the tracer can run the kernel, it does
// (a sample of its blocks, `traced_launch`), so the counts are the emulator's, not ours.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <catch2/catch.hpp>

#include "cuda_emu/gpu_model.h"
#include "cuda_emu/gpu_spec.h"
#include "cuda_emu/profile_report.h"
#include "cuda_emu/profiler.h"

#ifndef MG_EMU_HAVE_NVCC  // set by tests/CMakeLists.txt (not when nvcc compiles this file to PTX)
#define MG_EMU_HAVE_NVCC 0
#endif

namespace validation {

struct Row {
  std::string label;         // "16896 kB", "N=64", "K5 2D blocktiling"
  double measured_seconds;   // from the source's figure
  double predicted_seconds;  // the model's, launch latency included
  std::string binding;       // the model's binding limit
  double ratio() const { return measured_seconds / predicted_seconds; }
};

// Whether the launches were priced with their instructions counted from nvcc's PTX (the issue
// limit of docs/performance-model.md); without an nvcc the held bands are the ones before that.
// A build that found nvcc must count them, unless MG_EMU_NVCC="" switches the count off.
inline bool& instructions_counted() {
  static bool counted = false;
  return counted;
}
inline void require_counted(const mg_emu::profile::InstructionMix& mix) {
  instructions_counted() = mix.counted;
  const char* nvcc = std::getenv("MG_EMU_NVCC");
  const bool switched_off = nvcc != nullptr && *nvcc == '\0';
  if (MG_EMU_HAVE_NVCC && !switched_off && !mix.counted) FAIL("instructions not counted: " << mix.why);
}

// Runs `launch` (one kernel launch) under the tracer, the first `traced_blocks` blocks traced and
// the rest skipped, and predicts it on `gpu` with `fp32_flops` declared (the tracer does not count
// arithmetic). The launch's L2 is the GPU's.
inline mg_emu::Prediction traced_launch(const mg_emu::GpuSpec& gpu, uint64_t traced_blocks, double fp32_flops,
                                        const std::function<void()>& launch, uint64_t min_rows = 0) {
  namespace profile = mg_emu::profile;
  profile::Options options;
  options.max_traced_blocks = traced_blocks;
  options.min_traced_rows = min_rows;
  options.skip_untraced_blocks = true;
  options.gpu = &gpu;
  options.count_instructions = true;  // from nvcc's PTX where nvcc exists (the doc's issue limit)
  profile::begin(options);
  try {
    launch();
    cudaDeviceSynchronize();
  } catch (...) {
    profile::end();  // the next test starts untraced
    throw;
  }
  const std::vector<profile::LaunchProfile> launches = profile::end();
  if (launches.size() != 1) throw std::runtime_error("validation: expected one launch");
  profile::print_instructions(stdout, launches[0].instructions);
  require_counted(launches[0].instructions);
  const mg_emu::KernelWork work = profile::work_of(launches[0], fp32_flops);
  const mg_emu::Prediction prediction = mg_emu::predict(work, gpu);
  if (std::getenv("MG_VALIDATION_LIMITS") != nullptr)  // every limit, for a row that misses
    mg_emu::profile::print_limits(stdout, prediction, work, 6);
  return prediction;
}

// Spearman's rank correlation (average ranks for ties).
inline double rank_correlation(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> order(v.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t i, size_t j) { return v[i] < v[j]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < order.size();) {
      size_t j = i;
      while (j + 1 < order.size() && v[order[j + 1]] == v[order[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[order[k]] = 0.5 * double(i + j) + 1;
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  const double n = double(a.size()), mean = (n + 1) / 2;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    cov += (ra[i] - mean) * (rb[i] - mean);
    va += (ra[i] - mean) * (ra[i] - mean);
    vb += (rb[i] - mean) * (rb[i] - mean);
  }
  return va > 0 && vb > 0 ? cov / std::sqrt(va * vb) : 1.0;
}

// The target: every prediction within 0.67-1.5x of its measurement.
constexpr double kTargetLow = 0.67, kTargetHigh = 1.5;

struct Summary {
  double lowest = 0, highest = 0;  // measured / predicted
  double correlation = 0;          // of the measured and predicted times
  int within_target = 0, rows = 0;
};

// Prints the rows as a table under `title` and returns their extremes and rank correlation.
inline Summary report(const std::string& title, const mg_emu::GpuSpec& gpu, const std::vector<Row>& rows) {
  std::printf("%s (%s)\n  %-22s %13s %13s %9s  %s\n", title.c_str(), gpu.name.c_str(), "", "measured us",
              "predicted us", "meas/pred", "bound by");
  Summary s;
  s.lowest = 1e300;
  std::vector<double> measured, predicted;
  for (const Row& r : rows) {
    std::printf("  %-22s %13.2f %13.2f %9.2f  %s\n", r.label.c_str(), r.measured_seconds * 1e6,
                r.predicted_seconds * 1e6, r.ratio(), r.binding.c_str());
    s.lowest = std::min(s.lowest, r.ratio());
    s.highest = std::max(s.highest, r.ratio());
    s.within_target += r.ratio() >= kTargetLow && r.ratio() <= kTargetHigh ? 1 : 0;
    ++s.rows;
    measured.push_back(r.measured_seconds);
    predicted.push_back(r.predicted_seconds);
  }
  s.correlation = rank_correlation(measured, predicted);
  std::printf("  measured/predicted %.2f-%.2f (%d of %d within %.2f-%.2f), rank correlation %.2f\n\n",
              s.lowest, s.highest, s.within_target, s.rows, kTargetLow, kTargetHigh, s.correlation);
  return s;
}

// Holds a summary where the model is today (the values in docs/performance-model.md's validation
// table, with a little room), so that a model change that makes it worse fails.
inline void hold(const Summary& s, double lowest, double highest, double correlation) {
  CHECK(s.lowest >= lowest);
  CHECK(s.highest <= highest);
  CHECK(s.correlation >= correlation);
}

}  // namespace validation
