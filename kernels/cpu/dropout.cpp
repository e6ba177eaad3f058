// Dropout forward/backward on CPU.
//
// Decomposition: a flat loop over the elements, split across threads in
// contiguous chunks. Because Philox is counter-based, element i's random number
// is computed from (seed, i, call_offset) alone -- no generator state is
// shared between threads, and the result does not depend on how the loop is
// split.
//
// Cost per element: forward reads x (sizeof(T)), writes y (sizeof(T)) and the
// mask (1 byte); the random numbers are ten Philox rounds (two 32x32->64-bit
// multiplies and a few xors each, ~60 integer ops) per four elements: element i
// takes word i % 4 of block i / 4, all four words of every block are used. Backward reads gy and the mask,
// writes gx, and draws no random numbers: it never needs the seed, only the saved mask.
//
// Scaling by 1 / (1 - p) ("inverted dropout") keeps E[y] = x, so evaluation
// mode is the identity. The scale is computed once in double and applied in
// the compute type (float for halves and f32, double for f64).
#include "kernels/cpu/dropout.h"

#include <algorithm>

#include "base/philox.h"

namespace mg::kernels::cpu {

namespace {

[[maybe_unused]] constexpr int64_t kDropoutMinParallelWork = 1 << 14;

// 1 / (1 - p), or 0 when p == 1 (every element is dropped, nothing to scale).
double keep_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

template <class T>
void forward_elements(const T* x, T* y, bool* mask, int64_t count, double p, uint64_t seed,
                      uint64_t call_offset) {
  using Acc = acc_t<T>;
  const float threshold = static_cast<float>(p);
  const Acc scale = static_cast<Acc>(keep_scale(p));
  // One Philox block (four 32-bit words) per group of four elements: element i takes word i % 4
  // of block i / 4 (philox_dropout_uniform).
  const int64_t groups = (count + 3) / 4;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (count >= kDropoutMinParallelWork)
#endif
  for (int64_t g = 0; g < groups; ++g) {
    const PhiloxBlock block = philox4x32_10(seed, static_cast<uint64_t>(g), call_offset);
    for (int64_t i = 4 * g; i < std::min(count, 4 * g + 4); ++i) {
      const bool keep = philox_word_uniform(block.word[i - 4 * g]) >= threshold;
      mask[i] = keep;
      y[i] = static_cast<T>(keep ? static_cast<Acc>(x[i]) * scale : Acc(0));
    }
  }
}

template <class T>
void backward_elements(const T* gy, const bool* mask, T* gx, int64_t count, double p) {
  using Acc = acc_t<T>;
  const Acc scale = static_cast<Acc>(keep_scale(p));
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (count >= kDropoutMinParallelWork)
#endif
  for (int64_t i = 0; i < count; ++i)
    gx[i] = static_cast<T>(mask[i] ? static_cast<Acc>(gy[i]) * scale : Acc(0));
}

void check_args(const char* what, int64_t count, double p) {
  MG_CHECK(count >= 0, what, ": negative count ", count);
  MG_CHECK(p >= 0.0 && p <= 1.0, what, ": p must be in [0, 1], got ", p);
}

}  // namespace

void dropout_forward(DType dtype, const void* x, void* y, bool* mask, int64_t count, double p, uint64_t seed,
                     uint64_t call_offset) {
  check_args("dropout_forward", count, p);
  visit_floating(dtype, "dropout_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_elements(static_cast<const T*>(x), static_cast<T*>(y), mask, count, p, seed, call_offset);
  });
}

void dropout_backward(DType dtype, const void* grad_y, const bool* mask, void* grad_x, int64_t count,
                      double p) {
  check_args("dropout_backward", count, p);
  visit_floating(dtype, "dropout_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    backward_elements(static_cast<const T*>(grad_y), mask, static_cast<T*>(grad_x), count, p);
  });
}

}  // namespace mg::kernels::cpu
