// DistributedDataParallel: one process per device, each with a full replica of the model and
// its own slice of every global batch; gradients are averaged across processes during backward.
//
//   auto pg = parallel::init_process_group();          // mpirun -np N ./train
//   manual_seed(42);                                     // same init on every rank...
//   Net net;  net.to(pg.device());
//   parallel::DistributedDataParallel ddp(net, pg);      // ...checked, then broadcast from rank 0
//   optim::AdamWOptions adamw;
//   adamw.lr = 1e-3;
//   optim::AdamW opt(ddp.parameters(), adamw);
//   loss = nn::cross_entropy(ddp(x), y);                 // x: this rank's part of the batch
//   loss.backward();                                     // buckets all-reduce while backward runs
//   opt.step();                                          // every rank takes the same step
//
// Compared with DataParallel (one process driving N devices) nothing is replicated, scattered
// or gathered per step: the only traffic is the gradient all-reduce, 2(N−1)/N·|params| bytes per
// rank, overlapped with backward by the Reducer (reducer.h). That is why DDP wins.
//
// At construction, DDP checks that every rank holds the same parameter names, shapes and dtypes
// (a mismatch is an error naming the first difference, on every rank) and broadcasts parameters
// and buffers from rank 0, so replicas start identical even if seeds differed.
// On each forward it re-broadcasts the buffers (broadcast_buffers: BatchNorm running stats stay
// rank 0's) and, every check_replicas_every steps, compares a checksum of every parameter across
// ranks and fails naming the first divergent tensor -- the troubleshooting switch for "my ranks
// silently drifted apart".
#pragma once

#include <memory>
#include <string>

#include "nn/module.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/bucket_autotune.h"
#include "parallel/data_parallel/join.h"
#include "parallel/data_parallel/no_sync_guard.h"
#include "parallel/data_parallel/reducer.h"

namespace mg::parallel {

struct DDPOptions {
  double bucket_cap_mb = 25.0;       // PyTorch's default
  double first_bucket_cap_mb = 1.0;  // small first bucket: communication starts early
  // bucket_cap_mb = auto: at construction, time all-reduces, fit α and β and choose both caps for
  // the least predicted exposed communication (bucket_autotune.h); the caps above are then
  // replaced (options() and extra_repr() show the chosen ones, bucket_cap_choice() the fit).
  bool bucket_cap_auto = false;
  double bucket_cap_auto_backward_ms = 0;  // the model's backward duration if known; 0: assumed
  bool broadcast_buffers = true;           // buffers from rank 0 at every forward
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;        // .grad aliases the bucket (saves one copy and memory)
  AllreduceAlgo algo = AllreduceAlgo::Native;  // MPI/NCCL all-reduce, or our ring (ring_allreduce.h)
  int64_t check_replicas_every = 0;            // > 0: parameter checksum comparison every K forwards
  // The graph is the same every iteration (reducer.h, ReducerOptions::static_graph): buckets in the
  // first pass's ready order, each parameter reduced once per step even when its gradient becomes
  // ready twice (activation checkpointing), unused parameters handled without a search.
  bool static_graph = false;
};

class DistributedDataParallel : public nn::Module, public Joinable {
 public:
  // `module` must outlive DDP. Its parameters are DDP's parameters (as "module.<name>").
  DistributedDataParallel(nn::Module& module, ProcessGroup group, DDPOptions options = {});

  Tensor forward(const Tensor& x) override;
  // Any signature (nn/value.h): the same per-forward work, then module.forward_values(inputs).
  // Nothing is split -- every input is this rank's own. The gradients of every output the loss
  // uses are reduced; a parameter that fed only outputs the loss ignores got no gradient (an
  // error naming it, or zeros with find_unused_parameters).
  nn::Values forward_values(const nn::Values& inputs) override;
  nn::Module& module() const { return *module_; }
  const ProcessGroup& process_group() const { return group_; }
  const DDPOptions& options() const { return options_; }

  // Gradient accumulation: backward passes inside a no_sync scope skip the all-reduce, and the
  // first synchronised backward after it all-reduces the accumulated gradients.
  //   { auto guard = ddp.no_sync(); loss1.backward(); }   loss2.backward();   opt.step();
  using NoSyncGuard = parallel::NoSyncGuard<Reducer>;
  NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  // Communication cost so far (see ReducerStats) and the bucket layout.
  const ReducerStats& stats() const { return reducer_->stats(); }
  void reset_stats() { reducer_->reset_stats(); }
  std::vector<std::vector<std::string>> bucket_layout() const { return reducer_->bucket_layout(); }
  int64_t bucket_bytes() const { return reducer_->bucket_bytes(); }  // the persistent buckets
  bool buckets_rebuilt() const { return reducer_->buckets_rebuilt(); }

  // Communication hook (comm_hooks.h, PyTorch's register_comm_hook): each ready bucket goes to
  // hook(*state, bucket), which returns the future of the averaged bucket. Before the first
  // backward, at most once, on every rank alike.
  //   ddp.register_comm_hook(std::make_shared<ProcessGroup>(pg), fp16_compress_hook);
  //   ddp.register_comm_hook(std::make_shared<PowerSGDState>(pg, powersgd), powersgd_hook);
  template <class State, class Hook>
  void register_comm_hook(std::shared_ptr<State> state, Hook hook) {
    reducer_->register_comm_hook([state = std::move(state), hook = std::move(hook)](GradBucket& bucket) {
      return hook(*state, bucket);
    });
  }
  void register_comm_hook(CommHook hook) { reducer_->register_comm_hook(std::move(hook)); }

  // Compares every parameter across ranks now; throws naming the first that differs.
  void check_replicas() const;

  // With bucket_cap_auto: the measured link, the assumption and the chosen caps.
  const BucketCapChoice& bucket_cap_choice() const { return bucket_cap_choice_; }

  std::string extra_repr() const override;

  // Joinable (join.h): a joined rank shadows the buffer broadcast and the gradient buckets; when
  // all have joined, the model is broadcast from a last joiner.
  std::unique_ptr<JoinHook> join_hook(const JoinHookOptions& options) override;
  ProcessGroup join_process_group() const override { return group_; }

 private:
  friend class DDPJoinHook;
  void prepare_forward();  // buffers from rank 0, the replica check: before every forward
  void verify_same_parameters_everywhere() const;
  void broadcast_state(bool parameters, bool buffers, int root = 0);

  nn::Module* module_;
  ProcessGroup group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
  BucketCapChoice bucket_cap_choice_;
  int64_t forward_count_ = 0;
  bool divide_by_initial_world_size_ = true;  // set by a Join's hook options
};

}  // namespace mg::parallel
