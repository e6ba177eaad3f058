// Join: training on uneven inputs (PyTorch's torch.distributed.algorithms.Join, written anew).
//
// Why? DDP's every step is a set of collectives all ranks must call. A rank whose shard has
// fewer batches leaves the loop early and the others hang in their next gradient all-reduce.
// Padding or dropping samples hides the problem; Join solves it: a rank that runs out of batches
// *joins* and, until every rank has, answers the others' collectives with zeros.
//
//   {
//     parallel::Join join({&ddp});                  // enable, throw_on_early_termination = false
//     for (auto& batch : my_uneven_shard) { loss = ...ddp(x)...; loss.backward(); opt.step(); }
//   }                                               // the destructor (or join.finish()) joins
//
// Per round (one training iteration of the ranks still active):
//   active rank   forward: notification all-reduce ─▶ buffer broadcast ─▶ ... backward: buckets
//   joined rank   join loop: notification all-reduce ─▶ buffer broadcast ─▶ zero buckets (same
//                 layout, same order, through the same launch path and comm hook)
// The notification is an i64 all-reduce of [1 at my rank if I still train ..., ranks that will
// run a synchronised backward]: everyone learns who is still active. When nobody is, every rank
// leaves the loop, and DDP's post hook broadcasts the model from a last joiner (joined ranks
// stopped stepping; now every replica is the final model again).
//
// Gradients: with divide_by_initial_world_size (default) the active ranks' sum is divided by the
// initial world size (joined ranks count as zero gradients); without it, by the number of ranks
// active in that step (each step is the mean of the samples actually seen).
//
// throw_on_early_termination: the first rank to run out makes every rank throw an error naming
// it, in that round's notification, instead of shadowing.
//
// A collective Join does not shadow (a user's all-reduce while a rank has joined) meets the
// joined rank's notification: with verify_collectives (the default) both fail at once and the
// mismatch message names the joined rank and Join (process_group_signature.h), instead of a hang.
#pragma once

#include <memory>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mg::parallel {

// One round's notification, as every rank sees it.
struct JoinRound {
  std::vector<bool> active;  // per rank: still training this round
  int active_count = 0;
  int sync_count = 0;     // active ranks that will run a synchronised backward this round
  int first_active = -1;  // lowest active rank (the buffer broadcast's root), -1 if none
  bool someone_joined() const { return active_count < static_cast<int>(active.size()); }
};

// PyTorch's join_hook(**kwargs), for DDP.
struct JoinHookOptions {
  bool divide_by_initial_world_size = true;
};

// What a joined rank does for one joinable.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Once per round while some rank still trains: shadow the collectives of its iteration.
  virtual void main_hook(const JoinRound& /*round*/) {}
  // After every rank has joined; is_last_joiner: this rank was active in the last active round.
  virtual void post_hook(bool /*is_last_joiner*/) {}
};

struct JoinState;

// A class whose per-iteration collectives Join can shadow (DistributedDataParallel).
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual std::unique_ptr<JoinHook> join_hook(const JoinHookOptions& options) = 0;
  virtual ProcessGroup join_process_group() const = 0;

 protected:
  // Called at the start of every training iteration (DDP: every forward). Inside an enabled Join
  // it returns this round's notification (the first joinable all-reduces it, throwing when
  // throw_on_early_termination and a rank has run out); outside one, nullptr.
  const JoinRound* notify_join_context(bool will_sync_backward);

 private:
  friend class Join;
  std::shared_ptr<JoinState> join_state_;
};

class Join {
 public:
  // Every joinable must use the same process group; each must outlive the Join.
  explicit Join(std::vector<Joinable*> joinables, bool enable = true, bool throw_on_early_termination = false,
                JoinHookOptions hook_options = {});
  // Joins (finish()) unless already done or an exception is unwinding through the scope.
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank has no more inputs: shadow the others until every rank has joined, then run the
  // post hooks. Throws with throw_on_early_termination when this rank ran out before another.
  void finish();

 private:
  std::vector<Joinable*> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  std::shared_ptr<JoinState> state_;
  int uncaught_at_start_ = 0;
  bool finished_ = false;
};

}  // namespace mg::parallel
