// A scaling model for DataParallel and DDP: predicts the step time on N devices from what one
// device measured and a model of the link between devices. Most of our machines have 0 or 1 GPU;
// this is how bench_dp_vs_ddp --predict answers "what would 8 or 64 GPUs do?", and checks itself
// against the sizes it could actually run.
//
// The link: sending S bytes costs α + S·β (latency α, inverse bandwidth β). A ring all-reduce of
// S bytes over N devices takes 2(N−1) steps of S/N bytes:
//
//   T_allreduce(S, N) = 2(N−1)·α + 2(N−1)/N · S · β
//
// The work: one device measured forward F, backward B and optimizer O at the global batch, and
// when each parameter's gradient became ready during backward (t_i, as a fraction of B). With a
// fixed global batch (strong scaling) each of N devices computes F/N and B/N.
//
// DDP: buckets are formed exactly as the Reducer does (reducer.h: assign_buckets); bucket k is
// ready when its last gradient is (scaled to B/N), starts when it is ready and the link has
// finished bucket k−1, and lasts T_allreduce(S_k, N). What ends after backward is *exposed*:
//
//   step_DDP = F/N + B/N + exposed + O
//
// DP (one process drives N devices; device 0 holds the master copy):
//   replicate: device 0 sends the parameters P to N−1 devices: (N−1)·(α + P·β), serialised on
//              device 0's link -- the bottleneck that grows with N
//   scatter/gather: the batch's inputs out and outputs back through device 0: (N−1)/N·(I+Y)·β
//   backward: B/N in parallel, then every replica's gradients reduce-added onto device 0:
//              (N−1)·(α + P·β)
//   optimizer: O on device 0 only
//
// What the model leaves out: kernel-launch and framework overheads that do not shrink with the
// batch (so small per-device batches are optimistic), contention of the link by several
// transfers, and the cost of the reduction arithmetic. The benchmark prints its error where it
// can measure.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/data_parallel/reducer.h"

namespace mg::bench {

struct Link {
  std::string name;
  double alpha_s = 0;          // per-message latency
  double beta_s_per_byte = 0;  // 1 / bandwidth
};

// Per-direction bandwidths a ring actually sees (busbw), and typical latencies.
inline std::vector<Link> link_presets() {
  return {
      {"PCIe 4.0 x16", 10e-6, 1.0 / 20e9},
      {"NVLink 4 (H100/H200)", 5e-6, 1.0 / 360e9},
      {"100 Gb/s Ethernet/InfiniBand", 8e-6, 1.0 / 11e9},
  };
}

inline double allreduce_seconds(const Link& link, int n, double bytes) {
  if (n <= 1) return 0;
  return 2.0 * (n - 1) * link.alpha_s + 2.0 * (n - 1) / n * bytes * link.beta_s_per_byte;
}

struct Workload {
  double forward_s = 0, backward_s = 0, optimizer_s = 0;  // one device, the whole global batch
  // Each parameter's gradient in arrival order: (ready time as a fraction of backward, bytes).
  std::vector<std::pair<double, int64_t>> gradients;
  int64_t batch_io_bytes = 0;  // inputs + outputs of the whole global batch
  double first_bucket_cap_mb = 1.0, bucket_cap_mb = 25.0;

  int64_t parameter_bytes() const {
    int64_t total = 0;
    for (auto& g : gradients) total += g.second;
    return total;
  }
};

struct Prediction {
  double step_s = 0;
  double comm_s = 0;     // time the link is busy
  double exposed_s = 0;  // communication not hidden behind compute
};

inline Prediction predict_ddp(const Workload& w, const Link& link, int n) {
  double backward = w.backward_s / n;
  std::vector<size_t> order(w.gradients.size());
  std::vector<int64_t> bytes;
  std::vector<DType> dtypes(w.gradients.size(), DType::f32);
  for (size_t i = 0; i < order.size(); ++i) {
    order[i] = i;
    bytes.push_back(w.gradients[i].second);
  }
  auto mb = [](double m) { return static_cast<int64_t>(m * 1024 * 1024); };
  auto buckets =
      parallel::assign_buckets(order, bytes, dtypes, mb(w.first_bucket_cap_mb), mb(w.bucket_cap_mb));
  Prediction p;
  double link_free = 0;
  for (const auto& bucket : buckets) {
    double ready = 0, size = 0;
    for (size_t i : bucket) {
      ready = std::max(ready, w.gradients[i].first * backward);
      size += static_cast<double>(w.gradients[i].second);
    }
    double duration = allreduce_seconds(link, n, size);
    double start = std::max(ready, link_free);
    link_free = start + duration;
    p.comm_s += duration;
  }
  p.exposed_s = std::max(0.0, link_free - backward);
  p.step_s = w.forward_s / n + backward + p.exposed_s + w.optimizer_s;
  return p;
}

inline Prediction predict_dp(const Workload& w, const Link& link, int n) {
  Prediction p;
  if (n <= 1) {
    p.step_s = w.forward_s + w.backward_s + w.optimizer_s;
    return p;
  }
  double params = static_cast<double>(w.parameter_bytes());
  double replicate = (n - 1) * (link.alpha_s + params * link.beta_s_per_byte);
  double scatter_gather =
      2 * link.alpha_s + (n - 1.0) / n * static_cast<double>(w.batch_io_bytes) * link.beta_s_per_byte;
  double reduce_grads = (n - 1) * (link.alpha_s + params * link.beta_s_per_byte);
  p.comm_s = replicate + scatter_gather + reduce_grads;
  p.exposed_s = p.comm_s;  // nothing of it overlaps with compute
  p.step_s = w.forward_s / n + w.backward_s / n + w.optimizer_s + p.comm_s;
  return p;
}

}  // namespace mg::bench
