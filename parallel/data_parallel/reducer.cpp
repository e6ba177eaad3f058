// Reducer: bucketed gradient all-reduce overlapped with backward (see reducer.h for the picture).
#include "parallel/data_parallel/reducer.h"

#include <algorithm>

#include "core/autograd/node.h"
#include "core/base/error.h"
#include "core/grad_mode.h"
#include "parallel/comm/ring_allreduce.h"

namespace mg::parallel {

using Clock = std::chrono::steady_clock;

namespace {
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}
}  // namespace

const char* allreduce_algo_name(AllreduceAlgo algo) {
  return algo == AllreduceAlgo::Ring ? "ring" : "native";
}

std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& order,
                                                const std::vector<int64_t>& bytes,
                                                const std::vector<DType>& dtypes, int64_t first_cap,
                                                int64_t cap) {
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t index : order) {
    int64_t limit = buckets.size() == 1 ? first_cap : cap;  // limit of the bucket being filled
    bool start_new = buckets.empty() || dtypes[index] != dtypes[buckets.back().front()] ||
                     (filled > 0 && filled + bytes[index] > limit);
    if (start_new) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(index);
    filled += bytes[index];
  }
  return buckets;
}

std::shared_ptr<Reducer> Reducer::create(std::vector<std::pair<std::string, Tensor>> named_parameters,
                                         ProcessGroup group, ReducerOptions options) {
  std::shared_ptr<Reducer> reducer(new Reducer(std::move(named_parameters), std::move(group), options));
  reducer->install_hooks();
  return reducer;
}

Reducer::Reducer(std::vector<std::pair<std::string, Tensor>> named_parameters, ProcessGroup group,
                 ReducerOptions options)
    : group_(std::move(group)), options_(options) {
  MG_CHECK(options_.bucket_cap_mb > 0 && options_.first_bucket_cap_mb > 0,
           "DistributedDataParallel: bucket caps must be positive, got bucket_cap_mb=",
           options_.bucket_cap_mb, " first_bucket_cap_mb=", options_.first_bucket_cap_mb);
  for (auto& [name, param] : named_parameters) {
    if (!param.requires_grad()) continue;  // frozen parameters take no part
    names_.push_back(name);
    params_.push_back(param);
  }
  // Backward produces gradients roughly in reverse registration order.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  build_buckets(order);
  arrived_.assign(params_.size(), false);
}

void Reducer::install_hooks() {
  std::weak_ptr<Reducer> weak = shared_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto reducer = weak.lock()) reducer->on_gradient_ready(i);
    });
  }
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  std::vector<int64_t> bytes;
  std::vector<DType> dtypes;
  for (const Tensor& p : params_) {
    bytes.push_back(static_cast<int64_t>(p.nbytes()));
    dtypes.push_back(p.dtype());
  }
  auto mb = [](double megabytes) { return static_cast<int64_t>(megabytes * 1024 * 1024); };
  auto layout =
      assign_buckets(order, bytes, dtypes, mb(options_.first_bucket_cap_mb), mb(options_.bucket_cap_mb));

  buckets_.clear();
  slot_of_.assign(params_.size(), {0, 0});
  for (auto& members : layout) {
    Bucket bucket;
    bucket.members = members;
    int64_t total = 0;
    for (size_t m = 0; m < members.size(); ++m) {
      bucket.offsets.push_back(total);
      total += params_[members[m]].numel();
      slot_of_[members[m]] = {buckets_.size(), m};
    }
    const Tensor& first = params_[members.front()];
    bucket.flat = zeros({total}, TensorOptions{first.dtype(), first.device()});
    bucket.pending = members.size();
    buckets_.push_back(std::move(bucket));
  }
}

std::vector<std::vector<std::string>> Reducer::bucket_layout() const {
  std::vector<std::vector<std::string>> out;
  for (const Bucket& bucket : buckets_) {
    out.emplace_back();
    for (size_t index : bucket.members) out.back().push_back(names_[index]);
  }
  return out;
}

// ---- during backward ------------------------------------------------------------------------------

