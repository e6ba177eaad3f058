// The practices around DistributedDataParallel that the field learned the hard way, as functions.
//
//   seed_for_rank        parameter init must be identical on every rank (DDP broadcasts it
//                        anyway), but dropout masks and augmentations must differ per rank, or
//                        N ranks train on N copies of the same noise: seed + rank for those.
//   synchronize_grad_scaler
//                        with f16 mixed precision, a rank that finds inf/NaN skips its step;
//                        if the others do not, the replicas diverge for ever. The skip decision
//                        becomes an all-reduce(max) of the found-inf flag.
//
// Checkpoints: parallel/resilience/checkpoint_manager.h (every rank's RNG, the sampler position,
// background writes, the newest valid one on resume).
#pragma once

#include <cstdint>

#include "optim/grad_scaler.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// A seed for rank-dependent randomness (dropout, augmentation): distinct per rank, reproducible.
inline uint64_t seed_for_rank(uint64_t seed, int rank) { return seed + static_cast<uint64_t>(rank); }

// Makes scaler.update() skip the step on every rank when any rank found inf/NaN.
void synchronize_grad_scaler(optim::GradScaler& scaler, const ProcessGroup& group);

}  // namespace mg::parallel
