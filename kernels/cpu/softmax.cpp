// Softmax / log-softmax over the middle axis of [outer, dim, inner] (CPU).
//
// Numerics: softmax(x) = exp(x - m) / sum(exp(x - m)) with m = max(x) along the
// axis. Subtracting the max keeps every exponent <= 0, so nothing overflows and
// at least one term of the sum is exactly 1. Halves are widened to float; f32
// accumulates in float and f64 in double (acc_t<T>).
//
// Decomposition:
//  * inner == 1: one row of `dim` contiguous elements per task, rows split across
//    threads. Three sweeps over the row (max, sum of exp, write); the second and
//    third reread it from L1/L2 for any realistic row length.
//  * inner > 1: consecutive `d` are `inner` elements apart, so walking one
//    column at a time would touch a new cache line per element. Instead a task
//    owns a tile of up to kSoftmaxTile adjacent columns of one outer slice and sweeps
//    the `dim` axis row by row, keeping kSoftmaxTile running maxima / sums on the
//    stack: every load is contiguous, and tiles are independent so they split
//    across threads even when outer == 1.
//
// Cost per element: forward reads x three times from cache and memory once,
// writes y once (2 * sizeof(T) bytes of DRAM traffic) and evaluates exp twice
// (~20-40 flops); backward reads y and gy twice, writes gx once (3 * sizeof(T)
// bytes) with ~4 flops, plus one exp for log-softmax. Both are memory bound.
#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mg::kernels::cpu {

namespace {

constexpr int64_t kSoftmaxTile = 64;  // columns per task when inner > 1
// Below this many elements, starting threads costs more than it saves.
[[maybe_unused]] constexpr int64_t kSoftmaxMinParallelWork = 1 << 15;

// ---- forward ---------------------------------------------------------------

template <class T>
void softmax_forward_rows(const T* x, T* y, int64_t rows, int64_t dim, bool log) {
  using Acc = acc_t<T>;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * dim >= kSoftmaxMinParallelWork)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T* yr = y + r * dim;
    Acc max = -std::numeric_limits<Acc>::infinity();
    for (int64_t d = 0; d < dim; ++d) max = std::max(max, static_cast<Acc>(xr[d]));
    Acc sum = 0;
    for (int64_t d = 0; d < dim; ++d) sum += std::exp(static_cast<Acc>(xr[d]) - max);
    if (log) {
      // log_softmax = (x - max) - log(sum). Not x - (max + log(sum)): near max = 1000
      // the float sum max + log(sum) would keep only ~4 fractional digits.
      const Acc log_sum = std::log(sum);
      for (int64_t d = 0; d < dim; ++d) yr[d] = static_cast<T>((static_cast<Acc>(xr[d]) - max) - log_sum);
    } else {
      const Acc inv_sum = Acc(1) / sum;
      for (int64_t d = 0; d < dim; ++d)
        yr[d] = static_cast<T>(std::exp(static_cast<Acc>(xr[d]) - max) * inv_sum);
    }
  }
}

template <class T>
void softmax_forward_tiles(const T* x, T* y, const SoftmaxShape& s, bool log) {
  using Acc = acc_t<T>;
  const int64_t tiles_per_slice = (s.inner + kSoftmaxTile - 1) / kSoftmaxTile;
  const int64_t tiles = s.outer * tiles_per_slice;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (s.outer * s.dim * s.inner >= kSoftmaxMinParallelWork)
#endif
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t o = t / tiles_per_slice;
    const int64_t first = (t % tiles_per_slice) * kSoftmaxTile;
    const int64_t width = std::min(kSoftmaxTile, s.inner - first);
    const T* xs = x + o * s.dim * s.inner + first;  // element (o, 0, first)
    T* ys = y + o * s.dim * s.inner + first;

    Acc max[kSoftmaxTile], sum[kSoftmaxTile];
    for (int64_t i = 0; i < width; ++i) {
      max[i] = -std::numeric_limits<Acc>::infinity();
      sum[i] = 0;
    }
    for (int64_t d = 0; d < s.dim; ++d) {
      const T* row = xs + d * s.inner;
      for (int64_t i = 0; i < width; ++i) max[i] = std::max(max[i], static_cast<Acc>(row[i]));
    }
    for (int64_t d = 0; d < s.dim; ++d) {
      const T* row = xs + d * s.inner;
      for (int64_t i = 0; i < width; ++i) sum[i] += std::exp(static_cast<Acc>(row[i]) - max[i]);
    }
    if (log) {
      for (int64_t i = 0; i < width; ++i) sum[i] = std::log(sum[i]);  // now log(sum) per column
      for (int64_t d = 0; d < s.dim; ++d) {
        const T* row = xs + d * s.inner;
        T* out = ys + d * s.inner;
        for (int64_t i = 0; i < width; ++i)
          out[i] = static_cast<T>((static_cast<Acc>(row[i]) - max[i]) - sum[i]);
      }
    } else {
      for (int64_t i = 0; i < width; ++i) sum[i] = Acc(1) / sum[i];  // now 1 / sum per column
      for (int64_t d = 0; d < s.dim; ++d) {
        const T* row = xs + d * s.inner;
        T* out = ys + d * s.inner;
        for (int64_t i = 0; i < width; ++i)
          out[i] = static_cast<T>(std::exp(static_cast<Acc>(row[i]) - max[i]) * sum[i]);
      }
    }
  }
}

