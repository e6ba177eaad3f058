// nn layers against PyTorch: outputs, input and parameter gradients, and buffers.
//
// tests/fixtures/nn_reference.json is written once by scripts/gen_nn_reference.py (run
// with Debian's python3-torch); this test never needs PyTorch. For each case it
// builds the layer, casts it to f64, loads PyTorch's parameters through
// load_state_dict (the attention case maps MultiheadAttention's in_proj/out_proj
// onto c_attn/c_proj in the script), runs the forward in the recorded mode,
// back-propagates (output * out_weight).sum(), and compares everything to 1e-8.
#include <catch2/catch.hpp>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "multigrad.h"
#include "nn/nn.h"

#ifndef MG_TEST_FIXTURES_DIR
#define MG_TEST_FIXTURES_DIR "tests/fixtures"
#endif

namespace {

using json = nlohmann::json;
using mg::Tensor;

constexpr double kTol = 1e-8;

const json& reference() {
  static const json doc = [] {
    const std::string path = MG_TEST_FIXTURES_DIR "/nn_reference.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path + " (run scripts/gen_nn_reference.py)");
    return json::parse(in);
  }();
  return doc;
}

Tensor from_json(const json& t) {
  const mg::Shape shape = t.at("shape").get<mg::Shape>();
  if (t.at("dtype") == "i64")
    return mg::tensor<int64_t>(t.at("data").get<std::vector<int64_t>>(), shape, {mg::DType::i64});
  return mg::tensor<double>(t.at("data").get<std::vector<double>>(), shape, {mg::DType::f64});
}

// Largest |actual - expected| relative to max(1, |expected|); shapes must match.
void require_close(const std::string& what, const Tensor& actual, const json& expected) {
  INFO(what);
  REQUIRE(actual.defined());
  REQUIRE(actual.shape() == expected.at("shape").get<mg::Shape>());
  const std::vector<double> a = actual.to_vector<double>();
  const std::vector<double> e = expected.at("data").get<std::vector<double>>();
  REQUIRE(a.size() == e.size());
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(a[i] - e[i]) / std::max(1.0, std::abs(e[i]));
    if (!(err <= worst)) {
      worst = err;
      worst_at = i;
    }
  }
  INFO("worst relative error " << worst << " at element " << worst_at << ": " << a[worst_at] << " vs "
                               << e[worst_at]);
  CHECK(worst <= kTol);
}

std::shared_ptr<mg::nn::Module> build(const std::string& layer, const json& c) {
  using namespace mg::nn;
  if (layer == "Linear") return std::make_shared<Linear>(c.at("in"), c.at("out"), c.at("bias").get<bool>());
  if (layer == "Conv2d") {
    mg::nn::Conv2dOptions o;
    o.stride = c.at("stride");
    o.padding = c.at("padding");
    o.dilation = c.at("dilation");
    o.bias = c.at("bias");
    return std::make_shared<Conv2d>(c.at("in"), c.at("out"), c.at("kernel"), o);
  }
  if (layer == "BatchNorm2d") return std::make_shared<BatchNorm2d>(c.at("num_features"));
  if (layer == "BatchNorm1d") return std::make_shared<BatchNorm1d>(c.at("num_features"));
  if (layer == "LayerNorm") return std::make_shared<LayerNorm>(c.at("normalized_size").get<int64_t>());
  if (layer == "CausalSelfAttention")
    return std::make_shared<CausalSelfAttention>(c.at("n_embd"), c.at("n_head"));
  if (layer == "TransformerBlock") return std::make_shared<TransformerBlock>(c.at("n_embd"), c.at("n_head"));
  throw std::runtime_error("nn_reference.json: unknown layer " + layer);
}

}  // namespace

TEST_CASE("nn layers match PyTorch (outputs, gradients, buffers)", "[nn][reference]") {
  const json& cases = reference().at("cases");
  REQUIRE(cases.size() >= 8);
  for (const json& c : cases) {
    const std::string name = c.at("name");
    SECTION(name) {
      auto layer = build(c.at("layer"), c.at("config"));
      layer->to(mg::DType::f64);
      mg::StateDict state;
      for (const auto& [key, value] : c.at("state").items()) state[key] = from_json(value);
      layer->load_state_dict(state);  // strict: the script names every parameter and buffer
      layer->train(c.at("training").get<bool>());

      Tensor x = from_json(c.at("input")).set_requires_grad(true);
      Tensor y = (*layer)(x);
      require_close(name + " output", y, c.at("output"));

      mg::sum(mg::mul(y, from_json(c.at("out_weight")))).backward();
      const json& grads = c.at("grads");
      require_close(name + " grad input", x.grad(), grads.at("input"));
      int checked = 0;
      for (const auto& [pname, p] : layer->named_parameters()) {
        INFO("parameter " << pname);
        REQUIRE(grads.contains(pname));
        require_close(name + " grad " + pname, p.grad(), grads.at(pname));
        ++checked;
      }
      CHECK(checked + 1 == static_cast<int>(grads.size()));  // every reference gradient was compared
      for (const auto& [bname, b] : layer->named_buffers()) {
        if (!c.at("state_after").contains(bname)) continue;
        require_close(name + " buffer " + bname, b.to(mg::DType::f64), c.at("state_after").at(bname));
      }
    }
  }
}
