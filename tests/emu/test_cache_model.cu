// The caches the tracer replays a launch's requests through (cuda_emu/cache_model.h): one L1 per
// SM, one L2, resident blocks interleaved as they run. Each case's expected counts are worked by
// hand in its comments. Pure bookkeeping: runs in milliseconds.
#include <catch2/catch.hpp>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "cuda_emu/cache_model.h"

using mg_emu::BlockRequests;
using mg_emu::CacheConfig;
using mg_emu::CacheTraffic;
using mg_emu::RequestKind;
using mg_emu::simulate_caches;

namespace {

constexpr uint64_t A = 100, B = 200, C = 300;  // sector numbers

BlockRequests block(uint64_t id, std::vector<std::pair<RequestKind, uint64_t>> requests) {
  BlockRequests b;
  b.block = id;
  for (const auto& [kind, sector] : requests) b.add(kind, {sector});
  return b;
}

CacheConfig config(int sms, int per_sm, uint64_t l1_bytes, uint64_t l2_bytes, uint64_t all_blocks) {
  CacheConfig c;
  c.sms = sms;
  c.blocks_per_sm = per_sm;
  c.l1_bytes_per_sm = l1_bytes;
  c.l2_bytes = l2_bytes;
  c.all_blocks = all_blocks;
  return c;
}

constexpr RequestKind kLoad = RequestKind::load, kBypass = RequestKind::load_bypassing_l1,
                      kStore = RequestKind::store, kAtomic = RequestKind::atomic;

}  // namespace

TEST_CASE("cache model: a load that L1 holds never reaches L2; cp.async always does", "[cache_model]") {
  // One block loads A twice: the first misses L1 and L2 (one DRAM read), the second hits L1.
  const std::vector<BlockRequests> twice = {block(0, {{kLoad, A}, {kLoad, A}})};
  CacheTraffic t = simulate_caches(twice, config(1, 1, 1024, 1 << 20, 1));
  CHECK(t.l1_hit_sectors == 1);
  CHECK(t.l2_sectors == 1);
  CHECK(t.dram_read == 32);
  // Without an L1 both loads reach L2; the second hits there.
  t = simulate_caches(twice, config(1, 1, 0, 1 << 20, 1));
  CHECK(t.l1_hit_sectors == 0);
  CHECK(t.l2_sectors == 2);
  CHECK(t.dram_read == 32);
  // cp.async (.cg) bypasses L1: both reach L2.
  t = simulate_caches({block(0, {{kBypass, A}, {kBypass, A}})}, config(1, 1, 1024, 1 << 20, 1));
  CHECK(t.l1_hit_sectors == 0);
  CHECK(t.l2_sectors == 2);
}

TEST_CASE("cache model: an L1 belongs to one SM, shared by the blocks resident there", "[cache_model]") {
  const std::vector<BlockRequests> both_read_a = {block(0, {{kLoad, A}}), block(1, {{kLoad, A}})};
  // Two SMs: block 0 on SM 0, block 1 on SM 1; each L1 misses, the second L2 access hits.
  CacheTraffic t = simulate_caches(both_read_a, config(2, 1, 1024, 1 << 20, 2));
  CHECK(t.l2_sectors == 2);
  CHECK(t.l1_hit_sectors == 0);
  CHECK(t.dram_read == 32);
  // One SM holding both: block 1 finds A in the L1 block 0 filled.
  t = simulate_caches(both_read_a, config(1, 2, 1024, 1 << 20, 2));
  CHECK(t.l2_sectors == 1);
  CHECK(t.l1_hit_sectors == 1);
}

TEST_CASE("cache model: resident blocks are interleaved in L2, not run one after another", "[cache_model]") {
  // An L2 of one sector. Blocks 0 and 1 (two SMs, no L1) each read A then B. As they run together:
  //   round 1: block 0 reads A (DRAM), block 1 reads A (L2 hit);
  //   round 2: block 0 reads B (DRAM, A evicted), block 1 reads B (L2 hit):  64 bytes.
  // One block after the other would read A, B, then A and B again: 128 bytes.
  const std::vector<BlockRequests> blocks = {block(0, {{kLoad, A}, {kLoad, B}}),
                                             block(1, {{kLoad, A}, {kLoad, B}})};
  CacheTraffic t = simulate_caches(blocks, config(2, 1, 0, 32, 2));
  CHECK(t.dram_read == 64);
  // One SM with room for one block at a time: they do run one after the other.
  t = simulate_caches(blocks, config(1, 1, 0, 32, 2));
  CHECK(t.dram_read == 128);
}

TEST_CASE("cache model: stores write through, atomics drop the L1 copy, dirty sectors are written once",
          "[cache_model]") {
  // Store A (to L2: dirty, one write-back owed, nothing read), then load A (L1 miss, L2 hit).
  CacheTraffic t = simulate_caches({block(0, {{kStore, A}, {kLoad, A}})}, config(1, 1, 1024, 1 << 20, 1));
  CHECK(t.dram_read == 0);
  CHECK(t.dram_written == 32);
  CHECK(t.l2_sectors == 2);
  // Load A (into L1), atomic on A (L2; L1's copy dropped), load A again (L1 miss): 3 L2 sectors;
  // A is read once from DRAM and written back once.
  t = simulate_caches({block(0, {{kLoad, A}, {kAtomic, A}, {kLoad, A}})}, config(1, 1, 1024, 1 << 20, 1));
  CHECK(t.l2_sectors == 3);
  CHECK(t.l1_hit_sectors == 0);
  CHECK(t.dram_read == 32);
  CHECK(t.dram_written == 32);
  // A store keeps L1's copy: load A, store A, load A: the last load hits L1.
  t = simulate_caches({block(0, {{kLoad, A}, {kStore, A}, {kLoad, A}})}, config(1, 1, 1024, 1 << 20, 1));
  CHECK(t.l1_hit_sectors == 1);
  CHECK(t.l2_sectors == 2);
}

