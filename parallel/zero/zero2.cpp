// ShardedGradientReducer: ZeRO-2's bucketed reduce-scatter during backward (see zero2.h).
#include "parallel/zero/zero2.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "parallel/data_parallel/reducer.h"

namespace mg::parallel {

std::shared_ptr<ShardedGradientReducer> ShardedGradientReducer::create(std::vector<Tensor> params,
                                                                       ProcessGroup group,
                                                                       double bucket_cap_mb,
                                                                       double first_bucket_cap_mb) {
  std::shared_ptr<ShardedGradientReducer> reducer(
      new ShardedGradientReducer(std::move(params), std::move(group), bucket_cap_mb, first_bucket_cap_mb));
  reducer->broadcast_params_from_rank0();
  reducer->install_hooks();
  return reducer;
}

ShardedGradientReducer::ShardedGradientReducer(std::vector<Tensor> params, ProcessGroup group,
                                               double bucket_cap_mb, double first_bucket_cap_mb)
    : params_(std::move(params)), group_(std::move(group)) {
  MG_CHECK(bucket_cap_mb > 0 && first_bucket_cap_mb > 0,
           "ZeRO-2: bucket caps must be positive, got bucket_cap_mb=", bucket_cap_mb,
           " first_bucket_cap_mb=", first_bucket_cap_mb);
  const int world = group_.size();
  std::vector<int64_t> bytes;
  std::vector<DType> dtypes;
  std::vector<size_t> order;
  for (size_t i = 0; i < params_.size(); ++i) {
    MG_CHECK(params_[i].requires_grad() && params_[i].is_leaf(), "ZeRO-2: parameter ", i,
             " is not a leaf that requires grad; its gradient could not be reduce-scattered");
    bytes.push_back(static_cast<int64_t>(params_[i].nbytes()));
    dtypes.push_back(params_[i].dtype());
    order.push_back(params_.size() - 1 - i);  // backward produces gradients last layer first
  }
  slot_of_.assign(params_.size(), {0, 0});
  segments_.assign(static_cast<size_t>(world), {});
  for (auto& members : assign_buckets(order, bytes, dtypes,
                                      bucket_cap_bytes(first_bucket_cap_mb, "ZeRO-2: first_bucket_cap_mb"),
                                      bucket_cap_bytes(bucket_cap_mb, "ZeRO-2: bucket_cap_mb"))) {
    Bucket bucket;
    bucket.members = members;
    int64_t total = 0;
    for (size_t m = 0; m < members.size(); ++m) {
      bucket.offsets.push_back(total);
      slot_of_[members[m]] = {buckets_.size(), m};
      total += params_[members[m]].numel();
    }
    bucket.shard_numel = std::max<int64_t>(1, (total + world - 1) / world);
    bucket.shard_offset = shard_numel_;
    // Each member cut at the ranks' range boundaries: the pieces every rank's shard holds.
    for (size_t m = 0; m < members.size(); ++m) {
      const int64_t start = bucket.offsets[m], end = start + params_[members[m]].numel();
      for (int64_t at = start; at < end;) {
        const int64_t r = at / bucket.shard_numel;
        const int64_t piece_end = std::min(end, (r + 1) * bucket.shard_numel);
        segments_[static_cast<size_t>(r)].push_back(Segment{static_cast<int64_t>(members[m]), at - start,
                                                            piece_end - at,
                                                            shard_numel_ + at - r * bucket.shard_numel});
        at = piece_end;
      }
    }
    shard_numel_ += bucket.shard_numel;
    bucket.pending = members.size();
    buckets_.push_back(std::move(bucket));
  }
  arrived_.assign(params_.size(), false);
  stats_.gradients_arrived_at_launch.assign(buckets_.size(), 0);
}

void ShardedGradientReducer::broadcast_params_from_rank0() {
  if (group_.size() == 1) return;
  NoGradGuard no_grad;
  int64_t total = 0;
  for (const Tensor& p : params_) total += p.numel();
  Tensor flat = empty({total}, TensorOptions{params_[0].dtype(), params_[0].device()});
  int64_t at = 0;
  for (const Tensor& p : params_) {
    flat.narrow(0, at, p.numel()).copy_(p.reshape({-1}));
    at += p.numel();
  }
  group_.broadcast(flat, 0)->wait();
  at = 0;
  for (Tensor& p : params_) {
    p.copy_(flat.narrow(0, at, p.numel()).view(p.shape()));
    at += p.numel();
  }
}

void ShardedGradientReducer::install_hooks() {
  std::weak_ptr<ShardedGradientReducer> weak = shared_from_this();
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].register_post_accumulate_grad_hook([weak, i](const Tensor&) {
      if (auto reducer = weak.lock()) reducer->on_gradient_ready(i);
    });
  }
}

