// The autograd engine: accumulation, graph shapes, hooks (tensor, post-accumulate),
// retain_grad, grad mode, detach, version counters, callbacks, retain_graph,
// explicit seeds, split, requires_grad propagation, integer side branches.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "multigrad.h"
#include "tests/tensor_values.h"

using namespace mg;
using Catch::Matchers::Contains;

using mg::testing::values;

namespace {

TensorOptions rg() { return TensorOptions{DType::f32, Device::cpu(), true}; }

Tensor leaf(const std::vector<float>& v) {
  return tensor<float>(v, Shape{static_cast<int64_t>(v.size())}, rg());
}

}  // namespace

TEST_CASE("gradients accumulate across backward calls", "[autograd]") {
  Tensor x = leaf({1, 2, 3});
  mul(x, x).sum().backward();
  REQUIRE(x.grad().defined());
  CHECK(values(x.grad()) == std::vector<float>{2, 4, 6});
  mul(x, x).sum().backward();
  CHECK(values(x.grad()) == std::vector<float>{4, 8, 12});
  // A third, different graph adds its own gradient.
  mul(x, 10.0).sum().backward();
  CHECK(values(x.grad()) == std::vector<float>{14, 18, 22});
  // Resetting .grad starts afresh.
  x.set_grad(Tensor());
  CHECK_FALSE(x.grad().defined());
  mul(x, 3.0).sum().backward();
  CHECK(values(x.grad()) == std::vector<float>{3, 3, 3});
}

TEST_CASE("a diamond graph sums both paths", "[autograd]") {
  Tensor x = leaf({1, 2, 3});
  Tensor a = mul(x, 2.0);  // da/dx = 2
  Tensor b = pow(x, 2.0);  // db/dx = 2x
  Tensor loss = add(a, b).sum();
  loss.backward();
  CHECK(values(x.grad()) == std::vector<float>{4, 6, 8});

  // x used twice in one op, and a deeper diamond: y = x*x; z = y + y*x.
  Tensor x2 = leaf({1, 2});
  Tensor y = mul(x2, x2);
  Tensor z = add(y, mul(y, x2));  // z = x^2 + x^3, dz/dx = 2x + 3x^2
  z.sum().backward();
  CHECK(values(x2.grad()) == std::vector<float>{5, 16});
}

TEST_CASE("gradients of two inputs of an add do not alias", "[autograd]") {
  Tensor a = leaf({1, 2});
  Tensor b = leaf({3, 4});
  add(a, b).sum().backward();
  REQUIRE(a.grad().defined());
  REQUIRE(b.grad().defined());
  CHECK(a.grad().data_ptr() != b.grad().data_ptr());
  {
    NoGradGuard no_grad;
    a.mutable_grad().mul_(5.0);
  }
  CHECK(values(a.grad()) == std::vector<float>{5, 5});
  CHECK(values(b.grad()) == std::vector<float>{1, 1});

  // The user's seed gradient is not aliased by .grad either.
  Tensor x = leaf({1, 2, 3});
  Tensor seed = tensor<float>({1, 2, 3});
  add(x, 1.0).backward(seed);
  seed.fill_(0.0);
  CHECK(values(x.grad()) == std::vector<float>{1, 2, 3});
}

