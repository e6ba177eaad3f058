// Which submodules of a model become FullyShardedDataParallel units (PyTorch's auto_wrap_policy).
//
// A unit is the granularity of FSDP's communication: its parameters are flattened into one
// buffer, all-gathered together before its forward and reduce-scattered together after its
// backward. Few large units waste memory (a whole unit is alive at once); many tiny ones waste
// latency (one collective each). The usual choice is one unit per transformer block.
//
// The root module is always a unit as well: it holds every parameter no other unit took.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "nn/module.h"

namespace mg::parallel {

struct AutoWrapPolicy {
  enum class Kind {
    None,           // one unit: the root (every parameter gathered for the whole forward)
    Children,       // each direct child of the root that has parameters
    ModuleTypes,    // each module whose type_name() is in `module_types` (outermost match)
    SizeThreshold,  // bottom-up: a module whose not-yet-wrapped parameters reach min_params
  };
  Kind kind = Kind::Children;
  std::set<std::string> module_types;  // for ModuleTypes, e.g. {"TransformerBlock"}
  int64_t min_params = 100000;         // for SizeThreshold: elements, not bytes

  static AutoWrapPolicy none() { return {Kind::None, {}, 0}; }
  static AutoWrapPolicy children() { return {Kind::Children, {}, 0}; }
  static AutoWrapPolicy module_types_of(std::set<std::string> types) {
    return {Kind::ModuleTypes, std::move(types), 0};
  }
  static AutoWrapPolicy size_threshold(int64_t min_params) { return {Kind::SizeThreshold, {}, min_params}; }
};

// The dotted names (as in named_modules()) of the modules the policy wraps, in named_modules()
// order, root ("") first. A wrapped module may contain other wrapped modules: each parameter
// belongs to the innermost unit that contains it.
std::vector<std::string> select_units(const nn::Module& root, const AutoWrapPolicy& policy);

}  // namespace mg::parallel
