// bucket_cap_mb = auto (DDPOptions::bucket_cap_auto): DDP's bucket size chosen from the measured
// link instead of PyTorch's fixed 25 MB, which is right for one link and model and wrong for most.
//
// The link. At construction every rank times all-reduces of a few sizes (4 KiB, ×4 up to 16 MiB
// or about the model's gradient size, whichever is smaller; a warm-up and 5 timed repetitions
// each, median) and rank 0 fits
//
//   T(S) = α + β·S        (α: latency of one all-reduce, β: seconds per byte all-reduced)
//
// by least squares weighted by 1/T² (relative errors: the small sizes, which carry α, count as
// much as the large ones). The fit is of the all-reduce as this group runs it -- its algorithm,
// world size and links -- so T(S) predicts a bucket's all-reduce without any ring formula. Rank
// 0's fit is broadcast, so every rank chooses the same cap (ranks with different caps would issue
// different collectives).
//
// The model's backward. Gradients become ready in reverse registration order (the Reducer's
// initial bucket order), and the backward pass produces each parameter's gradient in time
// proportional to its bytes (compute ∝ parameters: exact for linear layers at a fixed batch,
// rough for convolutions, whose compute also scales with the image size). The backward duration
// B is DDPOptions::bucket_cap_auto_backward_ms when the user knows it; otherwise B = the time the
// link needs to all-reduce every gradient in one piece, T(P) -- the regime where the cap matters
// most (with B ≫ T(P) any cap hides communication; with B ≪ T(P) none does).
//
// The choice. Buckets are formed exactly as the Reducer forms them (assign_buckets); bucket k
// starts when its last gradient is ready and the link has finished bucket k−1, and lasts
// T(S_k). The exposed communication is what ends after backward:
//
//   exposed(cap) = max(0, end of the last all-reduce − B)
//
// Caps from the smallest gradient up to all of them, doubling, each with the user's first bucket
// cap and with none (first = cap), are evaluated, and the least of
//
//   cost(cap) = exposed(cap) + buckets(cap)·α
//
// wins: each all-reduce also takes about α of the host away from backward (issuing it, MPI's
// progress, the collective signature check), time the exposed figure does not see; without it
// a link much faster than the compute makes every cap "free" and the tie goes to the smallest,
// whose many collectives then slow backward down (measured: 7 buckets of 2.4 kB made the CNN's
// DDP step 2.5x slower than 3 buckets, 2 ranks on 2 cores). With uniform ready times and
// B = T(P) this is the square-root law: cost ≈ β·s + 2α·P/s, least at s = √(2α·P/β) -- small
// buckets when α is tiny, one bucket when α is huge.
//
// Left out: the rest of the contention between the all-reduces and backward's compute for the
// same cores or memory bandwidth, and the bucket rebuild after the first iteration (which only
// reorders).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// T(S) = alpha_s + beta_s_per_byte · S, for an all-reduce of S bytes.
struct LinkFit {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
  int points = 0;  // (size, time) pairs fitted
  double seconds(double bytes) const { return alpha_s + beta_s_per_byte * bytes; }
};

// Weighted least squares (weights 1/T²) of T = α + β·S over (bytes, seconds) samples; α and β are
// never negative (a negative one is set to 0 and the other refitted). Needs two distinct sizes.
LinkFit fit_alpha_beta(const std::vector<std::pair<double, double>>& bytes_seconds);

// Each gradient, in the order backward produces it: its bytes, dtype, and ready time (s from the
// start of backward). `backward_s` is when backward ends (>= the last ready time).
struct GradientTimeline {
  std::vector<int64_t> bytes;
  std::vector<DType> dtypes;
  std::vector<double> ready_s;
  double backward_s = 0;
  int64_t total_bytes() const;
};

// Ready times proportional to the bytes produced so far: gradient i is ready at
// backward_s · (bytes[0] + ... + bytes[i]) / total.
GradientTimeline proportional_timeline(std::vector<int64_t> bytes, std::vector<DType> dtypes,
                                       double backward_s);

// Communication still running after backward for these caps (MB = 2^20 bytes, as the Reducer).
double predicted_exposed_s(const GradientTimeline& timeline, const LinkFit& link, double first_bucket_cap_mb,
                           double bucket_cap_mb);

struct BucketCapChoice {
  LinkFit link;
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  double predicted_exposed_s = 0;
  double backward_s = 0;        // the backward duration the choice assumed
  bool backward_given = false;  // from the user, or assumed = T(all gradients)
  int buckets = 0;
  std::string summary() const;  // one line: the fit, the assumption, the choice
};

// The cap (and first cap: the given one, or none) with the least exposed(cap) + buckets(cap)·α.
BucketCapChoice choose_bucket_cap(const GradientTimeline& timeline, const LinkFit& link,
                                  double first_bucket_cap_mb);

// Collective (every rank of `group` calls it): times all-reduces of `dtype` on the group's
// device and returns rank 0's fit on every rank. `max_bytes` bounds the largest size timed.
LinkFit measure_allreduce_link(ProcessGroup& group, DType dtype, int64_t max_bytes, int repetitions = 5);

// What DDP calls at construction with bucket_cap_auto: measures the link, models the backward of
// these parameters (those requiring gradients, reverse registration order) and chooses. On a
// group of one nothing is measured and the given caps are returned.
BucketCapChoice autotune_bucket_cap(const std::vector<Tensor>& parameters, ProcessGroup& group,
                                    double first_bucket_cap_mb, double bucket_cap_mb, double backward_ms);

}  // namespace mg::parallel
