// nn::Module: the base class of every layer and model.
//
// A Module owns nothing magical: it keeps three ordered lists of *slots*
//
//   parameters  name -> Tensor*   (trainable leaves, requires_grad = true)
//   buffers     name -> Tensor*   (state that is saved but not trained: BatchNorm's running stats)
//   children    name -> Module*   (submodules; their slots appear as "child.name")
//
// Slots are pointers, so a layer keeps its tensors as ordinary members
// (`linear.weight`) and registers the member itself:
//
//   struct Affine : nn::Module {
//     Tensor scale;
//     nn::Linear fc{4, 4};
//     Affine() {
//       scale = ones({4});
//       register_parameter("scale", scale);   // the module remembers &scale
//       register_module("fc", fc);            // and &fc
//     }
//     Tensor forward(const Tensor& x) override { return fc(x) * scale; }
//   };
//
// Everything generic is then a walk over the slots: named_parameters() for the
// optimizer, state_dict()/load_state_dict() for checkpoints, to() to move or cast
// (it writes new tensors *into the slots*, so the members see them), clone() for
// DataParallel's replicas. Because the module stores pointers into itself, it can
// be neither copied nor moved; make it in place, or with std::make_shared.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "base/device.h"
#include "base/dtype.h"
#include "core/state_dict.h"
#include "core/tensor.h"
#include "nn/value.h"

namespace mg::nn {

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  // Slots point into the object: a copy or a move would point into the old one.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  // ---- the computation ----
  // One tensor in, one tensor out (all of multigrad's layers and models). Modules
  // that are only containers (ModuleList) leave it unimplemented.
  virtual Tensor forward(const Tensor& x);
  // forward(x) between the forward hooks below (calling forward() directly skips them).
  Tensor operator()(const Tensor& x);
  // Any signature (nn/value.h): several inputs, nested lists of them, several outputs; what
  // DataParallel and DDP call. The two defaults stand in for each other, so a module overrides
  // either: forward_values of one tensor returns {forward(x)}, and forward(x) of a module that
  // overrides only forward_values returns forward_values({x}) when that is one tensor. Anything
  // else is an error naming the module and the inputs it got.
  virtual Values forward_values(const Values& inputs);
  // forward_values(inputs); with forward hooks (which take one tensor), one tensor input goes
  // through operator()(x) and anything else is an error rather than skipping the hooks.
  Values operator()(const Values& inputs);

  // ---- forward hooks (PyTorch's register_forward_pre_hook / register_forward_hook) ----
  // operator() runs every pre-hook with the input, then forward, then every hook with the input
  // and the output; a hook returns the output to use (the one it got, or a replacement).
  // FullyShardedDataParallel (parallel/fsdp) gathers a unit's parameters in them. The returned
  // handle removes the hook.
  using ForwardPreHook = std::function<void(Module& module, const Tensor& input)>;
  using ForwardHook = std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;
  int64_t register_forward_pre_hook(ForwardPreHook hook);
  // operator()'s hooks around `body` in place of forward: for a wrapper that runs a module's
  // computation its own way and must still look like a call of the module to its hooks
  // (ContextParallelGPT runs each TransformerBlock with ring attention; FSDP's units gather there).
  Tensor call_with_hooks(const Tensor& x, const std::function<Tensor(const Tensor&)>& body);
  int64_t register_forward_hook(ForwardHook hook);
  void remove_forward_hook(int64_t handle);

  // ---- registration (names must be unique within this module and contain no '.') ----
  // Binds a member tensor: the module keeps &member, so `member` must live as long
  // as the module does (make it a data member, never a local variable).
  Tensor& register_parameter(const std::string& name, Tensor& member, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor& member);
  Module& register_module(const std::string& name, Module& member);
  // Owning forms: the module keeps the tensor / submodule itself. Reach an owned
  // tensor with parameter(name) / buffer(name).
  void register_parameter(const std::string& name, Tensor&& value, bool requires_grad = true);
  void register_buffer(const std::string& name, Tensor&& value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    MG_CHECK(module != nullptr, type_name(), ": register_module(\"", name, "\") got a null module");
    add_child(name, module.get());
    owned_children_.push_back(module);
    return module;
  }

