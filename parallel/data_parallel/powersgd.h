// PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019) as a DDP communication hook: each
// gradient matrix M (n x m: a tensor's first dimension by the rest) is sent as two thin factors,
// P (n x r) and Q (m x r), instead of n·m numbers -- one step of power iteration per training step:
//
//   P = M Q          all-reduce P (the sum over ranks: (Σ M_i) Q)     n·r numbers
//   P = orth(P)      Gram-Schmidt, the same on every rank
//   Q = Mᵀ P         all-reduce Q                                      m·r numbers
//   M ≈ P Qᵀ         = P Pᵀ Σ M_i: the rank-r projection of the averaged gradient
//
// Why it trains as well as the full all-reduce: error feedback. What the approximation dropped
// (each rank's residual e_i = M_i - P Q_iᵀ) is added to the next step's gradient, so nothing is
// lost, only delayed: summed over steps, the applied updates equal the true gradients' sum minus
// the residuals still held (Σ_t applied_t = Σ_t ḡ_t - Σ_i e_i, an identity the test checks).
// Warm start reuses the last Q, so the power iteration continues across steps and P converges to
// the dominant subspace; Q's first value is random from a fixed seed, the same on every rank.
//
// As in PyTorch's powerSGD_hook: the first start_powerSGD_iter steps are plain all-reduces (the
// early, fast-changing gradients; DDP also rebuilds its buckets then); 1-D tensors, and matrices
// where the factors would not be min_compression_rate times smaller, are packed and sent in one
// uncompressed all-reduce. Differences: residuals and Q are kept per parameter, so a bucket
// rebuild loses nothing; a rank's residual is its own compression error (PyTorch keeps M_i minus
// the *averaged* approximation: the same sum over ranks, so the same training, but a per-rank
// part that random-walks); Gram-Schmidt runs twice per column (numerically orthogonal even when
// M has lower rank than r). The P step waits for P's all-reduce in a continuation that runs when
// DDP waits for the bucket at the end of backward: the P all-reduces overlap backward, the Q
// all-reduces do not (on a GPU the host never blocks: the waits are the stream's).
#pragma once

#include <cstdint>
#include <map>

#include "parallel/data_parallel/comm_hooks.h"

namespace mg::parallel {

struct PowerSGDOptions {
  int64_t matrix_approximation_rank = 1;  // r (per matrix: min(r, n, m))
  int64_t start_powerSGD_iter = 1000;     // plain all-reduce for the steps before this one
  double min_compression_rate = 2.0;      // compress when n·m >= rate · (n + m)·r
  bool use_error_feedback = true;
  bool warm_start = true;
  double orthogonalization_epsilon = 1e-30;  // norms below it are not divided by (a zero column stays zero)
  uint64_t random_seed = 0;                  // Q's initial values (equal on every rank)
};

// What the compression did in the last step (counted when each bucket's hook runs).
struct PowerSGDStepStats {
  int64_t compressed_tensors = 0;
  int64_t uncompressed_tensors = 0;
  int64_t bytes_sent = 0;          // P + Q + the uncompressed all-reduce
  int64_t bytes_uncompressed = 0;  // what a plain all-reduce of the same buckets would send
};

class PowerSGDState {
 public:
  PowerSGDState(ProcessGroup group, PowerSGDOptions options = {});

  const PowerSGDOptions& options() const { return options_; }
  ProcessGroup& group() { return group_; }
  // Synchronised backward passes seen so far (counted at each pass's last bucket).
  int64_t iteration() const { return iteration_; }
  // This rank's residual for `parameter` (its shape; in gradient units already divided by the
  // world size), or an undefined tensor when it has none (never compressed, or no error feedback).
  Tensor residual_of(const Tensor& parameter) const;
  const PowerSGDStepStats& last_step() const { return last_step_; }

 private:
  friend BucketFuture powersgd_hook(PowerSGDState& state, GradBucket& bucket);
  struct Memory {
    Tensor residual;  // parameter-shaped as an n x m matrix
    Tensor q;         // m x r, the last step's Q (warm start)
  };
  ProcessGroup group_;
  PowerSGDOptions options_;
  int64_t iteration_ = 0;
  uint64_t random_draws_ = 0;             // Q initialisations so far (each draws from its own Philox offset)
  std::map<const void*, Memory> memory_;  // by parameter (its TensorImpl)
  PowerSGDStepStats last_step_, this_step_;
};

BucketFuture powersgd_hook(PowerSGDState& state, GradBucket& bucket);

}  // namespace mg::parallel
