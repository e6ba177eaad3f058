// The practices around DistributedDataParallel that the field learned the hard way, as functions.
//
//   seed_for_rank        parameter init must be identical on every rank (DDP broadcasts it
//                        anyway), but dropout masks and augmentations must differ per rank, or
//                        N ranks train on N copies of the same noise: seed + rank for those.
//   synchronize_grad_scaler
//                        with f16 mixed precision, a rank that finds inf/NaN skips its step;
//                        if the others do not, the replicas diverge for ever. The skip decision
//                        becomes an all-reduce(max) of the found-inf flag.
//   save_checkpoint / load_checkpoint (distributed)
//                        rank 0 writes (atomically, optim/checkpoint.h) while the others wait at
//                        a barrier, so nobody reads a half-written file or races the writer;
//                        every rank then loads the same files.
#pragma once

#include <cstdint>
#include <string>

#include "nn/module.h"
#include "optim/checkpoint.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "parallel/process_group.h"
#include "parallel/zero_redundancy_optimizer.h"

namespace mg::parallel {

// A seed for rank-dependent randomness (dropout, augmentation): distinct per rank, reproducible.
inline uint64_t seed_for_rank(uint64_t seed, int rank) { return seed + static_cast<uint64_t>(rank); }

// Makes scaler.update() skip the step on every rank when any rank found inf/NaN.
void synchronize_grad_scaler(optim::GradScaler& scaler, const ProcessGroup& group);

// Rank 0 saves (optim::save_checkpoint); everyone leaves only after the files are complete.
// The RNG state saved is rank 0's; on load every rank restores it and should re-derive its own
// stream with manual_seed(seed_for_rank(...)) if it uses rank-dependent randomness.
void save_checkpoint(const ProcessGroup& group, const std::string& dir, const nn::Module& module,
                     const optim::Optimizer& optimizer, optim::CheckpointInfo info,
                     const optim::GradScaler* scaler = nullptr);

// Every rank loads the same checkpoint (after a barrier, so a save just before is complete).
optim::CheckpointInfo load_checkpoint(const ProcessGroup& group, const std::string& dir, nn::Module& module,
                                      optim::Optimizer& optimizer, optim::GradScaler* scaler = nullptr);

// With a sharded optimizer (ZeRO-1): a collective. Every rank's shard of the state goes to rank 0
// (consolidated_state_dict), which writes it in the plain optimizer's layout, so the files are
// the ones DDP + the plain optimizer would write: they load into either, at any world size. On
// load every rank reads the whole state and keeps its shard's part.
void save_checkpoint(const ProcessGroup& group, const std::string& dir, const nn::Module& module,
                     optim::ZeroRedundancyOptimizer& optimizer, optim::CheckpointInfo info,
                     const optim::GradScaler* scaler = nullptr);
optim::CheckpointInfo load_checkpoint(const ProcessGroup& group, const std::string& dir, nn::Module& module,
                                      optim::ZeroRedundancyOptimizer& optimizer,
                                      optim::GradScaler* scaler = nullptr);

}  // namespace mg::parallel