std::vector<std::vector<size_t>> ShardedGradientReducer::bucket_members() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& bucket : buckets_) out.push_back(bucket.members);
  return out;
}

// ---- during backward ------------------------------------------------------------------------------

void ShardedGradientReducer::on_gradient_ready(size_t index) {
  if (!sync_) return;  // no_sync: .grad accumulates locally at full size
  if (!pass_active_) {
    pass_active_ = true;
    accumulating_ = grad_valid_;
    std::weak_ptr<ShardedGradientReducer> weak = shared_from_this();
    autograd::queue_callback([weak] {
      if (auto reducer = weak.lock()) reducer->finalize();
    });
  }
  auto [b, m] = slot_of_[index];
  Bucket& bucket = buckets_[b];
  MG_CHECK(!arrived_[index] && b >= next_to_launch_, "ZeRO-2: parameter ", index,
           " received two gradients in one backward pass (used through a reentrant or retain_graph "
           "backward); its bucket was already reduce-scattered");
  arrived_[index] = true;
  ++arrived_count_;
  // The oldest buckets' reduce-scatters finish before another full buffer is allocated.
  while (next_to_launch_ - next_to_retire_ >= kMaxBucketsInFlight && !bucket.flat.defined())
    retire(buckets_[next_to_retire_]);
  if (!bucket.flat.defined()) allocate_flat(bucket);
  Tensor& param = params_[index];
  {
    NoGradGuard no_grad;
    bucket.flat.narrow(0, bucket.offsets[m], param.numel()).copy_(param.grad().reshape({-1}));
  }
  param.set_grad(Tensor());  // the full gradient is freed: this rank keeps only its shard
  if (--bucket.pending == 0) launch_ready_buckets();
}

void ShardedGradientReducer::allocate_flat(Bucket& bucket) {
  const Tensor& first = params_[bucket.members.front()];
  bucket.flat = zeros({group_.size() * bucket.shard_numel}, TensorOptions{first.dtype(), first.device()});
  bucket_bytes_alive_ += static_cast<int64_t>(bucket.flat.nbytes());
  stats_.peak_bucket_bytes = std::max(stats_.peak_bucket_bytes, bucket_bytes_alive_);
}

void ShardedGradientReducer::launch_ready_buckets() {
  // Strictly in bucket order: every rank must issue the same collectives in the same order.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    Bucket& bucket = buckets_[next_to_launch_];
    if (!grad_shard_.defined())
      grad_shard_ = empty({shard_numel_}, TensorOptions{bucket.flat.dtype(), bucket.flat.device()});
    Tensor out = grad_shard_.narrow(0, bucket.shard_offset, bucket.shard_numel);
    if (accumulating_) {
      bucket.received = empty({bucket.shard_numel}, TensorOptions{bucket.flat.dtype(), bucket.flat.device()});
      out = bucket.received;
    }
    bucket.work = group_.reduce_scatter(out, bucket.flat, ReduceOp::Avg);
    stats_.gradients_arrived_at_launch[next_to_launch_] = arrived_count_;
    stats_.reduce_scattered_bytes += static_cast<int64_t>(bucket.flat.nbytes());
    ++next_to_launch_;
  }
}

