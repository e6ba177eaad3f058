// nn layers, initialisers and losses: shapes, hand-computed values, train/eval
// behaviour (BatchNorm running statistics, Dropout) and attention's causality.
// Values against PyTorch live in test_nn_reference.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "multigrad.h"
#include "nn/nn.h"

using namespace mg;

namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  const std::vector<double> u = a.to_vector<double>(), v = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < u.size(); ++i) worst = std::max(worst, std::abs(u[i] - v[i]));
  return worst;
}

double max_abs(const Tensor& a) {
  double worst = 0;
  for (double v : a.to_vector<double>()) worst = std::max(worst, std::abs(v));
  return worst;
}

}  // namespace

TEST_CASE("Linear computes x W^T + b with PyTorch's default init bounds", "[nn][layers]") {
  manual_seed(0);
  nn::Linear fc(16, 4);
  CHECK(fc.weight.shape() == Shape{4, 16});
  CHECK(fc.bias.shape() == Shape{4});
  CHECK(max_abs(fc.weight) <= 0.25);  // 1 / sqrt(16)
  CHECK(max_abs(fc.bias) <= 0.25);
  CHECK(max_abs(fc.weight) > 0.2);  // and actually spread over the range
  Tensor x = randn({2, 3, 16});
  Tensor y = fc(x);
  CHECK(y.shape() == Shape{2, 3, 4});
  CHECK(max_abs_diff(y, add(matmul(x, fc.weight.t()), fc.bias)) < 1e-6);
  nn::Linear no_bias(3, 2, false);
  CHECK_FALSE(no_bias.bias.defined());
  CHECK(no_bias.named_parameters().size() == 1);
}

TEST_CASE("Conv2d and pooling output shapes", "[nn][layers]") {
  Tensor x = randn({2, 3, 11, 9});
  nn::Conv2d plain(3, 5, 3);
  CHECK(plain(x).shape() == Shape{2, 5, 9, 7});
  nn::Conv2dOptions o;
  o.stride = 2;
  o.padding = 1;
  o.bias = false;
  nn::Conv2d strided(3, 4, 3, o);
  CHECK(strided(x).shape() == Shape{2, 4, 6, 5});
  CHECK(strided.named_parameters().size() == 1);
  o = {};
  o.dilation = 2;
  CHECK(nn::Conv2d(3, 2, 3, o)(x).shape() == Shape{2, 2, 7, 5});
  CHECK(max_abs(plain.weight) <= 1.0 / std::sqrt(27.0));

  CHECK(nn::MaxPool2d(2)(x).shape() == Shape{2, 3, 5, 4});
  CHECK(nn::MaxPool2d(3, 1, 1)(x).shape() == Shape{2, 3, 11, 9});
  CHECK(nn::AvgPool2d(2)(x).shape() == Shape{2, 3, 5, 4});
}

TEST_CASE("MaxPool2d / AvgPool2d / AdaptiveAvgPool2d values", "[nn][layers]") {
  Tensor x = arange(0.0, 16.0, 1.0).reshape({1, 1, 4, 4});
  CHECK(nn::MaxPool2d(2)(x).to_vector<double>() == std::vector<double>{5, 7, 13, 15});
  CHECK(nn::AvgPool2d(2)(x).to_vector<double>() == std::vector<double>{2.5, 4.5, 10.5, 12.5});
  CHECK(nn::AdaptiveAvgPool2d(2)(x).to_vector<double>() == std::vector<double>{2.5, 4.5, 10.5, 12.5});
  Tensor g = nn::AdaptiveAvgPool2d(1)(x);
  CHECK(g.shape() == Shape{1, 1, 1, 1});
  CHECK(g.item<double>() == 7.5);
  CHECK(nn::AdaptiveAvgPool2d(1, 2)(x).to_vector<double>() == std::vector<double>{6.5, 8.5});
  CHECK_THROWS_WITH(nn::AdaptiveAvgPool2d(3)(x), Catch::Contains("cannot be pooled to (3, 3)"));
}

