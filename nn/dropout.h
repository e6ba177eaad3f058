// Dropout: in train(), zeroes each element with probability p and scales the
// survivors by 1/(1-p), so the expected value is unchanged; in eval(), the identity.
// The mask comes from the Philox RNG (manual_seed makes it reproducible).
#pragma once

#include "nn/module.h"

namespace mg::nn {

class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override { return std::make_shared<Dropout>(p); }
  std::string extra_repr() const override;
  const double p;
};

}  // namespace mg::nn
