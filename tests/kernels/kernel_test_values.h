// What the CPU kernel tests share: conversions between the storage types and double, the
// closeness check of two results, and the floating dtypes every kernel is tested in. One copy
// here: the tests of a folder compile as one unity build (tests/CMakeLists.txt), where a helper
// written into two test files would be defined twice.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iomanip>
#include <random>
#include <type_traits>
#include <vector>

#include "base/dtype.h"

namespace mg::kernel_test {

// A value of storage type T as a double (half types through their float accumulator).
template <class T>
double as_double(T v) {
  return static_cast<double>(static_cast<acc_t<T>>(v));
}

// Doubles rounded to storage type T (through float, as the kernels' callers convert them).
template <class T>
std::vector<T> cast_to(const std::vector<double>& v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    std::vector<T> out;
    out.reserve(v.size());
    for (double x : v) out.push_back(static_cast<T>(static_cast<float>(x)));
    return out;
  }
}

template <class T>
std::vector<double> to_double(const std::vector<T>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = as_double(v[i]);
  return out;
}

// `size` values drawn uniformly from [-1, 1), rounded to T.
template <class T>
std::vector<T> random_buffer(int64_t size, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<T> out(static_cast<size_t>(size));
  for (T& v : out) v = static_cast<T>(uniform(rng));
  return out;
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// |got - want| <= atol + rtol * |want| everywhere (NaN fails); reports the first miss.
inline void require_close(const std::vector<double>& got, const std::vector<double>& want, double atol,
                          double rtol) {
  REQUIRE(got.size() == want.size());
  size_t misses = 0, first = 0;
  for (size_t k = 0; k < got.size(); ++k)
    if (!(std::abs(got[k] - want[k]) <= atol + rtol * std::abs(want[k])) && misses++ == 0) first = k;
  if (misses > 0)
    FAIL(std::setprecision(10) << misses << " of " << got.size() << " elements differ; first at " << first
                               << ": got " << got[first] << ", want " << want[first]);
}

inline constexpr DType kFloatingDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

}  // namespace mg::kernel_test
