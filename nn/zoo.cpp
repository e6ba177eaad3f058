// The model zoo: each constructor registers its layers, each forward reads like
// the model's diagram.
#include "nn/zoo.h"

#include "nn/activation_checkpoint.h"

#include <cmath>

#include "core/ops.h"
#include "nn/init.h"

namespace mg::nn {

namespace {
// A conv without bias (the BatchNorm after it has one).
Conv2dOptions no_bias(int64_t stride, int64_t padding) {
  Conv2dOptions o;
  o.stride = stride;
  o.padding = padding;
  o.bias = false;
  return o;
}
}  // namespace

// ---- MLP ----
MLP::MLP(int64_t in, std::vector<int64_t> hidden, int64_t out)
    : in_features(in), out_features(out), hidden_sizes(std::move(hidden)) {
  int64_t width = in;
  for (int64_t h : hidden_sizes) {
    layers.emplace_back<Linear>(width, h);
    layers.emplace_back<ReLU>();
    width = h;
  }
  layers.emplace_back<Linear>(width, out);
  register_module("layers", layers);
}

Tensor MLP::forward(const Tensor& x) { return layers(x.dim() > 2 ? x.flatten(1) : x); }

std::shared_ptr<Module> MLP::clone_empty() const {
  return std::make_shared<MLP>(in_features, hidden_sizes, out_features);
}

// ---- FashionCNN ----
FashionCNN::FashionCNN(FashionCNNOptions o)
    : options(o),
      conv1(1, o.channels1, 3, no_bias(1, 1)),
      bn1(o.channels1),
      conv2(o.channels1, o.channels2, 3, no_bias(1, 1)),
      bn2(o.channels2),
      pool(2),
      fc1(o.channels2 * 7 * 7, o.hidden),
      dropout(o.dropout),
      fc2(o.hidden, o.num_classes) {
  register_module("conv1", conv1);
  register_module("bn1", bn1);
  register_module("conv2", conv2);
  register_module("bn2", bn2);
  register_module("pool", pool);
  register_module("fc1", fc1);
  register_module("dropout", dropout);
  register_module("fc2", fc2);
}

Tensor FashionCNN::forward(const Tensor& x) {
  MG_CHECK(x.defined() && x.dim() == 4 && x.size(1) == 1 && x.size(2) == 28 && x.size(3) == 28,
           "FashionCNN: expected [N, 1, 28, 28] images, got ",
           x.defined() ? shape_str(x.shape()) : std::string("an undefined tensor"));
  Tensor h = pool(relu(bn1(conv1(x))));  // [N, c1, 14, 14]
  h = pool(relu(bn2(conv2(h))));         // [N, c2, 7, 7]
  h = relu(fc1(h.flatten(1)));
  return fc2(dropout(h));
}

std::shared_ptr<Module> FashionCNN::clone_empty() const { return std::make_shared<FashionCNN>(options); }

// ---- BasicBlock ----
BasicBlock::BasicBlock(int64_t in, int64_t out, int64_t s)
    : in_channels(in),
      out_channels(out),
      stride(s),
      conv1(in, out, 3, no_bias(s, 1)),
      bn1(out),
      conv2(out, out, 3, no_bias(1, 1)),
      bn2(out) {
  register_module("conv1", conv1);
  register_module("bn1", bn1);
  register_module("conv2", conv2);
  register_module("bn2", bn2);
  if (s != 1 || in != out) {
    downsample = std::make_shared<Sequential>();
    downsample->emplace_back<Conv2d>(in, out, 1, no_bias(s, 0));
    downsample->emplace_back<BatchNorm2d>(out);
    register_module("downsample", downsample);
  }
}

Tensor BasicBlock::forward(const Tensor& x) {
  Tensor h = relu(bn1(conv1(x)));
  h = bn2(conv2(h));
  return relu(add(h, downsample ? (*downsample)(x) : x));
}

std::shared_ptr<Module> BasicBlock::clone_empty() const {
  return std::make_shared<BasicBlock>(in_channels, out_channels, stride);
}

// ---- ResNetSmall ----
ResNetSmall::ResNetSmall(ResNetOptions o)
    : options(o),
      conv1(o.in_channels, o.widths.at(0), 3, no_bias(1, 1)),
      bn1(o.widths.at(0)),
      pool(1),
      fc(o.widths.back(), o.num_classes) {
  MG_CHECK(o.blocks_per_stage >= 1, "ResNetSmall: blocks_per_stage must be >= 1, got ", o.blocks_per_stage);
  register_module("conv1", conv1);
  register_module("bn1", bn1);
  int64_t width = o.widths[0];
  for (size_t s = 0; s < o.widths.size(); ++s) {
    auto stage = std::make_shared<Sequential>();
    for (int64_t b = 0; b < o.blocks_per_stage; ++b) {
      const int64_t stride = (s > 0 && b == 0) ? 2 : 1;  // every stage after the first halves H and W
      stage->emplace_back<BasicBlock>(width, o.widths[s], stride);
      width = o.widths[s];
    }
    stages.push_back(register_module("layer" + std::to_string(s + 1), stage));
  }
  register_module("pool", pool);
  register_module("fc", fc);
}

Tensor ResNetSmall::forward(const Tensor& x) {
  Tensor h = relu(bn1(conv1(x)));
  for (const auto& stage : stages)
    h = options.checkpoint_activations ? checkpoint_module(*stage, h) : (*stage)(h);
  return fc(pool(h).flatten(1));
}

std::shared_ptr<Module> ResNetSmall::clone_empty() const { return std::make_shared<ResNetSmall>(options); }

// ---- TinyGPT ----
TinyGPT::TinyGPT(GPTConfig c)
    : config(c),
      wte(c.vocab_size, c.n_embd),
      wpe(c.block_size, c.n_embd),
      drop(c.dropout),
      ln_f(c.n_embd),
      lm_head(c.n_embd, c.vocab_size, /*bias=*/false) {
  MG_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0,
           "TinyGPT: vocab_size, block_size and n_layer must "
           "be positive");
  register_module("wte", wte);
  register_module("wpe", wpe);
  register_module("drop", drop);
  for (int64_t i = 0; i < c.n_layer; ++i)
    h.emplace_back<TransformerBlock>(c.n_embd, c.n_head, c.dropout, c.attention);
  register_module("h", h);
  register_module("ln_f", ln_f);
  register_module("lm_head", lm_head);

