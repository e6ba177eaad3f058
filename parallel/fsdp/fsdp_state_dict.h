// FullyShardedDataParallel's checkpoints: full (consolidated) and sharded state dicts.
//
// Full: every unit's shards all-gathered, cut back into the parameters under the plain module's
// names ("fc1.weight"), plus the buffers -- exactly module.state_dict() of the unwrapped model, so
// save_safetensors of it loads into the plain module (and into PyTorch). On rank 0 by default.
//
// Sharded: each rank writes only its shards, with the layout needed to cut them again at another
// world size. For each unit (key "fsdp/<unit>/", <unit> the module path, "" for the root):
//   fsdp/<unit>/flat_shard   this rank's s elements of the padded flat buffer
//   fsdp/<unit>/layout       i64 [world size, rank, numel, s]
// plus the (replicated) buffers under their own names. Loading at world size M re-slices: new
// rank r needs flat elements [r*s', (r+1)*s') and copies them from the old shards that hold them
// (old rank k holds [k*s, (k+1)*s)); only the files that overlap are read.
//
// The optimizer (built on fsdp.parameters(): one state entry per unit's shard, e.g. AdamW's
// exp_avg and exp_avg_sq of s elements and its 0-d step) has the same two forms:
//   full     the layout one optimizer over module.parameters() of the unwrapped model saves
//            (optim/optimizer.h: state.<i>.<name>, i the plain parameter's index, param_groups.0.*):
//            each shard-shaped state all-gathered and cut at the members' offsets (the padding
//            dropped), each 0-d counter repeated per member. It loads into a plain optimizer, and
//            back into an FSDP optimizer at any world size and wrap policy.
//   sharded  fsdp/<unit>/optim_state/<name>  this rank's s elements (a 0-d counter as it is)
//            fsdp/<unit>/layout              as above (the same tensor the model's dict holds)
//            optim/param_groups.0.<name>     the hyperparameters and the step count
//            re-sliced at load as the parameters are.
// One parameter group only (a group of shards would not map onto contiguous plain indices).
#pragma once

#include <functional>
#include <string>

#include "core/state_dict.h"
#include "optim/optimizer.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"

namespace mg::parallel {

// The plain module's state dict (CPU tensors), on `rank` only (every rank when rank < 0); the
// other ranks get an empty one. A collective.
StateDict full_state_dict(const FullyShardedDataParallel& fsdp, int rank = 0);
// Every rank passes the full state dict (each reads the file): each keeps its shard of it.
// Strict: every parameter must be there with its shape. Not a collective.
void load_full_state_dict(FullyShardedDataParallel& fsdp, const StateDict& state);

// This rank's shards and layouts (CPU tensors), and the buffers. Not a collective.
StateDict sharded_state_dict(const FullyShardedDataParallel& fsdp);
// Loads this rank's shards from the sharded state dicts of any world size: shard_of(k) returns old
// rank k's (it is called only for the ranks whose shards overlap this rank's). Not a collective.
void load_sharded_state_dict(FullyShardedDataParallel& fsdp,
                             const std::function<StateDict(int old_rank)>& shard_of);

// The optimizer's state in the plain layout (CPU tensors), on `rank` only (every rank when
// rank < 0). A collective: every rank's optimizer must hold state for the same shards (it does
// when they step together); before the first step there is nothing to gather.
StateDict full_optim_state_dict(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt,
                                int rank = 0);
// Every rank passes the whole plain-layout state (full_optim_state_dict, or a plain optimizer's
// state_dict() over the unwrapped module's parameters): each keeps its shards' part, the padding
// zero. Not a collective.
void load_full_optim_state_dict(const FullyShardedDataParallel& fsdp, optim::Optimizer& opt,
                                const StateDict& state);

// This rank's optimizer state (CPU tensors) with the units' layouts. Not a collective.
StateDict sharded_optim_state_dict(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt);
// As load_sharded_state_dict, for the optimizer: shard_of(k) is old rank k's sharded optimizer
// state dict (or a dict holding it, e.g. the whole checkpoint file). Not a collective.
void load_sharded_optim_state_dict(const FullyShardedDataParallel& fsdp, optim::Optimizer& opt,
                                   const std::function<StateDict(int old_rank)>& shard_of);

// On disk: `dir`/fsdp-rank<r>-of<N>.safetensors, one file per rank (a collective: it ends with a
// barrier, so the directory is complete when it returns). Loading finds N from the file names.
// With an optimizer, its sharded state goes into the same files (and is loaded from them).
// Loading is a collective too, and the ranks agree: all load, or all throw an mg::Error naming
// every failed rank's file and reason, with the model and optimizer unchanged. A directory with
// the files of two world sizes, a stray fsdp-rank*.safetensors name, a missing or truncated rank
// file, a malformed layout or another wrap policy fails so.
void save_sharded_checkpoint(const FullyShardedDataParallel& fsdp, const std::string& dir);
void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir);
void save_sharded_checkpoint(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt,
                             const std::string& dir);
void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, optim::Optimizer& opt, const std::string& dir);

}  // namespace mg::parallel
