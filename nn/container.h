// Containers: modules that hold other modules.
//
//   Sequential  runs its children in order: forward(x) = layer_n(...layer_1(x))
//   ModuleList  just holds them (registered, so their parameters are found, saved,
//               moved and cloned); the owner decides how to call them
//   Functional  wraps a plain function (a lambda around relu, flatten, ...) so it
//               can sit in a Sequential
//
// Children are owned (std::shared_ptr) and named "0", "1", ... as in PyTorch, so a
// Sequential's parameters read "0.weight", "2.bias".
#pragma once

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"

namespace mg::nn {

class Functional : public Module {
 public:
  using Function = std::function<Tensor(const Tensor&)>;
  explicit Functional(Function fn, std::string name = "Functional");
  Tensor forward(const Tensor& x) override { return fn_(x); }
  std::shared_ptr<Module> clone_empty() const override;
  std::string type_name() const override { return name_; }

 private:
  Function fn_;
  std::string name_;
};

class Sequential : public Module {
 public:
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Module>> modules);

  // Appends a module (registered as child "<index>") and returns it.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(layers_.size()), module);
    layers_.push_back(module);
    return module;
  }
  // Appends a plain function as a Functional layer.
  void push_back(Functional::Function fn) { push_back(std::make_shared<Functional>(std::move(fn))); }
  // Constructs the module in place: seq.emplace_back<Linear>(784, 256).
  template <class M, class... Args>
  std::shared_ptr<M> emplace_back(Args&&... args) {
    return push_back(std::make_shared<M>(std::forward<Args>(args)...));
  }

  size_t size() const { return layers_.size(); }
  bool empty() const { return layers_.empty(); }
  Module& operator[](size_t i) const;
  const std::shared_ptr<Module>& ptr(size_t i) const;
  auto begin() const { return layers_.begin(); }
  auto end() const { return layers_.end(); }

  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

class ModuleList : public Module {
 public:
  ModuleList() = default;
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);

  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    register_module(std::to_string(modules_.size()), module);
    modules_.push_back(module);
    return module;
  }
  template <class M, class... Args>
  std::shared_ptr<M> emplace_back(Args&&... args) {
    return push_back(std::make_shared<M>(std::forward<Args>(args)...));
  }

  size_t size() const { return modules_.size(); }
  bool empty() const { return modules_.empty(); }
  Module& operator[](size_t i) const;
  const std::shared_ptr<Module>& ptr(size_t i) const;
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

  std::shared_ptr<Module> clone_empty() const override;

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace mg::nn