  // A directly registered (not nested) parameter / buffer / child, by its local name.
  Tensor& parameter(const std::string& name) const;
  Tensor& buffer(const std::string& name) const;
  Module& child(const std::string& name) const;

  // ---- recursive views with dotted names ("block.0.fc.weight"), in PyTorch's order: this
  //      module's own tensors in registration order, then each child's, depth first ----
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  // This module first (name ""), then every descendant, depth first.
  std::vector<std::pair<std::string, Module*>> named_modules() const;
  std::vector<std::pair<std::string, Module*>> named_children() const;
  // The slots themselves, for code that must put other tensors in them (DataParallel
  // writes its broadcast replicas here). Ordinary code uses named_parameters().
  std::vector<std::pair<std::string, Tensor*>> named_parameter_slots() const;
  std::vector<std::pair<std::string, Tensor*>> named_buffer_slots() const;
  int64_t num_parameters() const;  // total number of parameter elements

  // Calls fn on every module, children first, then this one (PyTorch's Module.apply).
  void apply(const std::function<void(Module&)>& fn);

  // ---- modes ----
  void train(bool on = true);  // recursively; Dropout and BatchNorm read is_training()
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // ---- moving, casting, gradients ----
  // Replaces every parameter and buffer with a copy on `device` and/or in `dtype`
  // (dtype applies to floating tensors only; integer buffers keep theirs). The new
  // parameters are leaves with the old requires_grad; existing grads are moved too.
  // Tensors already in place are left untouched. Build optimizers after to().
  void to(Device device);
  void to(DType dtype);
  void to(Device device, DType dtype);
  // Forgets every parameter's gradient (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  // ---- saving and loading ----
  // Parameters and buffers by dotted name, detached (they share storage with the module).
  StateDict state_dict() const;
  // Checks everything first: with strict, every key must match; shapes must always
  // match. On any problem it throws one mg::Error listing all missing, unexpected
  // and mis-shaped keys, and the module is left untouched. Then it copies the values
  // in (copy_ converts dtype and crosses devices), so parameters stay the same leaves.
  void load_state_dict(const StateDict& state, bool strict = true);

  // ---- copying ----
  // A deep copy with its own parameters and buffers (on `device`, or each on its own
  // device when none is given), the same values, requires_grad and train/eval mode.
  // Built as clone_empty() + a copy of every slot; the global RNG is left as it was.
  std::shared_ptr<Module> clone(std::optional<Device> device = std::nullopt) const;
  // A new module of the same class and configuration (its values do not matter:
  // clone() overwrites them). Every layer overrides it; a user model overrides it as
  //   std::shared_ptr<nn::Module> clone_empty() const override { return std::make_shared<Net>(); }
  virtual std::shared_ptr<Module> clone_empty() const;

  // ---- printing ----
  // The class name without namespaces ("Linear"), from RTTI; override to rename.
  virtual std::string type_name() const;
  // The part inside the parentheses of str(): "in_features=4, out_features=8, bias=true".
  virtual std::string extra_repr() const { return ""; }
  // PyTorch-style tree: "Net(\n  (fc): Linear(in_features=4, ...)\n)".
  std::string str() const;

 private:
  struct TensorSlot {
    std::string name;
    Tensor* tensor;
  };
  void check_new_name(const std::string& name, const char* what) const;
  void add_child(const std::string& name, Module* module);
  void collect_slots(const std::string& prefix, bool params, bool recurse,
                     std::vector<std::pair<std::string, Tensor*>>& out) const;
  void collect_modules(const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) const;
  void convert(std::optional<Device> device, std::optional<DType> dtype);

  std::vector<TensorSlot> parameters_;
  std::vector<TensorSlot> buffers_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::deque<Tensor> owned_tensors_;  // owning registrations (a deque never moves its elements)
  std::vector<std::shared_ptr<Module>> owned_children_;
  std::vector<std::pair<int64_t, ForwardPreHook>> forward_pre_hooks_;
  std::vector<std::pair<int64_t, ForwardHook>> forward_hooks_;
  int64_t next_hook_handle_ = 0;
  bool training_ = true;
};

std::ostream& operator<<(std::ostream& os, const Module& module);

}  // namespace mg::nn
