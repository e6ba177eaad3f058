// What bench_dp_vs_ddp measures of each DDP rank beyond its mean step: step-time percentiles (a
// slow rank or a slow link shows in p95 first) and the bytes its node sent on a network interface
// (scripts/cluster's nodes: /sys/class/net/eth0 inside each node's namespace is that node's link).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace mg::bench {

// The q-quantile (0 <= q <= 1) by the nearest-rank method: the smallest value with at least
// q·n values at or below it; 0 for no values.
inline double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// The tx_bytes counter of `interface` in this process's network namespace, or -1 if unreadable.
inline int64_t interface_tx_bytes(const std::string& interface) {
  std::ifstream in("/sys/class/net/" + interface + "/statistics/tx_bytes");
  long long value = -1;
  return (in >> value) ? value : -1;
}

}  // namespace mg::bench