// ---- backward --------------------------------------------------------------
// Both formulas need one reduction along the axis, then one elementwise pass:
//   softmax:     dot = sum(gy * y);  gx = y * (gy - dot)
//   log_softmax: dot = sum(gy);      gx = gy - exp(y) * dot

template <class T>
void softmax_backward_rows(const T* gy, const T* y, T* gx, int64_t rows, int64_t dim, bool log) {
  using Acc = acc_t<T>;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * dim >= kSoftmaxMinParallelWork)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* gyr = gy + r * dim;
    const T* yr = y + r * dim;
    T* gxr = gx + r * dim;
    Acc dot = 0;
    if (log) {
      for (int64_t d = 0; d < dim; ++d) dot += static_cast<Acc>(gyr[d]);
      for (int64_t d = 0; d < dim; ++d)
        gxr[d] = static_cast<T>(static_cast<Acc>(gyr[d]) - std::exp(static_cast<Acc>(yr[d])) * dot);
    } else {
      for (int64_t d = 0; d < dim; ++d) dot += static_cast<Acc>(gyr[d]) * static_cast<Acc>(yr[d]);
      for (int64_t d = 0; d < dim; ++d)
        gxr[d] = static_cast<T>(static_cast<Acc>(yr[d]) * (static_cast<Acc>(gyr[d]) - dot));
    }
  }
}

template <class T>
void softmax_backward_tiles(const T* gy, const T* y, T* gx, const SoftmaxShape& s, bool log) {
  using Acc = acc_t<T>;
  const int64_t tiles_per_slice = (s.inner + kSoftmaxTile - 1) / kSoftmaxTile;
  const int64_t tiles = s.outer * tiles_per_slice;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (s.outer * s.dim * s.inner >= kSoftmaxMinParallelWork)
#endif
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t o = t / tiles_per_slice;
    const int64_t first = (t % tiles_per_slice) * kSoftmaxTile;
    const int64_t width = std::min(kSoftmaxTile, s.inner - first);
    const int64_t base = o * s.dim * s.inner + first;

    Acc dot[kSoftmaxTile];
    for (int64_t i = 0; i < width; ++i) dot[i] = 0;
    for (int64_t d = 0; d < s.dim; ++d) {
      const T* gyr = gy + base + d * s.inner;
      const T* yr = y + base + d * s.inner;
      for (int64_t i = 0; i < width; ++i)
        dot[i] += log ? static_cast<Acc>(gyr[i]) : static_cast<Acc>(gyr[i]) * static_cast<Acc>(yr[i]);
    }
    for (int64_t d = 0; d < s.dim; ++d) {
      const T* gyr = gy + base + d * s.inner;
      const T* yr = y + base + d * s.inner;
      T* gxr = gx + base + d * s.inner;
      for (int64_t i = 0; i < width; ++i) {
        const Acc g = static_cast<Acc>(gyr[i]), out = static_cast<Acc>(yr[i]);
        gxr[i] = static_cast<T>(log ? g - std::exp(out) * dot[i] : out * (g - dot[i]));
      }
    }
  }
}

void check_shape(const char* what, const SoftmaxShape& s) {
  MG_CHECK(s.outer >= 0 && s.dim >= 0 && s.inner >= 0, what, ": negative extent in shape [outer ", s.outer,
           ", dim ", s.dim, ", inner ", s.inner, "]");
}

}  // namespace

void softmax_forward(DType dtype, const SoftmaxShape& s, const void* input, void* output, bool log) {
  const char* what = log ? "log_softmax_forward" : "softmax_forward";
  check_shape(what, s);
  visit_floating(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(input);
    T* y = static_cast<T*>(output);
    if (s.inner == 1)
      softmax_forward_rows(x, y, s.outer, s.dim, log);
    else
      softmax_forward_tiles(x, y, s, log);
  });
}

void softmax_backward(DType dtype, const SoftmaxShape& s, const void* grad_output, const void* output,
                      void* grad_input, bool log) {
  const char* what = log ? "log_softmax_backward" : "softmax_backward";
  check_shape(what, s);
  visit_floating(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gy = static_cast<const T*>(grad_output);
    const T* y = static_cast<const T*>(output);
    T* gx = static_cast<T*>(grad_input);
    if (s.inner == 1)
      softmax_backward_rows(gy, y, gx, s.outer, s.dim, log);
    else
      softmax_backward_tiles(gy, y, gx, s, log);
  });
}

}  // namespace mg::kernels::cpu