void Reducer::on_gradient_ready(size_t index) {
  if (!sync_) return;  // no_sync: let .grad accumulate locally
  if (!pass_active_) {
    pass_active_ = true;
    pass_start_ = Clock::now();
    std::weak_ptr<Reducer> weak = shared_from_this();
    autograd::queue_callback([weak] {
      if (auto reducer = weak.lock()) reducer->finalize();
    });
  }
  MG_CHECK(!arrived_[index], "DistributedDataParallel: parameter '", names_[index],
           "' received two gradients in one backward pass (it is used twice through a reentrant or "
           "retain_graph backward); DDP reduces each parameter once per pass");
  mark_ready(index, params_[index].grad());
}

void Reducer::mark_ready(size_t index, const Tensor& grad) {
  auto start = Clock::now();
  arrived_[index] = true;
  arrival_order_.push_back(index);
  auto [b, m] = slot_of_[index];
  Bucket& bucket = buckets_[b];
  {
    NoGradGuard no_grad;
    Tensor slot = bucket.flat.narrow(0, bucket.offsets[m], params_[index].numel());
    if (!grad.defined()) {
      slot.zero_();  // an unused parameter contributes zeros (find_unused_parameters)
    } else if (grad.data_ptr() != slot.data_ptr()) {
      slot.copy_(grad.reshape({-1}));
    }
  }
  copy_ms_this_pass_ += ms_between(start, Clock::now());
  if (--bucket.pending == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Strictly in bucket order: every rank must issue the same collectives in the same order.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_to_launch_];
    {
      // Pre-divide by the world size, once per bucket: the all-reduce's sum is then the mean.
      NoGradGuard no_grad;
      bucket.flat.mul_(1.0 / group_.size());
    }
    bucket.timing = std::make_shared<BucketTiming>();
    bucket.timing->launched = Clock::now();
    bucket.work = options_.algo == AllreduceAlgo::Ring
                      ? ring_allreduce_async(group_, bucket.flat, ReduceOp::Sum)
                      : group_.allreduce(bucket.flat, ReduceOp::Sum);
    bucket.work->then([timing = bucket.timing] {
      timing->finished_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    });
    ++next_to_launch_;
  }
}

// ---- end of backward ----------------------------------------------------------------------------

void Reducer::finalize() {
  auto backward_end = Clock::now();
  // Parameters that received no gradient keep their buckets unready.
  std::vector<size_t> missing;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!arrived_[i]) missing.push_back(i);
  if (!missing.empty()) {
    if (!options_.find_unused_parameters) {
      std::string names;
      for (size_t k = 0; k < missing.size() && k < 10; ++k) names += (k ? ", " : "") + names_[missing[k]];
      if (missing.size() > 10) names += str_cat(", ... (", missing.size(), " in all)");
      reset_pass();
      throw Error(str_cat(
          "DistributedDataParallel: these parameters received no gradient in this backward pass: ", names,
          ". Their buckets can never be all-reduced, which would hang every rank. Make every "
          "parameter take part in forward's output, or construct DDP with "
          "find_unused_parameters = true"));
    }
    for (size_t index : missing) mark_ready(index, Tensor());
  }

  // Wait for every bucket, in order, then write the averaged gradients back. On a GPU (NCCL) the
  // wait is the stream's, not the host's: the copies below and the optimizer's kernels queue
  // behind the all-reduces, and the host runs on to the next step.
  std::string error;
  for (Bucket& bucket : buckets_) {
    try {
      bucket.work->wait_on_device();
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
  }
  if (!error.empty()) {
    reset_pass();
    throw Error(str_cat("DistributedDataParallel: gradient all-reduce failed: ", error));
  }

  auto copy_start = Clock::now();
  {
    NoGradGuard no_grad;
    for (Bucket& bucket : buckets_) {
      for (size_t m = 0; m < bucket.members.size(); ++m) {
        Tensor& param = params_[bucket.members[m]];
        Tensor averaged = bucket.flat.narrow(0, bucket.offsets[m], param.numel()).view(param.shape());
        if (options_.gradient_as_bucket_view) {
          param.set_grad(averaged);  // .grad aliases the bucket: the next backward accumulates in place
        } else if (param.grad().defined()) {
          param.mutable_grad().copy_(averaged);
        } else {
          param.set_grad(averaged.clone());
        }
      }
    }
  }
  copy_ms_this_pass_ += ms_between(copy_start, Clock::now());

  // Statistics, once this pass's all-reduces have finished (at once on the CPU).
  PassRecord record;
  record.backward_end = backward_end;
  record.copy_ms = copy_ms_this_pass_;
  for (Bucket& bucket : buckets_) {
    record.buckets.emplace_back(bucket.work, bucket.timing);
    record.bytes += static_cast<int64_t>(bucket.flat.nbytes());
  }
  uncounted_.push_back(std::move(record));
  const bool first_pass = ++synchronised_passes_ == 1;
  count_finished_passes(/*wait=*/false);

  std::vector<size_t> order = arrival_order_;
  reset_pass();
  if (first_pass && options_.rebuild_buckets && !options_.gradient_as_bucket_view) {
    arrival_order_ = order;
    rebuild_from_arrival_order();
    arrival_order_.clear();
  }
}

