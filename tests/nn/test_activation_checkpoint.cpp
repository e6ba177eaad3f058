// Activation checkpointing (nn/activation_checkpoint.h): a checkpointed model's parameter
// gradients are bitwise those of the plain model, dropout included; BatchNorm's running statistics move once
// per step; the random generator ends where the plain model leaves it; peak activation memory
// drops by the intermediates of every block but one, measured by the allocator against that
// expectation worked out from the layer sizes.
#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/random.h"
#include "multigrad.h"
#include "nn/nn.h"

using namespace mg;

namespace {

// Linear -> GELU -> Dropout -> Linear, with a residual: the shape of a transformer MLP.
class MlpBlock : public nn::Module {
 public:
  MlpBlock(int64_t width, int64_t hidden, double p) : fc1(width, hidden), drop(p), fc2(hidden, width) {
    register_module("fc1", fc1);
    register_module("drop", drop);
    register_module("fc2", fc2);
  }
  Tensor forward(const Tensor& x) override { return x + fc2(drop(gelu(fc1(x)))); }
  nn::Linear fc1;
  nn::Dropout drop;
  nn::Linear fc2;
};

// `depth` blocks, each checkpointed or not.
class Stack : public nn::Module {
 public:
  Stack(int depth, int64_t width, int64_t hidden, double p, bool checkpointed) : checkpointed_(checkpointed) {
    for (int i = 0; i < depth; ++i) {
      blocks_.push_back(register_module(std::to_string(i), std::make_shared<MlpBlock>(width, hidden, p)));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = x;
    for (auto& block : blocks_) h = checkpointed_ ? nn::checkpoint_module(*block, h) : (*block)(h);
    return h;
  }

 private:
  bool checkpointed_;
  std::vector<std::shared_ptr<MlpBlock>> blocks_;
};

std::vector<std::vector<float>> gradients(const nn::Module& model) {
  std::vector<std::vector<float>> out;
  for (const auto& [name, p] : model.named_parameters()) {
    INFO(name);
    REQUIRE(p.grad().defined());
    out.push_back(p.grad().to_vector<float>());
  }
  return out;
}

}  // namespace

TEST_CASE("checkpointed blocks give bitwise the gradients of the plain model, dropout included",
          "[nn][checkpoint]") {
  manual_seed(7);
  Stack plain(3, 16, 48, 0.3, false), checkpointed(3, 16, 48, 0.3, true);
  checkpointed.load_state_dict(plain.state_dict());
  const Tensor x_value = randn({8, 16});

  auto run = [&](nn::Module& model) {
    manual_seed(123);
    Tensor x = x_value.clone().detach().set_requires_grad(true);
    Tensor loss = (model(x) * model(x)).mean();  // two forwards: six dropout draws in order
    loss.backward();
    return std::make_pair(x.grad().to_vector<float>(), generator_state().offset);
  };
  const auto [dx_plain, offset_plain] = run(plain);
  const auto [dx_checkpointed, offset_checkpointed] = run(checkpointed);
  // x feeds both forwards, so its gradient sums four contributions: the plain engine adds them
  // one by one, the checkpointed model per block first -- the same terms, summed in another order.
  REQUIRE(dx_checkpointed.size() == dx_plain.size());
  for (size_t i = 0; i < dx_plain.size(); ++i) CHECK(dx_checkpointed[i] == Approx(dx_plain[i]).epsilon(1e-5));
  CHECK(gradients(checkpointed) == gradients(plain));
  // The recompute replays the saved state on the side: the generator ends where it did.
  CHECK(offset_checkpointed == offset_plain);
}

TEST_CASE("a checkpointed segment whose input needs no gradient still trains its parameters",
          "[nn][checkpoint]") {
  manual_seed(3);
  Stack plain(2, 8, 16, 0.0, false), checkpointed(2, 8, 16, 0.0, true);
  checkpointed.load_state_dict(plain.state_dict());
  const Tensor x = randn({4, 8});  // a data batch: requires_grad false
  plain(x).sum().backward();
  checkpointed(x).sum().backward();
  CHECK(gradients(checkpointed) == gradients(plain));
}

TEST_CASE("TinyGPT and ResNet with checkpoint_activations equal the plain models", "[nn][checkpoint]") {
  SECTION("TinyGPT with dropout") {
    nn::GPTConfig config;
    config.vocab_size = 17, config.block_size = 8, config.n_layer = 3, config.n_head = 2, config.n_embd = 16;
    config.dropout = 0.2;
    manual_seed(11);
    nn::TinyGPT plain(config);
    config.checkpoint_activations = true;
    nn::TinyGPT checkpointed(config);
    checkpointed.load_state_dict(plain.state_dict());
    const Tensor idx = randint(0, 17, {2, 8}), targets = randint(0, 17, {16});
    for (nn::TinyGPT* model : {&plain, &checkpointed}) {
      manual_seed(5);
      cross_entropy((*model)(idx).reshape({16, 17}), targets).backward();
    }
    CHECK(gradients(checkpointed) == gradients(plain));
  }
  SECTION("ResNet: gradients, and BatchNorm's running statistics updated once") {
    nn::ResNetOptions options;
    options.widths = {4, 8};
    manual_seed(13);
    nn::ResNetSmall plain(options);
    options.checkpoint_activations = true;
    nn::ResNetSmall checkpointed(options);
    checkpointed.load_state_dict(plain.state_dict());
    const Tensor images = randn({3, 1, 12, 12});
    const Tensor labels = randint(0, 10, {3});
    for (nn::ResNetSmall* model : {&plain, &checkpointed}) cross_entropy((*model)(images), labels).backward();
    CHECK(gradients(checkpointed) == gradients(plain));
    const auto plain_buffers = plain.named_buffers(), checkpointed_buffers = checkpointed.named_buffers();
    REQUIRE(plain_buffers.size() == checkpointed_buffers.size());
    for (size_t i = 0; i < plain_buffers.size(); ++i) {
      INFO(plain_buffers[i].first);
      CHECK(checkpointed_buffers[i].second.to_vector<double>() ==
            plain_buffers[i].second.to_vector<double>());
    }
  }
}

TEST_CASE("checkpointing lowers peak activation memory by the blocks' intermediates", "[nn][checkpoint]") {
  // Each block keeps, for backward, fc1's output [B, H] (GELU's input), GELU's output [B, H]
  // (fc2's input) and the residual sum [B, W]; dropout is off, so no mask. Checkpointed, only
  // the block inputs stay, and one block's intermediates exist at a time during backward: the
  // saving is at least (depth - 1) blocks' 2 [B, H] f32 tensors.
  const int depth = 6;
  const int64_t batch = 64, width = 32, hidden = 512;
  manual_seed(1);
  Stack plain(depth, width, hidden, 0.0, false), checkpointed(depth, width, hidden, 0.0, true);
  checkpointed.load_state_dict(plain.state_dict());
  const Tensor x = randn({batch, width});

  // Activation memory: what the forward leaves alive for backward (the live bytes after it).
  // Peak: the most the step held above its start.
  auto measure = [&](nn::Module& model) {
    model.zero_grad();
    const int64_t before = cpu_device_memory(0).live_bytes;
    reset_cpu_device_peak(0);
    Tensor loss = model(x).sum();
    const int64_t activations = cpu_device_memory(0).live_bytes - before;
    loss.backward();
    return std::make_pair(activations, cpu_device_memory(0).peak_bytes - before);
  };
  const auto [plain_activations, plain_peak] = measure(plain);
  const auto [checkpointed_activations, checkpointed_peak] = measure(checkpointed);
  const int64_t intermediates = depth * 2 * batch * hidden * int64_t(sizeof(float));
  const int64_t block_outputs = depth * batch * width * int64_t(sizeof(float));
  INFO("activations kept by the forward: plain "
       << plain_activations << " B, checkpointed " << checkpointed_activations << " B; intermediates "
       << intermediates << " B, block outputs " << block_outputs << " B; step peak: plain " << plain_peak
       << " B, checkpointed " << checkpointed_peak << " B");
  CHECK(plain_activations - checkpointed_activations >= intermediates);
  CHECK(checkpointed_activations <= 2 * block_outputs);  // the block outputs (and the loss), nothing more
  // The step's peak also holds the gradients (zero_grad freed them; backward allocates them as
  // the activations are freed). Checkpointed, what is left above the gradients is one block's
  // recompute and its backward temporaries, plus the block outputs.
  const int64_t gradient_bytes = plain.num_parameters() * int64_t(sizeof(float));
  const int64_t one_block = 2 * batch * hidden * int64_t(sizeof(float));
  CHECK(checkpointed_peak < plain_peak);
  CHECK(checkpointed_peak - gradient_bytes <= 2 * one_block + 2 * block_outputs);
  CHECK(plain_peak - gradient_bytes > 2 * one_block + 2 * block_outputs);  // what the bound excludes
  CHECK(gradients(checkpointed) == gradients(plain));
}

TEST_CASE("checkpoint refuses an input modified in place before backward, and is plain under no_grad",
          "[nn][checkpoint]") {
  nn::Linear fc(4, 4);
  Tensor x = randn({2, 4}).set_requires_grad(true);
  Tensor h = randn({2, 4});  // needs no gradient, so an in-place op on it is allowed
  Tensor y = nn::checkpoint([&](const Tensor& in) { return fc(in); }, h);
  h.add_(1.0);
  REQUIRE_THROWS_WITH(y.sum().backward(), Catch::Contains("modified by an in-place operation"));

  NoGradGuard no_grad;
  Tensor z = nn::checkpoint([&](const Tensor& in) { return fc(in); }, x);
  CHECK_FALSE(z.requires_grad());
}
