// bucket_cap_mb = auto: the α-β fit of the measured all-reduce, the exposed-communication model
// and the choice of cap (the model and its assumptions: bucket_autotune.h).
#include "parallel/data_parallel/bucket_autotune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "parallel/data_parallel/reducer.h"

namespace mg::parallel {

namespace {

constexpr double kMB = 1024.0 * 1024.0;

int64_t mb_to_bytes(double megabytes) { return bucket_cap_bytes(megabytes, "bucket_cap_mb"); }

// Seconds for one all-reduce of `tensor`, as the host sees it complete (a copy of one element
// to the host waits for a device's stream).
double time_allreduce(ProcessGroup& group, Tensor& tensor) {
  group.barrier()->wait();
  const auto start = std::chrono::steady_clock::now();
  group.allreduce(tensor)->wait();
  if (!tensor.device().is_cpu()) (void)tensor.narrow(0, 0, 1).to(Device::cpu());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

LinkFit fit_alpha_beta(const std::vector<std::pair<double, double>>& bytes_seconds) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  double smallest = std::numeric_limits<double>::infinity(), largest = 0;
  for (const auto& [bytes, seconds] : bytes_seconds) {
    MG_CHECK(std::isfinite(bytes) && std::isfinite(seconds) && bytes >= 0 && seconds > 0,
             "fit_alpha_beta: need finite bytes >= 0 and seconds > 0 (an infinite time would make alpha and "
             "beta NaN), got (",
             bytes, ", ", seconds, ")");
    const double w = 1.0 / (seconds * seconds);
    sw += w;
    sx += w * bytes;
    sy += w * seconds;
    sxx += w * bytes * bytes;
    sxy += w * bytes * seconds;
    smallest = std::min(smallest, bytes);
    largest = std::max(largest, bytes);
  }
  MG_CHECK(bytes_seconds.size() >= 2 && largest > smallest,
           "fit_alpha_beta: need at least two distinct sizes, got ", bytes_seconds.size(), " sample(s)");
  LinkFit fit;
  fit.points = static_cast<int>(bytes_seconds.size());
  fit.beta_s_per_byte = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
  fit.alpha_s = (sy - fit.beta_s_per_byte * sx) / sw;
  if (fit.alpha_s < 0) {  // the best line through the origin
    fit.alpha_s = 0;
    fit.beta_s_per_byte = sxy / sxx;
  }
  if (fit.beta_s_per_byte < 0) {  // no measurable bandwidth cost: a constant
    fit.beta_s_per_byte = 0;
    fit.alpha_s = sy / sw;
  }
  return fit;
}

int64_t GradientTimeline::total_bytes() const {
  int64_t total = 0;
  for (int64_t b : bytes) total += b;
  return total;
}

GradientTimeline proportional_timeline(std::vector<int64_t> bytes, std::vector<DType> dtypes,
                                       double backward_s) {
  MG_CHECK(bytes.size() == dtypes.size(), "proportional_timeline: ", bytes.size(), " sizes but ",
           dtypes.size(), " dtypes");
  GradientTimeline timeline;
  timeline.bytes = std::move(bytes);
  timeline.dtypes = std::move(dtypes);
  timeline.backward_s = backward_s;
  const double total = static_cast<double>(std::max<int64_t>(timeline.total_bytes(), 1));
  double produced = 0;
  for (int64_t b : timeline.bytes) {
    produced += static_cast<double>(b);
    timeline.ready_s.push_back(backward_s * produced / total);
  }
  return timeline;
}

double predicted_exposed_s(const GradientTimeline& timeline, const LinkFit& link, double first_bucket_cap_mb,
                           double bucket_cap_mb) {
  std::vector<size_t> order(timeline.bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto buckets = assign_buckets(order, timeline.bytes, timeline.dtypes, mb_to_bytes(first_bucket_cap_mb),
                                mb_to_bytes(bucket_cap_mb));
  double link_free = 0;
  for (const auto& bucket : buckets) {
    double ready = 0, size = 0;
    for (size_t i : bucket) {
      ready = std::max(ready, timeline.ready_s[i]);
      size += static_cast<double>(timeline.bytes[i]);
    }
    link_free = std::max(ready, link_free) + link.seconds(size);
  }
  return std::max(0.0, link_free - timeline.backward_s);
}

BucketCapChoice choose_bucket_cap(const GradientTimeline& timeline, const LinkFit& link,
                                  double first_bucket_cap_mb) {
  MG_CHECK(!timeline.bytes.empty(), "choose_bucket_cap: no gradients");
  MG_CHECK(first_bucket_cap_mb > 0, "choose_bucket_cap: first_bucket_cap_mb must be positive, got ",
           first_bucket_cap_mb);
  const int64_t total = timeline.total_bytes();
  const int64_t smallest =
      std::max<int64_t>(*std::min_element(timeline.bytes.begin(), timeline.bytes.end()), 1);
  BucketCapChoice best;
  best.link = link;
  best.backward_s = timeline.backward_s;
  best.predicted_exposed_s = std::numeric_limits<double>::infinity();
  // Caps doubling from the smallest gradient; the last one holds every gradient.
  std::vector<int64_t> caps;
  for (int64_t cap = smallest; cap < total; cap *= 2) caps.push_back(cap);
  caps.push_back(std::max<int64_t>(total, 1));
  std::vector<size_t> order(timeline.bytes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  auto bucket_count = [&](double first_mb, double cap_mb) {
    return static_cast<int>(
        assign_buckets(order, timeline.bytes, timeline.dtypes, mb_to_bytes(first_mb), mb_to_bytes(cap_mb))
            .size());
  };
  double best_cost = std::numeric_limits<double>::infinity();
  for (int64_t cap : caps) {
    const double cap_mb = static_cast<double>(cap) / kMB;
    for (double first_mb : {std::min(first_bucket_cap_mb, cap_mb), cap_mb}) {
      const double exposed = predicted_exposed_s(timeline, link, first_mb, cap_mb);
      const int buckets = bucket_count(first_mb, cap_mb);
      // Each all-reduce also takes about α of the host away from backward (bucket_autotune.h).
      const double cost = exposed + buckets * link.alpha_s;
      if (cost < best_cost) {
        best_cost = cost;
        best.predicted_exposed_s = exposed;
        best.bucket_cap_mb = cap_mb;
        best.first_bucket_cap_mb = first_mb;
        best.buckets = buckets;
      }
    }
  }
  return best;
}

std::string BucketCapChoice::summary() const {
  return str_cat(
      "bucket_cap_mb=auto: all-reduce T(S) = ", link.alpha_s * 1e6, " us + S / ",
      link.beta_s_per_byte > 0 ? 1e-9 / link.beta_s_per_byte : std::numeric_limits<double>::infinity(),
      " GB/s (", link.points, " sizes); backward ", backward_s * 1e3, " ms (",
      backward_given ? "given" : "assumed = T(all gradients)", "); chose bucket_cap_mb=", bucket_cap_mb,
      ", first_bucket_cap_mb=", first_bucket_cap_mb, " (", buckets, " buckets, predicted exposed ",
      predicted_exposed_s * 1e3, " ms)");
}

LinkFit measure_allreduce_link(ProcessGroup& group, DType dtype, int64_t max_bytes, int repetitions) {
  MG_CHECK(repetitions >= 1, "measure_allreduce_link: repetitions must be >= 1, got ", repetitions);
  const int64_t element = static_cast<int64_t>(dtype_size(dtype));
  const int64_t limit = std::min<int64_t>(16 << 20, std::max<int64_t>(max_bytes, 256 << 10));
  std::vector<std::pair<double, double>> samples;
  NoGradGuard no_grad;
  for (int64_t bytes = 4 << 10; bytes <= limit; bytes *= 4) {
    Tensor payload = zeros({bytes / element}, TensorOptions{dtype, group.device()});
    time_allreduce(group, payload);  // warm-up: buffers, connections, the signature check's first use
    std::vector<double> times;
    for (int r = 0; r < repetitions; ++r) times.push_back(time_allreduce(group, payload));
    std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
    samples.emplace_back(static_cast<double>(bytes), std::max(times[times.size() / 2], 1e-9));
  }
  LinkFit fit = fit_alpha_beta(samples);
  Tensor shared = zeros({2}, TensorOptions{DType::f64});
  shared.data<double>()[0] = fit.alpha_s;
  shared.data<double>()[1] = fit.beta_s_per_byte;
  Tensor on_device = shared.to(group.device());
  group.broadcast(on_device, 0)->wait();
  shared = on_device.to(Device::cpu());
  fit.alpha_s = shared.data<double>()[0];
  fit.beta_s_per_byte = shared.data<double>()[1];
  return fit;
}

BucketCapChoice autotune_bucket_cap(const std::vector<Tensor>& parameters, ProcessGroup& group,
                                    double first_bucket_cap_mb, double bucket_cap_mb, double backward_ms) {
  MG_CHECK(backward_ms >= 0, "DistributedDataParallel: bucket_cap_auto_backward_ms must be >= 0, got ",
           backward_ms);
  std::vector<int64_t> bytes;
  std::vector<DType> dtypes;
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {  // backward's order
    if (!it->requires_grad()) continue;
    bytes.push_back(static_cast<int64_t>(it->nbytes()));
    dtypes.push_back(it->dtype());
  }
  BucketCapChoice keep;
  keep.bucket_cap_mb = bucket_cap_mb;
  keep.first_bucket_cap_mb = first_bucket_cap_mb;
  if (group.size() == 1 || bytes.empty()) return keep;  // nothing is ever all-reduced
  const DType dtype = dtypes.front();
  const int64_t total = std::accumulate(bytes.begin(), bytes.end(), int64_t{0});
  LinkFit link = measure_allreduce_link(group, dtype, total);
  const bool given = backward_ms > 0;
  const double backward_s = given ? backward_ms / 1e3 : link.seconds(static_cast<double>(total));
  BucketCapChoice choice = choose_bucket_cap(
      proportional_timeline(std::move(bytes), std::move(dtypes), backward_s), link, first_bucket_cap_mb);
  choice.backward_given = given;
  return choice;
}

}  // namespace mg::parallel
