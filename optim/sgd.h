// SGD: stochastic gradient descent with optional momentum (heavy-ball or
// Nesterov), dampening and L2 weight decay -- PyTorch's torch.optim.SGD.
//
//   d   = g + weight_decay * p
//   buf = d                                       on the first step
//   buf = momentum * buf + (1 - dampening) * d    afterwards
//   d   = nesterov ? d + momentum * buf : buf     (when momentum != 0)
//   p  -= lr * d
//
// Options are a plain aggregate with defaults, like every options struct in
// multigrad: set the fields you need by name, the others keep their defaults
// (see docs/nn-and-optim.md):
//   optim::SGDOptions sgd;
//   sgd.lr = 0.1;
//   sgd.momentum = 0.9;
//   optim::SGD opt(params, sgd);
#pragma once

#include <vector>

#include "optim/optimizer.h"

namespace mg::optim {

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;

  Options to_map() const;  // {"lr", "momentum", "dampening", "weight_decay", "nesterov"}
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SGDOptions& options = {});
  // Several groups; each group's missing options come from `defaults`.
  SGD(std::vector<ParamGroup> groups, const SGDOptions& defaults = {});

  const char* name() const override { return "SGD"; }

 protected:
  void update(const ParamGroup& group, const std::vector<ParamUpdate>& batch) override;
  void validate(const Options& options) const override;
  // "momentum_buffer" (required when momentum != 0).
  std::vector<StateSpec> state_spec(const Options& options) const override;
};

}  // namespace mg::optim
