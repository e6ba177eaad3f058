// Checkpoints: everything a training run needs to continue exactly where it
// stopped, in files PyTorch can read.
//
//   <dir>/model.safetensors      the module's state_dict (parameters + buffers)
//   <dir>/optimizer.safetensors  the optimizer's state_dict (moments, step counts, lr)
//                                plus "scaler.*" entries when a GradScaler is used
//   both files carry the same __metadata__: step, epoch, the sampler's position,
//   the RNG state (seed, offset) and any user entries.
//
// Each file is written atomically (temp file, fsync, rename), and the model file
// is renamed last-but-one, the optimizer file last: a crash leaves a previous
// checkpoint or the new one. Loading validates both files completely before
// touching the model or the optimizer (load_state_dict validates first too).
//
// Exact resume: with the RNG state restored, data order from (seed, epoch) and
// the sampler position, N steps + save + load + M steps gives the same
// parameters, bit for bit, as N + M steps without stopping (tests/optim/
// test_checkpoint.cpp shows it on the CPU).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "core/random.h"
#include "core/state_dict.h"
#include "nn/module.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace mg::optim {

struct CheckpointInfo {
  int64_t step = 0;
  int64_t epoch = 0;
  int64_t batches_into_epoch = 0;              // the sampler position: batches already consumed this epoch
  GeneratorState rng{};                        // the default generator when the checkpoint was taken
  std::map<std::string, std::string> extra{};  // user metadata
};

// Saves module + optimizer (+ scaler) into `dir` (created if missing). `info.rng`
// is filled from the default generator when left at its default value {0, 0}.
void save_checkpoint(const std::string& dir, const nn::Module& module, const Optimizer& optimizer,
                     CheckpointInfo info, const GradScaler* scaler = nullptr);

// Loads into module + optimizer (+ scaler), restores the default generator, and
// returns the saved info. Throws mg::Error naming the file and reason on a missing,
// truncated or tampered checkpoint, leaving module, optimizer and scaler untouched.
CheckpointInfo load_checkpoint(const std::string& dir, nn::Module& module, Optimizer& optimizer,
                               GradScaler* scaler = nullptr);

// The same with the optimizer's state as a StateDict in the plain optimizer's layout (what
// ZeroRedundancyOptimizer::consolidated_state_dict returns), and on load handed to
// `load_optimizer` (which throws to refuse it: the module then gets its previous values back).
void save_checkpoint(const std::string& dir, const nn::Module& module, const StateDict& optimizer_state,
                     CheckpointInfo info, const GradScaler* scaler = nullptr);
CheckpointInfo load_checkpoint(const std::string& dir, nn::Module& module,
                               const std::function<void(const StateDict&)>& load_optimizer,
                               GradScaler* scaler = nullptr);

// The same from StateDicts already copied to the host (what a background writer holds: the
// training thread goes on changing the live tensors). `scaler_state` may be null.
void save_checkpoint(const std::string& dir, const StateDict& module_state, const StateDict& optimizer_state,
                     CheckpointInfo info, const StateDict* scaler_state);

// True when `dir` holds a checkpoint (both files exist).
bool checkpoint_exists(const std::string& dir);

}  // namespace mg::optim
