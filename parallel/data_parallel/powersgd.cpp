// PowerSGD communication hook: rank-r compression with error feedback and warm start (see
// powersgd.h for the algorithm and how it differs from PyTorch's).
#include "parallel/data_parallel/powersgd.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/random.h"

namespace mg::parallel {

namespace {

// The columns of x (n x r) made orthonormal by Gram-Schmidt. Each column is projected off the
// previous ones twice ("twice is enough": once leaves rounding-sized components along them). A
// column that (nearly) lay in their span -- x of rank below r, as when M has fewer independent
// rows or columns than r -- is set to zero rather than normalised: what is left of it is rounding
// noise, which cannot leave that span (zero rows of M stay zero), so normalising it would repeat
// a direction and P Pᵀ would no longer be a projection. Zero columns add nothing to P Qᵀ.
// All on the device: no host synchronisation.
void orthogonalize(const Tensor& x, double epsilon) {
  const double dependent = x.dtype() == DType::f64 ? 1e-10 : 1e-4;  // relative norm left = dependent
  const int64_t r = x.size(1);
  for (int64_t i = 0; i < r; ++i) {
    Tensor column = x.narrow(1, i, 1);
    Tensor before = (column * column).sum().sqrt();
    for (int pass = 0; pass < (i > 0 ? 2 : 0); ++pass) {
      for (int64_t j = 0; j < i; ++j) {
        Tensor done = x.narrow(1, j, 1);
        column.sub_(done * (column * done).sum());
      }
    }
    Tensor after = (column * column).sum().sqrt();
    Tensor independent = gt(after, before * dependent);
    column.mul_(where(independent, reciprocal(maximum(after, epsilon)), zeros_like(after)));
  }
}

// One compressed member of a bucket.
struct Matrix {
  Tensor m;  // n x m view of the member's slot in the bucket
  Tensor p;  // n x r view into the P buffer
  Tensor q;  // m x r view into the Q buffer
  Tensor* residual;
  Tensor* warm_q;
};

// What the continuations of one bucket's hook share.
struct BucketWork {
  Tensor buffer;
  std::vector<Matrix> matrices;
  std::vector<Tensor> plain_slots;  // the members sent uncompressed
  Tensor plain_packed;              // ...packed into one tensor
  Tensor ps, qs;
};

}  // namespace

PowerSGDState::PowerSGDState(ProcessGroup group, PowerSGDOptions options)
    : group_(std::move(group)), options_(options) {
  MG_CHECK(group_.defined(), "PowerSGDState: the process group is undefined");
  MG_CHECK(options_.matrix_approximation_rank >= 1,
           "PowerSGDState: matrix_approximation_rank must be >= 1, got ", options_.matrix_approximation_rank);
  MG_CHECK(options_.start_powerSGD_iter >= 0, "PowerSGDState: start_powerSGD_iter must be >= 0, got ",
           options_.start_powerSGD_iter);
  MG_CHECK(options_.min_compression_rate >= 0, "PowerSGDState: min_compression_rate must be >= 0, got ",
           options_.min_compression_rate);
  MG_CHECK(options_.orthogonalization_epsilon >= 0, "PowerSGDState: orthogonalization_epsilon must be >= 0");
}

Tensor PowerSGDState::residual_of(const Tensor& parameter) const {
  auto it = memory_.find(parameter.impl());
  if (it == memory_.end() || !it->second.residual.defined()) return Tensor();
  return it->second.residual.view(parameter.shape());
}

BucketFuture powersgd_hook(PowerSGDState& state, GradBucket& bucket) {
  const PowerSGDOptions& options = state.options_;
  ProcessGroup& group = state.group_;
  if (bucket.index == 0) state.this_step_ = PowerSGDStepStats{};
  PowerSGDStepStats& stats = state.this_step_;
  const int64_t members = static_cast<int64_t>(bucket.parameters.size());
  stats.bytes_uncompressed += static_cast<int64_t>(bucket.buffer.nbytes());
  auto end_of_hook = [&state, &bucket] {
    if (!bucket.is_last) return;
    ++state.iteration_;
    state.last_step_ = state.this_step_;
  };
  const DType dtype = bucket.buffer.dtype();
  if (state.iteration_ < options.start_powerSGD_iter || (dtype != DType::f32 && dtype != DType::f64)) {
    stats.uncompressed_tensors += members;
    stats.bytes_sent += static_cast<int64_t>(bucket.buffer.nbytes());
    end_of_hook();
    return allreduce_hook(group, bucket);
  }

  NoGradGuard no_grad;
  auto work = std::make_shared<BucketWork>();
  work->buffer = bucket.buffer;
  work->buffer.mul_(1.0 / group.size());  // the sums of P and Q are then those of the averaged M

  // Which members are compressed, and where their factors go in the P and Q buffers.
  struct Plan {
    size_t member;
    int64_t rows, cols, rank;
  };
  std::vector<Plan> plans;
  int64_t p_total = 0, q_total = 0;
  for (size_t i = 0; i < bucket.parameters.size(); ++i) {
    const Tensor& param = bucket.parameters[i];
    const int64_t rows = param.dim() >= 2 ? param.size(0) : 0;
    const int64_t cols = rows > 0 ? param.numel() / rows : 0;
    const int64_t rank = std::min({options.matrix_approximation_rank, rows, cols});
    const bool pays = rows > 0 && cols > 0 &&
                      static_cast<double>(rows * cols) >=
                          options.min_compression_rate * static_cast<double>((rows + cols) * rank);
    if (param.dim() < 2 || !pays) {
      work->plain_slots.push_back(bucket.buffer.narrow(0, bucket.offsets[i], param.numel()));
      continue;
    }
    plans.push_back({i, rows, cols, rank});
    p_total += rows * rank;
    q_total += cols * rank;
  }
  stats.compressed_tensors += static_cast<int64_t>(plans.size());
  stats.uncompressed_tensors += static_cast<int64_t>(work->plain_slots.size());
  if (plans.empty()) {  // nothing worth compressing: the plain all-reduce of the (divided) bucket
    stats.bytes_sent += static_cast<int64_t>(bucket.buffer.nbytes());
    end_of_hook();
    return allreduce_future(group, work->buffer);
  }

  const TensorOptions factor_options{dtype, bucket.buffer.device()};
  work->ps = empty({p_total}, factor_options);
  work->qs = empty({q_total}, factor_options);
  int64_t p_offset = 0, q_offset = 0;
  for (const Plan& plan : plans) {
    const Tensor& param = bucket.parameters[plan.member];
    PowerSGDState::Memory& memory = state.memory_[param.impl()];
    Matrix matrix;
    matrix.m =
        bucket.buffer.narrow(0, bucket.offsets[plan.member], param.numel()).view({plan.rows, plan.cols});
    matrix.p = work->ps.narrow(0, p_offset, plan.rows * plan.rank).view({plan.rows, plan.rank});
    matrix.q = work->qs.narrow(0, q_offset, plan.cols * plan.rank).view({plan.cols, plan.rank});
    p_offset += plan.rows * plan.rank;
    q_offset += plan.cols * plan.rank;
    matrix.residual = options.use_error_feedback ? &memory.residual : nullptr;
    matrix.warm_q = options.warm_start ? &memory.q : nullptr;
    // Error feedback: what earlier steps' approximations dropped is sent now.
    if (matrix.residual && matrix.residual->defined() && matrix.residual->shape() == matrix.m.shape())
      matrix.m.add_(*matrix.residual);
    if (matrix.warm_q && matrix.warm_q->defined() && matrix.warm_q->shape() == matrix.q.shape()) {
      // Last step's Q, with 1% of a random one added before orthonormalising: the power iteration
      // goes on in nearly the same subspace, but a Q that lost rank (last step's M had rank below
      // r, or was zero) gets its missing directions back instead of keeping them lost for good.
      GeneratorReplayGuard same_everywhere(GeneratorState{options.random_seed, state.random_draws_++});
      Tensor jitter = randn({plan.cols, plan.rank}, factor_options);
      Tensor size = (*matrix.warm_q * *matrix.warm_q).sum().sqrt();
      Tensor scale =
          where(gt(size, 0.0), size * (0.01 / std::sqrt(static_cast<double>(plan.cols * plan.rank))),
                ones_like(size));
      matrix.q.copy_(*matrix.warm_q + jitter * scale);
      orthogonalize(matrix.q, options.orthogonalization_epsilon);
    } else {
      // The same random start on every rank: a fixed seed, and a Philox offset counting the draws.
      GeneratorReplayGuard same_everywhere(GeneratorState{options.random_seed, state.random_draws_++});
      matrix.q.copy_(randn({plan.cols, plan.rank}, factor_options));
      orthogonalize(matrix.q, options.orthogonalization_epsilon);
    }
    matrix.p.copy_(matrix.m.matmul(matrix.q));
    work->matrices.push_back(matrix);
  }

  // The uncompressed members, packed: one all-reduce for all of them.
  std::vector<WorkPtr> launched;
  int64_t bytes = 0;
  if (!work->plain_slots.empty()) {
    int64_t total = 0;
    for (const Tensor& slot : work->plain_slots) total += slot.numel();
    work->plain_packed = empty({total}, factor_options);
    int64_t offset = 0;
    for (const Tensor& slot : work->plain_slots) {
      work->plain_packed.narrow(0, offset, slot.numel()).copy_(slot);
      offset += slot.numel();
    }
    launched.push_back(group.allreduce(work->plain_packed, ReduceOp::Sum));
    bytes += static_cast<int64_t>(work->plain_packed.nbytes());
  }
  launched.push_back(group.allreduce(work->ps, ReduceOp::Sum));
  bytes += static_cast<int64_t>(work->ps.nbytes());
  stats.bytes_sent += bytes + static_cast<int64_t>(work->qs.nbytes());
  end_of_hook();

  const double epsilon = options.orthogonalization_epsilon;
  BucketFuture future = BucketFuture::after(std::move(launched), work->buffer, bytes);
  // After P's all-reduce: orthogonalise P, compute this rank's Q, keep its residual, send Q.
  future.then([work, group, epsilon](const Tensor&) mutable {
    int64_t offset = 0;
    for (Tensor& slot : work->plain_slots) {
      slot.copy_(work->plain_packed.narrow(0, offset, slot.numel()));
      offset += slot.numel();
    }
    for (Matrix& matrix : work->matrices) {
      orthogonalize(matrix.p, epsilon);
      matrix.q.copy_(matrix.m.t().matmul(matrix.p));
      if (matrix.residual) {
        Tensor residual = matrix.m - matrix.p.matmul(matrix.q.t());  // this rank's compression error
        if (matrix.residual->defined() && matrix.residual->shape() == residual.shape())
          matrix.residual->copy_(residual);
        else
          *matrix.residual = residual;
      }
    }
    return allreduce_future(group, work->qs);
  });
  // After Q's all-reduce: the approximation P Qᵀ into the bucket; Q kept for the warm start.
  future.then([work](const Tensor&) {
    for (Matrix& matrix : work->matrices) {
      matrix.m.copy_(matrix.p.matmul(matrix.q.t()));
      if (matrix.warm_q) {
        if (matrix.warm_q->defined() && matrix.warm_q->shape() == matrix.q.shape())
          matrix.warm_q->copy_(matrix.q);
        else
          *matrix.warm_q = matrix.q.clone();
      }
    }
    return BucketFuture::ready(work->buffer);
  });
  return future;
}

}  // namespace mg::parallel
