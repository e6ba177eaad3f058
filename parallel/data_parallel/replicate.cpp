// replicate = clone_empty() per device + broadcast of parameters and buffers into the
// replicas' slots; see replicate.h.
#include "parallel/data_parallel/replicate.h"

#include <string>
#include <utility>

#include "core/grad_mode.h"
#include "core/random.h"
#include "parallel/data_parallel/broadcast.h"

namespace mg::parallel {
namespace {

using Slots = std::vector<std::pair<std::string, Tensor*>>;

std::vector<Tensor> values(const Slots& slots) {
  std::vector<Tensor> out;
  for (const auto& slot : slots) out.push_back(*slot.second);
  return out;
}

// Every tensor of the module must sit on the source device: that is where the
// broadcast starts and where the gradients are summed.
void check_on_device(const nn::Module& module, const Slots& slots, Device source, const char* what) {
  for (const auto& [name, tensor] : slots)
    MG_CHECK(tensor->defined() && tensor->device() == source, "replicate: the module's ", what, " '", name,
             "' is on ", tensor->defined() ? tensor->device().str() : std::string("(undefined)"),
             " but the replicas are made from devices[0] = ", source, "; call ", module.type_name(), ".to(",
             source, ") first");
}

// Writes per_device[d][i] into the i-th slot of replicas[d], after checking that the
// replica has the same slot names as the module.
void write_slots(const Slots& module_slots, const std::vector<std::shared_ptr<nn::Module>>& replicas,
                 const std::vector<std::vector<Tensor>>& per_device, bool params) {
  for (size_t d = 0; d < replicas.size(); ++d) {
    const Slots slots = params ? replicas[d]->named_parameter_slots() : replicas[d]->named_buffer_slots();
    MG_CHECK(slots.size() == module_slots.size(), "replicate: replica ", d, " has ", slots.size(),
             params ? " parameters" : " buffers", " but the module has ", module_slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      MG_CHECK(slots[i].first == module_slots[i].first, "replicate: replica ", d, "'s ",
               params ? "parameter " : "buffer ", i, " is '", slots[i].first, "' but the module's is '",
               module_slots[i].first, "'");
      *slots[i].second = per_device[d][i];
    }
  }
}

}  // namespace

std::shared_ptr<nn::Module> make_replica_shell(const nn::Module& module) {
  // The constructor runs the initialisers, which draw from the global RNG: put it back,
  // so that replicating changes no later random number (as Module::clone does).
  const GeneratorState saved = generator_state();
  std::shared_ptr<nn::Module> shell;
  try {
    shell = module.clone_empty();
  } catch (...) {
    set_generator_state(saved);
    throw;
  }
  set_generator_state(saved);
  MG_CHECK(shell != nullptr, module.type_name(), "::clone_empty() returned null");
  return shell;
}

void fill_replicas(const nn::Module& module, const std::vector<std::shared_ptr<nn::Module>>& replicas,
                   const std::vector<Device>& devices) {
  check_devices(devices, "replicate");
  MG_CHECK(replicas.size() == devices.size(), "replicate: ", replicas.size(), " replicas for ",
           devices.size(), " devices");
  const Device source = devices[0];
  const Slots params = module.named_parameter_slots(), buffers = module.named_buffer_slots();
  check_on_device(module, params, source, "parameter");
  check_on_device(module, buffers, source, "buffer");

  // Parameters: through the autograd broadcast (when grad mode is on).
  write_slots(params, replicas, broadcast(values(params), devices), true);
  // Buffers: plain copies; nobody differentiates running statistics.
  {
    NoGradGuard no_grad;
    write_slots(buffers, replicas, broadcast(values(buffers), devices), false);
  }

  // Train/eval mode, module by module. named_modules() lists parents before children
  // and train() recurses, so each call is overridden by the later calls below it.
  const auto from = module.named_modules();
  for (size_t d = 0; d < replicas.size(); ++d) {
    const auto to = replicas[d]->named_modules();
    MG_CHECK(to.size() == from.size(), "replicate: replica ", d, " has ", to.size(),
             " submodules but the module has ", from.size());
    for (size_t m = 0; m < from.size(); ++m) to[m].second->train(from[m].second->is_training());
  }
}

void clear_replica(nn::Module& replica) {
  for (const auto& slot : replica.named_parameter_slots()) *slot.second = Tensor();
  for (const auto& slot : replica.named_buffer_slots()) *slot.second = Tensor();
}

std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module,
                                                   const std::vector<Device>& devices) {
  check_devices(devices, "replicate");
  std::vector<std::shared_ptr<nn::Module>> replicas;
  for (size_t d = 0; d < devices.size(); ++d) replicas.push_back(make_replica_shell(module));
  fill_replicas(module, replicas, devices);
  return replicas;
}

}  // namespace mg::parallel