TEST_CASE("post-accumulate hooks fire once per leaf, after .grad, in reverse creation order",
          "[autograd][hooks]") {
  Tensor x = tensor<float>({1, 2});  // input, no grad
  Tensor w1 = leaf({2, 3}), w2 = leaf({5, 7}), w3 = leaf({11, 13});
  std::vector<std::string> order;
  std::vector<std::vector<float>> seen(3);
  std::vector<int> calls(3, 0);
  std::vector<bool> same_tensor(3, false);
  const std::vector<Tensor> ws{w1, w2, w3};
  for (int i = 0; i < 3; ++i) {
    ws[i].register_post_accumulate_grad_hook([&, i](const Tensor& l) {
      order.push_back("w" + std::to_string(i + 1));
      ++calls[i];
      same_tensor[i] = l.is_same(ws[i]);
      seen[i] = l.grad().defined() ? l.grad().to_vector<float>() : std::vector<float>{};
    });
  }
  auto forward = [&] {
    Tensor h1 = mul(x, w1);
    Tensor h2 = mul(h1, w2);
    Tensor h3 = mul(h2, w3);
    return h3.sum();
  };
  forward().backward();
  CHECK(order == std::vector<std::string>{"w3", "w2", "w1"});
  CHECK(calls == std::vector<int>{1, 1, 1});
  CHECK(same_tensor == std::vector<bool>{true, true, true});
  // d/dw1 = x*w2*w3, d/dw2 = x*w1*w3, d/dw3 = x*w1*w2
  const std::vector<float> g1{1 * 5 * 11, 2 * 7 * 13}, g2{1 * 2 * 11, 2 * 3 * 13}, g3{1 * 2 * 5, 2 * 3 * 7};
  CHECK(seen[0] == g1);
  CHECK(seen[1] == g2);
  CHECK(seen[2] == g3);

  // Second backward: hooks see the accumulated value.
  order.clear();
  forward().backward();
  CHECK(order == std::vector<std::string>{"w3", "w2", "w1"});
  CHECK(calls == std::vector<int>{2, 2, 2});
  CHECK(seen[0] == std::vector<float>{2 * g1[0], 2 * g1[1]});
  CHECK(seen[2] == std::vector<float>{2 * g3[0], 2 * g3[1]});
}

