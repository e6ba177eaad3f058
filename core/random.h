// The default random generator: a seed and a call counter for Philox
// (core/base/philox.h). Every random op takes the next call offset, so successive
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

}  // namespace mg
