// Batch norm statistics, forward and backward (CPU).
//
// One channel per task (channels split across threads): a channel's n·hw values are n
// contiguous runs of hw elements, `stride c·hw` apart. Every sum a channel needs is computed by
// the task that owns the channel, so no two threads write the same address (no atomics,
// deterministic results), and sums accumulate in double whatever the dtype.
//
//   stats:    two sweeps -- the mean, then the squared deviations from it (the one-pass
//             E[x²] - E[x]² would cancel catastrophically when |mean| >> std)
//   apply:    one sweep: read x, write y (2 memory passes; the composed ops made ~6)
//   backward: two sweeps -- sum(gy) and sum(gy·xhat), then gx -- plus nothing more for the
//             weight and bias gradients, which are exactly those two sums (composed ops: ~12)
//
// Sums run in kBatchNormLanes independent accumulators (Lanes below). A plain `sum += x[j]` must add in
// order, so each add waits for the previous one (~4 cycles) and nothing vectorises: that made
// these sums ~4x slower than the memory they read. With separate lanes the compiler keeps
// several adds in flight (and in SIMD registers); the result is still the same on every run.
#include "kernels/cpu/batch_norm.h"

#include <cmath>

#include "base/error.h"

namespace mg::kernels::cpu {

namespace {

[[maybe_unused]] constexpr int64_t kBatchNormMinParallelWork = 1 << 15;

// kBatchNormLanes running double sums; element j of a run goes to lane j mod kBatchNormLanes.
constexpr int kBatchNormLanes = 8;
struct Lanes {
  double lane[kBatchNormLanes] = {};

