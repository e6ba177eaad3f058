// DistributedSampler: the same epoch list on every rank, padded or cut, then strided by rank.
#include "data/distributed_sampler.h"

#include <numeric>

#include "core/error.h"

namespace mg::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t rank, int64_t world_size,
                                       const DistributedSamplerOptions& options)
    : n_(dataset_size), rank_(rank), world_(world_size), options_(options) {
  check(dataset_size >= 0, "DistributedSampler: dataset_size must be >= 0, got ", dataset_size);
  check(world_size >= 1, "DistributedSampler: world_size must be >= 1, got ", world_size);
  check(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank, " is outside [0, ", world_size,
        ")");
  num_samples_ = options.drop_last ? n_ / world_ : (n_ + world_ - 1) / world_;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all;
  if (options_.shuffle) {
    all = random_permutation(n_, options_.seed, epoch);
  } else {
    all.resize(static_cast<size_t>(n_));
    std::iota(all.begin(), all.end(), int64_t(0));
  }
  const int64_t total = total_size();
  if (total > n_) {
    // Pad by wrapping around (repeatedly, when world > n): position p takes all[p mod n].
    for (int64_t p = n_; p < total; ++p) all.push_back(all[static_cast<size_t>(p % n_)]);
  } else {
    all.resize(static_cast<size_t>(total));
  }
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(num_samples_));
  for (int64_t p = rank_; p < total; p += world_) shard.push_back(all[static_cast<size_t>(p)]);
  return shard;
}

}  // namespace mg::data
