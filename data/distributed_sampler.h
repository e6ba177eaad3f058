// DistributedSampler: each of `world` ranks trains on its own 1/world of the dataset per epoch.
//
// PyTorch's semantics, so a PyTorch user's numbers carry over:
//   1. All ranks build the same list: a permutation seeded by (seed, epoch) when shuffling
//      (every rank must use the same seed), else 0..n-1.
//   2. Make it divisible by world. Default: pad by wrapping around to the list's start (a few
//      samples are seen twice per epoch) up to world * ceil(n / world). drop_last: cut the tail
//      to world * floor(n / world) instead (a few samples are skipped this epoch).
//   3. Rank r takes positions r, r + world, r + 2*world, ... (indices[r::world]).
// So every rank yields the same number of samples — the DDP all-reduce needs every rank to run
// the same number of steps — and the shards are disjoint apart from the padding.
//
// Call set_epoch(epoch) at the start of each epoch; without it every epoch repeats the order of
// epoch 0 (the DataLoader never changes a user sampler's epoch).
//
// Elastic resume (set_start_sample): a job checkpointed after the ranks had consumed S samples
// of epoch e's list (S = steps x global batch, at whatever world size) resumes, at any world
// size, on positions S, S+1, ... of the same list: the remainder is padded or cut as in step 2
// and strided by rank as in step 3, so no sample of the epoch is skipped or seen twice. At the
// world size of the checkpoint this is exactly the shard the uninterrupted run would have read
// (S is a multiple of the world size; padding still wraps to the list's start).
#pragma once

#include "data/sampler.h"

namespace mg::data {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;  // must be the same on every rank
  bool drop_last = false;
};

class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t rank, int64_t world_size,
                     const DistributedSamplerOptions& options = {});

  std::vector<int64_t> indices(int64_t epoch) const override;  // this rank's shard
  // Per rank and for all ranks (after padding/cutting), for the current epoch(): smaller in the
  // epoch set_start_sample names.
  int64_t size() const override { return samples_per_rank(epoch()); }
  int64_t total_size() const { return samples_per_rank(epoch()) * world_; }
  // This rank's samples in the current epoch that are not padding: its first real_size() indices
  // (padding comes last). Evaluation counts only these, so each sample is counted once
  // (parallel/resilience/sharded_metric.h); with drop_last every sample is real.
  int64_t real_size() const;
  // Epoch `epoch` starts at position `samples` of its global list (the other epochs are whole).
  void set_start_sample(int64_t epoch, int64_t samples);
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_; }
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t skipped(int64_t epoch) const { return epoch == start_epoch_ ? start_sample_ : 0; }
  int64_t samples_per_rank(int64_t epoch) const;

  int64_t n_, rank_, world_;
  DistributedSamplerOptions options_;
  int64_t start_epoch_ = -1, start_sample_ = 0;
};

}  // namespace mg::data
