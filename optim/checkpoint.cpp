#include "optim/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/files.h"
#include "core/safetensors.h"

namespace mg::optim {
namespace {

const char* kModelFile = "/model.safetensors";
const char* kOptimizerFile = "/optimizer.safetensors";
const std::string kScalerPrefix = "scaler.";

SafetensorsMetadata to_metadata(const CheckpointInfo& info) {
  SafetensorsMetadata meta = info.extra;
  meta["step"] = std::to_string(info.step);
  meta["epoch"] = std::to_string(info.epoch);
  meta["batches_into_epoch"] = std::to_string(info.batches_into_epoch);
  meta["rng_seed"] = std::to_string(info.rng.seed);
  meta["rng_offset"] = std::to_string(info.rng.offset);
  return meta;
}

template <class T>
T parse_number(const SafetensorsMetadata& meta, const std::string& key, const std::string& file) {
  auto it = meta.find(key);
  MG_CHECK(it != meta.end(), file, ": checkpoint metadata has no '", key, "'");
  try {
    size_t used = 0;
    const unsigned long long value = std::stoull(it->second, &used);
    MG_CHECK(used == it->second.size(), "trailing characters");
    return static_cast<T>(value);
  } catch (const std::exception&) {
    throw Error(str_cat(file, ": checkpoint metadata '", key, "' is not a number: '", it->second, "'"));
  }
}

}  // namespace

bool checkpoint_exists(const std::string& dir) {
  return ::access((dir + kModelFile).c_str(), F_OK) == 0 &&
         ::access((dir + kOptimizerFile).c_str(), F_OK) == 0;
}

void save_checkpoint(const std::string& dir, const nn::Module& module, const Optimizer& optimizer,
                     CheckpointInfo info, const GradScaler* scaler) {
  save_checkpoint(dir, module, optimizer.state_dict(), std::move(info), scaler);
}

void save_checkpoint(const std::string& dir, const nn::Module& module, const StateDict& optimizer_dict,
                     CheckpointInfo info, const GradScaler* scaler) {
  const StateDict scaler_state = scaler ? scaler->state_dict() : StateDict();
  save_checkpoint(dir, module.state_dict(), optimizer_dict, std::move(info),
                  scaler ? &scaler_state : nullptr);
}

void save_checkpoint(const std::string& dir, const StateDict& module_state, const StateDict& optimizer_dict,
                     CheckpointInfo info, const StateDict* scaler_state) {
  make_directory(dir, "save_checkpoint");
  if (info.rng.seed == 0 && info.rng.offset == 0) info.rng = generator_state();
  const SafetensorsMetadata meta = to_metadata(info);
  StateDict optimizer_state = optimizer_dict;
  if (scaler_state)
    for (const auto& [key, value] : *scaler_state) optimizer_state[kScalerPrefix + key] = value;
  save_safetensors(dir + kModelFile, module_state, meta);
  save_safetensors(dir + kOptimizerFile, optimizer_state, meta);
}

CheckpointInfo load_checkpoint(const std::string& dir, nn::Module& module, Optimizer& optimizer,
                               GradScaler* scaler) {
  return load_checkpoint(
      dir, module, [&optimizer](const StateDict& state) { optimizer.load_state_dict(state); }, scaler);
}

CheckpointInfo load_checkpoint(const std::string& dir, nn::Module& module,
                               const std::function<void(const StateDict&)>& load_optimizer,
                               GradScaler* scaler) {
  const std::string model_path = dir + kModelFile, optimizer_path = dir + kOptimizerFile;
  // Read and validate both files before changing anything.
  SafetensorsFile model_file = load_safetensors(model_path);
  SafetensorsFile optimizer_file = load_safetensors(optimizer_path);
  MG_CHECK(model_file.metadata == optimizer_file.metadata, dir,
           ": model.safetensors and optimizer.safetensors come from different checkpoints (their metadata "
           "differ)");
  CheckpointInfo info;
  const auto& meta = model_file.metadata;
  info.step = parse_number<int64_t>(meta, "step", model_path);
  info.epoch = parse_number<int64_t>(meta, "epoch", model_path);
  info.batches_into_epoch = parse_number<int64_t>(meta, "batches_into_epoch", model_path);
  info.rng.seed = parse_number<uint64_t>(meta, "rng_seed", model_path);
  info.rng.offset = parse_number<uint64_t>(meta, "rng_offset", model_path);
  for (const auto& [key, value] : meta)
    if (key != "step" && key != "epoch" && key != "batches_into_epoch" && key != "rng_seed" &&
        key != "rng_offset")
      info.extra[key] = value;

  StateDict optimizer_state, scaler_state;
  for (auto& [key, value] : optimizer_file.tensors) {
    if (key.compare(0, kScalerPrefix.size(), kScalerPrefix) == 0) {
      scaler_state[key.substr(kScalerPrefix.size())] = value;
    } else {
      optimizer_state[key] = value;
    }
  }
  MG_CHECK(!scaler || !scaler_state.empty(), optimizer_path,
           ": a GradScaler was given but the checkpoint has no scaler state");

  // Nothing may be half-loaded. The scaler state is validated on a copy first;
  // module.load_state_dict validates before it writes; if the optimizer then
  // rejects its state, the module gets its previous values back.
  GradScaler loaded_scaler = scaler ? *scaler : GradScaler();
  if (scaler) loaded_scaler.load_state_dict(scaler_state);
  StateDict module_backup;
  for (const auto& [key, value] : module.state_dict()) module_backup[key] = value.clone();
  module.load_state_dict(model_file.tensors);
  try {
    load_optimizer(optimizer_state);
  } catch (...) {
    module.load_state_dict(module_backup);
    throw;
  }
  if (scaler) *scaler = loaded_scaler;
  set_generator_state(info.rng);
  return info;
}

}  // namespace mg::optim