TEST_CASE("cache model: a hit on what another warp's same instruction missed is pending", "[cache_model]") {
  // Two warps' requests, interleaved by step as the tracer orders them. Step 0: warp 0 loads A and
  // B (misses), warp 1 loads A and B (hits on sectors still on their way: pending). Step 1: warp 0
  // loads A again (a plain hit: step 0's fetches have landed), and C (a miss).
  BlockRequests b;
  b.add(kLoad, {A, B}, 0);
  b.add(kLoad, {A, B}, 0);
  b.add(kLoad, {A, C}, 1);
  CacheTraffic t = simulate_caches({b}, config(1, 1, 1024, 1 << 20, 1));
  CHECK(t.l1_hit_sectors == 3);
  CHECK(t.l1_pending_sectors == 2);
  CHECK(t.l2_sectors == 3);  // A, B and C, each once
  // Each request a step of its own (the default): the same hits, none pending.
  t = simulate_caches({block(0, {{kLoad, A}, {kLoad, A}})}, config(1, 1, 1024, 1 << 20, 1));
  CHECK(t.l1_hit_sectors == 1);
  CHECK(t.l1_pending_sectors == 0);
  // Another block's fetch is not this block's step: two blocks on one SM, each loading A once.
  t = simulate_caches({block(0, {{kLoad, A}}), block(1, {{kLoad, A}})}, config(1, 2, 1024, 1 << 20, 2));
  CHECK(t.l1_hit_sectors == 1);
  CHECK(t.l1_pending_sectors == 0);
  // Steps must not go back.
  CHECK_THROWS_AS(b.add(kLoad, {A}, 0), std::invalid_argument);
}

TEST_CASE("cache model: an L1 of one sector keeps only the last one", "[cache_model]") {
  // A, B, A with room for one sector: the second A was evicted by B. 3 L2 sectors, 2 DRAM reads.
  const CacheTraffic t =
      simulate_caches({block(0, {{kLoad, A}, {kLoad, B}, {kLoad, A}})}, config(1, 1, 32, 1 << 20, 1));
  CHECK(t.l1_hit_sectors == 0);
  CHECK(t.l2_sectors == 3);
  CHECK(t.dram_read == 64);
}

TEST_CASE("cache model: untraced blocks cost what the second half of the traced ones did", "[cache_model]") {
  // 4 traced blocks of 8, each reading its own sector and C: the first reads C from DRAM, so blocks
  // 2 and 3 (the second half) cost 32 bytes each, and the 4 untraced ones 4 x 32 more.
  std::vector<BlockRequests> blocks;
  for (uint64_t b = 0; b < 4; ++b) blocks.push_back(block(b, {{kLoad, 1000 + b}, {kLoad, C}}));
  const CacheTraffic t = simulate_caches(blocks, config(4, 1, 0, 1 << 20, 8));
  CHECK(t.dram_read == 5 * 32 + 4 * 32);
  CHECK(t.l2_sectors == 8 + 4 * 2);
}

namespace {
// One block that sweeps `lines` 128-byte lines (4 sectors each) twice, through an L2 of 1024 lines
// in hashed sets of `ways`: the second sweep's DRAM reads over the first's.
double second_sweep_misses(uint64_t lines, int ways) {
  BlockRequests b;
  b.block = 0;
  for (int sweep = 0; sweep < 2; ++sweep)
    for (uint64_t line = 0; line < lines; ++line)
      b.add(kLoad, {4 * line, 4 * line + 1, 4 * line + 2, 4 * line + 3});
  CacheConfig c = config(1, 1, 0, 1024 * 128, 1);
  c.l2_ways = ways;
  const double first_sweep = double(lines) * 128;
  return (simulate_caches({b}, c).dram_read - first_sweep) / first_sweep;
}
}  // namespace

TEST_CASE("cache model: a hashed L2 loses hits gradually below its capacity", "[cache_model]") {
  // With one set of 1024 ways the hashed L2 is a fully associative LRU of lines: a sweep of 1024
  // lines fits, one of 1025 misses every line the second time (each evicted just before its use).
  CHECK(second_sweep_misses(1024, 1024) == 0);
  CHECK(second_sweep_misses(1025, 1024) == 1);
  // With sets of 16 ways a set receives about Poisson(16 x lines / 1024) of the lines; a line hits
  // when its set got at most 16 (the others thrash under a cyclic sweep). At half the capacity
  // almost every set fits (P(Poisson(8) >= 16) = 0.8 %); at 94 % about 57 % of lines hit, at 150 %
  // about 3 %. The hash is one fixed function, so the figures are deterministic; the bands allow
  // for 64 sets being a small sample of the Poisson law.
  const double half = second_sweep_misses(512, 16), near = second_sweep_misses(963, 16),
               over = second_sweep_misses(1536, 16);
  INFO("misses at 50 %: " << half << ", 94 %: " << near << ", 150 %: " << over);
  CHECK(half < 0.05);
  CHECK(near > 0.2);
  CHECK(near < 0.7);
  CHECK(over > 0.85);
}
