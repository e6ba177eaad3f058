// A tensor-parallel GPT (Megatron-LM's layout): each TransformerBlock's attention heads and MLP
// hidden features split across the T ranks of a group; everything else replicated.
//
//   x ─▶ ln_1 ─▶ f ─▶ c_attn (Column, blocks q|k|v) ─▶ H/T heads ─▶ c_proj (Row) ─▶ g ─▶ + x
//     ─▶ ln_2 ─▶ f ─▶ c_fc   (Column, 4C/T)        ─▶ GELU      ─▶ c_proj (Row) ─▶ g ─▶ + h
//
//   rank r holds: heads [r H/T, (r+1) H/T) — their rows of q, k and v (c_attn's weight is three
//   stacked [C, C] blocks, so the slice is taken from each block) and the matching columns of
//   the output projection; rows [r 4C/T, (r+1) 4C/T) of c_fc and the matching columns of the
//   MLP's c_proj. Per block and step: two all-reduces of [B, T, C] forward (the g's), two
//   backward (the f's), nothing else.
//
//   replicated on every rank: wte, wpe, the LayerNorms and lm_head. Their inputs are the same on
//   every rank and their gradients arrive whole (each f all-reduces the gradient it passes back
//   into the residual stream), so every rank computes the same update without communicating.
//
// With a context group as well (context parallelism x tensor parallelism, a 2-D mesh of T x N
// ranks), every sequence is also split over the context group's N ranks in the zigzag layout:
// the model takes this rank's positions (context_parallel_batch), and each block's attention runs
// ring_attention over the context group on this rank's H/T heads. Everything else is per token.
// The tensor-parallel shards' gradients, and the replicated layers', are then partial over the
// context group: wrap the model in DistributedDataParallel over it (context_parallel_gpt.h says
// why the sum is the whole sequence's gradient).
//
// Built from a TinyGPT (drawn after the same manual_seed on every rank), a TensorParallelGPT
// equals it: tests/parallel/tensor_parallel/test_tensor_parallel.cpp compares logits, gradients and 10 AdamW
// steps at T = 2 and 4. Dropout > 0 trains but is not equal to one device (each rank draws its own masks for
// its heads); the replicated dropouts need the same seed on every rank.
#pragma once

#include <memory>

#include "core/random.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "nn/zoo.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/tensor_parallel/tensor_parallel.h"

namespace mg::parallel {

// CausalSelfAttention with this rank's n_head / T heads; with a context group (of more than one
// rank), ring attention over it in the zigzag layout (no attention dropout).
class TensorParallelAttention : public nn::Module {
 public:
  TensorParallelAttention(const nn::CausalSelfAttention& full, ProcessGroup group,
                          ProcessGroup context = ProcessGroup());
  Tensor forward(const Tensor& x) override;  // [B, T, n_embd] -> [B, T, n_embd] (summed over ranks)
  std::shared_ptr<nn::Module> clone_empty() const override;
  std::string extra_repr() const override;

  const int64_t n_embd, n_head, heads_per_rank;
  const double dropout_p;
  const nn::AttentionImpl impl;                  // the full model's choice (nn/attention.h)
  std::shared_ptr<ColumnParallelLinear> c_attn;  // [3 n_embd / T, n_embd]: q_r, k_r, v_r
  std::shared_ptr<RowParallelLinear> c_proj;     // [n_embd, n_embd / T]
  nn::Dropout attn_dropout, resid_dropout;

 private:
  ProcessGroup group_, context_;
};

// TransformerMLP with 4 n_embd / T hidden features on this rank.
class TensorParallelTransformerMLP : public nn::Module {
 public:
  TensorParallelTransformerMLP(const nn::TransformerMLP& full, ProcessGroup group);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Module> clone_empty() const override;

  const int64_t n_embd;
  const double dropout_p;
  std::shared_ptr<ColumnParallelLinear> c_fc;
  nn::GELU gelu;
  std::shared_ptr<RowParallelLinear> c_proj;
  nn::Dropout dropout;

 private:
  ProcessGroup group_;
};

class TensorParallelBlock : public nn::Module {
 public:
  TensorParallelBlock(const nn::TransformerBlock& full, ProcessGroup group,
                      ProcessGroup context = ProcessGroup());
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::Module> clone_empty() const override;

  const int64_t n_embd, n_head;
  const double dropout_p;
  nn::LayerNorm ln_1;
  std::shared_ptr<TensorParallelAttention> attn;
  nn::LayerNorm ln_2;
  std::shared_ptr<TensorParallelTransformerMLP> mlp;

 private:
  ProcessGroup group_, context_;
};

class TensorParallelGPT : public nn::Module {
  // The generator's state before the replicated layers' own (discarded) initialisation, put back
  // at the end of the constructor: building this rank's part of a TinyGPT draws no random numbers.
  // Declared first, so it is initialised first.
  GeneratorState generator_before_;

 public:
  // Draws a TinyGPT(config) and splits it (the generator ends where TinyGPT(config) leaves it).
  TensorParallelGPT(nn::GPTConfig config, ProcessGroup group);
  // This rank's part of `full`; n_head must divide by the group size. With `context` (the ranks
  // that split each sequence; see the top of this file) forward takes this rank's positions.
  TensorParallelGPT(const nn::TinyGPT& full, ProcessGroup group, ProcessGroup context = ProcessGroup());
  // [B, T] i64 -> logits [B, T, vocab_size], replicated over the group; with a context group,
  // [B, T'/N] positions of context_parallel_batch -> their logits.
  Tensor forward(const Tensor& idx) override;
  // What to cut each batch with: the context group's layout (zigzag), under its context group.
  const ProcessGroup& context_group() const { return context_; }
  std::shared_ptr<nn::Module> clone_empty() const override;

  const nn::GPTConfig config;
  nn::Embedding wte, wpe;
  nn::Dropout drop;
  nn::ModuleList h;  // TensorParallelBlocks
  nn::LayerNorm ln_f;
  nn::Linear lm_head;

 private:
  ProcessGroup group_, context_;
};

}  // namespace mg::parallel
