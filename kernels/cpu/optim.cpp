// Fused optimizer steps (CPU): SGD, Adam, AdamW, one loop per parameter.
//
// Each kernel is a single `for` over the parameter's elements; the body is the
// update rule from kernels/cpu/optim.h written for one scalar, with every
// coefficient hoisted out of the loop and rounded to the parameter's dtype T
// once. The loop bodies have no branches that depend on the data (nesterov,
// amsgrad and "first step" are loop-invariant and the compiler unswitches
// them), so GCC vectorises them at -O3. Large tensors are split across OpenMP
// threads in static chunks; each element is written by exactly one thread, so
// results do not depend on the thread count.
#include "kernels/cpu/optim.h"

#include <cmath>

namespace mg::kernels::cpu {

namespace {

// Below this many elements a parallel region costs more than it saves.
[[maybe_unused]] constexpr int64_t kOptimMinParallelWork = 1 << 16;

template <class T>
void sgd_loop(int64_t n, T* p, const T* g, T* buf, bool first_step, const SgdHyper& h) {
  const T wd = static_cast<T>(h.weight_decay);
  const T momentum = static_cast<T>(h.momentum);
  const T one_minus_dampening = static_cast<T>(1.0 - h.dampening);
  const T neg_lr = static_cast<T>(-h.lr);
  const bool use_momentum = h.momentum != 0.0;
  const bool use_wd = h.weight_decay != 0.0;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (n >= kOptimMinParallelWork)
#endif
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i];
    if (use_wd) d = d + wd * p[i];
    if (use_momentum) {
      const T b = first_step ? d : buf[i] * momentum + one_minus_dampening * d;
      buf[i] = b;
      d = h.nesterov ? d + momentum * b : b;
    }
    p[i] = p[i] + neg_lr * d;
  }
}

// Adam and AdamW share this loop; they differ only in where the decay goes:
// Adam adds l2 * p to the gradient, AdamW scales p by `decay` first.
template <class T>
void adam_loop(int64_t n, T* p, const T* g, T* m, T* v, T* vmax, const AdamHyper& h, double l2,
               double decay) {
  // Per-step scalars in double, like PyTorch computes them in Python.
  const double t = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  const T neg_step_size = static_cast<T>(-(h.lr / bias_correction1));
  const T bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  const T beta1 = static_cast<T>(h.beta1), one_minus_beta1 = static_cast<T>(1.0 - h.beta1);
  const T beta2 = static_cast<T>(h.beta2), one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
  const T eps = static_cast<T>(h.eps);
  const T l2_t = static_cast<T>(l2);
  const T decay_t = static_cast<T>(decay);
  const bool use_l2 = l2 != 0.0;
  const bool use_decay = decay != 1.0;
  const bool amsgrad = h.amsgrad;
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (n >= kOptimMinParallelWork)
#endif
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i];
    if (use_decay) pi = pi * decay_t;
    T gi = g[i];
    if (use_l2) gi = gi + l2_t * pi;
    const T mi = m[i] * beta1 + one_minus_beta1 * gi;
    T vi = v[i] * beta2 + one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    if (amsgrad) {
      const T old = vmax[i];
      // NaN-propagating max, as torch.maximum.
      vi = (old != old || old >= vi) ? old : vi;
      vmax[i] = vi;
    }
    const T denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
    p[i] = pi + neg_step_size * (mi / denom);
  }
}

template <class F>
void dispatch(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::f32: f(type_tag<float>{}); return;
    case DType::f64: f(type_tag<double>{}); return;
    default: break;
  }
  throw Error(str_cat(what, ": parameters must be f32 or f64, got ", dtype_name(dtype),
                      " (keep f32 master weights for mixed precision)"));
}

}  // namespace

void sgd_step(DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer, bool first_step,
              const SgdHyper& h) {
  MG_CHECK(h.momentum == 0.0 || momentum_buffer != nullptr, "sgd_step: momentum needs a momentum buffer");
  dispatch(dtype, "sgd_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    sgd_loop<T>(n, static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(momentum_buffer),
                first_step, h);
  });
}

void adam_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
               void* max_exp_avg_sq, const AdamHyper& h) {
  MG_CHECK(!h.amsgrad || max_exp_avg_sq != nullptr, "adam_step: amsgrad needs a max_exp_avg_sq buffer");
  MG_CHECK(h.step >= 1, "adam_step: step counts from 1, got ", h.step);
  dispatch(dtype, "adam_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    adam_loop<T>(n, static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(exp_avg),
                 static_cast<T*>(exp_avg_sq), static_cast<T*>(max_exp_avg_sq), h, h.weight_decay, 1.0);
  });
}

void adamw_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
                void* max_exp_avg_sq, const AdamHyper& h) {
  MG_CHECK(!h.amsgrad || max_exp_avg_sq != nullptr, "adamw_step: amsgrad needs a max_exp_avg_sq buffer");
  MG_CHECK(h.step >= 1, "adamw_step: step counts from 1, got ", h.step);
  dispatch(dtype, "adamw_step", [&](auto tag) {
    using T = typename decltype(tag)::type;
    adam_loop<T>(n, static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(exp_avg),
                 static_cast<T*>(exp_avg_sq), static_cast<T*>(max_exp_avg_sq), h, 0.0,
                 1.0 - h.lr * h.weight_decay);
  });
}

void sgd_step_multi(DType dtype, const std::vector<SgdTensor>& tensors, const SgdHyper& h) {
  for (const SgdTensor& t : tensors)
    sgd_step(dtype, t.n, t.param, t.grad, t.momentum_buffer, t.first_step, h);
}

void adam_step_multi(DType dtype, const std::vector<AdamTensor>& tensors, const AdamHyper& h) {
  for (const AdamTensor& t : tensors) {
    AdamHyper ht = h;
    ht.step = t.step;
    adam_step(dtype, t.n, t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq, ht);
  }
}

void adamw_step_multi(DType dtype, const std::vector<AdamTensor>& tensors, const AdamHyper& h) {
  for (const AdamTensor& t : tensors) {
    AdamHyper ht = h;
    ht.step = t.step;
    adamw_step(dtype, t.n, t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq, ht);
  }
}

}  // namespace mg::kernels::cpu
