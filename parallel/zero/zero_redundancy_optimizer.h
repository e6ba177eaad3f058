// ZeroRedundancyOptimizer: ZeRO stage 1 -- the optimizer state is sharded across the ranks
// instead of replicated (PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer) -- and, with
// options.stage = ZeroStage::Gradients, stage 2: the gradients sharded too, reduce-scattered bucket
// by bucket during backward (zero2.h; the model is then not wrapped in DDP):
//
//   parallel::ZeroOptions options;
//   options.stage = parallel::ZeroStage::Gradients;       // the one switch from ZeRO-1 to ZeRO-2
//   parallel::ZeroRedundancyOptimizer opt(net.parameters(), pg, make_adamw, options);
//   loss.backward();  opt.step();  opt.zero_grad();       // backward reduce-scatters, step all-gathers
//
// With plain DDP every rank holds the whole optimizer state: AdamW keeps two moments per
// parameter, so 2x the model's bytes on every rank, all of it updated redundantly. Here each
// rank owns the state of ~1/N of the parameters and updates only those:
//
//            rank 0                 rank 1                 rank 2
//   params   [ A B C D E F ]        [ A B C D E F ]        [ A B C D E F ]   (full replicas)
//   state    [ A . . D . . ]        [ . B . . E . ]        [ . . C . . F ]   (1/N each)
//
//   step:  gradients   all-reduced by DDP (AllReduced)       every rank has all of them
//                   or reduce-scattered here (ReduceScatter)  each rank gets its shard's only
//          update      the wrapped optimizer on this rank's shard
//          all-gather  every rank's updated shard -> every rank's full parameters
//
// Two ways to cut the parameters into shards (ZeroPartition):
//   Parameters  (PyTorch's, the default) whole parameters, balanced by size: largest first, each to
//               the rank holding the fewest elements so far (ties: the lower rank). The wrapped
//               optimizer updates the real parameters. One big tensor unbalances it: an MLP
//               784-256-128-10 at N = 2 puts 85 % of the elements (the 784x256 weight) on rank 0.
//   Flat        (DeepSpeed's) the parameters laid end to end, cut into N equal ranges: exactly 1/N
//               of the state per rank. The wrapped optimizer updates one flat tensor of this
//               rank's range; its values are copied out of and back into the parameters each
//               step. Every parameter must have a gradient at every step (a flat range cannot
//               skip a piece of itself): a missing one is an error naming it.
// Communication per step,
// per rank, for P parameter bytes: AllReduced = DDP's all-reduce 2(N-1)/N P + the all-gather
// (N-1)/N P; ReduceScatter (no DDP) = (N-1)/N P + (N-1)/N P, the same as one all-reduce. Memory:
// the optimizer state is 1/N of plain DDP's (state_bytes() reports this rank's).
//
// The result equals plain DDP + the wrapped optimizer (same gradients, same update rule; only
// where each update is computed changes), which tests/parallel/zero/test_zero.cpp checks for SGD with
// momentum and AdamW, in both partitions. Limits: one parameter group; every parameter of one
// dtype and device; with Flat, optimizers whose update is elementwise (SGD, Adam, AdamW: all of
// multigrad's), since a flat range mixes pieces of several parameters.
//
//   auto pg = parallel::init_process_group();
//   parallel::DistributedDataParallel ddp(net, pg);
//   parallel::ZeroRedundancyOptimizer opt(ddp.parameters(), pg, [](std::vector<Tensor> shard) {
//     optim::AdamWOptions adamw;
//     adamw.lr = 1e-3;
//     return std::make_unique<optim::AdamW>(shard, adamw);
//   });
//   loss.backward();  opt.step();  opt.zero_grad();
//   optim::CosineAnnealingLR schedule(opt.local_optimizer(), cosine);  // schedulers: the wrapped one
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/state_dict.h"
#include "core/tensor.h"
#include "optim/optimizer.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/no_sync_guard.h"
#include "parallel/zero/zero2.h"

