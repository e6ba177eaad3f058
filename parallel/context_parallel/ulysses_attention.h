// DeepSpeed-Ulysses (Jacobs et al., 2023): context parallelism by an exchange of splits. Each of N
// ranks holds 1/N of the sequence for all H heads; one all-to-all per tensor turns that into the
// whole sequence for H/N heads, attention runs locally on it (heads are independent), and one
// all-to-all turns the output back:
//
//   q, k, v  [B, H, T/N, D]  --all_to_all-->  [B, H/N, T, D]  --attention-->  [B, H/N, T, D]
//   out      [B, H/N, T, D]  --all_to_all-->  [B, H, T/N, D]
//
// Backward is the same exchanges in reverse (an all-to-all's gradient is the all-to-all back).
// Against the ring (ring_attention.h), per rank and forward pass: the four all-to-alls send
// (N-1)/N of four [B, H, T/N, D] shards, a volume that falls as 1/N, where the ring sends N-1
// chunks of K and of V, about the whole K and V whatever N. But N can be at most H (and must
// divide it), and causal attention is balanced by construction: every rank has whole sequences.
#pragma once

#include "core/attention.h"
#include "core/tensor.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// Attention over the whole sequence from this rank's contiguous part of it (rank r holds
// positions [r T/N, (r+1) T/N), the contiguous layout of ring_attention.h): q, k, v are
// [B, H, T/N, D] with H divisible by the group size; returns this rank's [B, H, T/N, D] of the
// output, with autograd. Collective: every rank of `group` must call it, in the same order.
// `options` are scaled_dot_product_attention's (dropout included: each rank draws the mask of
// its own heads).
Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroup& group,
                         const AttentionOptions& options = {});

// all_to_all with autograd: block i of dim 0 (of `world` equal blocks) goes to rank i, which
// receives it as its block r (r = this rank). Its gradient is the same exchange applied to the
// output's gradient.
Tensor all_to_all_with_grad(const Tensor& x, const ProcessGroup& group);

}  // namespace mg::parallel
