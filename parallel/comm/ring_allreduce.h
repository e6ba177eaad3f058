// Ring all-reduce, written out by hand over a ProcessGroup's send/recv.
//
// After an all-reduce every rank holds the element-wise reduction (sum, average, max or min) of
// the N ranks' buffers. The ring does it in two phases, each of N-1 steps, with every rank
// talking only to its two neighbours:
//
//     left = (r - 1) mod N  ──▶  rank r  ──▶  right = (r + 1) mod N
//
// The buffer (S bytes, `len` elements) is cut into N segments; segment j has len / N elements,
// plus one for the first len % N segments (so lengths 0, 1, < N and primes all work: some
// segments are simply empty).
//
// Step t (t = 0 .. 2N-3) on rank r:   send segment (r - t) mod N to the right,
//                                     receive segment (r - t - 1) mod N from the left.
//
//   * Reduce-scatter (t = 0 .. N-2): the received segment is reduced into ours (a += b). The
//     segment sent at step t+1 is the one reduced at step t, so partial results travel round
//     the ring and pick up one rank's contribution per hop. After N-1 hops, rank r holds the
//     complete reduction of segment (r + 1) mod N.
//   * All-gather (t = N-1 .. 2N-3): the finished segments travel round the ring once more, and
//     each rank copies what it receives into place (received directly into the tensor).
//
// For Avg the owned segment is divided by N once, at the end of the reduce-scatter, so the
// all-gather already carries averages (1/N of the division work of doing it at the end).
//
// Example, N = 4, buffer [a b c d] per rank (aR = segment a of rank R; a+ = the full sum):
//
//   reduce-scatter                      rank 0      rank 1      rank 2      rank 3
//     t=0  r sends seg r           :    a0 ─▶       b1 ─▶       c2 ─▶       d3 ─▶(rank 0)
//          receives seg r-1 and adds:   d3+d0       a0+a1       b1+b2       c2+c3
//     t=1  sends what it just added:    d03 ─▶      a01 ─▶      b12 ─▶      c23 ─▶
//          receives and adds       :    c23+c0      d03+d1      a01+a2      b12+b3
//     t=2                          :    b123+b0     c230+c1     d031+d2     a012+a3
//          owns (r+1) mod 4        :    b+          c+          d+          a+
//   all-gather
//     t=3  sends its finished seg  :    b+ ─▶       c+ ─▶       d+ ─▶       a+ ─▶
//          receives and stores     :    a+          b+          c+          d+
//     t=4, t=5: pass on what arrived, until every rank has [a+ b+ c+ d+].
//
// Cost. Each step sends one segment, S/N bytes, so each rank sends (and receives)
//
//     2 (N-1) / N · S bytes                  (reduce-scatter N-1 steps + all-gather N-1 steps)
//
// which is the lower bound for an all-reduce: every rank must receive the other ranks'
// (N-1)/N·S of contributions to its own share, and send its reduced share to N-1 others. It does
// not grow with N, which is why the ring (Baidu, Horovod, NCCL) is the bandwidth-optimal choice
// for large buffers; its weakness is latency: 2(N-1) sequential steps.
//
// Bandwidths, as nccl-tests reports them:
//
//     algbw = S / time                           (what the user sees: buffer size per second)
//     busbw = algbw · 2 (N-1) / N                (the bytes each rank's link actually carried)
//
// busbw factors the algorithm out: a ring that saturates its links reports busbw = the link
// bandwidth whatever N is, so numbers measured at different N (and against other algorithms,
// MPI_Allreduce or NCCL) compare directly.
//
// Pipelining. Each segment is further cut into chunks of `RingOptions::chunk_bytes`. A chunk is
// forwarded as soon as it has been reduced, without waiting for the rest of its segment, so while
// chunk k is being added, chunk k+1 is already on the wire and chunk k-1 is on its way to the
// next rank: the transfer time and the reduction time overlap instead of adding up. All
// receives of a step are posted before its sends, and each chunk's next receive is posted as
// soon as its slot is free, so no rank ever blocks a neighbour (see ring_allreduce.cpp).
//
// Asynchrony. ring_allreduce_async() returns at once; the ring runs on one background thread
// per process group, which runs rings strictly in the order they were called (every rank calls
// them in the same order, as with any collective), and completes the returned Work.
// DistributedDataParallel launches one per gradient bucket from the autograd thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/work.h"

namespace mg::parallel {

struct RingOptions {
  // Pipelining granularity: each segment travels in chunks of at most this many bytes (at least
  // one element). 1 MiB is large enough that the per-message cost (a few microseconds through the
  // backend's progress thread and MPI's matching) is < 1 % of a chunk's transfer even at
  // ~10 GB/s, and small enough that a 25 MB DDP bucket on 8 ranks (3 MB segments) still has
  // several chunks in flight per step, and that a chunk and its partner fit in L2 while being
  // added. Smaller chunks are only useful to test the pipelining itself.
  size_t chunk_bytes = size_t{1} << 20;
  // Tags of the ring's messages: tag_base + (message index mod kRingTagSpan). Keep your own
  // send/recv tags on the same group outside [tag_base, tag_base + kRingTagSpan).
  int tag_base = 16384;
};
// Ring messages use kRingTagSpan consecutive tags from RingOptions::tag_base (16384 + 16384 - 1 =
// 32767, the largest tag every MPI must support).
constexpr int kRingTagSpan = 16384;

// Reduces `tensor` (contiguous; f32, f64, f16 or bf16; on any device the group can send from) in
// place across the group, with the framework's own kernels doing the reduction on the tensor's
// device. Returns at once; wait() on the Work before reading or writing the tensor. Rings on one
// group run in call order. In a world of one the tensor is already the result.
WorkPtr ring_allreduce_async(ProcessGroup& pg, Tensor& tensor, ReduceOp op = ReduceOp::Sum,
                             RingOptions opts = {});

// ring_allreduce_async(...)->wait().
void ring_allreduce(ProcessGroup& pg, Tensor& tensor, ReduceOp op = ReduceOp::Sum, RingOptions opts = {});

// Segment j of a `numel`-element buffer cut for `world` ranks: [offset, offset + length).
// The first numel % world segments are one element longer than the others.
struct RingSegment {
  int64_t offset = 0;
  int64_t length = 0;
};
std::vector<RingSegment> ring_segments(int64_t numel, int world);

}  // namespace mg::parallel