namespace mg::parallel {

// How much is sharded (DeepSpeed's "stage"): OptimizerState (ZeRO-1) only the optimizer's state;
// Gradients (ZeRO-2) the gradients too, reduce-scattered bucket by bucket during backward (zero2.h).
// With Gradients, `gradients` and `partition` are not read: the engine reduces the local gradients
// itself (do not wrap the model in DDP) into a flat, padded layout per bucket.
enum class ZeroStage { OptimizerState = 1, Gradients = 2 };

enum class ZeroGradients {
  AllReduced,    // the gradients are already averaged over the ranks (DDP ran the all-reduce)
  ReduceScatter  // local gradients: step() reduce-scatters (averages) them, each rank gets its shard's
};

enum class ZeroPartition {
  Parameters,  // whole parameters, balanced by size (PyTorch)
  Flat         // equal ranges of the flattened parameters (DeepSpeed)
};

struct ZeroOptions {
  ZeroStage stage = ZeroStage::OptimizerState;
  ZeroGradients gradients = ZeroGradients::AllReduced;  // ZeRO-1 only
  ZeroPartition partition = ZeroPartition::Parameters;  // ZeRO-1 only
  double bucket_cap_mb = 25.0;                          // ZeRO-2: the gradient buckets, as DDP's
  double first_bucket_cap_mb = 1.0;
};

// Builds the wrapped optimizer over one rank's shard (called once, with that rank's parameters).
using OptimizerFactory = std::function<std::unique_ptr<optim::Optimizer>(std::vector<Tensor> shard)>;

class ZeroRedundancyOptimizer {
 public:
  // `params`: the whole model's parameters, in the same order on every rank (e.g. ddp.parameters()).
  ZeroRedundancyOptimizer(std::vector<Tensor> params, ProcessGroup group,
                          const OptimizerFactory& make_optimizer, ZeroOptions options = {});

  // The update: (reduce-scatter,) the wrapped optimizer's step on this rank's shard, all-gather.
  // A collective: every rank calls it.
  void step();
  // Every parameter's gradient (not only the shard's) to undefined, as Optimizer::zero_grad.
  void zero_grad();

  // ZeRO-2 gradient accumulation: backward passes inside the scope leave .grad to accumulate
  // locally (full size, as DDP's no_sync); the next synchronised backward reduce-scatters the sum.
  //   { auto guard = opt.no_sync(); loss1.backward(); }   loss2.backward();   opt.step();
  using NoSyncGuard = parallel::NoSyncGuard<ShardedGradientReducer>;
  NoSyncGuard no_sync();
  // ZeRO-2's engine (buckets, the gradient shard, statistics); nullptr at stage 1.
  const ShardedGradientReducer* gradient_reducer() const { return gradient_reducer_.get(); }

  // The optimizer over this rank's shard: hyperparameters live here (LR schedulers take it).
  optim::Optimizer& local_optimizer() { return *local_; }
  const std::vector<Tensor>& params() const { return params_; }
  // The parameter indices whose state rank `rank` holds (all of it, or with Flat a piece), ascending.
  std::vector<int64_t> shard(int rank) const;
  // Elements of the parameters whose state rank `rank` holds.
  int64_t shard_numel(int rank) const;
  // Bytes of optimizer state this rank holds (momentum buffers, moments, step counters).
  int64_t state_bytes() const;

  // The whole optimizer's state in the layout one optimizer over all `params` would save
  // (optim/optimizer.h: state.<index>.<name>, param_groups.0.*), so it loads into a plain
  // optimizer, or into a ZeroRedundancyOptimizer at any world size. A collective: every rank
  // sends its shard's state to `to`, which returns the whole; the other ranks return {}.
  StateDict consolidated_state_dict(int to = 0);
  // Loads a whole state (consolidated_state_dict, or a plain optimizer's state_dict over the same
  // parameters): each rank keeps its shard's part. Every rank passes the whole state.
  void load_state_dict(const StateDict& state);

 private:
  // A piece of one parameter in one rank's block: the unit every copy below moves.
  struct Segment {
    int64_t param;         // index into params_
    int64_t param_offset;  // first element of the piece within the (flattened) parameter
    int64_t numel;
    int64_t block_offset;  // where the piece sits in its rank's block
  };
  Tensor flat(int64_t param) const { return params_[static_cast<size_t>(param)].reshape({-1}); }
  StateDict consolidate_flat(const std::vector<std::string>& parts) const;

  std::vector<Tensor> params_;
  ProcessGroup group_;
  ZeroOptions options_;
  std::vector<std::vector<Segment>> segments_;  // by rank, in block order
  int64_t block_numel_ = 0;                     // every rank's block (the largest shard, padded)
  Tensor flat_shard_;                           // Flat: the leaf the wrapped optimizer updates
  // step()'s communication buffers, allocated at the first step: the reduce-scatter's input (every
  // rank's block), this rank's block to all-gather, and the all-gathered blocks.
  Tensor reduce_input_, send_block_, gathered_;
  std::unique_ptr<optim::Optimizer> local_;
  std::shared_ptr<ShardedGradientReducer> gradient_reducer_;  // ZeRO-2
};

}  // namespace mg::parallel
