// Layer norm forward and backward (CPU).
//
// Forward, one row per task (rows split across threads): three sweeps over a
// row that stays in L1/L2 after the first -- a rough mean, then the deviations
// from it (their sum corrects the mean's rounding error, their squares give the
// variance; the one-pass E[x^2] - E[x]^2 would cancel catastrophically when
// |mean| >> std), then the normalised write. DRAM traffic per element: read x,
// write y (weight/bias stay in cache across rows); ~8 flops.
//
// Backward splits into two independent jobs so that no two threads ever write
// the same address (no atomics, deterministic results):
//  * grad_x, one row per task. With xhat = (x - mean) * rstd and g = gy * weight,
//      gx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//    which needs two row sums, so two sweeps: read gy and x (twice), write gx.
//  * grad_weight = sum over rows of gy * xhat, grad_bias = sum over rows of gy:
//    column sums. A task owns a block of kColumnBlock adjacent columns and walks
//    all rows, reading a contiguous piece of each, accumulating in registers /
//    on the stack. This re-reads gy and x once more (a second DRAM pass) in
//    exchange for having no shared partial sums.
#include "kernels/cpu/layer_norm.h"

#include <algorithm>
#include <cmath>

namespace mg::kernels::cpu {

namespace {

constexpr int64_t kColumnBlock = 64;
[[maybe_unused]] constexpr int64_t kLayerNormMinParallelWork = 1 << 15;

// S is the statistics type: double for f64, float otherwise (the same as acc_t<T>).
template <class T>
void forward_rows(const T* x, const T* weight, const T* bias, int64_t rows, int64_t cols, double eps, T* y,
                  acc_t<T>* mean_out, acc_t<T>* rstd_out) {
  using S = acc_t<T>;
  const S inv_cols = cols > 0 ? S(1) / static_cast<S>(cols) : S(0);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * cols >= kLayerNormMinParallelWork)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    S sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += static_cast<S>(xr[c]);
    const S rough_mean = sum * inv_cols;
    // Corrected two-pass: the deviations from the rough mean sum to the rounding
    // error of the first pass, which we add back to the mean and remove from
    // the variance (Chan, Golub & LeVeque, 1983).
    S deviations = 0, squares = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const S d = static_cast<S>(xr[c]) - rough_mean;
      deviations += d;
      squares += d * d;
    }
    const S correction = deviations * inv_cols;
    const S mean = rough_mean + correction;
    const S var = std::max(S(0), squares * inv_cols - correction * correction);
    const S rstd = S(1) / std::sqrt(var + static_cast<S>(eps));
    for (int64_t c = 0; c < cols; ++c) {
      S v = (static_cast<S>(xr[c]) - mean) * rstd;
      if (weight) v *= static_cast<S>(weight[c]);
      if (bias) v += static_cast<S>(bias[c]);
      yr[c] = static_cast<T>(v);
    }
    mean_out[r] = mean;
    rstd_out[r] = rstd;
  }
}

template <class T>
void backward_grad_x(const T* gy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, const T* weight,
                     int64_t rows, int64_t cols, T* gx) {
  using S = acc_t<T>;
  const S inv_cols = cols > 0 ? S(1) / static_cast<S>(cols) : S(0);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * cols >= kLayerNormMinParallelWork)
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const T* gyr = gy + r * cols;
    const T* xr = x + r * cols;
    T* gxr = gx + r * cols;
    const S mu = mean[r], rs = rstd[r];
    S sum_g = 0, sum_g_xhat = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const S g = weight ? static_cast<S>(gyr[c]) * static_cast<S>(weight[c]) : static_cast<S>(gyr[c]);
      sum_g += g;
      sum_g_xhat += g * (static_cast<S>(xr[c]) - mu) * rs;
    }
    const S mean_g = sum_g * inv_cols, mean_g_xhat = sum_g_xhat * inv_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const S g = weight ? static_cast<S>(gyr[c]) * static_cast<S>(weight[c]) : static_cast<S>(gyr[c]);
      const S xhat = (static_cast<S>(xr[c]) - mu) * rs;
      gxr[c] = static_cast<T>(rs * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

template <class T>
void backward_params(const T* gy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd, int64_t rows,
                     int64_t cols, T* grad_weight, T* grad_bias) {
  using S = acc_t<T>;
  const int64_t blocks = (cols + kColumnBlock - 1) / kColumnBlock;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * cols >= kLayerNormMinParallelWork)
#endif
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t first = b * kColumnBlock;
    const int64_t width = std::min(kColumnBlock, cols - first);
    S sum_w[kColumnBlock], sum_b[kColumnBlock];
    for (int64_t c = 0; c < width; ++c) sum_w[c] = sum_b[c] = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const T* gyr = gy + r * cols + first;
      const T* xr = x + r * cols + first;
      const S mu = mean[r], rs = rstd[r];
      for (int64_t c = 0; c < width; ++c) {
        const S g = static_cast<S>(gyr[c]);
        sum_w[c] += g * (static_cast<S>(xr[c]) - mu) * rs;
        sum_b[c] += g;
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      if (grad_weight) grad_weight[first + c] = static_cast<T>(sum_w[c]);
      if (grad_bias) grad_bias[first + c] = static_cast<T>(sum_b[c]);
    }
  }
}

}  // namespace

void layer_norm_forward(DType dtype, const void* x, const void* weight, const void* bias, int64_t rows,
                        int64_t cols, double eps, void* y, void* mean, void* rstd) {
  MG_CHECK(rows >= 0 && cols >= 0, "layer_norm_forward: negative shape [", rows, ", ", cols, "]");
  MG_CHECK(eps >= 0, "layer_norm_forward: eps must be >= 0, got ", eps);
  visit_floating(dtype, "layer_norm_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = acc_t<T>;
    forward_rows(static_cast<const T*>(x), static_cast<const T*>(weight), static_cast<const T*>(bias), rows,
                 cols, eps, static_cast<T*>(y), static_cast<S*>(mean), static_cast<S*>(rstd));
  });
}

void layer_norm_backward(DType dtype, const void* grad_y, const void* x, const void* mean, const void* rstd,
                         const void* weight, int64_t rows, int64_t cols, void* grad_x, void* grad_weight,
                         void* grad_bias) {
  MG_CHECK(rows >= 0 && cols >= 0, "layer_norm_backward: negative shape [", rows, ", ", cols, "]");
  visit_floating(dtype, "layer_norm_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using S = acc_t<T>;
    const T* gy = static_cast<const T*>(grad_y);
    const T* xs = static_cast<const T*>(x);
    const S* mu = static_cast<const S*>(mean);
    const S* rs = static_cast<const S*>(rstd);
    backward_grad_x(gy, xs, mu, rs, static_cast<const T*>(weight), rows, cols, static_cast<T*>(grad_x));
    if (grad_weight || grad_bias)
      backward_params(gy, xs, mu, rs, rows, cols, static_cast<T*>(grad_weight), static_cast<T*>(grad_bias));
  });
}

}  // namespace mg::kernels::cpu
