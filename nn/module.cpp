// nn::Module: registration, recursive walks over the slots, and everything
// built on those walks (to, zero_grad, state_dict, load_state_dict, clone, str).
#include "nn/module.h"

#include <cxxabi.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <typeinfo>

#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/random.h"

namespace mg::nn {

// ---- the computation ---------------------------------------------------------
// The two defaults call each other; this marks the module whose default forward(x) is asking
// forward_values, so that a module overriding neither gets an error instead of endless recursion.
namespace {
thread_local const Module* g_tensor_forward_fallback = nullptr;
}  // namespace

Tensor Module::forward(const Tensor& x) {
  MG_CHECK(
      g_tensor_forward_fallback != this, type_name(),
      " has no forward(const Tensor&) and no forward_values(const Values&); call its submodules directly");
  const Module* outer = g_tensor_forward_fallback;
  g_tensor_forward_fallback = this;
  Values outputs;
  try {
    outputs = forward_values({Value(x)});
  } catch (...) {
    g_tensor_forward_fallback = outer;
    throw;
  }
  g_tensor_forward_fallback = outer;
  MG_CHECK(outputs.size() == 1 && outputs[0].is_tensor(), type_name(),
           ".forward(const Tensor&): forward_values returned ", describe(outputs),
           ", not one tensor; call forward_values (or module(nn::Values{...})) to get all of it");
  return outputs[0].tensor();
}

Values Module::forward_values(const Values& inputs) {
  MG_CHECK(
      g_tensor_forward_fallback != this, type_name(),
      " has no forward(const Tensor&) and no forward_values(const Values&); call its submodules directly");
  MG_CHECK(inputs.size() == 1 && inputs[0].is_tensor(), type_name(),
           " takes one tensor (forward(const Tensor&)) but got ", describe(inputs),
           "; a module with several inputs overrides forward_values(const Values&)");
  return {Value(forward(inputs[0].tensor()))};
}

Tensor Module::operator()(const Tensor& x) {
  if (forward_pre_hooks_.empty() && forward_hooks_.empty()) return forward(x);
  return call_with_hooks(x, [this](const Tensor& input) { return forward(input); });
}

Tensor Module::call_with_hooks(const Tensor& x, const std::function<Tensor(const Tensor&)>& body) {
  // Copies: a hook may register or remove hooks.
  for (auto [handle, hook] : std::vector<std::pair<int64_t, ForwardPreHook>>(forward_pre_hooks_))
    hook(*this, x);
  Tensor out = body(x);
  for (auto [handle, hook] : std::vector<std::pair<int64_t, ForwardHook>>(forward_hooks_))
    out = hook(*this, x, out);
  return out;
}

Values Module::operator()(const Values& inputs) {
  if (forward_pre_hooks_.empty() && forward_hooks_.empty()) return forward_values(inputs);
  MG_CHECK(inputs.size() == 1 && inputs[0].is_tensor(), type_name(),
           " has forward hooks, which take one tensor, but was called with ", describe(inputs));
  return {Value((*this)(inputs[0].tensor()))};
}

int64_t Module::register_forward_pre_hook(ForwardPreHook hook) {
  MG_CHECK(static_cast<bool>(hook), type_name(), ": register_forward_pre_hook got an empty hook");
  forward_pre_hooks_.emplace_back(next_hook_handle_, std::move(hook));
  return next_hook_handle_++;
}

int64_t Module::register_forward_hook(ForwardHook hook) {
  MG_CHECK(static_cast<bool>(hook), type_name(), ": register_forward_hook got an empty hook");
  forward_hooks_.emplace_back(next_hook_handle_, std::move(hook));
  return next_hook_handle_++;
}

void Module::remove_forward_hook(int64_t handle) {
  auto drop = [handle](auto& hooks) {
    for (auto it = hooks.begin(); it != hooks.end(); ++it) {
      if (it->first == handle) {
        hooks.erase(it);
        return;
      }
    }
  };
  drop(forward_pre_hooks_);
  drop(forward_hooks_);
}

// ---- registration ------------------------------------------------------------
void Module::check_new_name(const std::string& name, const char* what) const {
  MG_CHECK(!name.empty(), type_name(), ": cannot register a ", what, " with an empty name");
  MG_CHECK(name.find('.') == std::string::npos, type_name(), ": ", what, " name '", name,
           "' must not contain '.' (dots separate submodule names)");
  bool taken = false;
  for (const TensorSlot& s : parameters_) taken = taken || s.name == name;
  for (const TensorSlot& s : buffers_) taken = taken || s.name == name;
  for (const auto& entry : children_) taken = taken || entry.first == name;
  MG_CHECK(!taken, type_name(), ": the name '", name, "' is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor& member, bool requires_grad) {
  check_new_name(name, "parameter");
  MG_CHECK(member.defined(), type_name(), ": parameter '", name, "' is an undefined tensor");
  MG_CHECK(is_floating(member.dtype()), type_name(), ": parameter '", name, "' must be floating, got ",
           member.dtype());
  if (!member.is_leaf()) member = member.detach();  // a parameter is always a leaf
  member.set_requires_grad(requires_grad);
  parameters_.push_back({name, &member});
  return member;
}

Tensor& Module::register_buffer(const std::string& name, Tensor& member) {
  check_new_name(name, "buffer");
  MG_CHECK(member.defined(), type_name(), ": buffer '", name, "' is an undefined tensor");
  buffers_.push_back({name, &member});
  return member;
}

void Module::register_parameter(const std::string& name, Tensor&& value, bool requires_grad) {
  owned_tensors_.push_back(std::move(value));
  try {
    register_parameter(name, owned_tensors_.back(), requires_grad);
  } catch (...) {
    owned_tensors_.pop_back();
    throw;
  }
}

void Module::register_buffer(const std::string& name, Tensor&& value) {
  owned_tensors_.push_back(std::move(value));
  try {
    register_buffer(name, owned_tensors_.back());
  } catch (...) {
    owned_tensors_.pop_back();
    throw;
  }
}

Module& Module::register_module(const std::string& name, Module& member) {
  add_child(name, &member);
  return member;
}

void Module::add_child(const std::string& name, Module* module) {
  check_new_name(name, "submodule");
  MG_CHECK(module != this, type_name(), ": a module cannot be its own submodule ('", name, "')");
  children_.emplace_back(name, module);
}

Tensor& Module::parameter(const std::string& name) const {
  for (const TensorSlot& s : parameters_)
    if (s.name == name) return *s.tensor;
  throw Error(str_cat(type_name(), " has no parameter '", name, "'"));
}

Tensor& Module::buffer(const std::string& name) const {
  for (const TensorSlot& s : buffers_)
    if (s.name == name) return *s.tensor;
  throw Error(str_cat(type_name(), " has no buffer '", name, "'"));
}

Module& Module::child(const std::string& name) const {
  for (const auto& [child_name, module] : children_)
    if (child_name == name) return *module;
  throw Error(str_cat(type_name(), " has no submodule '", name, "'"));
}

// ---- recursive views -----------------------------------------------------------
void Module::collect_slots(const std::string& prefix, bool params, bool recurse,
                           std::vector<std::pair<std::string, Tensor*>>& out) const {
  for (const TensorSlot& s : params ? parameters_ : buffers_) out.emplace_back(prefix + s.name, s.tensor);
  if (!recurse) return;
  for (const auto& [name, module] : children_) module->collect_slots(prefix + name + ".", params, true, out);
}

void Module::collect_modules(const std::string& prefix,
                             std::vector<std::pair<std::string, Module*>>& out) const {
  for (const auto& [name, module] : children_) {
    const std::string full = prefix.empty() ? name : prefix + "." + name;
    out.emplace_back(full, module);
    module->collect_modules(full, out);
  }
}

std::vector<std::pair<std::string, Tensor*>> Module::named_parameter_slots() const {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect_slots("", true, true, out);
  return out;
}

std::vector<std::pair<std::string, Tensor*>> Module::named_buffer_slots() const {
  std::vector<std::pair<std::string, Tensor*>> out;
  collect_slots("", false, true, out);
  return out;
}

namespace {
std::vector<std::pair<std::string, Tensor>> deref(const std::vector<std::pair<std::string, Tensor*>>& slots) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(slots.size());
  for (const auto& [name, slot] : slots) out.emplace_back(name, *slot);
  return out;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect_slots("", true, recurse, slots);
  return deref(slots);
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_parameters(recurse)) out.push_back(entry.second);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor*>> slots;
  collect_slots("", false, recurse, slots);
  return deref(slots);
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& entry : named_buffers(recurse)) out.push_back(entry.second);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out{{"", const_cast<Module*>(this)}};
  collect_modules("", out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_children() const { return children_; }

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (const auto& [name, slot] : named_parameter_slots()) total += slot->numel();
  return total;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (auto& [name, module] : children_) module->apply(fn);
  fn(*this);
}

// ---- modes -----------------------------------------------------------------------
void Module::train(bool on) {
  for (auto& [name, module] : named_modules()) module->training_ = on;
}

// ---- moving, casting, gradients -----------------------------------------------------
void Module::convert(std::optional<Device> device, std::optional<DType> dtype) {
  auto convert_slot = [&](Tensor& slot) {
    const Device to_device = device.value_or(slot.device());
    const DType to_dtype = dtype && is_floating(slot.dtype()) ? *dtype : slot.dtype();
    if (slot.device() == to_device && slot.dtype() == to_dtype) return;
    Tensor moved, grad;
    {
      NoGradGuard no_grad;
      moved = slot.detach().to(to_device, to_dtype);
      if (slot.grad().defined()) grad = slot.grad().detach().to(to_device, to_dtype);
    }
    if (slot.requires_grad()) moved.set_requires_grad(true);
    if (grad.defined()) moved.set_grad(grad);
    slot = moved;
  };
  for (auto& [name, slot] : named_parameter_slots()) convert_slot(*slot);
  for (auto& [name, slot] : named_buffer_slots()) convert_slot(*slot);
}

void Module::to(Device device) { convert(device, std::nullopt); }
void Module::to(DType dtype) {
  MG_CHECK(is_floating(dtype), type_name(), ".to(", dtype, "): modules can only be cast to a floating dtype");
  convert(std::nullopt, dtype);
}
void Module::to(Device device, DType dtype) {
  MG_CHECK(is_floating(dtype), type_name(), ".to(", dtype, "): modules can only be cast to a floating dtype");
  convert(device, dtype);
}

void Module::zero_grad() {
  for (auto& [name, slot] : named_parameter_slots())
    if (slot->grad().defined()) slot->set_grad(Tensor());
}

// ---- saving and loading ----------------------------------------------------------------
StateDict Module::state_dict() const {
  StateDict out;
  for (const auto& [name, slot] : named_parameter_slots()) out[name] = slot->detach();
  for (const auto& [name, slot] : named_buffer_slots()) out[name] = slot->detach();
  return out;
}

namespace {
std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}
}  // namespace

