// nn::Module: registration and names, state_dict / load_state_dict (including the
// all-or-nothing error), to(dtype/device), clone(device), train/eval, zero_grad.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "multigrad.h"
#include "nn/nn.h"

using namespace mg;

namespace {

// The shape of user code (docs/nn-and-optim.md): layers as members, registered by reference,
// plus one parameter and one buffer of its own.
struct Net : nn::Module {
  nn::Linear fc1{4, 8};
  nn::BatchNorm1d bn{8};
  nn::Linear fc2{8, 3};
  Tensor scale = ones({3});
  Tensor steps = zeros({}, TensorOptions{DType::i64});
  Net() {
    register_module("fc1", fc1);
    register_module("bn", bn);
    register_module("fc2", fc2);
    register_parameter("scale", scale);
    register_buffer("steps", steps);
  }
  Tensor forward(const Tensor& x) override { return mul(fc2(relu(bn(fc1(x)))), scale); }
  std::shared_ptr<nn::Module> clone_empty() const override { return std::make_shared<Net>(); }
};

struct NotCloneable : nn::Module {
  nn::Linear fc{2, 2};
  NotCloneable() { register_module("fc", fc); }
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& entry : named) out.push_back(entry.first);
  return out;
}

bool equal_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.to_vector<double>() == b.to_vector<double>();
}

}  // namespace

