// Shared by the tests in tests/optim/: the PyTorch reference file, the tiny
// linear-regression problem its trajectories were computed on, and builders
// that turn a JSON case into a multigrad optimizer.
#pragma once

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "multigrad.h"
#include "optim/adam.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"

#ifndef MG_TEST_FIXTURES_DIR
#define MG_TEST_FIXTURES_DIR "tests/fixtures"
#endif

namespace optim_test {

using json = nlohmann::json;

inline const json& reference() {
  static const json doc = [] {
    const std::string path = MG_TEST_FIXTURES_DIR "/optim_reference.json";
    std::ifstream in(path);
    if (!in)
      throw std::runtime_error("cannot open " + path +
                               " (run /usr/bin/python3 scripts/gen_optim_reference.py)");
    return json::parse(in);
  }();
  return doc;
}

inline mg::DType parse_dtype(const std::string& s) { return s == "f32" ? mg::DType::f32 : mg::DType::f64; }

inline mg::Tensor from_json(const json& values, const mg::Shape& shape, mg::DType dtype,
                            bool requires_grad = false) {
  return mg::tensor<double>(values.get<std::vector<double>>(), shape,
                            mg::TensorOptions{dtype, mg::Device::cpu(), requires_grad});
}

// The regression problem: loss(W, b) = mean((X W^T + b - Y)^2).
struct Problem {
  mg::Tensor X, Y, W, b;
  explicit Problem(mg::DType dtype) {
    const json& p = reference().at("problem");
    const json& s = p.at("shapes");
    X = from_json(p.at("X"), s.at("X").get<mg::Shape>(), dtype);
    Y = from_json(p.at("Y"), s.at("Y").get<mg::Shape>(), dtype);
    W = from_json(p.at("W"), s.at("W").get<mg::Shape>(), dtype, true);
    b = from_json(p.at("b"), s.at("b").get<mg::Shape>(), dtype, true);
  }
  mg::Tensor loss() const { return mg::mean(mg::square(mg::linear(X, W, b) - Y)); }
  // zero_grad, forward, backward: gradients ready for opt.step().
  void compute_grads(mg::optim::Optimizer& opt) const {
    opt.zero_grad();
    loss().backward();
  }
};

// JSON options (multigrad names) -> an Options map.
inline mg::optim::Options to_options(const json& j) {
  mg::optim::Options o;
  for (auto it = j.begin(); it != j.end(); ++it) o[it.key()] = it.value().get<double>();
  return o;
}

template <class O>
void fill_adam(O& o, const json& j) {
  o.lr = j.value("lr", o.lr);
  o.beta1 = j.value("beta1", o.beta1);
  o.beta2 = j.value("beta2", o.beta2);
  o.eps = j.value("eps", o.eps);
  o.weight_decay = j.value("weight_decay", o.weight_decay);
  o.amsgrad = j.value("amsgrad", 0.0) != 0.0;
}

// The optimizer a trajectory case describes, over `named` ("W" -> tensor, "b" -> tensor).
inline std::unique_ptr<mg::optim::Optimizer> make_optimizer(const json& c,
                                                            const std::map<std::string, mg::Tensor>& named) {
  std::vector<mg::optim::ParamGroup> groups;
  for (const json& g : c.at("groups")) {
    mg::optim::ParamGroup group;
    for (const json& name : g.at("params")) group.params.push_back(named.at(name.get<std::string>()));
    group.options = to_options(g.at("options"));
    groups.push_back(group);
  }
  const std::string kind = c.at("optimizer");
  const json& o = c.at("options");
  if (kind == "SGD") {
    mg::optim::SGDOptions s;
    s.lr = o.value("lr", s.lr);
    s.momentum = o.value("momentum", s.momentum);
    s.dampening = o.value("dampening", s.dampening);
    s.weight_decay = o.value("weight_decay", s.weight_decay);
    s.nesterov = o.value("nesterov", 0.0) != 0.0;
    return std::make_unique<mg::optim::SGD>(groups, s);
  }
  if (kind == "Adam") {
    mg::optim::AdamOptions a;
    fill_adam(a, o);
    return std::make_unique<mg::optim::Adam>(groups, a);
  }
  if (kind == "AdamW") {
    mg::optim::AdamWOptions a;
    fill_adam(a, o);
    return std::make_unique<mg::optim::AdamW>(groups, a);
  }
  throw std::runtime_error("unknown optimizer " + kind);
}

inline const json& trajectory(const std::string& name) {
  for (const json& c : reference().at("trajectories"))
    if (c.at("name") == name) return c;
  throw std::runtime_error("no trajectory " + name);
}

inline std::vector<double> values(const mg::Tensor& t) { return t.to_vector<double>(); }

}  // namespace optim_test
