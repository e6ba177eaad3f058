// A module of any forward signature (nn/value.h), shared by the DataParallel and DDP tests:
// inputs (x [N, features], [z [N, 3], scale]) and outputs (logits [N, classes], [aux [N, 2], None])
// -- a tensor and a nested list each way, a number input (copied to every replica) and a None
// output. `aux` reads only z, so a loss of the logits alone leaves aux's parameters unused.
#pragma once

#include <cstdint>
#include <memory>

#include "nn/nn.h"
#include "nn/value.h"

namespace mg::testing {

struct TwoInTwoOut : nn::Module {
  int64_t features, classes;
  nn::Linear fx, fz{3, 6}, head, aux{3, 2};
  TwoInTwoOut(int64_t features_, int64_t classes_)
      : features(features_), classes(classes_), fx(features_, 6), head(6, classes_) {
    register_module("fx", fx);
    register_module("fz", fz);
    register_module("head", head);
    register_module("aux", aux);
  }
  nn::Values forward_values(const nn::Values& in) override {
    const Tensor& x = in.at(0).tensor();
    const Tensor& z = in.at(1).list().at(0).tensor();
    const double scale = in.at(1).list().at(1).to_double();
    Tensor hidden = relu(add(fx(x), mul(fz(z), scale)));
    return {head(hidden), nn::Values{tanh(aux(z)), nn::Value()}};
  }
  std::shared_ptr<nn::Module> clone_empty() const override {
    return std::make_shared<TwoInTwoOut>(features, classes);
  }
};

}  // namespace mg::testing