TEST_CASE("a post-accumulate hook fires once when the leaf is reached by several paths",
          "[autograd][hooks]") {
  Tensor x = leaf({1, 2});
  int calls = 0;
  std::vector<float> seen;
  x.register_post_accumulate_grad_hook([&](const Tensor& l) {
    ++calls;
    seen = l.grad().to_vector<float>();
  });
  Tensor loss = add(add(mul(x, 2.0), mul(x, 3.0)), mul(x, x)).sum();  // 5x + x^2
  loss.backward();
  CHECK(calls == 1);
  CHECK(seen == std::vector<float>{7, 9});
  // Not fired for leaves the backward does not reach.
  Tensor unused = leaf({1});
  int unused_calls = 0;
  unused.register_post_accumulate_grad_hook([&](const Tensor&) { ++unused_calls; });
  mul(x, 1.0).sum().backward();
  CHECK(unused_calls == 0);
  CHECK(calls == 2);
  // Only leaves that require grad accept such hooks.
  CHECK_THROWS_AS(mul(x, 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
  CHECK_THROWS_AS(tensor<float>({1}).register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
}

TEST_CASE("tensor hooks can read and replace gradients", "[autograd][hooks]") {
  SECTION("on a leaf") {
    Tensor x = leaf({1, 2, 3});
    std::vector<float> seen;
    x.register_hook([&](const Tensor& g) {
      seen = g.to_vector<float>();
      return mul(g, 2.0);
    });
    std::vector<float> post_seen;
    x.register_post_accumulate_grad_hook([&](const Tensor& l) { post_seen = l.grad().to_vector<float>(); });
    mul(x, x).sum().backward();  // incoming 2x
    CHECK(seen == std::vector<float>{2, 4, 6});
    CHECK(values(x.grad()) == std::vector<float>{4, 8, 12});
    CHECK(post_seen == std::vector<float>{4, 8, 12});  // post hook runs after the replacement
  }
  SECTION("on a non-leaf") {
    Tensor x = leaf({1, 2, 3});
    Tensor y = mul(x, 3.0);
    std::vector<float> seen;
    y.register_hook([&](const Tensor& g) {
      seen = g.to_vector<float>();
      return mul(g, 2.0);
    });
    mul(y, y).sum().backward();  // dL/dy = 2y = 6x
    CHECK(seen == std::vector<float>{6, 12, 18});
    CHECK(values(x.grad()) == std::vector<float>{36, 72, 108});  // 2 * 6x * 3
  }
  SECTION("a hook returning an undefined tensor keeps the gradient") {
    Tensor x = leaf({1, 2});
    int calls = 0;
    x.register_hook([&](const Tensor&) {
      ++calls;
      return Tensor();
    });
    mul(x, 4.0).sum().backward();
    CHECK(calls == 1);
    CHECK(values(x.grad()) == std::vector<float>{4, 4});
  }
  SECTION("hooks on tensors that do not require grad are refused") {
    CHECK_THROWS_AS(tensor<float>({1}).register_hook([](const Tensor& g) { return g; }), Error);
  }
}

TEST_CASE("retain_grad keeps .grad on a non-leaf", "[autograd]") {
  Tensor x = leaf({1, 2});
  Tensor y = mul(x, 2.0);
  Tensor z = mul(y, y);  // not retained
  y.retain_grad();
  CHECK(y.retains_grad());
  CHECK_FALSE(z.retains_grad());
  z.sum().backward();
  REQUIRE(y.grad().defined());
  CHECK(values(y.grad()) == std::vector<float>{4, 8});  // 2y
  CHECK_FALSE(z.grad().defined());
  CHECK(values(x.grad()) == std::vector<float>{8, 16});
  CHECK_FALSE(y.is_leaf());
  CHECK(x.is_leaf());

  // An intermediate nobody retained has no grad.
  Tensor a = leaf({3});
  Tensor b = exp(a);
  Tensor c = mul(b, 2.0);
  c.sum().backward();
  CHECK_FALSE(b.grad().defined());
  CHECK_FALSE(c.grad().defined());
  CHECK(a.grad().defined());
  CHECK_THROWS_AS(tensor<float>({1}).retain_grad(), Error);
}

TEST_CASE("NoGradGuard disables recording and restores the previous mode", "[autograd][grad_mode]") {
  REQUIRE(GradMode::is_enabled());
  Tensor x = leaf({1, 2});
  {
    NoGradGuard outer;
    CHECK_FALSE(GradMode::is_enabled());
    Tensor y = mul(x, 2.0);
    CHECK_FALSE(y.requires_grad());
    CHECK(y.grad_fn() == nullptr);
    CHECK(y.is_leaf());
    CHECK(values(y) == std::vector<float>{2, 4});
    {
      NoGradGuard inner;
      CHECK_FALSE(GradMode::is_enabled());
    }
    CHECK_FALSE(GradMode::is_enabled());  // the inner guard restored "off", not "on"
    {
      AutoGradMode enable(true);
      CHECK(GradMode::is_enabled());
      Tensor z = mul(x, 3.0);
      CHECK(z.requires_grad());
      CHECK(z.grad_fn() != nullptr);
    }
    CHECK_FALSE(GradMode::is_enabled());
  }
  CHECK(GradMode::is_enabled());
  // Restored even when the scope exits by an exception.
  try {
    NoGradGuard guard;
    throw Error("boom");
  } catch (const Error&) {
  }
  CHECK(GradMode::is_enabled());
  CHECK(mul(x, 2.0).requires_grad());
}

TEST_CASE("detach shares storage and has no history", "[autograd]") {
  Tensor x = leaf({1, 2, 3});
  Tensor y = mul(x, 2.0);
  Tensor d = y.detach();
  CHECK(d.data_ptr() == y.data_ptr());
  CHECK(d.storage() == y.storage());
  CHECK_FALSE(d.requires_grad());
  CHECK(d.grad_fn() == nullptr);
  CHECK(d.is_leaf());
  Tensor dx = x.detach();
  CHECK(dx.data_ptr() == x.data_ptr());
  CHECK_FALSE(dx.requires_grad());
  // Writes through the detached alias show in the original (and bump the shared version).
  const uint64_t v0 = x.version();
  dx.fill_(5.0);
  CHECK(values(x) == std::vector<float>{5, 5, 5});
  CHECK(x.version() > v0);
  // Ops on the detached tensor do not reach x.
  Tensor w = mul(d, 3.0);
  CHECK_FALSE(w.requires_grad());
}

TEST_CASE("version counters catch in-place writes to saved tensors", "[autograd][version]") {
  SECTION("a tensor without grad saved by mul") {
    Tensor w = leaf({1, 2});
    Tensor c = tensor<float>({3, 4});
    Tensor y = mul(w, c);  // saves c
    const uint64_t v0 = c.version();
    c.add_(1.0);  // allowed: c does not require grad
    CHECK(c.version() == v0 + 1);
    CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an in-place operation"));
  }
  SECTION("a leaf written under NoGradGuard") {
    Tensor w = leaf({1, 2});
    Tensor y = mul(w, w);
    {
      NoGradGuard no_grad;
      w.mul_(2.0);
    }
    CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an in-place operation"));
  }
  SECTION("a write through a view of the saved tensor") {
    Tensor w = leaf({1, 2, 3});
    Tensor c = tensor<float>({1, 1, 1});
    Tensor y = mul(w, c);
    c.narrow(0, 1, 1).fill_(9.0);
    CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an in-place operation"));
  }
  SECTION("a saved output (exp saves its result)") {
    Tensor w = leaf({0, 1});
    Tensor e = exp(w);
    Tensor loss = e.sum();
    {
      NoGradGuard no_grad;
      e.zero_();
    }
    CHECK_THROWS_WITH(loss.backward(), Contains("modified by an in-place operation"));
  }
  SECTION("an in-place write to an unsaved tensor is fine") {
    Tensor w = leaf({1, 2});
    Tensor c = tensor<float>({3, 4});
    Tensor y = add(w, c);  // add saves nothing
    c.add_(100.0);
    REQUIRE_NOTHROW(y.sum().backward());
    CHECK(values(w.grad()) == std::vector<float>{1, 1});
  }
  SECTION("every in-place op bumps the version") {
    Tensor t = zeros({3});
    uint64_t v = t.version();
    t.add_(1.0);
    CHECK(t.version() == ++v);
    t.mul_(2.0);
    CHECK(t.version() == ++v);
    t.fill_(3.0);
    CHECK(t.version() == ++v);
    t.copy_(ones({3}));
    CHECK(t.version() == ++v);
    t.add_(ones({3}));
    CHECK(t.version() == ++v);
    t.clamp_(0.0, 1.5);
    CHECK(t.version() == ++v);
    CHECK(t.view({3, 1}).version() == v);  // views share the counter
    // Out-of-place ops do not.
    Tensor u = add(t, 1.0);
    CHECK(t.version() == v);
    (void)u;
  }
}

TEST_CASE("queue_callback runs after every gradient is accumulated", "[autograd][callback]") {
  Tensor w1 = leaf({1, 2}), w2 = leaf({3, 4}), w3 = leaf({5, 6});
  int callbacks = 0;
  bool all_set = false;
  std::vector<float> w1_grad_in_callback;
  bool in_backward_in_hook = false;
  // w3 is the first leaf to be accumulated; queue the callback from its hook.
  w3.register_post_accumulate_grad_hook([&](const Tensor&) {
    in_backward_in_hook = autograd::in_backward();
    autograd::queue_callback([&] {
      ++callbacks;
      all_set = w1.grad().defined() && w2.grad().defined() && w3.grad().defined();
      if (w1.grad().defined()) w1_grad_in_callback = w1.grad().to_vector<float>();
    });
  });
  Tensor loss = mul(mul(mul(w1, 2.0), w2), w3).sum();
  loss.backward();
  CHECK(in_backward_in_hook);
  CHECK(callbacks == 1);
  CHECK(all_set);
  CHECK(w1_grad_in_callback == std::vector<float>{2 * 3 * 5, 2 * 4 * 6});
  CHECK_FALSE(autograd::in_backward());

  // A callback can queue another one; both run.
  int chained = 0;
  Tensor x = leaf({1});
  x.register_hook([&](const Tensor& g) {
    autograd::queue_callback([&] {
      ++chained;
      autograd::queue_callback([&] { chained += 10; });
    });
    return g;
  });
  mul(x, 2.0).sum().backward();
  CHECK(chained == 11);

  // Outside backward it is an error.
  CHECK_THROWS_AS(autograd::queue_callback([] {}), Error);
  CHECK_THROWS_WITH(autograd::queue_callback([] {}), Contains("backward"));
}

TEST_CASE("backward twice needs retain_graph", "[autograd]") {
  SECTION("without retain_graph the second call throws") {
    Tensor x = leaf({1, 2});
    Tensor loss = mul(x, x).sum();
    loss.backward();
    CHECK_THROWS_WITH(loss.backward(), Contains("second time"));
    CHECK(values(x.grad()) == std::vector<float>{2, 4});
  }
  SECTION("with retain_graph it works and accumulates") {
    Tensor x = leaf({1, 2});
    Tensor loss = mul(x, x).sum();
    loss.backward(Tensor(), /*retain_graph=*/true);
    CHECK(values(x.grad()) == std::vector<float>{2, 4});
    loss.backward(Tensor(), true);
    CHECK(values(x.grad()) == std::vector<float>{4, 8});
    loss.backward();  // last use frees the graph
    CHECK(values(x.grad()) == std::vector<float>{6, 12});
    CHECK_THROWS_WITH(loss.backward(), Contains("second time"));
  }
}

TEST_CASE("backward of a non-scalar with an explicit gradient", "[autograd]") {
  Tensor x = leaf({1, 2, 3});
  Tensor y = mul(x, x);
  y.backward(tensor<float>({1, 10, 100}));
  CHECK(values(x.grad()) == std::vector<float>{2, 40, 600});

  Tensor m = tensor<float>({1, 2, 3, 4}, {2, 2}, rg());
  Tensor out = mul(m, 3.0);
  out.backward(tensor<float>({1, 0, 0, 2}, {2, 2}));
  CHECK(m.grad().shape() == Shape{2, 2});
  CHECK(values(m.grad()) == std::vector<float>{3, 0, 0, 6});

  // Multiple roots at once.
  Tensor a = leaf({1, 2});
  autograd::backward({mul(a, 2.0).sum(), mul(a, a).sum()}, {Tensor(), Tensor()});
  CHECK(values(a.grad()) == std::vector<float>{4, 6});
}

TEST_CASE("gradient flows through split where only one piece is used", "[autograd]") {
  Tensor x = leaf({1, 2, 3, 4, 5, 6});
  std::vector<Tensor> parts = split(x, 2);
  REQUIRE(parts.size() == 3);
  mul(parts[1], 3.0).sum().backward();
  CHECK(values(x.grad()) == std::vector<float>{0, 0, 3, 3, 0, 0});

  Tensor m = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3}, rg());
  std::vector<Tensor> cols = split(m, std::vector<int64_t>{1, 2}, 1);
  REQUIRE(cols[1].shape() == Shape{2, 2});
  mul(cols[1], cols[1]).sum().backward();
  CHECK(values(m.grad()) == std::vector<float>{0, 4, 6, 0, 10, 12});

  // chunk, using the first and last pieces.
  Tensor c = leaf({1, 1, 1, 1});
  std::vector<Tensor> ch = chunk(c, 4);
  add(mul(ch[0], 2.0), mul(ch[3], 5.0)).sum().backward();
  CHECK(values(c.grad()) == std::vector<float>{2, 0, 0, 5});
}

TEST_CASE("requires_grad propagation rules", "[autograd]") {
  Tensor a = leaf({1, 2});
  Tensor b = tensor<float>({3, 4});
  CHECK(a.requires_grad());
  CHECK(a.is_leaf());
  CHECK(a.grad_fn() == nullptr);
  CHECK_FALSE(b.requires_grad());

  Tensor ab = add(a, b);
  CHECK(ab.requires_grad());
  CHECK_FALSE(ab.is_leaf());
  CHECK(ab.grad_fn() != nullptr);
  CHECK_FALSE(add(b, b).requires_grad());
  CHECK(add(b, b).grad_fn() == nullptr);
  CHECK(mul(b, a).requires_grad());
  CHECK(a.sum().requires_grad());
  CHECK(a.view({2, 1}).requires_grad());
  CHECK(a.to(DType::f64).requires_grad());
  CHECK(a.clone().requires_grad());
  CHECK_FALSE(a.detach().requires_grad());
  CHECK(matmul(a, b).requires_grad());
  CHECK(cat({b, a}).requires_grad());
  // Integer results carry no gradient.
  Tensor am = argmax(a);
  CHECK_FALSE(am.requires_grad());
  CHECK(am.grad_fn() == nullptr);
  CHECK(am.dtype() == DType::i64);
  CHECK_FALSE(gt(a, 1.0).requires_grad());
  // Factories.
  CHECK(zeros({2}, rg()).requires_grad());
  CHECK(zeros({2}, rg()).is_leaf());
  CHECK_FALSE(zeros_like(a).requires_grad());
  // set_requires_grad(false) on a leaf stops recording.
  Tensor c = leaf({1});
  c.set_requires_grad(false);
  CHECK_FALSE(mul(c, 2.0).requires_grad());
  // Casting to f64 and back gives gradients in the leaf's dtype.
  Tensor d = leaf({1, 2});
  Tensor d64 = d.to(DType::f64);
  CHECK(d64.dtype() == DType::f64);
  mul(d64, d64).sum().backward();
  CHECK(d.grad().dtype() == DType::f32);
  CHECK(values(d.grad()) == std::vector<float>{2, 4});
}

TEST_CASE("a graph with an integer side branch still backpropagates", "[autograd]") {
  Tensor x = leaf({0.5f, 3.0f, -1.0f, 2.0f});
  Tensor idx = argmax(x);  // i64, no history
  REQUIRE(idx.dtype() == DType::i64);
  REQUIRE(idx.item<int64_t>() == 1);
  Tensor picked = index_select(x, 0, idx.reshape({1}));  // x[1]
  Tensor mask = gt(x, 0.0).to(DType::f32);               // bool -> f32, no history
  Tensor loss = add(picked.sum(), mul(mul(x, x), mask).sum());
  loss.backward();
  // d/dx = onehot(argmax) + 2x * (x > 0)
  CHECK(values(x.grad()) == std::vector<float>{1.0f, 7.0f, 0.0f, 4.0f});

  // argmax along a dim feeding an integer computation in the middle of a graph.
  Tensor m = tensor<float>({1, 5, 2, 7, 3, 4}, {2, 3}, rg());
  Tensor rows = argmax(m, 1);  // [1, 0]
  CHECK(rows.to_vector<int64_t>() == std::vector<int64_t>{1, 0});
  Tensor scale = add(rows.to(DType::f32), 1.0);  // [2, 1], no history
  Tensor out = mul(m.sum({1}), scale).sum();
  out.backward();
  CHECK(values(m.grad()) == std::vector<float>{2, 2, 2, 1, 1, 1});
}

TEST_CASE("hooks and .grad on a leaf reached through views", "[autograd]") {
  Tensor x = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3}, rg());
  Tensor v = x.t().reshape({6}).slice(0, 0, 6, 2);  // x[0][0], x[1][1]?, ...
  // x.t() = [[1,4],[2,5],[3,6]] -> flat [1,4,2,5,3,6] -> step 2: [1,2,3] (x[0][*])
  CHECK(values(v) == std::vector<float>{1, 2, 3});
  mul(v, tensor<float>({10, 20, 30})).sum().backward();
  CHECK(values(x.grad()) == std::vector<float>{10, 20, 30, 0, 0, 0});
  Tensor e = tensor<float>({2}, {1}, rg());
  e.expand({3}).sum().backward();
  CHECK(e.grad().shape() == Shape{1});
  CHECK(e.grad().item<float>() == 3.0f);
}

