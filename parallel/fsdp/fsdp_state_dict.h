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
#pragma once

#include <functional>
#include <string>

#include "core/state_dict.h"
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

// On disk: `dir`/fsdp-rank<r>-of<N>.safetensors, one file per rank (a collective: it ends with a
// barrier, so the directory is complete when it returns). Loading finds N from the file names.
void save_sharded_checkpoint(const FullyShardedDataParallel& fsdp, const std::string& dir);
void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir);

}  // namespace mg::parallel
