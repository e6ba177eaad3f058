// The zero-bubble split of a backward (core/autograd/split_backward.h): backward_input (B) then
// DeferredWeightGrad::run (W) accumulate what one backward() does, B alone gives the inputs their
// gradients and no weight its own, and hooks and callbacks run where backward() would run them.
#include <catch2/catch.hpp>
#include <functional>
#include <memory>
#include <vector>

#include "multigrad.h"
#include "tests/tensor_values.h"

using namespace mg;
using Catch::Matchers::Contains;
using mg::testing::values;

namespace {

// A stage as a pipeline cuts one: Linear, LayerNorm, GELU, Linear (biases and affine norms: every
// kind of edge B leaves to W).
std::shared_ptr<nn::Sequential> make_stage(uint64_t seed) {
  manual_seed(seed);
  auto s = std::make_shared<nn::Sequential>();
  s->push_back(std::make_shared<nn::Linear>(6, 8));
  s->push_back(std::make_shared<nn::LayerNorm>(8));
  s->push_back(std::make_shared<nn::GELU>());
  s->push_back(std::make_shared<nn::Linear>(8, 5));
  return s;
}

Tensor received_input() {
  manual_seed(7);
  Tensor x = randn({4, 6});
  x.set_requires_grad(true);
  return x;
}

void check_same_grads(nn::Module& a, nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    REQUIRE(pa[i].grad().defined());
    REQUIRE(pb[i].grad().defined());
    const std::vector<float> ga = values(pa[i].grad()), gb = values(pb[i].grad());
    for (size_t j = 0; j < ga.size(); ++j) CHECK(ga[j] == Approx(gb[j]).epsilon(1e-6).margin(1e-7));
  }
}

// loss(x, w) for x [2, 3] and w [3, 3] drawn after `seed`, differentiated by one backward and by
// B then W: the same gradients for both, B gives x its whole gradient and w none, W adds to x
// nothing.
void require_split_equals_backward(uint64_t seed,
                                   const std::function<Tensor(const Tensor&, const Tensor&)>& loss_of) {
  auto run = [&](bool split) {
    manual_seed(seed);
    Tensor w = randn({3, 3}).set_requires_grad(true);
    Tensor x = randn({2, 3}).set_requires_grad(true);
    Tensor loss = loss_of(x, w);
    if (split) {
      auto deferred = autograd::backward_input({loss}, {Tensor()}, {x});
      CHECK_FALSE(w.grad().defined());
      const std::vector<float> gx = values(x.grad());
      deferred.run();
      CHECK(values(x.grad()) == gx);
    } else {
      loss.backward();
    }
    return std::make_pair(values(x.grad()), values(w.grad()));
  };
  auto [gx_ref, gw_ref] = run(false);
  auto [gx, gw] = run(true);
  for (size_t j = 0; j < gx.size(); ++j) CHECK(gx[j] == Approx(gx_ref[j]).epsilon(1e-6));
  for (size_t j = 0; j < gw.size(); ++j) CHECK(gw[j] == Approx(gw_ref[j]).epsilon(1e-6));
}

}  // namespace

