// ShardedGradientReducer: ZeRO stage 2's engine -- each gradient bucket reduce-scattered while
// backward is still running, so a rank only ever keeps its 1/N shard of the gradients (DeepSpeed's
// ZeRO-2, PyTorch FSDP's SHARD_GRAD_OP; written anew beside DDP's Reducer, reducer.h).
//
// Why not reduce-scatter after backward, as ZeRO-1's ReduceScatter mode does? Because then every
// rank holds every full gradient until backward ends: the gradient memory stays P bytes. Here a
// parameter's gradient lives only from its accumulation until its copy into its bucket:
//
//   backward:   grad(fc3) grad(fc2) │ grad(fc1) │ grad(fc0) │ end of backward
//   bucket 0    [fc3 fc2]──reduce-scatter──▶ this rank's range of bucket 0 in grad_shard
//   bucket 1                          [fc1]──reduce-scatter──▶ ...
//   .grad       set to undefined as soon as it is copied into its bucket
//
// Layout: the parameters (in reverse registration order, the order backward produces them) are
// cut into buckets as DDP's (assign_buckets); bucket b's flat gradient, padded with zeros to
// N * s_b elements, is cut into N equal ranges of s_b = ceil(numel_b / N). Rank r owns range r of
// every bucket; its shard is those ranges end to end (S = sum of s_b elements, padding included,
// so uneven sizes are never lost). The optimizer steps that flat shard; all_gather_params() then
// gives every rank every bucket back, one bucket at a time.
//
// Memory per rank: the gradient shard (S elements, ~P/N) plus at most kMaxBucketsInFlight full
// bucket buffers (a third one waits for the oldest's reduce-scatter before it is filled).
// Communication per step: (N-1)/N of the padded bytes reduce-scattered, the same all-gathered.
//
// Gradient accumulation: inside set_sync(false) (ZeroRedundancyOptimizer::no_sync) the hooks do
// nothing and .grad accumulates at full size, as in DDP; the next synchronised backward reduces the
// sum. A synchronised backward while the shard holds gradients (no zero_grad between) adds to it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// What ZeRO-2's reduce-scatters did (for tests, benchmarks and the docs).
struct ZeroGradientStats {
  int64_t backward_passes = 0;  // synchronised passes so far
  // The last synchronised pass: for each bucket, how many parameters' gradients had arrived when
  // its reduce-scatter was launched (fewer than all of them: it overlapped backward).
  std::vector<int64_t> gradients_arrived_at_launch;
  int64_t peak_bucket_bytes = 0;       // the most bytes of full bucket buffers alive at once, ever
  int64_t reduce_scattered_bytes = 0;  // input bytes of every reduce-scatter so far (padded buckets)
};

class ShardedGradientReducer : public std::enable_shared_from_this<ShardedGradientReducer> {
 public:
  static constexpr size_t kMaxBucketsInFlight = 2;

  // A piece of one parameter inside one rank's shard (block_offset: where it sits in that shard).
  struct Segment {
    int64_t param;
    int64_t param_offset;
    int64_t numel;
    int64_t block_offset;
  };

  // Broadcasts the parameters from rank 0 (every rank starts equal) and hooks every parameter.
  // Use create(): the hooks hold weak pointers. A collective.
  static std::shared_ptr<ShardedGradientReducer> create(std::vector<Tensor> params, ProcessGroup group,
                                                        double bucket_cap_mb, double first_bucket_cap_mb);

  int64_t shard_numel() const { return shard_numel_; }  // S: every rank's shard, padding included
  const std::vector<std::vector<Segment>>& segments() const { return segments_; }  // by rank
  std::vector<std::vector<size_t>> bucket_members() const;  // parameter indices, bucket order

  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  // True after a synchronised backward (until zero_grad): grad_shard() holds averaged gradients.
  bool has_gradients() const { return grad_valid_; }
  const Tensor& grad_shard() const { return grad_shard_; }
  void zero_grad() { grad_valid_ = false; }

  // This rank's pieces of the parameters into `shard` (S elements; the padding is left alone).
  void copy_params_into_shard(Tensor& shard) const;
  // Every rank's updated `shard` into every rank's parameters, bucket by bucket. A collective.
  void all_gather_params(const Tensor& shard);

  const ZeroGradientStats& stats() const { return stats_; }

 private:
  struct Bucket {
    std::vector<size_t> members;
    std::vector<int64_t> offsets;  // of each member in the bucket's flat gradient
    int64_t shard_numel = 0;       // s_b: one rank's range (the flat gradient is N * s_b, padded)
    int64_t shard_offset = 0;      // where this bucket's range sits in every rank's shard
    Tensor flat;                   // the full flat gradient, alive only while the bucket is in flight
    Tensor received;               // accumulating passes: the reduce-scatter's output, added at retire
    size_t pending = 0;
    WorkPtr work;
  };

  ShardedGradientReducer(std::vector<Tensor> params, ProcessGroup group, double bucket_cap_mb,
                         double first_bucket_cap_mb);
  void install_hooks();
  void broadcast_params_from_rank0();
  void on_gradient_ready(size_t index);
  void allocate_flat(Bucket& bucket);
  void launch_ready_buckets();
  void retire(Bucket& bucket);  // waits for its reduce-scatter, then frees its full buffer
  void finalize();
  void reset_pass();

  std::vector<Tensor> params_;
  ProcessGroup group_;
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> slot_of_;  // parameter -> (bucket, member)
  std::vector<std::vector<Segment>> segments_;      // by rank
  int64_t shard_numel_ = 0;
  Tensor grad_shard_;  // S elements: this rank's averaged gradients
  bool grad_valid_ = false;
  bool accumulating_ = false;  // this pass adds to grad_shard_ (it held gradients when it began)
  bool sync_ = true;
  bool pass_active_ = false;
  std::vector<bool> arrived_;
  int64_t arrived_count_ = 0;
  size_t next_to_launch_ = 0, next_to_retire_ = 0;
  int64_t bucket_bytes_alive_ = 0;
  ZeroGradientStats stats_;
};

}  // namespace mg::parallel
