// A small model zoo: four complete models built only from nn/ layers.
//
//   MLP          in -> hidden... -> out, ReLU between (flattens [N, 1, 28, 28] itself)
//   FashionCNN   [N, 1, 28, 28] -> 2 x (conv3x3 + BatchNorm + ReLU + maxpool2) -> Linear -> ReLU
//                -> Dropout -> Linear(10): the "2 Conv + pooling + BN" of Fashion-MNIST's table
//   ResNetSmall  a CIFAR-style ResNet: conv stem, 3 stages of BasicBlocks (the 2nd and 3rd
//                halve H, W and use a 1x1-conv + BN shortcut), global average pool, Linear
//   TinyGPT      token + position embeddings, n_layer TransformerBlocks, LayerNorm, LM head:
//                idx [B, T] i64 -> logits [B, T, vocab_size]
//
// Every model overrides clone_empty(), so clone(device) (and DataParallel) works.
#pragma once

#include <memory>
#include <vector>

#include "nn/activation.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "nn/pooling.h"
#include "nn/transformer.h"

namespace mg::nn {

class MLP : public Module {
 public:
  MLP(int64_t in_features, std::vector<int64_t> hidden_sizes, int64_t out_features);
  Tensor forward(const Tensor& x) override;  // [N, ...] is flattened to [N, in_features]
  std::shared_ptr<Module> clone_empty() const override;

  const int64_t in_features, out_features;
  const std::vector<int64_t> hidden_sizes;
  Sequential layers;  // Linear, ReLU, Linear, ReLU, ..., Linear
};

struct FashionCNNOptions {
  int64_t channels1 = 32, channels2 = 64;  // conv widths
  int64_t hidden = 128;                    // the first Linear's width
  double dropout = 0.25;                   // before the classifier
  int64_t num_classes = 10;
};

class FashionCNN : public Module {
 public:
  explicit FashionCNN(FashionCNNOptions options = {});
  Tensor forward(const Tensor& x) override;  // [N, 1, 28, 28] -> [N, num_classes]
  std::shared_ptr<Module> clone_empty() const override;

  const FashionCNNOptions options;
  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  MaxPool2d pool;
  Linear fc1;
  Dropout dropout;
  Linear fc2;
};

// conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU. The shortcut is the
// identity, or a strided 1x1 conv + BN ("downsample") when the shape changes.
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t in_channels, int64_t out_channels, int64_t stride = 1);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;

  const int64_t in_channels, out_channels, stride;
  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  std::shared_ptr<Sequential> downsample;  // null for the identity shortcut
};

struct ResNetOptions {
  int64_t in_channels = 1;  // 1 for Fashion-MNIST, 3 for CIFAR
  int64_t num_classes = 10;
  std::vector<int64_t> widths = {16, 32, 64};  // channels of each stage
  int64_t blocks_per_stage = 1;
  bool checkpoint_activations = false;  // recompute each stage in backward (nn/activation_checkpoint.h)
};

class ResNetSmall : public Module {
 public:
  explicit ResNetSmall(ResNetOptions options = {});
  Tensor forward(const Tensor& x) override;  // [N, in_channels, H, W] -> [N, num_classes]
  std::shared_ptr<Module> clone_empty() const override;

  const ResNetOptions options;
  Conv2d conv1;
  BatchNorm2d bn1;
  std::vector<std::shared_ptr<Sequential>> stages;  // registered as layer1, layer2, ...
  AdaptiveAvgPool2d pool;
  Linear fc;
};

struct GPTConfig {
  int64_t vocab_size = 65;  // tiny Shakespeare's character set
  int64_t block_size = 64;  // longest context
  int64_t n_layer = 2;
  int64_t n_head = 4;
  int64_t n_embd = 64;
  double dropout = 0.0;
  bool checkpoint_activations = false;  // recompute each block in backward (nn/activation_checkpoint.h)
  // The fused scaled_dot_product_attention (no [T, T] scores stored), or the composed ops.
  AttentionImpl attention = AttentionImpl::fused;
};

class TinyGPT : public Module {
 public:
  explicit TinyGPT(GPTConfig config = {});
  Tensor forward(const Tensor& idx) override;  // [B, T] i64 -> logits [B, T, vocab_size]
  std::shared_ptr<Module> clone_empty() const override;
  // The same model as a Sequential of the same modules (parameters shared), for pipeline_stage:
  //   [embeddings (wte + wpe + drop), h.0, ..., h.{n_layer - 1}, head (ln_f + lm_head)]
  // The Sequential refers to this TinyGPT, which must outlive it.
  std::shared_ptr<Sequential> as_sequential();
  Tensor embed(const Tensor& idx);  // drop(wte(idx) + wpe(positions)): [B, T] -> [B, T, C]

  const GPTConfig config;
  Embedding wte;  // token embeddings
  Embedding wpe;  // position embeddings
  Dropout drop;
  ModuleList h;  // the TransformerBlocks
  LayerNorm ln_f;
  Linear lm_head;  // no bias (and, unlike GPT-2, not tied to wte)
};

}  // namespace mg::nn
