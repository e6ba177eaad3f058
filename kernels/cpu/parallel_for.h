// How the CPU kernels split a loop over OpenMP threads, and the NaN test their max/min share.
//
// parallel_for(n, parallel, body) calls body(begin, end) on [0, n): one contiguous range per
// thread when `parallel` (the kernel decided the work is worth the threads), the build has
// OpenMP, and we are not already inside a parallel region; otherwise one call on the whole
// range. Contiguous ranges keep each thread on its own cache lines, and the split depends only
// on n and the thread count, never on timing.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace mg::kernels::cpu {

template <class Body>
void parallel_for(int64_t n, bool parallel, const Body& body) {
#ifdef _OPENMP
  if (parallel && n > 1 && omp_get_max_threads() > 1 && !omp_in_parallel()) {
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads();
      const int64_t t = omp_get_thread_num();
      const int64_t begin = n * t / threads;
      const int64_t end = n * (t + 1) / threads;
      if (begin < end) body(begin, end);
    }
    return;
  }
#else
  (void)parallel;
#endif
  body(0, n);
}

// std::isnan for floating types; integers (and the int accumulator of bool) are never NaN.
template <class V>
inline bool is_nan(V v) {
  if constexpr (std::is_floating_point<V>::value) {
    return std::isnan(v);
  } else {
    (void)v;
    return false;
  }
}

}  // namespace mg::kernels::cpu
