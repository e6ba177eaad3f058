// SequentialSampler, RandomSampler and the seeded permutation behind shuffling.
#include "data/sampler.h"

#include <numeric>

#include "base/error.h"
#include "data/seeding.h"

namespace mg::data {

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  MG_CHECK(n >= 0, "random_permutation: n must be >= 0, got ", n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t(0));
  const uint64_t key = stream_key(seed, Stream::Shuffle);
  // Fisher–Yates from the back: after step i, perm[i] is final and uniform over what was left.
  // Each step's random number is its own Philox block, so the draw for step i never depends on
  // how many numbers earlier steps consumed.
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t r = philox128(key, static_cast<uint64_t>(i), static_cast<uint64_t>(epoch)).lo;
    const int64_t j = static_cast<int64_t>(below(r, static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  MG_CHECK(n >= 0, "SequentialSampler: n must be >= 0, got ", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t(0));
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  MG_CHECK(n >= 0, "RandomSampler: n must be >= 0, got ", n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  return random_permutation(n_, seed_, epoch);
}

}  // namespace mg::data
