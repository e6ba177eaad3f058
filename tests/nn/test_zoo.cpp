// The model zoo end to end: every model runs forward + backward on a small batch,
// every parameter gets a gradient of its own shape, a few hand-written SGD steps
// reduce the loss on a fixed batch, and clone() reproduces the model's outputs.
// Models are shrunk (narrow widths, tiny batches) so the file runs in seconds.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "multigrad.h"
#include "nn/nn.h"

using namespace mg;

namespace {

// Runs `steps` of p -= lr * grad on a fixed batch; returns the losses (first before any step).
std::vector<double> sgd_losses(nn::Module& model, const std::function<Tensor()>& loss_fn, double lr,
                               int steps) {
  std::vector<double> losses;
  for (int step = 0; step <= steps; ++step) {
    model.zero_grad();
    Tensor loss = loss_fn();
    losses.push_back(loss.item<double>());
    if (step == steps) break;
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : model.parameters()) p.add_(p.grad(), -lr);
  }
  return losses;
}

void check_every_parameter_has_a_gradient(const nn::Module& model) {
  REQUIRE_FALSE(model.named_parameters().empty());
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    CHECK(p.grad().shape() == p.shape());
    CHECK(p.grad().dtype() == p.dtype());
  }
}

void check_clone_matches(nn::Module& model, const Tensor& input) {
  model.eval();
  auto copy = model.clone(Device::cpu(1));
  const Tensor a = model(input), b = (*copy)(input.to(Device::cpu(1)));
  CHECK(b.device() == Device::cpu(1));
  CHECK(a.to_vector<double>() == b.to_vector<double>());
  CHECK(copy->state_dict().size() == model.state_dict().size());
  model.train();
}

void check_loss_goes_down(const std::vector<double>& losses) {
  INFO("losses: first " << losses.front() << ", last " << losses.back());
  CHECK(losses.back() < 0.7 * losses.front());
  for (double l : losses) CHECK(std::isfinite(l));
}

}  // namespace

TEST_CASE("MLP: forward, backward, SGD, clone", "[nn][zoo]") {
  manual_seed(100);
  nn::MLP mlp(12, {16, 8}, 3);
  CHECK(mlp.named_parameters().size() == 6);
  CHECK(mlp.named_parameters()[2].first == "layers.2.weight");
  Tensor x = randn({8, 1, 3, 4});  // flattened to [8, 12]
  Tensor y = randint(0, 3, {8});
  Tensor logits = mlp(x);
  CHECK(logits.shape() == Shape{8, 3});
  nn::cross_entropy(logits, y).backward();
  check_every_parameter_has_a_gradient(mlp);
  check_loss_goes_down(sgd_losses(
      mlp, [&] { return nn::cross_entropy(mlp(x), y); }, 0.5, 15));
  check_clone_matches(mlp, x);
}

TEST_CASE("FashionCNN: forward, backward, SGD, clone", "[nn][zoo]") {
  manual_seed(101);
  nn::FashionCNNOptions o;
  o.channels1 = 4;
  o.channels2 = 8;
  o.hidden = 16;
  o.dropout = 0.0;  // a deterministic loss curve on the fixed batch
  nn::FashionCNN cnn(o);
  Tensor x = randn({6, 1, 28, 28});
  Tensor y = randint(0, 10, {6});
  Tensor logits = cnn(x);
  CHECK(logits.shape() == Shape{6, 10});
  nn::cross_entropy(logits, y).backward();
  check_every_parameter_has_a_gradient(cnn);
  CHECK(cnn.named_buffers().size() == 6);  // two BatchNorms
  check_loss_goes_down(sgd_losses(
      cnn, [&] { return nn::cross_entropy(cnn(x), y); }, 0.03, 10));
  CHECK(cnn.bn1.num_batches_tracked.item<int64_t>() == 12);  // 1 + 11 training forwards
  check_clone_matches(cnn, x);
  CHECK_THROWS_WITH(cnn(randn({2, 1, 32, 32})), Catch::Contains("expected [N, 1, 28, 28]"));
  // The default model is the one the Fashion-MNIST example trains.
  nn::FashionCNN full;
  CHECK(full.num_parameters() ==
        32 * 9 + 32 * 2 + 64 * 32 * 9 + 64 * 2 + 3136 * 128 + 128 + 128 * 10 + 10);  // 421,738
}

