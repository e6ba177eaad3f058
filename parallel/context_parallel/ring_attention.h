// Context parallelism: a group of N ranks holds 1/N of every sequence, and attention -- the one
// layer that mixes positions -- passes the keys and values around a ring (Liu et al., 2023, "Ring
// Attention"; Megatron-LM's and torchtitan's context parallelism). Everything else in a model is
// per position and runs on the local part unchanged.
//
//   step 0: rank r attends its queries to its own K/V chunk, while sending that chunk to rank r+1
//           and receiving rank r-1's
//   step t: the chunk of rank r-t, which arrived during step t-1; the next one is in flight
//   after N steps every query has seen every key; the partial results are merged exactly
//           through their log-sum-exps (core/attention.h: attention_block_forward, merge)
//
// Backward passes K and V around the same ring, each with the gradient accumulators dK, dV of
// its chunk: every rank adds its queries' share (attention_block_backward) and passes them on;
// one last hop brings each chunk's dK, dV home. dQ stays local.
//
// Layouts (which positions a rank holds). With causal attention a query sees only earlier keys,
// so with contiguous chunks rank 0 has nearly nothing to do and rank N-1 the most. The zigzag
// (Megatron-CP, Llama 3) cuts the sequence into 2N chunks and gives rank r chunks r and 2N-1-r,
// an early and a late one, so every rank does the same work:
//
//   positions   | c0 | c1 | c2 | c3 | c4 | c5 | c6 | c7 |      N = 4, 2N = 8 chunks
//   contiguous  |  rank 0 |  rank 1 |  rank 2 |  rank 3 |
//   zigzag      | r0 | r1 | r2 | r3 | r3 | r2 | r1 | r0 |
//
// A query chunk i and a key chunk j (chunk indices in the whole sequence): j < i is attended in
// full, j == i with the causal mask, j > i not at all. docs/model-parallel.md has the ring's
// timeline and the measured traffic.
#pragma once

#include <optional>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

enum class ContextLayout {
  contiguous,  // rank r holds positions [r T/N, (r+1) T/N)
  zigzag,      // rank r holds chunks r and 2N-1-r of 2N (T divisible by 2N)
};

// What one rank did, summed over the calls (and their backwards) that were given it.
struct RingAttentionStats {
  int64_t blocks = 0;          // attention blocks computed, forward and backward
  double compute_seconds = 0;  // CPU time of the calling thread in those blocks (CPU tensors;
                               // with OMP_NUM_THREADS=1 it is all of their work)
  double wait_seconds = 0;     // wall time waiting for a step's transfers after its blocks
  int64_t bytes_sent = 0;      // K, V and the gradient accumulators sent to the right
};

struct RingAttentionOptions {
  bool causal = false;
  std::optional<double> scale;  // default 1 / sqrt(D)
  ContextLayout layout = ContextLayout::contiguous;
  RingAttentionStats* stats = nullptr;  // when set, added to; it must outlive the backward
};

// Attention over the whole sequence, from this rank's part of it: q, k, v are [B, H, T_local, D]
// on the group's device, every rank's T_local the same (a multiple of 2 for zigzag); returns this
// rank's [B, H, T_local, D] of the output, and records a backward that gives q, k and v their
// exact gradients (collective: every rank of `group` must call it, in the same order). Equal to
// scaled_dot_product_attention on the gathered sequence, sharded the same way.
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroup& group,
                      const RingAttentionOptions& options = {});

// This rank's part of `full` along `dim` (length divisible by N, or 2N for zigzag): the positions
// ring_attention expects it to hold, in sequence order. No communication.
Tensor context_shard(const Tensor& full, int64_t dim, int rank, int world, ContextLayout layout);

}  // namespace mg::parallel