TEST_CASE("BatchNorm2d: batch statistics in train, running statistics in eval", "[nn][layers]") {
  manual_seed(5);
  nn::BatchNorm2d bn(2);
  bn.to(DType::f64);
  Tensor x = add(mul(randn({3, 2, 2, 2}, TensorOptions{DType::f64}), 2.0), 1.0);
  const std::vector<double> v = x.to_vector<double>();
  // Hand computation per channel: 3 samples x 2 x 2 = 12 values.
  std::vector<double> mean(2, 0), var_biased(2, 0);
  auto at = [&](int n, int c, int i) { return v[static_cast<size_t>((n * 2 + c) * 4 + i)]; };
  for (int c = 0; c < 2; ++c) {
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) mean[c] += at(n, c, i) / 12.0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) var_biased[c] += (at(n, c, i) - mean[c]) * (at(n, c, i) - mean[c]) / 12.0;
  }

  Tensor y = bn(x);  // train mode
  const std::vector<double> out = y.to_vector<double>();
  for (int c = 0; c < 2; ++c)
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i)
        CHECK(out[static_cast<size_t>((n * 2 + c) * 4 + i)] ==
              Approx((at(n, c, i) - mean[c]) / std::sqrt(var_biased[c] + 1e-5)).epsilon(1e-12));
  const std::vector<double> rm = bn.running_mean.to_vector<double>(), rv = bn.running_var.to_vector<double>();
  for (int c = 0; c < 2; ++c) {
    CHECK(rm[c] == Approx(0.9 * 0.0 + 0.1 * mean[c]).epsilon(1e-12));
    CHECK(rv[c] == Approx(0.9 * 1.0 + 0.1 * var_biased[c] * 12.0 / 11.0).epsilon(1e-12));  // unbiased
  }
  CHECK(bn.num_batches_tracked.item<int64_t>() == 1);

  // A second step compounds the moving average.
  bn(x);
  CHECK(bn.running_mean.to_vector<double>()[0] == Approx(0.9 * rm[0] + 0.1 * mean[0]).epsilon(1e-12));
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);

  // eval: normalise with the running statistics, leave them alone.
  bn.eval();
  const std::vector<double> rm2 = bn.running_mean.to_vector<double>(),
                            rv2 = bn.running_var.to_vector<double>();
  const std::vector<double> e = bn(x).to_vector<double>();
  for (int c = 0; c < 2; ++c)
    CHECK(e[static_cast<size_t>(c * 4)] ==
          Approx((at(0, c, 0) - rm2[c]) / std::sqrt(rv2[c] + 1e-5)).epsilon(1e-12));
  CHECK(bn.running_mean.to_vector<double>() == rm2);
  CHECK(bn.num_batches_tracked.item<int64_t>() == 2);

  // Gradients reach input, weight and bias in both modes.
  bn.train();
  Tensor xg = x.detach().set_requires_grad(true);
  bn(xg).pow(2.0).sum().backward();
  CHECK(xg.grad().defined());
  CHECK(bn.weight.grad().shape() == Shape{2});
  CHECK_THROWS_WITH(bn(randn({1, 2, 1, 1}, TensorOptions{DType::f64})),
                    Catch::Contains("more than one value"));
  CHECK_THROWS_WITH(bn(randn({2, 3, 2, 2}, TensorOptions{DType::f64})),
                    Catch::Contains("3 channels, expected 2"));
}

TEST_CASE("BatchNorm1d accepts [N, C] and [N, C, L]", "[nn][layers]") {
  nn::BatchNorm1d bn(3);
  Tensor y = bn(randn({5, 3}));
  CHECK(y.shape() == Shape{5, 3});
  CHECK(max_abs(mean(y, {0})) < 1e-5);
  CHECK(bn(randn({4, 3, 6})).shape() == Shape{4, 3, 6});
  CHECK_THROWS(bn(randn({4, 3, 2, 2})));
}

TEST_CASE("Dropout zeroes and rescales in train, is the identity in eval", "[nn][layers]") {
  manual_seed(11);
  nn::Dropout drop(0.25);
  Tensor x = ones({4000});
  const std::vector<double> y = drop(x).to_vector<double>();
  int zeros_seen = 0;
  for (double v : y) {
    if (v == 0.0) {
      ++zeros_seen;
    } else {
      CHECK(v == Approx(1.0 / 0.75));
    }
  }
  CHECK(zeros_seen > 850);  // ~1000 expected
  CHECK(zeros_seen < 1150);
  drop.eval();
  CHECK(drop(x).is_same(x));
  CHECK_THROWS(nn::Dropout(1.5));
}

