// The bandwidth-bound rows of bench_kernels (families "memory" and "layers"): device buffers,
// deterministic inputs made on the host, the check of every output against its CPU twin, and the
// timing, as one row of the table.
//
// A row's bytes are its compulsory traffic: each operand read once and each result written once,
// as a perfect kernel would move them. achieved = bytes / median time; ratio = achieved / the
// copy ceiling of the same run (main.cpp).
//
// Correctness. Each row runs its CPU twin (kernels/cpu/*) on the same input, with the GPU output
// poisoned before the checked call (or reset, for a call that accumulates or updates in place),
// and reports max_rel_err = max |gpu - cpu| / max |cpu| over the elements of each output, the
// largest over the outputs (a NaN where the CPU has a number counts as infinite). Above the row's
// tolerance the row is WRONG and the run exits 1, so a fast but wrong kernel cannot pass.
//
// Inputs are deterministic: a hash of (seed, index) mapped to a uniform range, made on the host
// (OpenMP) and copied over, so the GPU and the CPU read the same bits.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "base/half.h"
#include "base/strided_view.h"
#include "bench_kernels.h"
#include "kernels/kernel_args.h"

namespace mg::bench {

inline void cuda_ok(cudaError_t e, const char* what) {
  MG_CHECK(e == cudaSuccess, "bench_kernels: ", what, ": ", cudaGetErrorString(e));
}

// ---- buffers ---------------------------------------------------------------------------------
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit DeviceBuffer(size_t b) : bytes(b) {
    if (b > 0) cuda_ok(cudaMalloc(&ptr, b), "cudaMalloc");
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr(other.ptr), bytes(other.bytes) { other.ptr = nullptr; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
};

struct HostArray {
  DType dtype = DType::f32;
  int64_t n = 0;
  std::vector<unsigned char> bytes;
  HostArray(DType t, int64_t count)
      : dtype(t), n(count), bytes(static_cast<size_t>(count) * mg::dtype_size(t)) {}
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
  size_t size() const { return bytes.size(); }
};

// A contiguous view of `shape` over `data`.
inline StridedView view(void* data, DType dtype, const std::vector<int64_t>& shape) {
  StridedView v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = v.ndim - 1; d >= 0; --d) {
    v.shape[static_cast<size_t>(d)] = shape[static_cast<size_t>(d)];
    v.strides[static_cast<size_t>(d)] = stride;
    stride *= shape[static_cast<size_t>(d)];
  }
  return v;
}
inline StridedView view(const void* data, DType dtype, const std::vector<int64_t>& shape) {
  return view(const_cast<void*>(data), dtype, shape);
}

inline uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform values in [lo, hi), rounded to `dtype` on the host (integers: truncated).
inline HostArray random_host(DType dtype, int64_t n, uint64_t seed, double lo, double hi) {
  HostArray a(dtype, n);
  mg::visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = static_cast<T*>(a.data());
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < n; ++i) {
      const double u =
          static_cast<double>(mix(seed * 0x100000001b3ull ^ static_cast<uint64_t>(i)) >> 11) * 0x1p-53;
      const double v = lo + (hi - lo) * u;
      if constexpr (std::is_same<T, bool>::value) {
        p[i] = v > 0.5 * (lo + hi);
      } else if constexpr (std::is_same<T, mg::f16>::value || std::is_same<T, mg::bf16>::value) {
        p[i] = T(static_cast<float>(v));
      } else {
        p[i] = static_cast<T>(v);
      }
    }
  });
  return a;
}

inline DeviceBuffer upload(const HostArray& a) {
  DeviceBuffer d(a.size());
  cuda_ok(cudaMemcpy(d.ptr, a.data(), a.size(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  return d;
}

inline std::vector<double> as_doubles(const HostArray& a) {
  std::vector<double> out(static_cast<size_t>(a.n));
  mg::visit_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = static_cast<const T*>(a.data());
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int64_t i = 0; i < a.n; ++i) {
      if constexpr (std::is_same<T, mg::f16>::value || std::is_same<T, mg::bf16>::value) {
        out[static_cast<size_t>(i)] = static_cast<double>(static_cast<float>(p[i]));
      } else {
        out[static_cast<size_t>(i)] = static_cast<double>(p[i]);
      }
    }
  });
  return out;
}

