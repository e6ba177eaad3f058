// Optimizer update rules on the CPU: one fused pass per parameter tensor.
//
// Each function walks the n elements of ONE parameter once, reading the
// parameter p, its gradient g and the optimizer state for that element, and
// writing the new p and state back in the same iteration. Composing the update
// from tensor ops (as PyTorch's for-loop path does) would instead make ~5-10
// passes, each with its own temporaries; here nothing is allocated and each
// element is touched once, so the kernel runs at memory bandwidth.
//
// Bytes moved per parameter element (s = sizeof(T): 4 for f32, 8 for f64):
//   sgd_step   momentum == 0: read p, g; write p                       3s
//              momentum != 0: read p, g, buf; write p, buf             5s
//              (the first step with momentum reads no buf: buf = d_p)  4s
//   adam_step  read p, g, m, v; write p, m, v                          7s
//              amsgrad: also read and write v_max                      9s
//   adamw_step the same as adam_step (decay is folded into the pass)   7s / 9s
// FLOPs are ~5-15 per element, far below what the bytes take, so these are
// bandwidth-bound; the optimizer step of an f32 model with N parameters moves
// 28N bytes with Adam.
//
// Arithmetic runs in the parameter's dtype T with the hyperparameters rounded to
// T, in the same order of operations as PyTorch 1.13's single-tensor path, so
// f64 results agree to rounding and f32 results to ~1e-6 relative. Per-step
// scalars (bias corrections, step size) are computed once in double by the
// caller-facing wrapper, as PyTorch does in Python.
//
// dtypes: f32 and f64 (mixed-precision training keeps f32 master weights; the
// kernels refuse f16/bf16 with an error). All buffers are contiguous, n
// elements, same dtype; p and the state buffers are updated in place, g is
// read only. Elements are independent, so large tensors are split across
// OpenMP threads with bitwise-deterministic results.
#pragma once

#include <cstdint>
#include <vector>

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// PyTorch's SGD:
//   d = g + weight_decay * p
//   if momentum != 0:
//     buf = first_step ? d : momentum * buf + (1 - dampening) * d
//     d   = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// momentum_buffer may be nullptr when momentum == 0. With first_step it is
// written (initialised to d), never read.
void sgd_step(DType dtype, int64_t n, void* param, const void* grad, void* momentum_buffer, bool first_step,
              const SgdHyper& h);

// Adam (L2 penalty added to the gradient):
//   g' = g + weight_decay * p
//   m  = beta1 * m + (1 - beta1) * g'
//   v  = beta2 * v + (1 - beta2) * g'^2
//   v_max = max(v_max, v)                   (amsgrad; v_max then replaces v below)
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// max_exp_avg_sq may be nullptr unless amsgrad.
void adam_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
               void* max_exp_avg_sq, const AdamHyper& h);

// AdamW (decoupled weight decay, Loshchilov & Hutter): first p *= 1 - lr * weight_decay,
// then the Adam update above with no decay term in the gradient.
void adamw_step(DType dtype, int64_t n, void* param, const void* grad, void* exp_avg, void* exp_avg_sq,
                void* max_exp_avg_sq, const AdamHyper& h);

// ---- multi-tensor steps: every parameter of a group (same dtype, same device) at once ----
// The same update as the single-tensor functions above, applied to a list of
// tensors. On the CPU this is a loop over the list (a call costs nothing, so
// there is nothing to fuse); on CUDA it is one kernel launch for the whole list
// (kernels/cuda/optim.cu). The optimizer calls these, so both devices take the
// same path. Per-tensor fields are what can differ between the tensors of one
// group: SGD's first_step (a parameter that got its first gradient later) and
// Adam's step count (likewise).
void sgd_step_multi(DType dtype, const std::vector<SgdTensor>& tensors, const SgdHyper& h);
void adam_step_multi(DType dtype, const std::vector<AdamTensor>& tensors, const AdamHyper& h);
void adamw_step_multi(DType dtype, const std::vector<AdamTensor>& tensors, const AdamHyper& h);

}  // namespace mg::kernels::cpu
