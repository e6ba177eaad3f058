// What the benchmark binaries share: the statistics they report and the facts about the machine
// they print next to every table (these machines are shared and noisy, so a number without the
// load it was measured under means little).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace mg::bench {

// The median (the mean of the two middle values for an even count); 0 for no values.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// The 1-minute load average, or -1 when /proc/loadavg is unreadable. Other processes on the
// cores make every multi-threaded measurement slower (a parallel region waits for its slowest,
// descheduled thread), so the tables say when the machine was busy.
inline double load_average() {
  std::ifstream f("/proc/loadavg");
  double load = -1;
  return (f >> load) ? load : -1;
}

// /proc/cpuinfo's first "model name", or "unknown".
inline std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) break;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string("unknown") : line.substr(start);
  }
  return "unknown";
}

// Now, as 2026-12-01T07:20:33Z.
inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// One core per logical device or rank: BLAS and OpenMP read their thread counts when they start,
// so the benchmark re-executes itself once with OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = 1 (the
// environment variable MG_BENCH_PINNED marks the second run, where this returns at once).
inline void reexec_with_one_thread(char** argv, const std::string& who) {
  if (std::getenv("MG_BENCH_PINNED") != nullptr) return;
  setenv("MG_BENCH_PINNED", "1", 1);
  setenv("OMP_NUM_THREADS", "1", 1);
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  execv("/proc/self/exe", argv);
  throw std::runtime_error(who + ": could not re-execute itself with one BLAS/OpenMP thread");
}

}  // namespace mg::bench
