// Optimizer steps on the GPU: SGD (momentum, dampening, nesterov, weight decay),
// Adam and AdamW (amsgrad), one fused pass per parameter tensor. Update rules
// and their order of operations: kernels/cpu/optim.h.
//
// Decomposition. One thread per parameter element in a grid-stride loop; each
// thread reads p, g and the state of its element, computes the update in
// registers and writes p and the state back. Per-step scalars (bias
// corrections, step size) are computed once on the host in double and passed
// in, rounded to T, exactly as the CPU kernel does.
//
// Cost. Bytes per element (s = sizeof(T)): SGD 3s (no momentum) to 5s, Adam and
// AdamW 7s (9s with amsgrad); ~10 FLOPs and one sqrt per element: bandwidth
// bound. An f32 model of N parameters moves 28N bytes per Adam step: ~6 us
// per million parameters on an H200 at ~4.8 TB/s, plus ~4 us of launch per
// parameter tensor. That launch cost is why a multi-tensor version (one launch
// for a list of tensors) is the next step (issue 4); it is not written yet.
//
// Results match the CPU to rounding: nvcc contracts a*b + c into one FMA, which
// rounds once where the CPU rounds twice (~1 ulp per step).
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace mg::kernels::cuda {
namespace {

template <class T>
struct SgdScalars {
  T wd, momentum, one_minus_dampening, neg_lr;
  bool use_momentum, use_wd, nesterov, first_step;
};

template <class T>
__global__ void sgd_kernel(int64_t n, T* p, const T* g, T* buf, SgdScalars<T> k) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    T d = g[i];
    if (k.use_wd) d = d + k.wd * p[i];
    if (k.use_momentum) {
      const T b = k.first_step ? d : buf[i] * k.momentum + k.one_minus_dampening * d;
      buf[i] = b;
      d = k.nesterov ? d + k.momentum * b : b;
    }
    p[i] = p[i] + k.neg_lr * d;
  }
}

template <class T>
struct AdamScalars {
  T neg_step_size, bias_correction2_sqrt, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay;
  bool use_l2, use_decay, amsgrad;
};

template <class T>
__global__ void adam_kernel(int64_t n, T* p, const T* g, T* m, T* v, T* vmax, AdamScalars<T> k) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    T pi = p[i];
    if (k.use_decay) pi = pi * k.decay;
    T gi = g[i];
    if (k.use_l2) gi = gi + k.l2 * pi;
    const T mi = m[i] * k.beta1 + k.one_minus_beta1 * gi;
    T vi = v[i] * k.beta2 + k.one_minus_beta2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    if (k.amsgrad) {
      const T old = vmax[i];
      vi = (old != old || old >= vi) ? old : vi;  // NaN-propagating max, as torch.maximum
      vmax[i] = vi;
    }
    const T denom = sqrt(vi) / k.bias_correction2_sqrt + k.eps;
    p[i] = pi + k.neg_step_size * (mi / denom);
  }
}

template <class F>
void visit_param(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::f32: return f(tag<float>{});
    case DType::f64: return f(tag<double>{});
    default: break;
  }
  throw Error(str_cat(what, " (CUDA): parameters must be f32 or f64, got ", dtype_name(dtype),
                      " (keep f32 master weights for mixed precision)"));
}

void adam_common(const char* what, DType dtype, int64_t n, void* param, const void* grad, void* exp_avg,
                 void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h, double l2, double decay) {
  check(!h.amsgrad || max_exp_avg_sq != nullptr, what, ": amsgrad needs a max_exp_avg_sq buffer");
  check(h.step >= 1, what, ": step counts from 1, got ", h.step);
  if (n == 0) return;
  const double t = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  visit_param(dtype, what, [&](auto tg) {
    using T = typename decltype(tg)::type;
    AdamScalars<T> k;
    k.neg_step_size = static_cast<T>(-(h.lr / bias_correction1));
    k.bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
    k.beta1 = static_cast<T>(h.beta1);
    k.one_minus_beta1 = static_cast<T>(1.0 - h.beta1);
    k.beta2 = static_cast<T>(h.beta2);
    k.one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
    k.eps = static_cast<T>(h.eps);
    k.l2 = static_cast<T>(l2);
    k.decay = static_cast<T>(decay);
    k.use_l2 = l2 != 0.0;
    k.use_decay = decay != 1.0;
    k.amsgrad = h.amsgrad;
    adam_kernel<T><<<grid_for(n), kThreads, 0, mg::cuda::current_cuda_stream()>>>(
        n, static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(exp_avg),
        static_cast<T*>(exp_avg_sq), static_cast<T*>(max_exp_avg_sq), k);
  });
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace

void sgd_step(DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer, bool first_step,
              const SgdHyper& h) {
  check(h.momentum == 0.0 || momentum_buffer != nullptr, "sgd_step (CUDA): momentum needs a momentum buffer");
  if (n == 0) return;
  visit_param(dtype, "sgd_step", [&](auto tg) {
    using T = typename decltype(tg)::type;
    SgdScalars<T> k;
    k.wd = static_cast<T>(h.weight_decay);
    k.momentum = static_cast<T>(h.momentum);
    k.one_minus_dampening = static_cast<T>(1.0 - h.dampening);
    k.neg_lr = static_cast<T>(-h.lr);
    k.use_momentum = h.momentum != 0.0;
    k.use_wd = h.weight_decay != 0.0;
    k.nesterov = h.nesterov;
    k.first_step = first_step;
    sgd_kernel<T><<<grid_for(n), kThreads, 0, mg::cuda::current_cuda_stream()>>>(
        n, static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(momentum_buffer), k);
  });
  MG_CUDA_CHECK_LAUNCH();
}

void adam_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
               void* max_exp_avg_sq, const AdamHyper& h) {
  adam_common("adam_step", dtype, n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, h.weight_decay,
              1.0);
}

void adamw_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
                void* max_exp_avg_sq, const AdamHyper& h) {
  adam_common("adamw_step", dtype, n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, 0.0,
              1.0 - h.lr * h.weight_decay);
}

}  // namespace mg::kernels::cuda
