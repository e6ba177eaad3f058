#include "core/random.h"

#include <mutex>

namespace mg {
namespace {
std::mutex generator_mutex;
GeneratorState default_generator{0x5eed, 0};
// Set while a GeneratorReplayGuard is alive on this thread.
thread_local bool replaying = false;
thread_local GeneratorState replay_generator;
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
  if (replaying) return GeneratorState{replay_generator.seed, replay_generator.offset++};
  std::lock_guard<std::mutex> lock(generator_mutex);
  GeneratorState call = default_generator;
  ++default_generator.offset;
  return call;
}

GeneratorReplayGuard::GeneratorReplayGuard(const GeneratorState& state)
    : had_previous_(replaying), previous_(replay_generator) {
  replaying = true;
  replay_generator = state;
}

GeneratorReplayGuard::~GeneratorReplayGuard() {
  replaying = had_previous_;
  replay_generator = previous_;
}

}  // namespace mg
