// Samplers: permutations, reproducibility per (seed, epoch), and DistributedSampler's shards.
#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <set>

#include "data/distributed_sampler.h"
#include "data/sampler.h"

using namespace mg;
using namespace mg::data;
using Catch::Contains;

namespace {
std::vector<int64_t> iota_vec(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t(0));
  return v;
}
bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  return v == iota_vec(n);
}
}  // namespace

TEST_CASE("SequentialSampler yields 0..n-1 every epoch", "[data][sampler]") {
  SequentialSampler s(5);
  CHECK(s.size() == 5);
  CHECK(s.indices(0) == iota_vec(5));
  CHECK(s.indices(7) == iota_vec(5));
  CHECK(SequentialSampler(0).indices(0).empty());
  CHECK_THROWS_WITH(SequentialSampler(-1), Contains("n must be >= 0"));
}

TEST_CASE("RandomSampler: a permutation, reproducible per (seed, epoch), new each epoch", "[data][sampler]") {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    RandomSampler s(n, 42);
    CHECK(s.size() == n);
    for (int64_t epoch = 0; epoch < 3; ++epoch) CHECK(is_permutation_of_range(s.indices(epoch), n));
  }
  RandomSampler a(1000, 42), b(1000, 42), c(1000, 43);
  CHECK(a.indices(0) == b.indices(0));  // same (seed, epoch): same order, from a different object
  CHECK(a.indices(5) == b.indices(5));
  CHECK(a.indices(0) == a.indices(0));  // indices() is const: asking twice changes nothing
  CHECK(a.indices(0) != a.indices(1));  // a new order each epoch
  CHECK(a.indices(0) != c.indices(0));  // and per seed
  CHECK(a.indices(0) != iota_vec(1000));
  CHECK(random_permutation(1000, 42, 3) == a.indices(3));
}

TEST_CASE("RandomSampler: every permutation of 3 is about equally likely", "[data][sampler]") {
  RandomSampler s(3, 7);
  std::map<std::vector<int64_t>, int> counts;
  const int epochs = 6000;
  for (int e = 0; e < epochs; ++e) ++counts[s.indices(e)];
  REQUIRE(counts.size() == 6);
  for (const auto& [perm, count] : counts) {
    CHECK(count > 850);  // expected 1000, sd ~29
    CHECK(count < 1150);
  }
}

TEST_CASE("Sampler::set_epoch records the epoch", "[data][sampler]") {
  RandomSampler s(10, 1);
  CHECK(s.epoch() == 0);
  s.set_epoch(4);
  CHECK(s.epoch() == 4);
}

TEST_CASE("DistributedSampler: PyTorch's examples", "[data][sampler][distributed]") {
  // n = 10, world = 4: padded to 12 by wrapping ([0..9, 0, 1]), rank r takes [r::4].
  const std::vector<std::vector<int64_t>> padded = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  const std::vector<std::vector<int64_t>> dropped = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  DistributedSamplerOptions in_order;
  in_order.shuffle = false;
  DistributedSamplerOptions in_order_drop_last;
  in_order_drop_last.shuffle = false;
  in_order_drop_last.drop_last = true;
  for (int64_t r = 0; r < 4; ++r) {
    DistributedSampler pad(10, r, 4, in_order);
    CHECK(pad.size() == 3);
    CHECK(pad.total_size() == 12);
    CHECK(pad.indices(0) == padded[size_t(r)]);
    DistributedSampler drop(10, r, 4, in_order_drop_last);
    CHECK(drop.size() == 2);
    CHECK(drop.indices(0) == dropped[size_t(r)]);
  }
  // More ranks than samples: the list wraps around several times.
  std::vector<int64_t> got;
  for (int64_t r = 0; r < 5; ++r) {
    DistributedSampler s(2, r, 5, in_order);
    REQUIRE(s.size() == 1);
    got.push_back(s.indices(0)[0]);
  }
  CHECK(got == std::vector<int64_t>{0, 1, 0, 1, 0});
  CHECK(DistributedSampler(2, 4, 5, in_order_drop_last).indices(0).empty());
}

TEST_CASE("DistributedSampler: shards are disjoint, cover the dataset, and pad or drop",
          "[data][sampler][distributed]") {
  for (int64_t world = 1; world <= 5; ++world) {
    for (int64_t n : {0, 1, 3, 10, 11, 17, 100}) {
      for (bool shuffle : {false, true}) {
        for (bool drop_last : {false, true}) {
          INFO("world " << world << " n " << n << " shuffle " << shuffle << " drop_last " << drop_last);
          const int64_t per_rank = drop_last ? n / world : (n + world - 1) / world;
          std::map<int64_t, int> seen;
          std::vector<int64_t> interleaved(size_t(per_rank * world));
          for (int64_t r = 0; r < world; ++r) {
            DistributedSamplerOptions options;
            options.shuffle = shuffle;
            options.seed = 9;
            options.drop_last = drop_last;
            DistributedSampler s(n, r, world, options);
            const std::vector<int64_t> shard = s.indices(2);
            REQUIRE(int64_t(shard.size()) == per_rank);  // every rank runs the same number of steps
            CHECK(s.size() == per_rank);
            for (size_t p = 0; p < shard.size(); ++p) {
              REQUIRE(shard[p] >= 0);
              REQUIRE(shard[p] < n);
              ++seen[shard[p]];
              interleaved[p * size_t(world) + size_t(r)] = shard[p];
            }
          }
          const int64_t total = per_rank * world;
          if (drop_last) {
            // Disjoint, no repeats, only the last n % world (of the epoch's order) left out.
            CHECK(int64_t(seen.size()) == total);
            for (const auto& [index, count] : seen) CHECK(count == 1);
          } else {
            // Every sample appears, and exactly total - n appear twice (the wrap-around padding).
            CHECK(int64_t(seen.size()) == n);
            int64_t repeats = 0;
            for (const auto& [index, count] : seen) repeats += count - 1;
            CHECK(repeats == total - n);
          }
          // Interleaving the shards rebuilds one global order: all ranks agree on the permutation.
          if (!drop_last && total > 0) {
            std::vector<int64_t> head(interleaved.begin(), interleaved.begin() + n);
            CHECK(is_permutation_of_range(head, n));
            for (int64_t p = n; p < total; ++p) CHECK(interleaved[size_t(p)] == interleaved[size_t(p % n)]);
            if (!shuffle) CHECK(head == iota_vec(n));
          }
        }
      }
    }
  }
}

