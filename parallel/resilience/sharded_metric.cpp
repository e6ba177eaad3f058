// ShardedMetric: drops the DistributedSampler's padding, then sums over the ranks (sharded_metric.h).
#include "parallel/resilience/sharded_metric.h"

#include <algorithm>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::parallel {

void ShardedMetric::add(const Tensor& per_sample) {
  MG_CHECK(per_sample.dim() == 1, "ShardedMetric::add: expected one value per sample (1-D), got shape ",
           shape_str(per_sample.shape()));
  NoGradGuard no_grad;
  const int64_t n = per_sample.numel();
  const int64_t keep = std::clamp<int64_t>(real_ - offered_, 0, n);
  offered_ += n;
  if (keep == 0) return;
  Tensor kept = per_sample.detach().to(Device::cpu()).to(DType::f64).narrow(0, 0, keep);
  sum_ += mg::sum(kept).item<double>();
  counted_ += keep;
}

ShardedMetric::Total ShardedMetric::all_reduce(const ProcessGroup& group) const {
  ProcessGroup pg = group;
  Tensor totals = tensor<double>({sum_, static_cast<double>(counted_)});
  pg.allreduce(totals)->wait();
  const auto values = totals.to_vector<double>();
  return {values[0], static_cast<int64_t>(values[1])};
}

}  // namespace mg::parallel
