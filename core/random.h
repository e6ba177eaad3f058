// The default random generator: a seed and a call counter for Philox
// (base/philox.h). Every random op takes the next call offset, so successive
// calls differ while each element of a call is computable on its own.
#pragma once

#include <cstdint>

namespace mg {

struct GeneratorState {
  uint64_t seed = 0;
  uint64_t offset = 0;
};

void manual_seed(uint64_t seed);  // also resets the offset
GeneratorState generator_state();
void set_generator_state(const GeneratorState& state);
// Returns {seed, offset} for one random op and advances the offset.
GeneratorState next_random_call();

// Replays random ops on this thread from `state` for its scope: next_random_call() on this
// thread draws from a private copy of `state` instead of the default generator, which neither
// moves nor is read meanwhile. Activation checkpointing recomputes a forward under it, so the
// recomputed dropout masks equal the original ones while other threads (DataParallel's replicas,
// running their own recomputes) keep drawing from the default generator undisturbed.
class GeneratorReplayGuard {
 public:
  explicit GeneratorReplayGuard(const GeneratorState& state);
  ~GeneratorReplayGuard();
  GeneratorReplayGuard(const GeneratorReplayGuard&) = delete;
  GeneratorReplayGuard& operator=(const GeneratorReplayGuard&) = delete;

 private:
  bool had_previous_;
  GeneratorState previous_;
};

}  // namespace mg
