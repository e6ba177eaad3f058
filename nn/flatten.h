// Shape-only layers.
//
//   Flatten(start_dim = 1, end_dim = -1)  merges those dims: [N, C, H, W] -> [N, C*H*W]
//   Identity                              returns its input (a placeholder, e.g. a shortcut)
#pragma once

#include "nn/module.h"

namespace mg::nn {

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_dim(start_dim), end_dim(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim, end_dim); }
  std::shared_ptr<Module> clone_empty() const override {
    return std::make_shared<Flatten>(start_dim, end_dim);
  }
  std::string extra_repr() const override { return str_cat("start_dim=", start_dim, ", end_dim=", end_dim); }
  const int64_t start_dim, end_dim;
};

class Identity : public Module {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::shared_ptr<Module> clone_empty() const override { return std::make_shared<Identity>(); }
};

}  // namespace mg::nn