// max |got - ref| / max |ref|; a NaN in `got` where `ref` has a number gives +inf.
inline double max_rel_error(const HostArray& got, const HostArray& ref) {
  MG_CHECK(got.n == ref.n && got.dtype == ref.dtype,
           "bench_kernels: output and reference differ in size or dtype");
  const std::vector<double> g = as_doubles(got), r = as_doubles(ref);
  double diff = 0, norm = 0;
  int64_t unmatched = 0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(max : diff, norm) reduction(+ : unmatched)
#endif
  for (int64_t i = 0; i < got.n; ++i) {
    const double a = g[static_cast<size_t>(i)], b = r[static_cast<size_t>(i)];
    const bool an = std::isnan(a), bn = std::isnan(b);
    if (an || bn) {
      unmatched += an != bn ? 1 : 0;
      continue;
    }
    if (std::isinf(a) || std::isinf(b)) {
      unmatched += a != b ? 1 : 0;
      continue;
    }
    diff = std::max(diff, std::fabs(a - b));
    norm = std::max(norm, std::fabs(b));
  }
  if (unmatched > 0) return INFINITY;
  return norm > 0 ? diff / norm : diff;
}

inline std::string count_text(int64_t n) {
  if (n % (int64_t{1} << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}
inline std::string dims_text(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "x" : "") + std::to_string(shape[i]);
  return s;
}

// ---- one row ---------------------------------------------------------------------------------
struct Env {
  const BenchOptions& options;
  const Ceilings& ceilings;
  cudaStream_t stream;
  const char* family;  // the rows' family name: "memory", "layers"
};

struct Output {
  const DeviceBuffer* device;
  const HostArray* reference;
};

struct Row {
  std::string kernel, dtype, shape;
  double bytes = 0;  // compulsory bytes per call
  double floor = 0;
  double tolerance = 0;
  std::string note;
  Row(std::string kernel_, std::string dtype_, std::string shape_, double bytes_, double floor_,
      double tolerance_, std::string note_ = "")
      : kernel(std::move(kernel_)),
        dtype(std::move(dtype_)),
        shape(std::move(shape_)),
        bytes(bytes_),
        floor(floor_),
        tolerance(tolerance_),
        note(std::move(note_)) {}
};

// Prepares the outputs -- poisons them (all bits set: NaN in every floating dtype), or, for a call
// that accumulates into them or updates them in place, runs `reset` instead -- runs `gpu` once
// and compares every output with its CPU reference; then times `gpu` (median_seconds on the
// current stream). --profile: only the traced blocks run, so nothing is checked.
inline KernelResult measure(const Row& row, const std::function<void()>& gpu,
                            const std::vector<Output>& outputs, const Env& env,
                            const std::function<void()>& reset = nullptr) {
  double err = env.options.profile ? -1 : 0;
  if (!env.options.profile) {
    if (reset) {
      reset();
    } else {
      for (const Output& o : outputs)
        cuda_ok(cudaMemsetAsync(o.device->ptr, 0xff, o.device->bytes, env.stream), "poison");
    }
    gpu();
    cuda_ok(cudaStreamSynchronize(env.stream), "the checked call");
    for (const Output& o : outputs) {
      HostArray got(o.reference->dtype, o.reference->n);
      cuda_ok(cudaMemcpy(got.data(), o.device->ptr, got.size(), cudaMemcpyDeviceToHost),
              "cudaMemcpy to host");
      const double e = max_rel_error(got, *o.reference);
      err = std::isnan(e) || e > err ? e : err;
    }
  }
  const double seconds = median_seconds(gpu, env.options, env.stream);
  cuda_ok(cudaGetLastError(), "after timing");

  KernelResult r;
  r.family = env.family;
  r.kernel = row.kernel;
  r.dtype = row.dtype;
  r.shape = row.shape;
  r.seconds = seconds;
  r.achieved = row.bytes / seconds / 1e9;
  r.ceiling = env.ceilings.copy_gbps;
  r.reference = "d2d copy";
  r.unit = "GB/s";
  r.ratio = r.ceiling > 0 ? r.achieved / r.ceiling : 0;
  r.max_rel_error = err;
  r.tolerance = row.tolerance;
  r.floor = row.floor;
  r.note = row.note;
  if (env.options.profile) {
    r.profile = take_profile(row.bytes, 0);
    r.tolerance = -1;
  }
  return r;
}
}  // namespace mg::bench