TEST_CASE("named_parameters and named_buffers: dotted names in registration order", "[nn][module]") {
  Net net;
  // PyTorch's order: a module's own tensors, then each child's, depth first.
  CHECK(names_of(net.named_parameters()) == std::vector<std::string>{"scale", "fc1.weight", "fc1.bias",
                                                                     "bn.weight", "bn.bias", "fc2.weight",
                                                                     "fc2.bias"});
  CHECK(names_of(net.named_parameters(/*recurse=*/false)) == std::vector<std::string>{"scale"});
  CHECK(names_of(net.named_buffers()) ==
        std::vector<std::string>{"steps", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked"});
  std::vector<std::string> modules;
  for (const auto& [name, m] : net.named_modules()) modules.push_back(name);
  CHECK(modules == std::vector<std::string>{"", "fc1", "bn", "fc2"});
  CHECK(net.num_parameters() == 4 * 8 + 8 + 8 + 8 + 8 * 3 + 3 + 3);
  for (const Tensor& p : net.parameters()) CHECK(p.requires_grad());
  for (const Tensor& b : net.buffers()) CHECK_FALSE(b.requires_grad());
  // The handles are the members themselves.
  CHECK(net.named_parameters()[1].second.is_same(net.fc1.weight));
  CHECK(&net.child("bn") == &net.bn);
  CHECK(net.str().find("(fc1): Linear(in_features=4, out_features=8, bias=true)") != std::string::npos);
}

TEST_CASE("registration rejects bad names", "[nn][module]") {
  nn::Module m;
  Tensor a = zeros({2}), b = zeros({2});
  m.register_parameter("a", a);
  CHECK_THROWS_WITH(m.register_parameter("a", b), Catch::Contains("already registered"));
  CHECK_THROWS_WITH(m.register_buffer("x.y", b), Catch::Contains("must not contain '.'"));
  CHECK_THROWS_WITH(m.register_parameter("", b), Catch::Contains("empty name"));
  Tensor ints = zeros({2}, TensorOptions{DType::i64});
  CHECK_THROWS_WITH(m.register_parameter("i", ints), Catch::Contains("must be floating"));
  // Owning forms keep the tensor in the module.
  m.register_parameter("owned", ones({3}));
  m.register_buffer("owned_buffer", zeros({1}));
  CHECK(m.parameter("owned").requires_grad());
  CHECK(m.buffer("owned_buffer").numel() == 1);
  CHECK_THROWS_WITH(m.parameter("nope"), Catch::Contains("has no parameter 'nope'"));
  CHECK_THROWS_WITH(m(zeros({1})), Catch::Contains("has no forward"));
}

TEST_CASE("state_dict round-trips into a freshly initialised module", "[nn][module]") {
  manual_seed(1);
  Net a;
  a.train();
  a(randn({5, 4}));  // moves BatchNorm's running statistics away from their initial values
  manual_seed(2);
  Net b;
  CHECK_FALSE(equal_values(a.fc1.weight, b.fc1.weight));

  const StateDict sd = a.state_dict();
  CHECK(sd.size() == 11);  // 7 parameters + 4 buffers
  CHECK_FALSE(sd.at("fc1.weight").requires_grad());
  b.load_state_dict(sd);
  for (const auto& [name, t] : sd) {
    INFO(name);
    Tensor mine = b.state_dict().at(name);
    CHECK(equal_values(mine, t));
    CHECK(mine.dtype() == t.dtype());
  }
  CHECK(b.bn.num_batches_tracked.item<int64_t>() == 1);
  // Loading copies in place: b's parameters are still the same leaves (an optimizer keeps them).
  CHECK(b.named_parameters()[1].second.is_same(b.fc1.weight));
  CHECK(b.fc1.weight.is_leaf());
  CHECK(b.fc1.weight.requires_grad());
  // ... and do not alias a's storage.
  {
    NoGradGuard no_grad;
    a.fc1.weight.fill_(0.5);
  }
  CHECK_FALSE(equal_values(a.fc1.weight, b.fc1.weight));
  // Same outputs in eval mode.
  a.load_state_dict(b.state_dict());
  a.eval();
  b.eval();
  Tensor x = randn({3, 4});
  CHECK(equal_values(a(x), b(x)));
}

TEST_CASE("load_state_dict lists every problem and leaves the module untouched", "[nn][module]") {
  Net net;
  const StateDict before = net.state_dict();
  std::vector<std::vector<double>> before_values;
  for (const auto& [name, t] : before) before_values.push_back(t.clone().to_vector<double>());

  StateDict sd;
  for (const auto& [name, t] : before) sd[name] = add(t.to(DType::f64), 1.0);  // different values everywhere
  sd.erase("fc2.bias");
  sd.erase("bn.running_var");
  sd["extra.weight"] = zeros({2});
  sd["fc1.weight"] = zeros({8, 5});
  sd["scale"] = zeros({4});

  std::string message;
  try {
    net.load_state_dict(sd);
  } catch (const Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("nothing was loaded") != std::string::npos);
  CHECK(message.find("missing keys (2): fc2.bias, bn.running_var") != std::string::npos);
  CHECK(message.find("unexpected keys (1): extra.weight") != std::string::npos);
  CHECK(message.find("fc1.weight: module [8, 4] vs state dict [8, 5]") != std::string::npos);
  CHECK(message.find("scale: module [3] vs state dict [4]") != std::string::npos);
  size_t i = 0;
  for (const auto& [name, t] : net.state_dict()) {
    INFO(name);
    CHECK(t.to_vector<double>() == before_values[i++]);
  }

  // strict = false tolerates missing and unexpected keys, never a shape mismatch.
  CHECK_THROWS_WITH(net.load_state_dict(sd, /*strict=*/false), Catch::Contains("fc1.weight: module [8, 4]"));
  sd["fc1.weight"] = add(before.at("fc1.weight"), 1.0);
  sd["scale"] = full({3}, 2.0);
  net.load_state_dict(sd, /*strict=*/false);
  CHECK(net.scale.to_vector<double>() == std::vector<double>{2, 2, 2});
  CHECK(net.fc1.weight.dtype() == DType::f32);                                   // copy_ converted f64 -> f32
  CHECK(net.bn.running_var.to_vector<double>() == std::vector<double>(8, 1.0));  // missing: untouched
}

TEST_CASE("to(f64) converts floating tensors, keeps requires_grad and integer buffers", "[nn][module]") {
  Net net;
  const Tensor w_before = net.fc1.weight;
  Tensor x = randn({2, 4});
  net(x).sum().backward();
  REQUIRE(net.fc1.weight.grad().defined());
  net.to(DType::f64);
  for (const auto& [name, p] : net.named_parameters()) {
    INFO(name);
    CHECK(p.dtype() == DType::f64);
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  CHECK(net.fc1.weight.grad().dtype() == DType::f64);  // the grad moved with its parameter
  CHECK(net.bn.running_mean.dtype() == DType::f64);
  CHECK(net.bn.num_batches_tracked.dtype() == DType::i64);
  CHECK(net.steps.dtype() == DType::i64);
  CHECK_FALSE(net.fc1.weight.is_same(w_before));  // a new leaf in the member's slot
  CHECK(equal_values(net.fc1.weight, w_before.to(DType::f64)));
  Tensor y = net(x.to(DType::f64));
  CHECK(y.dtype() == DType::f64);
  CHECK_THROWS_WITH(net.to(DType::i64), Catch::Contains("floating dtype"));
  // to() is a no-op for tensors already in place: the handle stays the same.
  const Tensor w = net.fc1.weight;
  net.to(DType::f64);
  CHECK(net.fc1.weight.is_same(w));
}

TEST_CASE("to(device) moves every tensor to the logical device", "[nn][module]") {
  Net net;
  net.to(Device::cpu(1));
  for (const auto& [name, t] : net.state_dict()) CHECK(t.device() == Device::cpu(1));
  CHECK(net(randn({2, 4}, TensorOptions{DType::f32, Device::cpu(1)})).device() == Device::cpu(1));
  CHECK_THROWS(net(randn({2, 4})));  // cpu:0 input against cpu:1 parameters
}

TEST_CASE("clone(cpu:1) is an independent deep copy with equal values", "[nn][module]") {
  manual_seed(7);
  Net net;
  net(randn({4, 4}));  // non-trivial running stats
  net.eval();
  const GeneratorState rng_before = generator_state();
  std::shared_ptr<nn::Module> copy = net.clone(Device::cpu(1));
  CHECK(generator_state().offset == rng_before.offset);  // cloning draws no random numbers

  auto* twin = dynamic_cast<Net*>(copy.get());
  REQUIRE(twin != nullptr);
  CHECK_FALSE(twin->is_training());
  CHECK_FALSE(twin->bn.is_training());
  const StateDict a = net.state_dict(), b = twin->state_dict();
  REQUIRE(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    const Tensor& u = b.at(name);
    CHECK(u.device() == Device::cpu(1));
    CHECK(u.dtype() == t.dtype());
    CHECK(equal_values(u, t));
    CHECK(u.storage() != t.storage());
  }
  for (const auto& [name, p] : twin->named_parameters()) {
    CHECK(p.requires_grad());
    CHECK(p.is_leaf());
  }
  // The members of the copy are its own slots.
  CHECK(twin->named_parameters()[1].second.is_same(twin->fc1.weight));

  // Independent: gradients land on the copy only, changes do not leak back.
  Tensor x = randn({3, 4});
  Tensor y_orig = net(x);
  Tensor y_copy = (*twin)(x.to(Device::cpu(1)));
  CHECK(equal_values(y_orig, y_copy));
  y_copy.sum().backward();
  CHECK(twin->fc1.weight.grad().defined());
  CHECK_FALSE(net.fc1.weight.grad().defined());
  {
    NoGradGuard no_grad;
    twin->fc1.weight.fill_(0.0);
  }
  CHECK_FALSE(equal_values(net.fc1.weight, twin->fc1.weight));

  // clone() without a device keeps each tensor where it is.
  CHECK(net.clone()->state_dict().at("fc1.weight").device() == Device::cpu(0));

  NotCloneable plain;
  CHECK_THROWS_WITH(plain.clone(), Catch::Contains("override clone_empty()"));
}

TEST_CASE("train/eval reach every submodule; zero_grad forgets gradients", "[nn][module]") {
  Net net;
  CHECK(net.is_training());
  net.eval();
  for (const auto& [name, m] : net.named_modules()) CHECK_FALSE(m->is_training());
  net.train();
  for (const auto& [name, m] : net.named_modules()) CHECK(m->is_training());

  net(randn({3, 4})).sum().backward();
  for (const Tensor& p : net.parameters()) CHECK(p.grad().defined());
  net.zero_grad();
  for (const Tensor& p : net.parameters()) CHECK_FALSE(p.grad().defined());

  int visited = 0;
  net.apply([&](nn::Module&) { ++visited; });
  CHECK(visited == 4);
}

TEST_CASE("Sequential and ModuleList name, run and clone their children", "[nn][module]") {
  manual_seed(3);
  nn::Sequential seq{std::make_shared<nn::Linear>(3, 5), std::make_shared<nn::ReLU>()};
  seq.emplace_back<nn::Linear>(5, 2);
  seq.push_back([](const Tensor& x) { return mul(x, 2.0); });
  CHECK(seq.size() == 4);
  CHECK(names_of(seq.named_parameters()) ==
        std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"});
  Tensor x = randn({4, 3});
  auto& l0 = dynamic_cast<nn::Linear&>(seq[0]);
  auto& l2 = dynamic_cast<nn::Linear&>(seq[2]);
  Tensor expected = mul(l2(relu(l0(x))), 2.0);
  CHECK(equal_values(seq(x), expected));
  auto copy = seq.clone();
  CHECK(equal_values((*copy)(x), expected));

  nn::ModuleList list;
  list.emplace_back<nn::Linear>(2, 2);
  list.push_back(std::make_shared<nn::Linear>(2, 1, false));
  CHECK(names_of(list.named_parameters()) == std::vector<std::string>{"0.weight", "0.bias", "1.weight"});
  CHECK(list.clone()->num_parameters() == list.num_parameters());
  CHECK_THROWS_WITH(list[5], Catch::Contains("out of range"));
}
