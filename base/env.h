// The one parser of multigrad's MG_* environment variables: every value is checked for its form,
// its range and its unit, and a bad one is an mg::Error naming the variable, what it must be and
// what it got -- never a truncating or undefined cast (MG_TIMEOUT_S=4294967297 used to become a
// 1 s timeout through static_cast<int>, MG_STALL_WARMUP_S=1e300 a negative bound, and
// MG_FAILURE_DETECTION_S=inf was accepted). docs/fault-tolerance.md lists each variable with its
// range and cost.
#pragma once

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "base/error.h"

namespace mg::env {

// The variable's text, or nullopt when it is unset or empty (both mean "the default").
inline std::optional<std::string> text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

// A whole number in [min, max] ("unit" says what it counts), or nullopt when unset. Refused:
// anything but an optional '-' and decimal digits (no spaces, signs, decimals, hex), and any
// value out of the range, including one beyond int64 (never wrapped or truncated).
inline std::optional<int64_t> integer(const char* name, int64_t min, int64_t max, const char* unit) {
  const std::optional<std::string> value = text(name);
  if (!value) return std::nullopt;
  const std::string& s = *value;
  const size_t digits_from = s[0] == '-' ? 1 : 0;
  bool ok = s.size() > digits_from && s.find_first_not_of("0123456789", digits_from) == std::string::npos;
  long long parsed = 0;
  if (ok) {
    errno = 0;
    char* end = nullptr;
    parsed = std::strtoll(s.c_str(), &end, 10);
    ok = errno == 0 && *end == '\0' && parsed >= min && parsed <= max;
  }
  MG_CHECK(ok, name, " must be a whole number of ", unit, " from ", min, " to ", max, ", got '", s, "'");
  return static_cast<int64_t>(parsed);
}

// A finite decimal number in [min, max] (in `unit`), or nullopt when unset. inf, nan, hex floats
// and trailing text are refused.
inline std::optional<double> number(const char* name, double min, double max, const char* unit) {
  const std::optional<std::string> value = text(name);
  if (!value) return std::nullopt;
  const std::string& s = *value;
  bool ok = s.find_first_not_of("0123456789.eE+-") == std::string::npos;
  double parsed = 0;
  if (ok) {
    char* end = nullptr;
    parsed = std::strtod(s.c_str(), &end);
    ok = end != s.c_str() && *end == '\0' && std::isfinite(parsed) && parsed >= min && parsed <= max;
  }
  MG_CHECK(ok, name, " must be a number of ", unit, " from ", min, " to ", max, ", got '", s, "'");
  return parsed;
}

// Seconds (a decimal) in [min_s, max_s], as milliseconds (rounded to the nearest), or nullopt.
inline std::optional<std::chrono::milliseconds> seconds(const char* name, double min_s, double max_s) {
  const std::optional<double> s = number(name, min_s, max_s, "seconds");
  if (!s) return std::nullopt;
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(*s * 1000)));
}

}  // namespace mg::env
