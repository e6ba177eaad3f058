// DataParallel::forward = scatter → replicate → parallel_apply → gather; see
// data_parallel.h.
#include "parallel/data_parallel/data_parallel.h"

#include <chrono>

#include "base/clock.h"
#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "parallel/data_parallel/broadcast.h"
#include "parallel/data_parallel/parallel_apply.h"
#include "parallel/data_parallel/replicate.h"
#include "parallel/data_parallel/scatter_gather.h"

namespace mg::parallel {
namespace {

using Clock = std::chrono::steady_clock;

// The parameter and buffer names of a module, in slot order: a replica shell fits the
// module as long as these stay the same.
std::vector<std::string> slot_names(const nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& slot : module.named_parameter_slots()) names.push_back("p:" + slot.first);
  for (const auto& slot : module.named_buffer_slots()) names.push_back("b:" + slot.first);
  return names;
}

Device device_of(const nn::Module& module, Device fallback) {
  for (const auto& slot : module.named_parameter_slots())
    if (slot.second->defined()) return slot.second->device();
  for (const auto& slot : module.named_buffer_slots())
    if (slot.second->defined()) return slot.second->device();
  return fallback;
}

}  // namespace

std::vector<Device> default_devices(Device fallback) {
  std::vector<Device> devices;
  if (cuda_backend() != nullptr)
    for (int i = 0; i < cuda::device_count(); ++i) devices.push_back(Device::cuda(i));
  if (devices.empty()) devices.push_back(fallback);
  return devices;
}

DataParallel::DataParallel(nn::Module& module, std::vector<Device> devices,
                           std::optional<Device> output_device, int64_t dim)
    : module_(&module), dim_(dim) {
  init(std::move(devices), output_device);
}

DataParallel::DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> devices,
                           std::optional<Device> output_device, int64_t dim)
    : module_(module.get()), owned_(std::move(module)), dim_(dim) {
  MG_CHECK(module_ != nullptr, "DataParallel: the module is null");
  init(std::move(devices), output_device);
}

void DataParallel::init(std::vector<Device> devices, std::optional<Device> output_device) {
  devices_ = devices.empty() ? default_devices(device_of(*module_, Device::cpu(0))) : std::move(devices);
  check_devices(devices_, "DataParallel");
  for (const Device& d : devices_)
    MG_CHECK(d.type == devices_[0].type, "DataParallel: devices must all be CPU or all be CUDA, got ",
             devices_[0], " and ", d);
  output_device_ = output_device.value_or(devices_[0]);
  // Fail now rather than at the first forward when the module is elsewhere.
  for (const auto& [name, p] : module_->named_parameters())
    MG_CHECK(p.device() == devices_[0],
             "DataParallel: the module's parameters must be on devices[0] = ", devices_[0], ", but '", name,
             "' is on ", p.device(), "; call .to(", devices_[0], ") on the module first");
  // Registered as "module", so dp.parameters() are the module's own and state_dict keys
  // read "module.<name>", as in PyTorch.
  register_module("module", *module_);
}

Tensor DataParallel::forward(const Tensor& x) {
  MG_CHECK(x.defined(), "DataParallel: the input is undefined");
  nn::Values outputs = forward_values({nn::Value(x)});
  MG_CHECK(outputs.size() == 1 && outputs[0].is_tensor(), "DataParallel: the module returned ",
           nn::describe(outputs),
           ", not one tensor; call forward_values (or dp(nn::Values{x})) to get all of it");
  return outputs[0].tensor();
}

nn::Values DataParallel::forward_values(const nn::Values& inputs) {
  timings_ = DataParallelTimings{};

  // 1. scatter: chunk i of every tensor input goes to devices[i] (maybe fewer chunks than devices).
  auto start = Clock::now();
  std::vector<nn::Values> per_replica;
  if (devices_.size() == 1)
    per_replica.push_back(
        nn::map_tensors(inputs, [&](const std::string&, const Tensor& t) { return t.to(devices_[0]); }));
  else
    per_replica = scatter(inputs, devices_, dim_);
  timings_.scatter_ms = ms_since(start);
  const size_t n = per_replica.size();
  timings_.replicas = static_cast<int>(n);

  if (n == 1) {  // nothing to replicate: run the module itself
    start = Clock::now();
    nn::Values outputs = module_->forward_values(per_replica[0]);
    timings_.apply_ms = ms_since(start);
    start = Clock::now();
    // As before any splitting: outputs are only moved (a scalar stays a scalar).
    outputs = nn::map_tensors(outputs, [&](const std::string& path, const Tensor& t) {
      MG_CHECK(t.defined(), "DataParallel: the module returned an undefined tensor at ", path);
      return t.to(output_device_);
    });
    timings_.gather_ms = ms_since(start);
    return outputs;
  }

  // 2. replicate: fill the first n shells with broadcast parameters and buffers.
  start = Clock::now();
  const std::vector<std::string> names = slot_names(*module_);
  if (shells_.size() != devices_.size() || names != shell_names_) {
    shells_.clear();
    for (size_t i = 0; i < devices_.size(); ++i) shells_.push_back(make_replica_shell(*module_));
    shell_names_ = names;
  }
  const std::vector<std::shared_ptr<nn::Module>> replicas(shells_.begin(), shells_.begin() + n);
  const std::vector<Device> used(devices_.begin(), devices_.begin() + n);
  // Whatever happens below, the shells must not keep this step's tensors alive.
  struct ClearShells {
    const std::vector<std::shared_ptr<nn::Module>>& shells;
    ~ClearShells() {
      for (const auto& shell : shells) clear_replica(*shell);
    }
  } clear_shells{replicas};
  fill_replicas(*module_, replicas, used);
  timings_.replicate_ms = ms_since(start);

  // 3. parallel_apply: one thread per replica.
  start = Clock::now();
  std::vector<nn::Values> outputs = parallel_apply(replicas, per_replica, used);
  timings_.apply_ms = ms_since(start);

  // 4. gather every tensor output onto output_device.
  start = Clock::now();
  nn::Values joined = gather(outputs, output_device_, dim_);
  timings_.gather_ms = ms_since(start);
  return joined;
}

std::string DataParallel::extra_repr() const {
  std::string devices;
  for (const Device& d : devices_) devices += (devices.empty() ? "" : ", ") + d.str();
  return str_cat("devices=[", devices, "], output_device=", output_device_, ", dim=", dim_);
}

}  // namespace mg::parallel
