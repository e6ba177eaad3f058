// bench_kernels family "lab" (order 15): the kernel lab's ladders (kernels/cuda/kernel_lab.h), every
// rung of softmax forward (kernels/cuda/softmax_ladder.cu) and of layer norm forward
// (kernels/cuda/layer_norm_ladder.cu) on the same f32 input, against the copy ceiling of the same run,
// as the "memory" family measures the production kernels:
//
//   softmax     [65536, 1024] and [2048, 32768]   reads 4n, writes 4n bytes
//   layer_norm  [87381, 768] and [16384, 4096]    (weight and bias; mean and rstd saved)
//                                                 reads 4n + 8 cols, writes 4n + 8 rows
//   --check: [37, 100] and [5, 3000] for both (a warp per row and a block per row at the top rung,
//   31 of 37 rows and every row of 3000 off a 16-byte boundary for the packs' scalar head)
//
// Rows are "softmax/<rung>" and "layer_norm/<rung>", rungs in ladder order (naive, warp, block,
// online, registers), then "<op>/production": softmax.cu's and layer_norm.cu's kernels, whose
// algorithm the ladders' registers rungs teach. achieved = compulsory bytes /
// median time (the bytes a perfect kernel moves: each input read once, each output written once; the rungs
// that reread a row get no credit for it); ratio = achieved / the copy ceiling. max_rel_error = max |gpu -
// cpu| / max |cpu| against the CPU kernel (kernels/cpu/softmax.h, layer_norm.h) on the same input,
// the largest over y, mean and rstd, with the output poisoned (NaN) first; tolerance
// row_sum_tolerance(cols) (bench_kernels.h: 1e-5, 4.3e-5 for rows of 32768).
//
// --profile: each rung traced once and predicted on a GPU (profile.cpp); nothing is checked then
// (only the traced blocks run). The table shows what each step buys: sectors per request (4 for
// 4-byte lanes, 16 for 16-byte packs, 32 for the naive rung's lanes on 32 different rows), DRAM and
// L2 traffic against the ideal, and the limit that binds.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_kernels.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/kernel_lab.h"

namespace mg::bench {
namespace {

namespace kc = kernels::cuda;

void cuda_ok(cudaError_t e, const char* what) {
  MG_CHECK(e == cudaSuccess, "lab family: ", what, ": ", cudaGetErrorString(e));
}

// A cudaMalloc'ed array of floats, freed on scope exit.
struct DeviceFloats {
  float* ptr = nullptr;
  int64_t n = 0;
  explicit DeviceFloats(int64_t count) : n(count) {
    cuda_ok(cudaMalloc(&ptr, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(float)), "cudaMalloc");
  }
  ~DeviceFloats() { cudaFree(ptr); }
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;
  void upload(const std::vector<float>& v) {
    cuda_ok(cudaMemcpy(ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "upload");
  }
  std::vector<float> download() const {
    std::vector<float> v(static_cast<size_t>(n));
    cuda_ok(cudaMemcpy(v.data(), ptr, v.size() * sizeof(float), cudaMemcpyDeviceToHost), "download");
    return v;
  }
};

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// n values uniform in [lo, hi), a hash of (seed, index): the same on every run.
std::vector<float> uniform(int64_t n, uint64_t seed, double lo, double hi) {
  std::vector<float> v(static_cast<size_t>(n));
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t i = 0; i < n; ++i) {
    const double u =
        static_cast<double>(mix(seed * 0x100000001b3ull ^ static_cast<uint64_t>(i)) >> 11) * 0x1p-53;
    v[static_cast<size_t>(i)] = static_cast<float>(lo + (hi - lo) * u);
  }
  return v;
}

// max |got - ref| / max |ref|; a NaN or infinity in one where the other has none gives +inf.
double max_rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = ref[i];
    if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
      if (!(a == b || (std::isnan(a) && std::isnan(b)))) return INFINITY;
      continue;
    }
    diff = std::max(diff, std::fabs(a - b));
    norm = std::max(norm, std::fabs(b));
  }
  return norm > 0 ? diff / norm : diff;
}

struct Shape {
  int64_t rows, cols;
  std::string text() const { return std::to_string(rows) + "x" + std::to_string(cols); }
};

struct Env {
  const BenchOptions& options;
  const Ceilings& ceilings;
  cudaStream_t stream;
};

// One row: poisons the outputs, runs `gpu` once and compares them with the CPU's (not with
// --profile), then times `gpu`.
KernelResult measure(const std::string& op, kc::RowKernel rung, const Shape& s, double bytes,
                     const std::function<void()>& gpu, const std::vector<DeviceFloats*>& outputs,
                     const std::vector<const std::vector<float>*>& references, const Env& env) {
  KernelResult r;
  r.family = "lab";
  r.kernel = op + "/" + kc::row_kernel_name(rung);
  r.dtype = "f32";
  r.shape = s.text();
  r.unit = "GB/s";
  r.reference = "d2d copy";
  r.tolerance = bench::row_sum_tolerance(s.cols);
  try {
    if (!env.options.profile) {
      for (DeviceFloats* o : outputs)
        cuda_ok(cudaMemsetAsync(o->ptr, 0xff, static_cast<size_t>(o->n) * sizeof(float), env.stream),
                "poison");
      gpu();
      cuda_ok(cudaStreamSynchronize(env.stream), "the checked call");
      r.max_rel_error = 0;
      for (size_t i = 0; i < outputs.size(); ++i) {
        const double e = max_rel_error(outputs[i]->download(), *references[i]);
        r.max_rel_error = std::isnan(e) || e > r.max_rel_error ? e : r.max_rel_error;
      }
    }
    r.seconds = median_seconds(gpu, env.options, env.stream);
    cuda_ok(cudaGetLastError(), "after timing");
    r.achieved = bytes / r.seconds / 1e9;
    r.ceiling = env.ceilings.copy_gbps;
    r.ratio = r.ceiling > 0 ? r.achieved / r.ceiling : 0;
    if (env.options.profile) {  // only the traced blocks ran: nothing to check
      r.profile = take_profile(bytes, 0);
      r.tolerance = -1;
    }
  } catch (const Error& e) {
    r.failed = true;
    r.note = std::string("failed: ") + e.what();
  }
  return r;
}

