#include "core/random.h"

#include <mutex>

namespace mg {
namespace {
std::mutex generator_mutex;
GeneratorState default_generator{0x5eed, 0};
}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(generator_mutex);
  default_generator = GeneratorState{seed, 0};
}

GeneratorState generator_state() {
  std::lock_guard<std::mutex> lock(generator_mutex);
  return default_generator;
}

void set_generator_state(const GeneratorState& state) {
  std::lock_guard<std::mutex> lock(generator_mutex);
  default_generator = state;
}

GeneratorState next_random_call() {
  std::lock_guard<std::mutex> lock(generator_mutex);
  GeneratorState call = default_generator;
  ++default_generator.offset;
  return call;
}

}  // namespace mg
