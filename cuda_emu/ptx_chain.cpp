// A warp's own clocks through one basic block of PTX: issue and dependent latency (ptx_count.h).
//
// Why. A scheduler hides the latency of one warp's instruction behind the instructions of its other
// warps. With few warps resident (a large block, many registers, a small grid) there are not enough
// of them: a warp that has issued an FFMA waits 4 clocks before the next FFMA that reads its
// result, and 30 after a shared load before the instruction that uses the value. The issue limit
// (gpu_model.cpp) counts slots, which latency does not take; this file gives the other bound, the
// time one warp needs by itself:
//
//   clocks of a block = max(its instructions (a warp issues one a clock),
//                           its longest chain: each instruction starts when the registers it reads are
//                           ready, and its result is ready `latency` clocks later)
//
// The chain is the dataflow bound: ptxas may reorder a block's instructions freely, so only true
// dependences order them. Each block run starts with every register ready (the loop's next trip
// waits for the last one at the branch, so a loop-carried chain is counted once per trip). A
// global load's result is taken as ready at once: its latency is the round-trip limit's (Little's
// law, gpu_model.cpp), which prices it with the L1, L2 and DRAM latencies. A barrier waits for
// every result before it (a shared store's included). A branch ends the block when it issues.
//
// The same dataflow gives a block's memory round trips (load_levels): the global loads that wait
// for none of each other -- the copies of an unrolled loop's load, a tile's A and B -- go out
// together, as ptxas hoists them, and each load that needs another's value (its address, or a
// barrier after that value was stored) is one more round trip. A kernel's round trips
// (load_round_trips) carry that dataflow from block to block through each stretch without a loop
// edge: nvcc puts a guarded load (`if (i < n) v = x[i]`) in a block of its own that a branch
// skips, and the guarded loads of an unrolled loop still go out together, since a warp stalls only
// at an instruction whose operand is not back. ptxas does not move a load above a branch, so a
// block's loads go out after every use in the blocks before it (in-order issue).
#include <algorithm>
#include <map>

#include "cuda_emu/ptx_count.h"

namespace mg_emu::ptx {

double latency_of(InstructionKind kind) {
  using K = InstructionKind;
  switch (kind) {
    case K::fp32:
    case K::fp16:
    case K::integer:
    case K::other: return kArithmeticLatency;
    case K::fp64: return kFp64Latency;
    case K::conversion:
    case K::special: return kQuarterRateLatency;
    case K::shared_memory:
    case K::warp:
    case K::tensor: return kSharedLatency;
    case K::global_memory:
    case K::local_memory:
    case K::branch:
    case K::barrier: return 0;
  }
  return kArithmeticLatency;
}

double block_cycles(const Block& b, const std::vector<InstructionKind>& kinds) {
  std::map<std::string, double> ready;  // when each register's value is ready, clocks from the start
  double issued = 0;                    // warp instructions: one a clock
  double finished = 0;                  // the latest result so far
  double floor = 0;                     // a barrier's: nothing after it starts earlier
  double previous_piece = 0;            // when the last instruction's result was ready
  for (size_t i = 0; i < b.instructions.size(); ++i) {
    const Instruction& in = b.instructions[i];
    const InstructionKind kind = i < kinds.size() ? kinds[i] : in.kind;
    issued += in.weight;
    double start = floor;
    for (const std::string& r : in.sources) {
      const auto it = ready.find(r);
      if (it != ready.end()) start = std::max(start, it->second);
    }
    if (in.continues) start = std::max(start, previous_piece);
    if (kind == InstructionKind::barrier) {
      floor = std::max(floor, finished);
      previous_piece = floor;
      continue;
    }
    // A free instruction (weight 0: a move, a contracted multiply) passes its inputs on; a
    // sequence of w dependent SASS instructions (a 64-bit add's two halves) takes w latencies; a
    // shared access is one, whatever its width.
    const double times = kind == InstructionKind::shared_memory ? std::min(in.weight, 1.0) : in.weight;
    const double done = start + latency_of(kind) * times;
    for (const std::string& r : in.dests) ready[r] = done;
    previous_piece = done;
    finished = std::max(finished, done);
  }
  return std::max(issued, finished);
}

namespace {

// What a warp's loads have waited for so far in one stretch of blocks without a loop edge.
struct LoadState {
  std::map<std::string, double> level;  // each register: the load levels its value waited for
  double used = 0;                      // the most levels any instruction so far has read
  double floor = 0;                     // what no later load can go out before
};

// Walks block `b`'s instructions in state `s`; returns the deepest load level among its loads.
double walk_loads(const Block& b, const std::vector<InstructionKind>& kinds, LoadState& s) {
  double deepest = 0;
  for (size_t i = 0; i < b.instructions.size(); ++i) {
    const Instruction& in = b.instructions[i];
    const InstructionKind kind = i < kinds.size() ? kinds[i] : in.kind;
    if (kind == InstructionKind::barrier) {  // a tile stored to shared memory before it: landed
      s.floor = std::max(s.floor, s.used);
      continue;
    }
    double waited = 0;
    for (const std::string& r : in.sources) {
      const auto it = s.level.find(r);
      if (it != s.level.end()) waited = std::max(waited, it->second);
    }
    s.used = std::max(s.used, waited);
    if (kind == InstructionKind::global_memory && in.access == Access::load) {
      waited = std::max(waited, s.floor) + 1;
      deepest = std::max(deepest, waited);
    }
    for (const std::string& r : in.dests) s.level[r] = waited;
  }
  return deepest;
}

}  // namespace

double load_levels(const Block& b, const std::vector<InstructionKind>& kinds) {
  LoadState s;
  return walk_loads(b, kinds, s);
}

double load_round_trips(const std::vector<Block>& blocks,
                        const std::vector<std::vector<InstructionKind>>& kinds,
                        const std::vector<double>& runs) {
  std::vector<bool> loop_header(blocks.size(), false);
  for (const Block& b : blocks)
    if (b.loops_back_to >= 0 && static_cast<size_t>(b.loops_back_to) < blocks.size())
      loop_header[static_cast<size_t>(b.loops_back_to)] = true;
  LoadState s;
  std::vector<double> reached;  // reached[l - 1]: the most runs that have gone out at level l
  double trips = 0;
  for (size_t k = 0; k < blocks.size(); ++k) {
    const bool after_latch = k > 0 && blocks[k - 1].loops_back_to >= 0;
    if (loop_header[k] || after_latch) {  // a new stretch: each trip starts with its loads landed
      s = LoadState{};
      reached.clear();
    } else {  // in-order issue: a block's loads do not go out before the uses of the blocks before it
      s.floor = std::max(s.floor, s.used);
    }
    if (runs[k] <= 0) continue;  // a way not taken sets no level
    const double deepest = walk_loads(blocks[k], kinds[k], s);
    for (size_t l = 0; l < static_cast<size_t>(deepest); ++l) {
      if (reached.size() <= l) reached.push_back(0);
      trips += std::max(0.0, runs[k] - reached[l]);
      reached[l] = std::max(reached[l], runs[k]);
    }
  }
  return trips;
}

}  // namespace mg_emu::ptx