// After the first iteration: buckets in the order gradients really arrived. All ranks must build
// identical buckets, so rank 0's order is broadcast and used everywhere.
void Reducer::rebuild_from_arrival_order() {
  Tensor order = zeros({static_cast<int64_t>(params_.size())}, TensorOptions{DType::i64});
  int64_t* data = order.data<int64_t>();
  for (size_t k = 0; k < arrival_order_.size(); ++k) data[k] = static_cast<int64_t>(arrival_order_[k]);
  group_.broadcast(order, 0)->wait();
  std::vector<size_t> new_order;
  for (size_t k = 0; k < params_.size(); ++k) new_order.push_back(static_cast<size_t>(data[k]));
  std::vector<size_t> current;
  for (const Bucket& bucket : buckets_)
    current.insert(current.end(), bucket.members.begin(), bucket.members.end());
  if (new_order != current) build_buckets(new_order);
  rebuilt_ = true;
}

// The link is busy with bucket k from max(its launch, bucket k-1 done) to its end; the exposed
// time runs from the end of backward to the last bucket's end.
void Reducer::count_finished_passes(bool wait) const {
  while (!uncounted_.empty()) {
    PassRecord& pass = uncounted_.front();
    for (auto& [work, timing] : pass.buckets) {
      if (wait) {
        try {
          work->wait();
        } catch (const std::exception&) {  // finalize() or the group reports failures
        }
      }
      if (!work->is_completed()) return;
    }
    auto finished = [](const BucketTiming& t) {
      return Clock::time_point(
          std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(t.finished_ns.load())));
    };
    double comm = 0;
    Clock::time_point link_free = pass.buckets.front().second->launched, last = link_free;
    for (auto& [work, timing] : pass.buckets) {
      const Clock::time_point begin = std::max(timing->launched, link_free), end = finished(*timing);
      if (end > begin) comm += ms_between(begin, end);
      link_free = std::max(link_free, end);
      last = std::max(last, end);
    }
    stats_.backward_passes += 1;
    stats_.comm_ms += comm;
    stats_.exposed_ms += std::max(0.0, ms_between(pass.backward_end, last));
    stats_.copy_ms += pass.copy_ms;
    stats_.bytes += pass.bytes;
    uncounted_.pop_front();
  }
}

const ReducerStats& Reducer::stats() const {
  count_finished_passes(/*wait=*/true);
  return stats_;
}

void Reducer::reset_stats() {
  count_finished_passes(/*wait=*/true);
  stats_ = ReducerStats{};
}

void Reducer::reset_pass() {
  for (Bucket& bucket : buckets_) {
    bucket.pending = bucket.members.size();
    bucket.work.reset();
  }
  arrived_.assign(params_.size(), false);
  arrival_order_.clear();
  next_to_launch_ = 0;
  pass_active_ = false;
  copy_ms_this_pass_ = 0;
}

}  // namespace mg::parallel