TEST_CASE("LayerNorm, Embedding, activations, Flatten", "[nn][layers]") {
  nn::LayerNorm ln(6);
  Tensor y = ln(add(mul(randn({2, 3, 6}), 3.0), 2.0));
  CHECK(max_abs(mean(y, {-1})) < 1e-5);
  CHECK(max_abs(sub(var(y, {-1}, 0), 1.0)) < 1e-3);

  nn::Embedding emb(10, 4, /*padding_idx=*/0);
  CHECK(max_abs(emb.weight.select(0, 0)) == 0.0);
  Tensor idx = tensor<int64_t>({0, 3, 3, 9}, {2, 2}, {DType::i64});
  Tensor e = emb(idx);
  CHECK(e.shape() == Shape{2, 2, 4});
  CHECK(max_abs_diff(e.select(0, 1).select(0, 0), emb.weight.select(0, 3)) == 0.0);
  e.sum().backward();
  const std::vector<double> g = emb.weight.grad().to_vector<double>();
  CHECK(g[0] == 0.0);      // padding row: no gradient
  CHECK(g[3 * 4] == 2.0);  // token 3 used twice
  CHECK(g[9 * 4] == 1.0);

  Tensor v = tensor<double>({-1.0, 0.5, 2.0}, {DType::f64});
  CHECK(nn::ReLU()(v).to_vector<double>() == std::vector<double>{0.0, 0.5, 2.0});
  CHECK(nn::Tanh()(v).to_vector<double>()[2] == Approx(std::tanh(2.0)));
  const double gelu2 = 0.5 * 2.0 * (1 + std::tanh(std::sqrt(2 / M_PI) * (2.0 + 0.044715 * 8.0)));
  CHECK(nn::GELU()(v).to_vector<double>()[2] == Approx(gelu2).epsilon(1e-12));
  CHECK(nn::Flatten()(zeros({2, 3, 4, 5})).shape() == Shape{2, 60});
  CHECK(nn::Flatten(0, 1)(zeros({2, 3, 4})).shape() == Shape{6, 4});
  CHECK(nn::Identity()(v).is_same(v));
}

TEST_CASE("CausalSelfAttention is causal: the future never changes the past", "[nn][layers][attention]") {
  manual_seed(21);
  nn::CausalSelfAttention attn(16, 4);
  nn::TransformerBlock block(16, 4);
  Tensor x = randn({2, 6, 16});
  Tensor changed = x.clone();
  {
    NoGradGuard no_grad;
    changed.narrow(1, 4, 2).copy_(randn({2, 2, 16}));  // new tokens at positions 4 and 5
  }
  for (nn::Module* m : {static_cast<nn::Module*>(&attn), static_cast<nn::Module*>(&block)}) {
    Tensor a = (*m)(x), b = (*m)(changed);
    CHECK(a.shape() == Shape{2, 6, 16});
    CHECK(max_abs_diff(a.narrow(1, 0, 4), b.narrow(1, 0, 4)) == 0.0);  // positions 0..3: identical
    CHECK(max_abs_diff(a.narrow(1, 4, 2), b.narrow(1, 4, 2)) > 1e-3);  // 4, 5 did change
  }
  // The gradient of output position 2 w.r.t. inputs after position 2 is exactly zero.
  Tensor xg = x.detach().set_requires_grad(true);
  attn(xg).narrow(1, 2, 1).sum().backward();
  CHECK(max_abs(xg.grad().narrow(1, 3, 3)) == 0.0);
  CHECK(max_abs(xg.grad().narrow(1, 0, 3)) > 0.0);
  // Position 0 attends only to itself: its output is c_proj(v_0).
  Tensor v0 = split(attn.c_attn(x.narrow(1, 0, 1)), 16, 2)[2];
  CHECK(max_abs_diff(attn(x).narrow(1, 0, 1), attn.c_proj(v0)) < 1e-5);
  CHECK_THROWS_WITH(nn::CausalSelfAttention(10, 4), Catch::Contains("divisible"));
  CHECK_THROWS_WITH(attn(randn({2, 3, 8})), Catch::Contains("expected input [B, T, 16]"));
}

TEST_CASE("initialisers follow the seeded RNG and their formulas", "[nn][init]") {
  Tensor w = empty({256, 128});
  manual_seed(9);
  nn::init::kaiming_uniform_(w);  // a = 0, leaky_relu: bound = sqrt(2) * sqrt(3 / 128)
  const double bound = std::sqrt(6.0 / 128.0);
  CHECK(max_abs(w) <= bound);
  CHECK(max_abs(w) > 0.99 * bound);
  const std::vector<double> first = w.to_vector<double>();
  manual_seed(9);
  nn::init::kaiming_uniform_(w);
  CHECK(w.to_vector<double>() == first);  // same seed, same weights

  nn::init::kaiming_normal_(w, 0.0, nn::init::FanMode::FanOut, nn::init::Nonlinearity::ReLU);
  CHECK(std::sqrt(var(w).item<double>()) == Approx(std::sqrt(2.0 / 256.0)).epsilon(0.03));
  nn::init::xavier_uniform_(w);
  CHECK(max_abs(w) <= std::sqrt(6.0 / 384.0));
  nn::init::xavier_normal_(w, 2.0);
  CHECK(std::sqrt(var(w).item<double>()) == Approx(2.0 * std::sqrt(2.0 / 384.0)).epsilon(0.03));
  nn::init::normal_(w, 3.0, 0.5);
  CHECK(mean(w).item<double>() == Approx(3.0).epsilon(0.01));
  nn::init::uniform_(w, -2.0, -1.0);
  CHECK(max_abs(add(w, 1.5)) <= 0.5);
  nn::init::zeros_(w);
  CHECK(max_abs(w) == 0.0);
  nn::init::ones_(w);
  CHECK(mean(w).item<double>() == 1.0);

  // In place on a parameter that requires grad, without recording history.
  nn::Linear fc(4, 4);
  nn::init::xavier_uniform_(fc.weight);
  CHECK(fc.weight.is_leaf());
  CHECK(nn::init::calculate_gain(nn::init::Nonlinearity::LeakyReLU, std::sqrt(5.0)) ==
        Approx(std::sqrt(1.0 / 3.0)));
  CHECK(nn::init::calculate_fan_in_and_fan_out(empty({8, 3, 5, 5})) == std::pair<int64_t, int64_t>{75, 200});
  CHECK_THROWS(nn::init::xavier_uniform_(empty({5})));
}