  // GPT-2's initialisation: N(0, 0.02) weights, zero biases, and the projections that
  // write into the residual stream scaled down by sqrt(2 n_layer) so its variance
  // does not grow with depth.
  apply([](Module& m) {
    if (auto* linear = dynamic_cast<Linear*>(&m)) {
      init::normal_(linear->weight, 0.0, 0.02);
      if (linear->bias.defined()) init::zeros_(linear->bias);
    } else if (auto* emb = dynamic_cast<Embedding*>(&m)) {
      init::normal_(emb->weight, 0.0, 0.02);
    }
  });
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  for (auto& [name, p] : named_parameters()) {
    const std::string suffix = "c_proj.weight";
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      init::normal_(p, 0.0, proj_std);
  }
}

Tensor TinyGPT::embed(const Tensor& idx) {
  MG_CHECK(
      idx.defined() && idx.dim() == 2 && is_integral(idx.dtype()),
      "TinyGPT: expected token ids [B, T] (i64), got ",
      idx.defined() ? str_cat(shape_str(idx.shape()), " ", idx.dtype()) : std::string("an undefined tensor"));
  const int64_t T = idx.size(1);
  MG_CHECK(T <= config.block_size, "TinyGPT: sequence length ", T, " exceeds block_size ", config.block_size);
  const Tensor pos = arange(T, TensorOptions{DType::i64, idx.device()});
  return drop(add(wte(idx), wpe(pos)));  // [B, T, C] + [T, C]
}

Tensor TinyGPT::forward(const Tensor& idx) {
  Tensor x = embed(idx);
  for (const auto& block : h) x = config.checkpoint_activations ? checkpoint_module(*block, x) : (*block)(x);
  return lm_head(ln_f(x));
}

namespace {

// The first and last pieces of TinyGPT::as_sequential(): views that register the model's own
// modules (so their parameters are the model's) and run its code.
class GPTEmbeddingsView : public Module {
 public:
  explicit GPTEmbeddingsView(TinyGPT& gpt) : gpt_(gpt) {
    register_module("wte", gpt.wte);
    register_module("wpe", gpt.wpe);
    register_module("drop", gpt.drop);
  }
  Tensor forward(const Tensor& idx) override { return gpt_.embed(idx); }
  std::string type_name() const override { return "GPTEmbeddings"; }

 private:
  TinyGPT& gpt_;
};

class GPTHeadView : public Module {
 public:
  explicit GPTHeadView(TinyGPT& gpt) : gpt_(gpt) {
    register_module("ln_f", gpt.ln_f);
    register_module("lm_head", gpt.lm_head);
  }
  Tensor forward(const Tensor& x) override { return gpt_.lm_head(gpt_.ln_f(x)); }
  std::string type_name() const override { return "GPTHead"; }

 private:
  TinyGPT& gpt_;
};

}  // namespace

std::shared_ptr<Sequential> TinyGPT::as_sequential() {
  auto layers = std::make_shared<Sequential>();
  layers->push_back(std::make_shared<GPTEmbeddingsView>(*this));
  for (size_t i = 0; i < h.size(); ++i) layers->push_back(h.ptr(i));
  layers->push_back(std::make_shared<GPTHeadView>(*this));
  return layers;
}

std::shared_ptr<Module> TinyGPT::clone_empty() const { return std::make_shared<TinyGPT>(config); }

}  // namespace mg::nn