  // Adds value(j) for j in [0, length).
  template <class Value>
  void add_run(int64_t length, const Value& value) {
    int64_t j = 0;
    for (; j + kBatchNormLanes <= length; j += kBatchNormLanes)
      for (int l = 0; l < kBatchNormLanes; ++l) lane[l] += value(j + l);
    for (; j < length; ++j) lane[j % kBatchNormLanes] += value(j);
  }
  // Pairwise, in a fixed order.
  double total() const {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

template <class T>
void stats(const T* x, int64_t n, int64_t c, int64_t hw, acc_t<T>* mean_out, acc_t<T>* var_out) {
  const double count = static_cast<double>(n * hw);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (n * c * hw >= kBatchNormMinParallelWork)
#endif
  for (int64_t k = 0; k < c; ++k) {
    Lanes sum;
    for (int64_t i = 0; i < n; ++i) {
      const T* run = x + (i * c + k) * hw;
      sum.add_run(hw, [run](int64_t j) { return static_cast<double>(run[j]); });
    }
    const double mean = count > 0 ? sum.total() / count : 0.0;
    Lanes squares;
    for (int64_t i = 0; i < n; ++i) {
      const T* run = x + (i * c + k) * hw;
      squares.add_run(hw, [run, mean](int64_t j) {
        const double d = static_cast<double>(run[j]) - mean;
        return d * d;
      });
    }
    mean_out[k] = static_cast<acc_t<T>>(mean);
    var_out[k] = static_cast<acc_t<T>>(count > 0 ? squares.total() / count : 0.0);
  }
}

template <class T>
void apply(const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, const T* weight, const T* bias, int64_t n,
           int64_t c, int64_t hw, T* y) {
  using S = acc_t<T>;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (n * c * hw >= kBatchNormMinParallelWork)
#endif
  for (int64_t k = 0; k < c; ++k) {
    // y = x * scale + shift: one multiply-add per element.
    const S scale = rstd[k] * (weight ? static_cast<S>(weight[k]) : S(1));
    const S shift = (bias ? static_cast<S>(bias[k]) : S(0)) - mean[k] * scale;
    for (int64_t i = 0; i < n; ++i) {
      const T* in = x + (i * c + k) * hw;
      T* out = y + (i * c + k) * hw;
      for (int64_t j = 0; j < hw; ++j) out[j] = static_cast<T>(static_cast<S>(in[j]) * scale + shift);
    }
  }
}

template <class T>
void backward(const T* gy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, const T* weight, int64_t n,
              int64_t c, int64_t hw, bool batch_stats, T* gx, T* gw, T* gb) {
  const double count = static_cast<double>(n * hw);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (n * c * hw >= kBatchNormMinParallelWork)
#endif
  for (int64_t k = 0; k < c; ++k) {
    const double mu = static_cast<double>(mean[k]), r = static_cast<double>(rstd[k]);
    Lanes gy_lanes, gy_xhat_lanes;
    for (int64_t i = 0; i < n; ++i) {
      const T* g = gy + (i * c + k) * hw;
      const T* in = x + (i * c + k) * hw;
      gy_lanes.add_run(hw, [g](int64_t j) { return static_cast<double>(g[j]); });
      gy_xhat_lanes.add_run(hw, [g, in, mu](int64_t j) {
        return static_cast<double>(g[j]) * (static_cast<double>(in[j]) - mu);
      });
    }
    // sum(gy * xhat) = r * sum(gy * (x - mu)): the constant factor leaves the loop.
    const double sum_gy = gy_lanes.total(), sum_gy_xhat = gy_xhat_lanes.total() * r;
    if (gw) gw[k] = static_cast<T>(sum_gy_xhat);
    if (gb) gb[k] = static_cast<T>(sum_gy);
    if (!gx) continue;
    const double w = weight ? static_cast<double>(weight[k]) : 1.0;
    // gx = a * gy + b * xhat + d, with the batch-statistics terms folded into b and d.
    const double a = w * r;
    const double b = batch_stats && count > 0 ? -a * sum_gy_xhat / count : 0.0;
    const double d = batch_stats && count > 0 ? -a * sum_gy / count : 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const T* g = gy + (i * c + k) * hw;
      const T* in = x + (i * c + k) * hw;
      T* out = gx + (i * c + k) * hw;
      for (int64_t j = 0; j < hw; ++j) {
        const double xhat = (static_cast<double>(in[j]) - mu) * r;
        out[j] = static_cast<T>(a * static_cast<double>(g[j]) + b * xhat + d);
      }
    }
  }
}

void require_f32_or_f64(DType dtype, const char* what) {
  MG_CHECK(dtype == DType::f32 || dtype == DType::f64, what, ": the fused CPU kernel takes f32 or f64, got ",
           dtype);
}

}  // namespace

void batch_norm_stats(DType dtype, const void* x, int64_t n, int64_t c, int64_t hw, void* mean, void* var) {
  require_f32_or_f64(dtype, "batch_norm_stats");
  if (dtype == DType::f64)
    stats(static_cast<const double*>(x), n, c, hw, static_cast<double*>(mean), static_cast<double*>(var));
  else
    stats(static_cast<const float*>(x), n, c, hw, static_cast<float*>(mean), static_cast<float*>(var));
}

void batch_norm_apply(DType dtype, const void* x, const void* mean, const void* rstd, const void* weight,
                      const void* bias, int64_t n, int64_t c, int64_t hw, void* y) {
  require_f32_or_f64(dtype, "batch_norm_apply");
  if (dtype == DType::f64)
    apply(static_cast<const double*>(x), static_cast<const double*>(mean), static_cast<const double*>(rstd),
          static_cast<const double*>(weight), static_cast<const double*>(bias), n, c, hw,
          static_cast<double*>(y));
  else
    apply(static_cast<const float*>(x), static_cast<const float*>(mean), static_cast<const float*>(rstd),
          static_cast<const float*>(weight), static_cast<const float*>(bias), n, c, hw,
          static_cast<float*>(y));
}

void batch_norm_backward(DType dtype, const void* grad_y, const void* x, const void* mean, const void* rstd,
                         const void* weight, int64_t n, int64_t c, int64_t hw, bool batch_stats, void* grad_x,
                         void* grad_weight, void* grad_bias) {
  require_f32_or_f64(dtype, "batch_norm_backward");
  if (dtype == DType::f64)
    backward(static_cast<const double*>(grad_y), static_cast<const double*>(x),
             static_cast<const double*>(mean), static_cast<const double*>(rstd),
             static_cast<const double*>(weight), n, c, hw, batch_stats, static_cast<double*>(grad_x),
             static_cast<double*>(grad_weight), static_cast<double*>(grad_bias));
  else
    backward(static_cast<const float*>(grad_y), static_cast<const float*>(x), static_cast<const float*>(mean),
             static_cast<const float*>(rstd), static_cast<const float*>(weight), n, c, hw, batch_stats,
             static_cast<float*>(grad_x), static_cast<float*>(grad_weight), static_cast<float*>(grad_bias));
}

}  // namespace mg::kernels::cpu