TEST_CASE("hooks and retain_grad on a non-leaf see the summed gradient once", "[autograd][hooks]") {
  Tensor x = leaf({1, 2});
  Tensor y = mul(x, 2.0);  // [2, 4]
  y.retain_grad();
  int calls = 0;
  std::vector<float> seen;
  y.register_hook([&](const Tensor& g) {
    ++calls;
    seen = g.to_vector<float>();
    return Tensor();
  });
  add(mul(y, y), mul(y, 3.0)).sum().backward();  // dL/dy = 2y + 3
  CHECK(calls == 1);
  CHECK(seen == std::vector<float>{7, 11});
  CHECK(values(y.grad()) == std::vector<float>{7, 11});
  CHECK(values(x.grad()) == std::vector<float>{14, 22});
}

TEST_CASE("backward from a leaf accumulates the seed into its .grad", "[autograd]") {
  Tensor x = leaf({1, 2});
  x.backward(tensor<float>({3, 4}));
  CHECK(values(x.grad()) == std::vector<float>{3, 4});
  Tensor s = tensor<float>({5}, Shape{}, rg());
  s.backward();
  CHECK(s.grad().item<float>() == 1.0f);
}

TEST_CASE(".grad is an independent contiguous tensor even when the incoming gradient is a broadcast view",
          "[autograd]") {
  Tensor x = tensor<float>({1, 2, 3, 4, 5, 6}, {2, 3}, rg());
  x.t().sum().backward();  // the gradient reaching x is a stride-0 expand, transposed
  REQUIRE(x.grad().shape() == Shape{2, 3});
  CHECK(values(x.grad()) == std::vector<float>(6, 1.0f));
  {
    NoGradGuard no_grad;
    x.mutable_grad().narrow(1, 0, 1).fill_(7.0);  // must touch only column 0
  }
  CHECK(values(x.grad()) == std::vector<float>{7, 1, 1, 7, 1, 1});
  x.sum().backward();
  CHECK(values(x.grad()) == std::vector<float>{8, 2, 2, 8, 2, 2});
}

