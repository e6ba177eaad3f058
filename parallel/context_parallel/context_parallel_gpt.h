// A context-parallel GPT: every rank of a group of N holds 1/N of each sequence, and only attention
// talks to the other ranks.
//
//   tokens [B, T] ──pad to T'──▶ rank r's positions [B, T'/N] (context_parallel_batch)
//     ─▶ wte + wpe(this rank's positions) ─▶ per block:
//          ln_1 ─▶ c_attn ─▶ q, k, v [B, H, T'/N, D] ─▶ ring_attention or ulysses_attention ─▶ c_proj ─▶ + x
//          ln_2 ─▶ MLP                                                                       ─▶ + h
//     ─▶ ln_f ─▶ lm_head ─▶ logits [B, T'/N, V] for this rank's positions only
//
// Everything but attention is per token (embeddings, LayerNorms, the projections, the MLP, the
// loss), so a rank computes it on its own tokens without communicating. The parameters are the
// TinyGPT's own (registered as "gpt.<name>"), the same on every rank. Their gradients differ per
// rank: rank r's are those of its tokens' losses, plus, through the K/V gradients the ring brings
// home, what every other rank's queries owe to r's keys and values. The sum over the group is the
// gradient of the sum of the ranks' losses, so the group's gradients are all-reduced as data
// parallelism does: wrap the model in DistributedDataParallel over every rank that holds a copy
// (the context group alone, or data x context on a mesh: see examples/train_gpt_parallel.cpp), or
// shard it with FullyShardedDataParallel over all of them (each block runs through its own
// module's hooks, Module::call_with_hooks, so one FSDP unit per TransformerBlock works).
//
// Layouts (ring_attention.h): ring attention in the zigzag layout by default (each rank holds
// chunks r and 2N-1-r of 2N, so causal work is balanced); Ulysses in the contiguous one (an
// all-to-all needs no balancing: every rank attends over whole sequences for H/N heads).
//
// Padding: a length T that does not divide into the layout's chunks is padded at the end to T'
// (the next multiple of N, or of 2N in the zigzag); padded inputs are token 0 and padded targets
// are ignore_index (-100), so they count in no loss. Attention is causal and the padding comes
// after every real token, so no real token attends to a padded one: padding changes no real
// output. (Padded positions past block_size take the last position's embedding; only padding
// lies there.)
//
// tests/parallel/context_parallel/test_context_parallel_gpt.cpp trains a TinyGPT 10 AdamW steps
// this way at N = 2, 3 and 4 (and on a 2 x 2 data x context mesh) and compares every loss and
// parameter with one process.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "nn/module.h"
#include "nn/zoo.h"
#include "parallel/context_parallel/ring_attention.h"

namespace mg::parallel {

enum class ContextAttention {
  ring,     // K/V blocks passed round the ring (ring_attention.h)
  ulysses,  // two all-to-alls re-shard sequence <-> heads (ulysses_attention.h); H divisible by N
};

struct ContextParallelOptions {
  ContextAttention attention = ContextAttention::ring;
  // The layout of each rank's positions; unset: zigzag for the ring, contiguous for Ulysses (the
  // only one Ulysses takes).
  std::optional<ContextLayout> layout;
  RingAttentionStats* stats = nullptr;  // the ring's, summed over every block and layer (optional)
};

// The padded length of a T-token sequence over `world` ranks in `layout`: the next multiple of
// world (contiguous) or of 2 world (zigzag).
int64_t context_padded_length(int64_t T, int world, ContextLayout layout);

// This rank's part of a batch: inputs [B, T] and targets [B, T] (i64) padded to T' as above and
// cut to this rank's T'/N positions.
struct ContextBatch {
  Tensor inputs, targets;   // [B, T'/N]
  int64_t real_tokens = 0;  // B * T: the tokens of the whole (unpadded) batch, over all ranks
};

// The same, for any model over `group` in `layout` (TensorParallelGPT with a context group uses
// it): inputs and targets [B, T] padded to T' and cut to this rank's positions.
ContextBatch context_parallel_batch(const Tensor& inputs, const Tensor& targets, const ProcessGroup& group,
                                    ContextLayout layout, int64_t block_size);

// The positions (wpe rows) of this rank's `local` positions of a padded sequence, [local] i64 on
// `device`; those past block_size are padding and take the last row.
Tensor context_positions(int64_t local, const ProcessGroup& group, ContextLayout layout, int64_t block_size,
                         Device device);

class ContextParallelGPT : public nn::Module {
 public:
  // `gpt` must outlive this; its attention dropout must be 0 for the ring (Ulysses runs dropout,
  // each rank drawing the masks of its own heads, which then differ from one device's).
  ContextParallelGPT(nn::TinyGPT& gpt, ProcessGroup group, ContextParallelOptions options = {});

  // idx: this rank's positions [B, T'/N] of a padded [B, T'] batch (context_parallel_batch) ->
  // logits [B, T'/N, vocab_size] for those positions. Collective over the group.
  Tensor forward(const Tensor& idx) override;
  std::string extra_repr() const override;  // (a view of `gpt`: it cannot be cloned, as DDP's views)

  // This rank's part of a whole batch (the same inputs and targets on every rank of the group).
  ContextBatch context_parallel_batch(const Tensor& inputs, const Tensor& targets) const;

  ContextLayout layout() const { return layout_; }
  const ProcessGroup& group() const { return group_; }

 private:
  Tensor attention(nn::CausalSelfAttention& attn, const Tensor& x);

  nn::TinyGPT& gpt_;
  ProcessGroup group_;
  ContextParallelOptions options_;
  ContextLayout layout_;
};

}  // namespace mg::parallel
