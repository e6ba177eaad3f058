// DistributedSampler: the same epoch list on every rank, padded or cut, then strided by rank.
#include "data/distributed_sampler.h"

#include <algorithm>
#include <numeric>

#include "base/error.h"

namespace mg::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t rank, int64_t world_size,
                                       const DistributedSamplerOptions& options)
    : n_(dataset_size), rank_(rank), world_(world_size), options_(options) {
  MG_CHECK(dataset_size >= 0, "DistributedSampler: dataset_size must be >= 0, got ", dataset_size);
  MG_CHECK(world_size >= 1, "DistributedSampler: world_size must be >= 1, got ", world_size);
  MG_CHECK(rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank, " is outside [0, ", world_size,
           ")");
}

void DistributedSampler::set_start_sample(int64_t epoch, int64_t samples) {
  MG_CHECK(samples >= 0 && samples <= n_, "DistributedSampler::set_start_sample: ", samples,
           " samples consumed is outside [0, ", n_, "] (the dataset size)");
  start_epoch_ = epoch;
  start_sample_ = samples;
}

int64_t DistributedSampler::samples_per_rank(int64_t epoch) const {
  const int64_t remaining = n_ - skipped(epoch);
  return options_.drop_last ? remaining / world_ : (remaining + world_ - 1) / world_;
}

int64_t DistributedSampler::real_size() const {
  // Rank r holds positions r, r + world, ...; those at or past the epoch's remaining length are
  // padding (wrapped around to the start of the list).
  const int64_t remaining = n_ - skipped(epoch());
  const int64_t real = remaining > rank_ ? (remaining - rank_ + world_ - 1) / world_ : 0;
  return std::min(real, samples_per_rank(epoch()));
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> all;
  if (options_.shuffle) {
    all = random_permutation(n_, options_.seed, epoch);
  } else {
    all.resize(static_cast<size_t>(n_));
    std::iota(all.begin(), all.end(), int64_t(0));
  }
  // Positions [skip, skip + total) of the list; past its end, padding wraps around to its start
  // (repeatedly, when world > n): position p takes all[p mod n].
  const int64_t skip = skipped(epoch), per_rank = samples_per_rank(epoch), total = per_rank * world_;
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(per_rank));
  for (int64_t q = rank_; q < total; q += world_) shard.push_back(all[static_cast<size_t>((skip + q) % n_)]);
  return shard;
}

}  // namespace mg::data
