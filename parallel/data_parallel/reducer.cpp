// Reducer: bucketed gradient all-reduce overlapped with backward (see reducer.h for the picture) --
// the plain step; static_graph, unused parameters, the first pass's rebuild and Join are in
// reducer_variants.cpp.
#include "parallel/data_parallel/reducer.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "parallel/comm/flight_recorder.h"
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

int64_t bucket_cap_bytes(double megabytes, const char* what) {
  MG_CHECK(std::isfinite(megabytes) && megabytes > 0 && megabytes <= 1048576, what,
           " must be a finite number of MB in (0, 1048576], got ", megabytes);
  return static_cast<int64_t>(megabytes * 1024 * 1024);
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
  arrivals_.assign(params_.size(), 0);
  last_arrival_.assign(params_.size(), 0);
  expected_arrivals_.assign(params_.size(), 1);
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
  auto layout = assign_buckets(order, bytes, dtypes,
                               bucket_cap_bytes(options_.first_bucket_cap_mb, "first_bucket_cap_mb"),
                               bucket_cap_bytes(options_.bucket_cap_mb, "bucket_cap_mb"));

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

int64_t Reducer::bucket_bytes() const {
  int64_t bytes = 0;
  for (const Bucket& bucket : buckets_)
    if (bucket.flat.defined()) bytes += static_cast<int64_t>(bucket.flat.nbytes());
  return bytes;
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
    if (static_recorded_) {
      // static_graph: the first pass's unused parameters contribute zeros from the start, so
      // their buckets need not wait for the end of backward.
      for (size_t i = 0; i < params_.size(); ++i)
        if (expected_arrivals_[i] == 0) mark_ready(i, Tensor());
    }
  }
  if (options_.static_graph) {
    on_static_graph_arrival(index);
    return;
  }
  if (arrived_[index]) {
    const std::string name = names_[index];
    reset_pass();
    throw Error(
        str_cat("DistributedDataParallel: parameter '", name,
                "' became ready twice in one backward pass (its gradient hook fired again: it is used "
                "both inside and outside an activation-checkpointed block, or through a reentrant or "
                "retain_graph backward); DDP reduces each parameter once per pass. If the graph is "
                "the same every iteration, construct DDP with static_graph = true"));
  }
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
    bucket.timing = std::make_shared<BucketTiming>();
    bucket.timing->launched = Clock::now();
    bucket.future = launch_bucket(next_to_launch_);
    ++next_to_launch_;
  }
}

// ---- end of backward ----------------------------------------------------------------------------

