// StateDict: named tensors, the one currency of saving and loading.
//
// Modules put their parameters and buffers here ("fc1.weight", "bn.running_mean");
// optimizers put their per-parameter state and their hyperparameters here as
// tensors too ("state.3.exp_avg", "param_groups.0.lr" as a 0-d f64 tensor), so a
// checkpoint is just safetensors files of StateDicts. std::map keeps keys sorted,
// so iteration order, and therefore files, are deterministic.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"

namespace mg {

using StateDict = std::map<std::string, Tensor>;

}  // namespace mg
