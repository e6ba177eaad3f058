// Fused log-softmax + negative log-likelihood (CPU).
//
// With lse_i = logsumexp(x_i) = m + log(sum_c exp(x_ic - m)), m = max_c x_ic:
//   -log_softmax(x_i)[c] = lse_i - x_ic
//   nll_i                = lse_i - x_i[t_i]
//   smoothing term       = mean_c(lse_i - x_ic) = lse_i - mean_c(x_ic)
// (the code keeps m and log(sum) apart and subtracts m from each logit first,
// see LogSumExp below), so a whole row's loss needs only max, sum of exp and
// sum of logits: one read of the logits from DRAM (the row is re-read from
// cache), one exp per logit, one scalar written per row. The unfused path (log_softmax, then gather) would
// write and re-read a [rows, classes] tensor.
//
// Backward: d loss_i / d x_ic = softmax_ic - (1 - eps) [c == t_i] - eps / classes.
// It recomputes the softmax from the logits (two reads of x, one exp per
// logit, one write of gx) instead of saving [rows, classes] probabilities.
//
// Decomposition: one row per task, rows split across threads. The targets are
// validated up front, before any thread starts, so a bad label throws cleanly
// (an exception may not escape an OpenMP region) and nothing is half-written.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace mg::kernels::cpu {

namespace {

[[maybe_unused]] constexpr int64_t kCrossEntropyMinParallelWork = 1 << 15;

// Returns the number of rows whose target is not ignore_index.
int64_t validate_targets(const char* what, const int64_t* targets, int64_t rows, int64_t classes,
                         int64_t ignore_index, double label_smoothing) {
  MG_CHECK(rows >= 0 && (classes > 0 || rows == 0), what, ": expected rows >= 0 and classes > 0, got rows ",
           rows, ", classes ", classes);
  MG_CHECK(label_smoothing >= 0.0 && label_smoothing < 1.0, what, ": label_smoothing must be in [0, 1), got ",
           label_smoothing);
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = targets[i];
    if (t == ignore_index) continue;
    MG_CHECK(t >= 0 && t < classes, what, ": target ", t, " at row ", i, " is out of range [0, ", classes,
             ") (ignore_index ", ignore_index, ")");
    ++counted;
  }
  return counted;
}

// logsumexp(x) = max + log_sum, kept as two numbers: every use subtracts a logit
// from it, and (max - x) + log_sum keeps full precision where the rounded sum
// max + log_sum would not (at max = 1000 a float has ~4 fractional digits).
template <class Acc>
struct LogSumExp {
  Acc max, log_sum;
};

template <class T, class Acc = acc_t<T>>
LogSumExp<Acc> row_logsumexp(const T* x, int64_t classes) {
  Acc max = -std::numeric_limits<Acc>::infinity();
  for (int64_t c = 0; c < classes; ++c) max = std::max(max, static_cast<Acc>(x[c]));
  Acc sum = 0;
  for (int64_t c = 0; c < classes; ++c) sum += std::exp(static_cast<Acc>(x[c]) - max);
  return {max, std::log(sum)};
}

template <class T>
void forward_rows(const T* x, const int64_t* targets, int64_t rows, int64_t classes, int64_t ignore_index,
                  double label_smoothing, T* losses) {
  using Acc = acc_t<T>;
  const Acc eps = static_cast<Acc>(label_smoothing);
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * classes >= kCrossEntropyMinParallelWork)
#endif
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = targets[i];
    if (t == ignore_index) {
      losses[i] = static_cast<T>(Acc(0));
      continue;
    }
    const T* xi = x + i * classes;
    const LogSumExp<Acc> lse = row_logsumexp(xi, classes);
    Acc loss = lse.log_sum - (static_cast<Acc>(xi[t]) - lse.max);
    if (eps > 0) {  // mean_c(lse - x_c) = log_sum - mean_c(x_c - max)
      Acc sum_shifted = 0;
      for (int64_t c = 0; c < classes; ++c) sum_shifted += static_cast<Acc>(xi[c]) - lse.max;
      loss = (1 - eps) * loss + eps * (lse.log_sum - sum_shifted / static_cast<Acc>(classes));
    }
    losses[i] = static_cast<T>(loss);
  }
}

template <class T>
void backward_rows(const T* x, const int64_t* targets, int64_t rows, int64_t classes, int64_t ignore_index,
                   double label_smoothing, const T* grad_losses, T* gx) {
  using Acc = acc_t<T>;
  const Acc eps = static_cast<Acc>(label_smoothing);
  const Acc uniform = eps / static_cast<Acc>(classes);  // smoothing mass each class receives
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (rows * classes >= kCrossEntropyMinParallelWork)
#endif
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t t = targets[i];
    T* gxi = gx + i * classes;
    if (t == ignore_index) {
      for (int64_t c = 0; c < classes; ++c) gxi[c] = static_cast<T>(Acc(0));
      continue;
    }
    const T* xi = x + i * classes;
    const LogSumExp<Acc> lse = row_logsumexp(xi, classes);
    const Acc g = static_cast<Acc>(grad_losses[i]);
    for (int64_t c = 0; c < classes; ++c) {
      Acc d = std::exp((static_cast<Acc>(xi[c]) - lse.max) - lse.log_sum) - uniform;
      if (c == t) d -= 1 - eps;
      gxi[c] = static_cast<T>(g * d);
    }
  }
}

}  // namespace

int64_t cross_entropy_forward(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                              int64_t classes, int64_t ignore_index, double label_smoothing, void* losses) {
  const char* what = "cross_entropy_forward";
  const int64_t counted = validate_targets(what, targets, rows, classes, ignore_index, label_smoothing);
  visit_floating(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_rows(static_cast<const T*>(logits), targets, rows, classes, ignore_index, label_smoothing,
                 static_cast<T*>(losses));
  });
  return counted;
}

void cross_entropy_forward_counted(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                                   int64_t classes, int64_t ignore_index, double label_smoothing,
                                   void* losses, float* counted) {
  *counted = static_cast<float>(
      cross_entropy_forward(dtype, logits, targets, rows, classes, ignore_index, label_smoothing, losses));
}

void cross_entropy_backward(DType dtype, const void* logits, const int64_t* targets, int64_t rows,
                            int64_t classes, int64_t ignore_index, double label_smoothing,
                            const void* grad_losses, void* grad_logits) {
  const char* what = "cross_entropy_backward";
  validate_targets(what, targets, rows, classes, ignore_index, label_smoothing);
  visit_floating(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_rows(static_cast<const T*>(logits), targets, rows, classes, ignore_index, label_smoothing,
                  static_cast<const T*>(grad_losses), static_cast<T*>(grad_logits));
  });
}

}  // namespace mg::kernels::cpu