void Module::load_state_dict(const StateDict& state, bool strict) {
  auto slots = named_parameter_slots();
  for (auto& entry : named_buffer_slots()) slots.push_back(entry);

  // 1. Validate everything, collecting every problem.
  std::vector<std::string> missing, unexpected, mismatched;
  std::set<std::string> own;
  for (const auto& [name, slot] : slots) {
    own.insert(name);
    auto it = state.find(name);
    if (it == state.end()) {
      missing.push_back(name);
    } else if (!it->second.defined()) {
      mismatched.push_back(str_cat(name, " (the state dict holds an undefined tensor)"));
    } else if (it->second.shape() != slot->shape()) {
      mismatched.push_back(str_cat(name, ": module ", shape_str(slot->shape()), " vs state dict ",
                                   shape_str(it->second.shape())));
    }
  }
  for (const auto& [name, tensor] : state)
    if (!own.count(name)) unexpected.push_back(name);
  const bool fail = !mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()));
  if (fail) {
    std::ostringstream msg;
    msg << "load_state_dict for " << type_name() << " failed; nothing was loaded.";
    if (!missing.empty()) msg << "\n  missing keys (" << missing.size() << "): " << join(missing);
    if (!unexpected.empty()) msg << "\n  unexpected keys (" << unexpected.size() << "): " << join(unexpected);
    if (!mismatched.empty()) {
      msg << "\n  shape mismatches (" << mismatched.size() << "):";
      for (const std::string& m : mismatched) msg << "\n    " << m;
    }
    throw Error(msg.str());
  }

  // 2. Copy in place: the parameters stay the same leaves (optimizers keep working).
  NoGradGuard no_grad;
  for (const auto& [name, slot] : slots) {
    auto it = state.find(name);
    if (it != state.end()) slot->copy_(it->second);
  }
}