TEST_CASE("B then W accumulate exactly what one backward does", "[autograd][split]") {
  auto whole = make_stage(1), split = make_stage(1);
  Tensor x_whole = received_input(), x_split = received_input();
  Tensor gy = full({4, 5}, 0.5f);

  (*whole)(x_whole).backward(gy);

  Tensor y = (*split)(x_split);
  autograd::DeferredWeightGrad w = autograd::backward_input({y}, {gy}, {x_split});
  // B: the input's gradient, and no weight's yet.
  REQUIRE(x_split.grad().defined());
  const std::vector<float> gx = values(x_split.grad()), gx_ref = values(x_whole.grad());
  for (size_t j = 0; j < gx.size(); ++j) CHECK(gx[j] == Approx(gx_ref[j]).epsilon(1e-6));
  for (const Tensor& p : split->parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(w.pending());
  // 5 nodes lead both ways: the two matmuls (to the weights), the two bias adds, the layer norm.
  CHECK(w.num_deferred() == 5);

  w.run();
  CHECK_FALSE(w.pending());
  check_same_grads(*whole, *split);
  CHECK_THROWS_WITH(w.run(), Contains("already computed"));
}

TEST_CASE("a weight used twice and a shared weight-only subgraph still sum once per use",
          "[autograd][split]") {
  // h = (x W2) W2 with W2 = 2 W: the weight-only node (mul by 2) gets gradients from two matmuls
  // that both lie on the input's path; W must count both before running it.
  require_split_equals_backward(3, [](const Tensor& x, const Tensor& w) {
    Tensor w2 = mul(w, 2.0);
    return sum(mul(matmul(matmul(x, w2), w2), matmul(x, w)));
  });
}

TEST_CASE("a diamond: a node that reaches the input only through a node already walked is on the path",
          "[autograd][split]") {
  // a = x W; out = 2a + 3 exp(a). The walk reaches a's matmul through the first product, then
  // meets it again from the second: that product must still count as on the B path.
  require_split_equals_backward(9, [](const Tensor& x, const Tensor& w) {
    Tensor a = matmul(x, w);
    return sum(add(mul(a, 2.0), mul(exp(a), 3.0)));
  });
}

TEST_CASE("no inputs (a first stage) leaves the whole backward to W; roots off the path wait for W",
          "[autograd][split]") {
  auto whole = make_stage(2), split = make_stage(2);
  manual_seed(5);
  Tensor data = randn({4, 6});  // a first stage's input: data, no gradient wanted
  (*whole)(data).sum().backward();
  auto w = autograd::backward_input({(*split)(data).sum()}, {Tensor()}, {});
  for (const Tensor& p : split->parameters()) CHECK_FALSE(p.grad().defined());
  CHECK(w.num_deferred() == 1);  // the root itself
  w.run();
  check_same_grads(*whole, *split);

  // Two roots, one of which never reaches the input: its seed waits for W.
  Tensor x = received_input(), b = full({5}, 1.0f).set_requires_grad(true);
  auto stage = make_stage(2);
  Tensor y = (*stage)(x);
  Tensor loss_x = sum(y), loss_b = sum(mul(b, b));
  auto deferred = autograd::backward_input({loss_x, loss_b}, {Tensor(), Tensor()}, {x});
  CHECK_FALSE(b.grad().defined());
  deferred.run();
  CHECK(values(b.grad()) == std::vector<float>(5, 2.0f));
}

TEST_CASE("hooks: tensor hooks run in B, weight hooks and their callbacks in W", "[autograd][split]") {
  auto stage = make_stage(4);
  Tensor x = received_input();
  Tensor y = (*stage)(x);
  int tensor_hooks = 0, weight_hooks = 0, callbacks = 0;
  y.register_hook([&](const Tensor& g) {
    ++tensor_hooks;
    return g;
  });
  Tensor weight = stage->parameters().front();
  weight.register_post_accumulate_grad_hook([&](const Tensor&) {
    ++weight_hooks;
    autograd::queue_callback([&] { ++callbacks; });
  });
  auto w = autograd::backward_input({y}, {ones({4, 5})}, {x});
  CHECK(tensor_hooks == 1);
  CHECK(weight_hooks == 0);
  w.run();
  CHECK(tensor_hooks == 1);  // ran once, in B; W reuses the hooked gradient
  CHECK(weight_hooks == 1);
  CHECK(callbacks == 1);
}

TEST_CASE("a checkpointed block on the B path recomputes and differentiates as one backward",
          "[autograd][split]") {
  auto whole = make_stage(6), split = make_stage(6);
  Tensor x_whole = received_input(), x_split = received_input();
  nn::checkpoint_module(*whole, x_whole).sum().backward();
  auto w = autograd::backward_input({nn::checkpoint_module(*split, x_split).sum()}, {Tensor()}, {x_split});
  w.run();
  check_same_grads(*whole, *split);
  const std::vector<float> gx = values(x_split.grad()), gx_ref = values(x_whole.grad());
  for (size_t j = 0; j < gx.size(); ++j) CHECK(gx[j] == Approx(gx_ref[j]).epsilon(1e-6));
}

TEST_CASE("backward_input refuses what it cannot split", "[autograd][split]") {
  Tensor x = received_input();
  auto stage = make_stage(8);
  Tensor y = (*stage)(x);
  Tensor not_leaf = mul(x, 2.0);
  CHECK_THROWS_WITH(autograd::backward_input({y.sum()}, {Tensor()}, {not_leaf}), Contains("must be a leaf"));
  Tensor unused = full({2}, 1.0f).set_requires_grad(true);
  CHECK_THROWS_WITH(autograd::backward_input({stage->forward(x).sum()}, {Tensor()}, {unused}),
                    Contains("not used by the graph"));
  autograd::DeferredWeightGrad empty;
  CHECK_FALSE(empty.pending());
  CHECK_THROWS_WITH(empty.run(), Contains("not made by backward_input"));
  // Without retain_graph, W frees what it used: a second backward through it says so.
  Tensor z = (*stage)(x).sum();
  auto w = autograd::backward_input({z}, {Tensor()}, {x});
  w.run();
  CHECK_THROWS_WITH(z.backward(), Contains("a second time"));
}

TEST_CASE("a formula that asks needs_input_grad computes each half once", "[autograd][split]") {
  // y = x * w recorded by hand, with a formula that says which gradients it was asked for.
  Tensor x = received_input(), w = full({4, 6}, 3.0f).set_requires_grad(true);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = mul(x, w);
  }
  std::vector<std::vector<bool>> asked;
  autograd::record("AskingMul", {x, w}, {y}, [&, x, w](const std::vector<Tensor>& g) {
    asked.push_back({autograd::needs_input_grad(0), autograd::needs_input_grad(1)});
    return std::vector<Tensor>{autograd::needs_input_grad(0) ? mul(g[0], w.detach()) : Tensor(),
                               autograd::needs_input_grad(1) ? mul(g[0], x.detach()) : Tensor()};
  });
  auto deferred = autograd::backward_input({y.sum()}, {Tensor()}, {x});
  REQUIRE(asked.size() == 1);
  CHECK(asked[0] == std::vector<bool>{true, false});
  CHECK(values(x.grad()) == std::vector<float>(24, 3.0f));
  deferred.run();
  REQUIRE(asked.size() == 2);
  CHECK(asked[1] == std::vector<bool>{false, true});
  CHECK(values(w.grad()) == values(x.detach()));
  // Outside a split, every input is wanted.
  CHECK(autograd::needs_input_grad(0));
}