// Waits for every bucket in order (each wait is tried even after one fails, so no collective is
// left pending) and returns the first failure's message, empty when all succeeded.
std::string Reducer::wait_for_all_buckets() {
  std::string error;
  for (Bucket& bucket : buckets_) {
    try {
      wait_for_bucket(bucket);
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
  }
  return error;
}

// The end of a synchronised backward pass (the autograd engine's callback), in four steps: every
// parameter accounted for, every bucket waited for, the averaged gradients written back, the
// pass's statistics recorded. Only the first step and the last lines differ from the plain
// path under static_graph or with unused parameters (reducer_variants.cpp).
void Reducer::finalize() {
  const auto backward_end = Clock::now();
  const bool recording_static_graph = options_.static_graph && !static_recorded_;
  if (recording_static_graph) ready_first_static_pass();
  const std::string missing_names = ready_missing_parameters();

  // Wait for every bucket, in order, then write the averaged gradients back. On a GPU (NCCL) the
  // wait is the stream's, not the host's: the copies below and the optimizer's kernels queue
  // behind the all-reduces, and the host runs on to the next step.
  const std::string error = wait_for_all_buckets();
  if (!error.empty() || !missing_names.empty()) fail_pass(missing_names, error);
  write_back_gradients();
  record_pass(backward_end);

  const bool first_pass = !first_pass_done_;
  first_pass_done_ = true;
  const std::vector<size_t> order = recording_static_graph ? static_graph_order() : arrival_order_;
  const std::vector<int> arrivals = arrivals_;
  reset_pass();
  if (first_pass) after_first_pass(order, arrivals, /*counts_known=*/true);
}

// Each bucket's average into its members' .grad (or, with gradient_as_bucket_view, .grad made a
// view of the bucket: no second copy).
void Reducer::write_back_gradients() {
  const auto copy_start = Clock::now();
  {
    NoGradGuard no_grad;
    if (gradient_divisor_ > 0 && gradient_divisor_ != group_.size()) {
      // Join without divide_by_initial_world_size: the sum over the ranks still active, divided
      // by their number (the buckets hold sum / world).
      for (Bucket& bucket : buckets_)
        bucket.flat.mul_(static_cast<double>(group_.size()) / gradient_divisor_);
    }
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
}

// The pass's statistics, counted once its all-reduces have finished (at once on the CPU).
void Reducer::record_pass(Clock::time_point backward_end) {
  PassRecord record;
  record.backward_end = backward_end;
  record.copy_ms = copy_ms_this_pass_;
  for (Bucket& bucket : buckets_) {
    record.buckets.emplace_back(bucket.work, bucket.timing);
    record.bytes += bucket.future.bytes();
  }
  uncounted_.push_back(std::move(record));
  ++synchronised_passes_;
  count_finished_passes(/*wait=*/false);
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
    bucket.future = BucketFuture();
  }
  arrived_.assign(params_.size(), false);
  arrivals_.assign(params_.size(), 0);
  last_arrival_.assign(params_.size(), 0);
  arrival_seq_ = 0;
  arrival_order_.clear();
  next_to_launch_ = 0;
  pass_active_ = false;
  copy_ms_this_pass_ = 0;
}

// ---- communication hooks ----------------------------------------------------------------------

void Reducer::register_comm_hook(CommHook hook) {
  MG_CHECK(hook != nullptr, "DistributedDataParallel::register_comm_hook: the hook is empty");
  MG_CHECK(!comm_hook_,
           "DistributedDataParallel::register_comm_hook: a communication hook is already "
           "registered (at most one, as in PyTorch)");
  MG_CHECK(synchronised_passes_ == 0 && !pass_active_,
           "DistributedDataParallel::register_comm_hook: register the hook before the first backward pass "
           "(every rank must reduce every bucket the same way from the start)");
  MG_CHECK(options_.algo == AllreduceAlgo::Native,
           "DistributedDataParallel::register_comm_hook: the hook decides how buckets are reduced; "
           "construct DDP with algo = Native (the ring is not used with a hook)");
  comm_hook_ = std::move(hook);
}

BucketFuture Reducer::launch_bucket(size_t index) {
  CollectiveCaller caller(str_cat("Reducer bucket ", index));  // names its collectives in the flight recorder
  Bucket& bucket = buckets_[index];
  BucketFuture future;
  if (comm_hook_) {
    GradBucket view;
    view.index = index;
    view.is_last = index + 1 == buckets_.size();
    view.buffer = bucket.flat;
    view.offsets = bucket.offsets;
    for (size_t member : bucket.members) view.parameters.push_back(params_[member]);
    future = comm_hook_(view);
    MG_CHECK(future.defined(),
             "DistributedDataParallel: the communication hook returned an empty future "
             "for bucket ",
             index);
  } else {
    {
      // Pre-divide by the world size, once per bucket: the all-reduce's sum is then the mean.
      NoGradGuard no_grad;
      bucket.flat.mul_(1.0 / group_.size());
    }
    WorkPtr work = options_.algo == AllreduceAlgo::Ring
                       ? ring_allreduce_async(group_, bucket.flat, ReduceOp::Sum)
                       : group_.allreduce(bucket.flat, ReduceOp::Sum);
    future = BucketFuture::after({work}, bucket.flat, static_cast<int64_t>(bucket.flat.nbytes()));
  }
  // The bucket's communication ends when its last collective so far does (wait_for_bucket
  // re-times it if continuations launch more).
  bucket.work =
      future.works().empty() ? completed_work("communication hook (no collective)") : future.works().back();
  bucket.work->then([timing = bucket.timing] {
    timing->finished_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  });
  return future;
}

void Reducer::wait_for_bucket(Bucket& bucket) {
  Tensor averaged = bucket.future.wait();
  if (!bucket.future.works().empty() && bucket.future.works().back() != bucket.work) {
    bucket.work = bucket.future.works().back();  // a continuation launched more collectives
    bucket.timing->finished_ns = 0;
    bucket.work->then([timing = bucket.timing] {
      timing->finished_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
    });
  }
  if (averaged.data_ptr() == bucket.flat.data_ptr() && averaged.numel() == bucket.flat.numel()) return;
  MG_CHECK(averaged.numel() == bucket.flat.numel() && averaged.device() == bucket.flat.device(),
           "DistributedDataParallel: the communication hook's result has ", averaged.numel(), " elements on ",
           averaged.device(), "; the bucket has ", bucket.flat.numel(), " on ", bucket.flat.device());
  NoGradGuard no_grad;
  bucket.flat.copy_(averaged.reshape({-1}));
}

}  // namespace mg::parallel