// ---- copying ----------------------------------------------------------------------------
std::shared_ptr<Module> Module::clone_empty() const {
  throw Error(
      str_cat(type_name(), " cannot be cloned: override clone_empty() to build a new ", type_name(),
              " with the same configuration, e.g.\n  std::shared_ptr<mg::nn::Module> clone_empty() const "
              "override { return std::make_shared<",
              type_name(), ">(/* same arguments */); }"));
}

std::shared_ptr<Module> Module::clone(std::optional<Device> device) const {
  // A fresh module of the same structure. Its constructor runs the initialisers,
  // which draw from the global RNG: put the RNG back so cloning changes nothing.
  std::shared_ptr<Module> copy;
  {
    struct RestoreRng {
      GeneratorState saved = generator_state();
      ~RestoreRng() { set_generator_state(saved); }
    } restore_rng;
    copy = clone_empty();
  }
  MG_CHECK(copy != nullptr, type_name(), "::clone_empty() returned null");

  auto copy_slots = [&](const std::vector<std::pair<std::string, Tensor*>>& from,
                        const std::vector<std::pair<std::string, Tensor*>>& to, const char* what) {
    std::vector<std::string> from_names, to_names;
    for (const auto& entry : from) from_names.push_back(entry.first);
    for (const auto& entry : to) to_names.push_back(entry.first);
    MG_CHECK(from_names == to_names, type_name(), "::clone_empty() built a module with other ", what, ": [",
             join(to_names), "] instead of [", join(from_names), "]");
    for (size_t i = 0; i < from.size(); ++i) {
      const Tensor& src = *from[i].second;
      Tensor fresh = empty(src.shape(), TensorOptions{src.dtype(), device.value_or(src.device()), false});
      {
        NoGradGuard no_grad;
        fresh.copy_(src);
      }
      if (src.requires_grad()) fresh.set_requires_grad(true);
      *to[i].second = fresh;
    }
  };
  copy_slots(named_parameter_slots(), copy->named_parameter_slots(), "parameters");
  copy_slots(named_buffer_slots(), copy->named_buffer_slots(), "buffers");

  const auto from_modules = named_modules(), to_modules = copy->named_modules();
  MG_CHECK(from_modules.size() == to_modules.size(), type_name(), "::clone_empty() built a module with ",
           to_modules.size(), " submodules instead of ", from_modules.size());
  for (size_t i = 0; i < from_modules.size(); ++i)
    to_modules[i].second->training_ = from_modules[i].second->training_;
  return copy;
}

// ---- printing -------------------------------------------------------------------------------
std::string Module::type_name() const {
  const char* mangled = typeid(*this).name();
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && demangled ? demangled : mangled;
  std::free(demangled);
  // "mg::nn::Linear" -> "Linear", "(anonymous namespace)::Net" -> "Net"
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

std::string Module::str() const {
  std::ostringstream os;
  os << type_name() << "(" << extra_repr();
  if (!children_.empty()) {
    os << "\n";
    for (const auto& [name, module] : children_) {
      std::string child = module->str();
      // Indent every line of the child's text by two spaces.
      std::string indented;
      for (char c : child) {
        indented += c;
        if (c == '\n') indented += "  ";
      }
      os << "  (" << name << "): " << indented << "\n";
    }
  }
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& module) { return os << module.str(); }

}  // namespace mg::nn