TEST_CASE("ResNetSmall: identity and 1x1-conv shortcuts, forward, backward, SGD, clone", "[nn][zoo]") {
  manual_seed(102);
  nn::ResNetOptions o;
  o.widths = {4, 8, 8};
  nn::ResNetSmall net(o);
  std::vector<std::string> names;
  for (const auto& [name, p] : net.named_parameters()) names.push_back(name);
  auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  CHECK(has("layer1.0.conv1.weight"));
  CHECK_FALSE(has("layer1.0.downsample.0.weight"));  // 4 -> 4, stride 1: identity shortcut
  CHECK(has("layer2.0.downsample.0.weight"));        // 4 -> 8, stride 2: 1x1 conv
  CHECK(has("layer3.0.downsample.1.weight"));        // 8 -> 8, stride 2: 1x1 conv + BN
  CHECK(has("fc.weight"));

  Tensor x = randn({4, 1, 28, 28});
  Tensor y = randint(0, 10, {4});
  Tensor logits = net(x);
  CHECK(logits.shape() == Shape{4, 10});
  nn::cross_entropy(logits, y).backward();
  check_every_parameter_has_a_gradient(net);
  check_loss_goes_down(sgd_losses(
      net, [&] { return nn::cross_entropy(net(x), y); }, 0.1, 8));
  check_clone_matches(net, x);

  // 32x32 RGB input works too (global average pooling makes the head size-independent).
  nn::ResNetOptions rgb;
  rgb.in_channels = 3;
  rgb.widths = {4, 4, 8};
  rgb.blocks_per_stage = 2;
  nn::ResNetSmall cifar(rgb);
  CHECK(cifar(randn({2, 3, 32, 32})).shape() == Shape{2, 10});
}

TEST_CASE("TinyGPT: logits shape, causality, backward, SGD, clone", "[nn][zoo]") {
  manual_seed(103);
  nn::GPTConfig cfg;
  cfg.vocab_size = 11;
  cfg.block_size = 8;
  cfg.n_layer = 2;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  nn::TinyGPT gpt(cfg);
  CHECK(gpt.named_parameters().front().first == "wte.weight");
  CHECK(gpt.named_parameters().back().first == "lm_head.weight");
  CHECK(gpt.state_dict().count("h.1.attn.c_attn.weight") == 1);
  CHECK(gpt.state_dict().count("h.0.mlp.c_fc.bias") == 1);

  Tensor idx = randint(0, 11, {3, 8});
  Tensor logits = gpt(idx);
  CHECK(logits.shape() == Shape{3, 8, 11});
  // Next-token prediction: inputs idx[:, :-1], targets idx[:, 1:].
  Tensor inputs = idx.narrow(1, 0, 7), targets = idx.narrow(1, 1, 7).contiguous();
  auto loss_fn = [&] { return nn::cross_entropy(gpt(inputs).reshape({-1, 11}), targets.reshape({-1})); };
  loss_fn().backward();
  check_every_parameter_has_a_gradient(gpt);
  // Changing the last token leaves the logits of every earlier position unchanged.
  std::vector<int64_t> tokens = idx.to_vector<int64_t>();
  for (int b = 0; b < 3; ++b) tokens[b * 8 + 7] = (tokens[b * 8 + 7] + 1) % 11;
  Tensor other = tensor<int64_t>(tokens, {3, 8}, {DType::i64});
  CHECK(gpt(idx).narrow(1, 0, 7).to_vector<double>() == gpt(other).narrow(1, 0, 7).to_vector<double>());
  check_loss_goes_down(sgd_losses(gpt, loss_fn, 0.5, 15));
  check_clone_matches(gpt, idx);
  CHECK_THROWS_WITH(gpt(randint(0, 11, {1, 9})), Catch::Contains("exceeds block_size 8"));
}

TEST_CASE("TinyGPT::as_sequential runs the same modules in the same order", "[nn][zoo]") {
  manual_seed(104);
  nn::GPTConfig cfg;
  cfg.vocab_size = 11;
  cfg.block_size = 8;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.n_embd = 8;
  nn::TinyGPT gpt(cfg);
  std::shared_ptr<nn::Sequential> layers = gpt.as_sequential();
  REQUIRE(layers->size() == 5);  // embeddings, 3 blocks, head
  const std::vector<Tensor> mine = layers->parameters(), theirs = gpt.parameters();
  REQUIRE(mine.size() == theirs.size());
  for (size_t i = 0; i < mine.size(); ++i) CHECK(mine[i].data_ptr() == theirs[i].data_ptr());  // shared
  Tensor idx = randint(0, 11, {2, 8});
  CHECK((*layers)(idx).to_vector<float>() == gpt(idx).to_vector<float>());
  layers->eval();
  CHECK(!gpt.drop.is_training());
}
