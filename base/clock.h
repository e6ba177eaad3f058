// The one stopwatch of the timings the library and its benchmarks report: milliseconds on the
// steady clock (never the wall clock, which can jump).
#pragma once

#include <chrono>

namespace mg {

// Milliseconds from `start` to now, on the steady clock.
inline double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mg
