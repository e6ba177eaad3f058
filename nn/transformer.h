// TransformerBlock: one GPT-2 layer, pre-LayerNorm residual style:
//
//   x = x + attn(ln_1(x))          causal self-attention
//   x = x + mlp(ln_2(x))           mlp = c_proj(gelu(c_fc(x))), hidden width 4 n_embd
//
// Normalising *before* each sublayer keeps the residual path an identity, which is
// what lets deep GPTs train without warmup tricks. Names follow nanoGPT.
#pragma once

#include "nn/activation.h"
#include "nn/attention.h"
#include "nn/dropout.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "nn/normalization.h"

namespace mg::nn {

// The block's feed-forward part: Linear(C, 4C) -> GELU -> Linear(4C, C) -> Dropout.
class TransformerMLP : public Module {
 public:
  TransformerMLP(int64_t n_embd, double dropout = 0.0);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<Module> clone_empty() const override;

  const int64_t n_embd;
  const double dropout_p;
  Linear c_fc;
  GELU gelu;
  Linear c_proj;
  Dropout dropout;
};

class TransformerBlock : public Module {
 public:
  TransformerBlock(int64_t n_embd, int64_t n_head, double dropout = 0.0,
                   AttentionImpl attention = AttentionImpl::fused);
  Tensor forward(const Tensor& x) override;  // [B, T, n_embd] -> [B, T, n_embd]
  std::shared_ptr<Module> clone_empty() const override;

  const int64_t n_embd, n_head;
  const double dropout_p;
  LayerNorm ln_1;
  CausalSelfAttention attn;
  LayerNorm ln_2;
  TransformerMLP mlp;
};

}  // namespace mg::nn