void softmax_rows(const Shape& s, const Env& env, std::vector<KernelResult>& rows) {
  const int64_t n = s.rows * s.cols;
  const std::vector<float> x = uniform(n, 21, -4.0, 4.0);
  std::vector<float> ref;
  if (!env.options.profile) {
    ref.resize(x.size());
    kernels::cpu::softmax_forward(DType::f32, kernels::SoftmaxShape{s.rows, s.cols, 1}, x.data(), ref.data(),
                                  false);
  }
  DeviceFloats xd(n), yd(n);
  xd.upload(x);
  for (kc::RowKernel rung : kc::kAllRowKernels) {
    rows.push_back(measure(
        "softmax", rung, s, 8.0 * n,
        [&] {
          kc::softmax_lab(mg::cuda::current_kernel_stream(), rung, s.rows, s.cols, xd.ptr, yd.ptr, false);
        },
        {&yd}, {&ref}, env));
  }
  // The production kernel (softmax.cu, every dtype) beside the ladder's teaching rungs 4 and 5.
  rows.push_back(measure(
      "softmax", kc::RowKernel::registers, s, 8.0 * n,
      [&] {
        kc::softmax_rows_forward(mg::cuda::current_kernel_stream(), DType::f32, s.rows, s.cols, xd.ptr,
                                 yd.ptr, false, false);
      },
      {&yd}, {&ref}, env));
  rows.back().kernel = "softmax/production";
}

void layer_norm_rows(const Shape& s, const Env& env, std::vector<KernelResult>& rows) {
  const int64_t n = s.rows * s.cols;
  const std::vector<float> x = uniform(n, 22, -1.5, 2.5), w = uniform(s.cols, 23, 0.5, 1.5),
                           b = uniform(s.cols, 24, -0.5, 0.5);
  std::vector<float> ref, ref_mean, ref_rstd;
  if (!env.options.profile) {
    ref.resize(x.size());
    ref_mean.resize(static_cast<size_t>(s.rows));
    ref_rstd.resize(static_cast<size_t>(s.rows));
    kernels::cpu::layer_norm_forward(DType::f32, x.data(), w.data(), b.data(), s.rows, s.cols, 1e-5,
                                     ref.data(), ref_mean.data(), ref_rstd.data());
  }
  DeviceFloats xd(n), wd(s.cols), bd(s.cols), yd(n), md(s.rows), rd(s.rows);
  xd.upload(x);
  wd.upload(w);
  bd.upload(b);
  const double bytes = 8.0 * n + 8.0 * s.rows + 8.0 * s.cols;
  for (kc::RowKernel rung : kc::kAllRowKernels) {
    rows.push_back(measure(
        "layer_norm", rung, s, bytes,
        [&] {
          kc::layer_norm_lab(mg::cuda::current_kernel_stream(), rung, s.rows, s.cols, xd.ptr, wd.ptr, bd.ptr,
                             1e-5, yd.ptr, md.ptr, rd.ptr);
        },
        {&yd, &md, &rd}, {&ref, &ref_mean, &ref_rstd}, env));
  }
  // The production kernel (layer_norm.cu, every dtype) beside the ladder's teaching rungs 4 and 5.
  rows.push_back(measure(
      "layer_norm", kc::RowKernel::registers, s, bytes,
      [&] {
        kc::layer_norm_rows_forward(mg::cuda::current_kernel_stream(), DType::f32, xd.ptr, wd.ptr, bd.ptr,
                                    s.rows, s.cols, 1e-5, yd.ptr, md.ptr, rd.ptr, false);
      },
      {&yd, &md, &rd}, {&ref, &ref_mean, &ref_rstd}, env));
  rows.back().kernel = "layer_norm/production";
}

std::vector<KernelResult> bench_lab(const BenchOptions& options, const Ceilings& ceilings) {
  const Env env{options, ceilings,
                static_cast<cudaStream_t>(mg::cuda::current_stream(mg::cuda::current_device()).handle)};
  const std::vector<Shape> softmax_shapes = options.check ? std::vector<Shape>{{37, 100}, {5, 3000}}
                                                          : std::vector<Shape>{{65536, 1024}, {2048, 32768}};
  const std::vector<Shape> norm_shapes = options.check ? std::vector<Shape>{{37, 100}, {5, 3000}}
                                                       : std::vector<Shape>{{87381, 768}, {16384, 4096}};
  std::vector<KernelResult> rows;
  for (const Shape& s : softmax_shapes) softmax_rows(s, env, rows);
  for (const Shape& s : norm_shapes) layer_norm_rows(s, env, rows);
  if (!rows.empty())
    rows.front().note =
        "lab: softmax and layer_norm forward, f32, every rung of kernels/cuda/kernel_lab.h, and the "
        "production kernels; bytes: each input read once, each output written once";
  return rows;
}

const RegisterFamily kRegistered("lab", 15, bench_lab);

}  // namespace
}  // namespace mg::bench
