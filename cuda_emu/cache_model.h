// The caches between the SMs and DRAM, as the tracer (trace.cpp) replays a launch's global requests
// through them: one L1 per SM, shared by the blocks resident on it, then one L2 for the GPU.
// Internal to cuda_emu/; profiler.h says what the results mean.
//
// How the blocks run. Traced block i goes to SM i mod SMs (the GPU's block scheduler hands blocks
// out in order, one per SM first). An SM holds `blocks_per_sm` blocks at once (the occupancy the
// GPU model computes) and the next of its blocks starts when one finishes. Time advances in rounds:
// in each round every resident block of every SM issues its next request. So the L2 sees the
// blocks of a wave interleaved, as they run, and an L1 sees only its own SM's blocks. A grid of
// more than one wave is modelled in its steady state, where resident blocks are at different
// points of their work: the first resident blocks start staggered (block b after b / (SMs x
// blocks_per_sm) of a block's length), so two blocks that read the same data far apart in the
// grid are far apart in time too (RRZE's gpu-l2-cache sweep, tests/emu/validation/, shows a GPU
// does not share data between them; started together, they would).
//
//   L1 (per SM, LRU of 32-byte sectors, the unified L1/shared array minus what the resident
//       blocks' shared memory takes): a load's sector found there is served without L2. A load
//       that misses brings the sector in. A hit on a sector that a request of the block's same
//       step missed (warps running together, the first to ask fetching it for the others) saves
//       the L2 traffic but not the wait: it is counted as pending (l1_pending_sectors).
//       cp.async (.cg) bypasses L1. Stores are write-through: they go to L2 and leave L1 as it
//       is; atomics go to L2 and drop L1's copy.
//   L2 (the GPU's capacity: sets of 128-byte lines chosen by a hash of the address, LRU within a
//       set, a miss fetching one 32-byte sector; with l2_ways 0, one LRU of sectors): what reaches
//       it is counted (l2_sectors); a read of a sector it does not hold is a DRAM read; a sector
//       that turns dirty is one DRAM write (its write-back, at eviction or at the end). A store of
//       a sector it does not hold reads nothing (the store fills it).
//
// When only the first blocks were traced the rest are extrapolated from the steady state: the
// traffic of the second half of the traced blocks (in block order), per block, times the untraced
// blocks. With every block traced it is exact (for this model).
#pragma once

#include <cstdint>
#include <vector>

namespace mg_emu {

enum class RequestKind : uint8_t { load, load_bypassing_l1, store, atomic };

// One traced block's global requests in the order it made them.
struct BlockRequests {
  uint64_t block = 0;             // linear block index in the grid
  std::vector<uint64_t> sectors;  // every request's 32-byte sector numbers, one request after another
  std::vector<uint32_t> ends;     // request r's sectors are sectors[ends[r-1] .. ends[r])
  std::vector<RequestKind> kinds;
  // Request r's step: the requests of one step are the warps' same instruction, issued together
  // (the tracer numbers each warp's requests in program order and interleaves the warps by it).
  // Non-decreasing. kOwnStep gives a request a step of its own (its index).
  std::vector<uint32_t> steps;
  static constexpr uint32_t kOwnStep = 0xffffffffu;
  void add(RequestKind kind, const std::vector<uint64_t>& request_sectors, uint32_t step = kOwnStep);
};

struct CacheConfig {
  int sms = 132;
  int blocks_per_sm = 1;
  uint64_t l1_bytes_per_sm = 0;  // 0: no L1 (every sector goes to L2)
  uint64_t l2_bytes = 0;         // 0: an unbounded L2 (DRAM sees each sector's first touch only)
  int l2_ways = 0;               // > 0: hashed sets of this many 128-byte lines; 0: one LRU of sectors
  uint64_t all_blocks = 0;       // the grid's blocks, traced or not (for the extrapolation)
};

struct CacheTraffic {
  double l1_hit_sectors = 0;      // load sectors L1 served
  double l1_pending_sectors = 0;  // of those, sectors a request of the same step (another warp's
                                  // same instruction) had just missed: still on their way from L2,
                                  // so the hit waits for them as the miss does
  double l2_sectors = 0;          // sectors that reached L2 (L1 misses, bypassing loads, stores, atomics)
  double dram_read = 0, dram_written = 0;  // bytes
};

// `blocks` in block order. Every figure is for the whole grid (extrapolated as above).
CacheTraffic simulate_caches(const std::vector<BlockRequests>& blocks, const CacheConfig& config);

}  // namespace mg_emu
