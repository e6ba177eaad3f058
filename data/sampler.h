// Samplers decide which dataset indices an epoch visits, and in what order.
//
// The DataLoader asks its sampler for one epoch's list, cuts it into batches and loads them. The
// list must be a pure function of (the sampler's configuration, epoch): two processes (or two
// runs) with the same configuration must get the same list, whatever threads are involved.
//
// ---- The Sampler interface (what a new sampler implements) ----------------------------------
//   indices(epoch)  Required. The epoch's dataset indices in visiting order. const and
//                   deterministic: same object state + same epoch -> same vector, every time, on
//                   every rank. Indices may repeat (padding, sampling with replacement); each
//                   must be in [0, dataset size) — the DataLoader checks.
//   size()          Required. indices(e).size() for every epoch (the DataLoader's len() is
//                   derived from it without building the list).
//   set_epoch(e)    Optional override (which must call Sampler::set_epoch). Records the epoch
//                   the DataLoader uses for its next pass (PyTorch's sampler.set_epoch); read it
//                   with epoch(). A DataLoader given a sampler never changes its epoch: the
//                   training loop calls set_epoch each epoch, exactly as with PyTorch's
//                   DistributedSampler (forgetting it repeats epoch 0's order every epoch).
// DistributedSampler (distributed_sampler.h) is this interface plus a shard per rank.
#pragma once

#include <cstdint>
#include <vector>

namespace mg::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  virtual int64_t size() const = 0;
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 private:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation of 0..n-1 that depends only on (seed, epoch): a new order each epoch, the same
// order for the same (seed, epoch) on any machine.
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t n, uint64_t seed = 0);
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// The permutation RandomSampler and DistributedSampler use: Fisher–Yates, where step i swaps
// position i with a position j in [0, i] drawn from Philox(key(seed), counter = (i, epoch)).
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace mg::data
