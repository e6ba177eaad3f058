// Sequential, ModuleList, Functional. A container's clone_empty() asks each child
// for its own clone_empty(), so cloning recurses through any nesting.
#include "nn/container.h"

namespace mg::nn {

Functional::Functional(Function fn, std::string name) : fn_(std::move(fn)), name_(std::move(name)) {
  MG_CHECK(static_cast<bool>(fn_), "Functional: the function is empty");
}

std::shared_ptr<Module> Functional::clone_empty() const { return std::make_shared<Functional>(fn_, name_); }

// ---- Sequential ----
Sequential::Sequential(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

Module& Sequential::operator[](size_t i) const { return *ptr(i); }

const std::shared_ptr<Module>& Sequential::ptr(size_t i) const {
  MG_CHECK(i < layers_.size(), "Sequential: index ", i, " is out of range (size ", layers_.size(), ")");
  return layers_[i];
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& layer : layers_) h = (*layer)(h);  // through operator(): its forward hooks run
  return h;
}

std::shared_ptr<Module> Sequential::clone_empty() const {
  auto copy = std::make_shared<Sequential>();
  for (const auto& layer : layers_) copy->push_back(layer->clone_empty());
  return copy;
}

// ---- ModuleList ----
ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) {
  for (const auto& m : modules) push_back(m);
}

Module& ModuleList::operator[](size_t i) const { return *ptr(i); }

const std::shared_ptr<Module>& ModuleList::ptr(size_t i) const {
  MG_CHECK(i < modules_.size(), "ModuleList: index ", i, " is out of range (size ", modules_.size(), ")");
  return modules_[i];
}

std::shared_ptr<Module> ModuleList::clone_empty() const {
  auto copy = std::make_shared<ModuleList>();
  for (const auto& m : modules_) copy->push_back(m->clone_empty());
  return copy;
}

}  // namespace mg::nn
