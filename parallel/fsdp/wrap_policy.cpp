// The auto-wrap policies of FullyShardedDataParallel (see wrap_policy.h).
#include "parallel/fsdp/wrap_policy.h"

#include <algorithm>

#include "base/error.h"

namespace mg::parallel {
namespace {

// Post-order, PyTorch's size_based_auto_wrap_policy: returns the parameters under `module` that
// no unit took; wraps a child when its own remainder reaches the threshold.
int64_t wrap_by_size(const nn::Module& module, const std::string& name, int64_t min_params,
                     std::set<std::string>& out) {
  int64_t remaining = 0;
  for (const auto& [tensor_name, tensor] : module.named_parameters(false)) remaining += tensor.numel();
  for (const auto& [child_name, child] : module.named_children()) {
    const std::string full = name.empty() ? child_name : name + "." + child_name;
    const int64_t child_remaining = wrap_by_size(*child, full, min_params, out);
    if (child_remaining >= min_params) {
      out.insert(full);
    } else {
      remaining += child_remaining;
    }
  }
  return remaining;
}

}  // namespace

std::vector<std::string> select_units(const nn::Module& root, const AutoWrapPolicy& policy) {
  std::set<std::string> chosen;
  switch (policy.kind) {
    case AutoWrapPolicy::Kind::None: break;
    case AutoWrapPolicy::Kind::Children:
      for (const auto& [name, child] : root.named_children())
        if (child->num_parameters() > 0) chosen.insert(name);
      break;
    case AutoWrapPolicy::Kind::ModuleTypes: {
      MG_CHECK(!policy.module_types.empty(), "FSDP: the ModuleTypes wrap policy names no module type");
      std::vector<std::string> taken;  // outermost matches only
      for (const auto& entry : root.named_modules()) {
        // Not a structured binding: a lambda may not capture one before C++20 (clang refuses it).
        const std::string& name = entry.first;
        const auto& module = entry.second;
        if (name.empty() || policy.module_types.count(module->type_name()) == 0) continue;
        const bool inside = std::any_of(taken.begin(), taken.end(), [&](const std::string& outer) {
          return name.compare(0, outer.size() + 1, outer + ".") == 0;
        });
        if (!inside && module->num_parameters() > 0) {
          taken.push_back(name);
          chosen.insert(name);
        }
      }
      break;
    }
    case AutoWrapPolicy::Kind::SizeThreshold:
      MG_CHECK(policy.min_params > 0, "FSDP: the SizeThreshold wrap policy needs min_params > 0, got ",
               policy.min_params);
      wrap_by_size(root, "", policy.min_params, chosen);
      break;
  }
  std::vector<std::string> units{""};
  for (const auto& [name, module] : root.named_modules())
    if (!name.empty() && chosen.count(name)) units.push_back(name);
  return units;
}

}  // namespace mg::parallel