TEST_CASE("losses: cross_entropy, nll_loss, mse_loss", "[nn][loss]") {
  manual_seed(13);
  Tensor logits = randn({5, 4}, TensorOptions{DType::f64}).set_requires_grad(true);
  Tensor targets = tensor<int64_t>({0, 3, 1, 1, 2}, {DType::i64});

  // nll(log_softmax) == cross_entropy, values and gradients.
  Tensor ce = nn::cross_entropy(logits, targets);
  ce.backward();
  const Tensor ce_grad = logits.grad().clone();
  logits.set_grad(Tensor());
  Tensor nll = nn::nll_loss(log_softmax(logits, 1), targets);
  nll.backward();
  CHECK(nll.item<double>() == Approx(ce.item<double>()).epsilon(1e-12));
  CHECK(max_abs_diff(logits.grad(), ce_grad) < 1e-12);

  // Reductions and ignore_index (which also leaves the ignored rows out of the mean).
  Tensor logp = log_softmax(logits.detach(), 1);
  const std::vector<double> lp = logp.to_vector<double>();
  Tensor none = nn::nll_loss(logp, targets, {Reduction::None});
  CHECK(none.to_vector<double>()[1] == -lp[1 * 4 + 3]);
  CHECK(nn::nll_loss(logp, targets, {Reduction::Sum}).item<double>() == Approx(sum(none).item<double>()));
  Tensor ignored = nn::nll_loss(logp, targets, {Reduction::Mean, /*ignore_index=*/1});
  CHECK(ignored.item<double>() == Approx(-(lp[0] + lp[1 * 4 + 3] + lp[4 * 4 + 2]) / 3.0).epsilon(1e-12));
  CHECK_THROWS_WITH(nn::nll_loss(logp, tensor<int64_t>({0, 4, 1, 1, 2}, {DType::i64})),
                    Catch::Contains("outside [0, 4)"));
  CHECK_THROWS_WITH(nn::nll_loss(logp, tensor<int64_t>({0, 1}, {DType::i64})),
                    Catch::Contains("need targets"));

  // Label smoothing passes through: (1 - s) * nll + s * mean_c(-log p_c).
  CrossEntropyOptions smooth;
  smooth.label_smoothing = 0.1;
  double expected = 0;
  for (int n = 0; n < 5; ++n) {
    double uniform = 0;
    for (int c = 0; c < 4; ++c) uniform += -lp[n * 4 + c] / 4.0;
    expected += (0.9 * none.to_vector<double>()[n] + 0.1 * uniform) / 5.0;
  }
  CHECK(nn::cross_entropy(logits.detach(), targets, smooth).item<double>() ==
        Approx(expected).epsilon(1e-12));

  // mse
  Tensor a = tensor<double>({1.0, 2.0, 4.0}, {DType::f64}).set_requires_grad(true);
  Tensor b = tensor<double>({0.0, 2.0, 1.0}, {DType::f64});
  CHECK(nn::mse_loss(a, b).item<double>() == Approx(10.0 / 3.0));
  CHECK(nn::mse_loss(a, b, Reduction::Sum).item<double>() == 10.0);
  CHECK(nn::mse_loss(a, b, Reduction::None).to_vector<double>() == std::vector<double>{1.0, 0.0, 9.0});
  nn::mse_loss(a, b).backward();
  CHECK(a.grad().to_vector<double>()[2] == Approx(2.0 * 3.0 / 3.0));
  CHECK_THROWS_WITH(nn::mse_loss(a, zeros({3, 1}, TensorOptions{DType::f64})), Catch::Contains("same shape"));
}