TEST_CASE("grad mode is thread-local", "[autograd][grad_mode]") {
  Tensor x = leaf({1, 2});
  bool other_thread_enabled = false, other_thread_records = false;
  {
    NoGradGuard no_grad;
    std::thread t([&] {
      other_thread_enabled = GradMode::is_enabled();
      other_thread_records = mul(x, 2.0).requires_grad();
    });
    t.join();
    CHECK_FALSE(GradMode::is_enabled());
  }
  CHECK(other_thread_enabled);
  CHECK(other_thread_records);
  bool disabled_there = true;
  std::thread t2([&] {
    NoGradGuard no_grad;
    disabled_there = !GradMode::is_enabled();
  });
  t2.join();
  CHECK(disabled_there);
  CHECK(GradMode::is_enabled());  // unaffected by the other thread's guard
}

TEST_CASE("a write through a detached alias of a saved tensor is caught", "[autograd][version]") {
  Tensor w = leaf({1, 2});
  Tensor y = exp(w);  // saves w
  Tensor alias = w.detach();
  alias.fill_(0.0);  // allowed: the alias does not require grad
  CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an in-place operation"));
}

TEST_CASE("gradients cross logical CPU devices back to the leaf's device", "[autograd][device]") {
  Tensor x = leaf({1, 2, 3});
  Tensor on1 = x.to(Device::cpu(1));
  REQUIRE(on1.device() == Device::cpu(1));
  CHECK(on1.requires_grad());
  mul(on1, on1).sum().backward();
  REQUIRE(x.grad().defined());
  CHECK(x.grad().device() == Device::cpu(0));
  CHECK(values(x.grad()) == std::vector<float>{2, 4, 6});
}

TEST_CASE("a backward that throws leaves the engine usable", "[autograd]") {
  Tensor w = leaf({1, 2});
  Tensor c = tensor<float>({3, 4});
  Tensor y = mul(w, c);
  c.add_(1.0);
  CHECK_THROWS_WITH(y.sum().backward(), Contains("modified by an in-place operation"));
  CHECK_FALSE(autograd::in_backward());
  CHECK_THROWS_AS(autograd::queue_callback([] {}), Error);
  CHECK(GradMode::is_enabled());  // the engine's NoGradGuard was unwound
  mul(w, c).sum().backward();
  CHECK(values(w.grad()) == std::vector<float>{4, 5});
}