TEST_CASE("DistributedSampler: the epoch changes the shuffle, the same on every rank",
          "[data][sampler][distributed]") {
  DistributedSamplerOptions options;
  options.shuffle = true;
  options.seed = 42;
  DistributedSampler r0(100, 0, 2, options), r1(100, 1, 2, options);
  CHECK(r0.indices(0) != r0.indices(1));
  // set_epoch is what the DataLoader reads; indices(epoch) is pure.
  r0.set_epoch(3);
  r1.set_epoch(3);
  std::vector<int64_t> global;
  const auto a = r0.indices(r0.epoch()), b = r1.indices(r1.epoch());
  for (size_t p = 0; p < a.size(); ++p) {
    global.push_back(a[p]);
    global.push_back(b[p]);
  }
  CHECK(global == random_permutation(100, 42, 3));
  // Unshuffled, the epoch doesn't matter.
  DistributedSamplerOptions in_order;
  in_order.shuffle = false;
  DistributedSampler plain(100, 0, 2, in_order);
  CHECK(plain.indices(0) == plain.indices(5));
}

TEST_CASE("DistributedSampler: argument errors", "[data][sampler][distributed]") {
  CHECK_THROWS_WITH(DistributedSampler(10, 2, 2), Contains("rank 2 is outside [0, 2)"));
  CHECK_THROWS_WITH(DistributedSampler(10, -1, 2), Contains("rank -1 is outside"));
  CHECK_THROWS_WITH(DistributedSampler(10, 0, 0), Contains("world_size must be >= 1"));
  CHECK_THROWS_WITH(DistributedSampler(-3, 0, 1), Contains("dataset_size must be >= 0"));
}

TEST_CASE("DistributedSampler resumes an epoch at any world size from the global position",
          "[data][sampler][elastic]") {
  const int64_t n = 103;
  DistributedSamplerOptions options;
  options.seed = 9;
  // World 2 consumed 3 steps of 8 samples per rank: 48 samples of epoch 5's list.
  const int64_t consumed = 3 * 8 * 2;
  std::vector<int64_t> seen;
  for (int64_t r = 0; r < 2; ++r) {
    DistributedSampler before(n, r, 2, options);
    auto shard = before.indices(5);
    seen.insert(seen.end(), shard.begin(), shard.begin() + 24);
  }
  SECTION("at the same world size it is exactly the rest of the uninterrupted shard") {
    for (int64_t r = 0; r < 2; ++r) {
      DistributedSampler whole(n, r, 2, options), resumed(n, r, 2, options);
      resumed.set_start_sample(5, consumed);
      resumed.set_epoch(5);
      auto full = whole.indices(5);
      REQUIRE(resumed.indices(5) == std::vector<int64_t>(full.begin() + 24, full.end()));
      REQUIRE(resumed.size() == static_cast<int64_t>(full.size()) - 24);
      REQUIRE(resumed.indices(6) == whole.indices(6));  // the next epoch is whole again
    }
  }
  SECTION("at world 3 and 1 no sample of the epoch is skipped or seen twice") {
    for (int64_t world : {1, 3}) {
      std::vector<int64_t> all = seen;
      int64_t padded = 0;
      for (int64_t r = 0; r < world; ++r) {
        DistributedSampler resumed(n, r, world, options);
        resumed.set_start_sample(5, consumed);
        resumed.set_epoch(5);
        auto shard = resumed.indices(5);
        REQUIRE(static_cast<int64_t>(shard.size()) == resumed.size());
        all.insert(all.end(), shard.begin(), shard.end());
      }
      padded = static_cast<int64_t>(all.size()) - n;
      REQUIRE(padded == (world == 3 ? (3 - (n - consumed) % 3) % 3 : 0));
      std::sort(all.begin(), all.end());
      all.erase(std::unique(all.begin(), all.end()), all.end());
      REQUIRE(static_cast<int64_t>(all.size()) == n);  // every sample, and the padding only repeats
    }
  }
  REQUIRE_THROWS_WITH(DistributedSampler(n, 0, 2, options).set_start_sample(5, n + 1),
                      Catch::Contains("outside [0, 103]"));
}