void ShardedGradientReducer::retire(Bucket& bucket) {
  // On a GPU the wait orders this thread's stream after the collective: the add below and any
  // later reuse of the freed block queue behind it.
  bucket.work->wait_on_device();
  if (bucket.received.defined()) {
    NoGradGuard no_grad;
    grad_shard_.narrow(0, bucket.shard_offset, bucket.shard_numel).add_(bucket.received);
    bucket.received = Tensor();
  }
  bucket_bytes_alive_ -= static_cast<int64_t>(bucket.flat.nbytes());
  bucket.flat = Tensor();
  bucket.work.reset();
  ++next_to_retire_;
}

// ---- end of backward ----------------------------------------------------------------------------

void ShardedGradientReducer::finalize() {
  // A parameter that got no gradient contributes zeros (its slot was zeroed with the buffer), so
  // every rank still issues every bucket's reduce-scatter, in order.
  std::string error;
  try {
    for (Bucket& bucket : buckets_) {
      if (bucket.pending == 0) continue;
      while (next_to_launch_ - next_to_retire_ >= kMaxBucketsInFlight && !bucket.flat.defined())
        retire(buckets_[next_to_retire_]);
      if (!bucket.flat.defined()) allocate_flat(bucket);
      bucket.pending = 0;
      launch_ready_buckets();
    }
    while (next_to_retire_ < next_to_launch_) retire(buckets_[next_to_retire_]);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!error.empty()) {
    reset_pass();
    throw Error(str_cat("ZeRO-2: gradient reduce-scatter failed: ", error));
  }
  grad_valid_ = true;
  stats_.backward_passes += 1;
  reset_pass();
}

void ShardedGradientReducer::reset_pass() {
  for (Bucket& bucket : buckets_) {
    if (bucket.flat.defined()) bucket_bytes_alive_ -= static_cast<int64_t>(bucket.flat.nbytes());
    bucket.flat = Tensor();
    bucket.received = Tensor();
    bucket.work.reset();
    bucket.pending = bucket.members.size();
  }
  arrived_.assign(params_.size(), false);
  arrived_count_ = 0;
  next_to_launch_ = next_to_retire_ = 0;
  pass_active_ = false;
}

// ---- the optimizer step's side ------------------------------------------------------------------

void ShardedGradientReducer::copy_params_into_shard(Tensor& shard) const {
  NoGradGuard no_grad;
  for (const Segment& s : segments_[static_cast<size_t>(group_.rank())])
    shard.narrow(0, s.block_offset, s.numel)
        .copy_(params_[static_cast<size_t>(s.param)].reshape({-1}).narrow(0, s.param_offset, s.numel));
}

void ShardedGradientReducer::all_gather_params(const Tensor& shard) {
  NoGradGuard no_grad;
  // One bucket at a time, the next one's all-gather posted before this one's copies: at most two
  // full buckets of parameters in flight, never the whole model.
  auto launch = [&](size_t b, Tensor& gathered) {
    const Bucket& bucket = buckets_[b];
    gathered = empty({group_.size() * bucket.shard_numel}, TensorOptions{shard.dtype(), shard.device()});
    return group_.allgather(gathered, shard.narrow(0, bucket.shard_offset, bucket.shard_numel));
  };
  Tensor current, next;
  WorkPtr work = launch(0, current);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    WorkPtr next_work = b + 1 < buckets_.size() ? launch(b + 1, next) : nullptr;
    work->wait_on_device();
    const Bucket& bucket = buckets_[b];  // the gathered blocks, end to end, are the bucket's flat values
    for (size_t m = 0; m < bucket.members.size(); ++m) {
      Tensor& param = params_[bucket.members[m]];
      param.reshape({-1}).copy_(current.narrow(0, bucket.offsets[m], param.numel()));
    }
    current = next;
    next = Tensor();
    work = next_work;
  }
}

}  // namespace mg::parallel
