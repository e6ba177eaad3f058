// Optimizer steps on the GPU: SGD (momentum, dampening, nesterov, weight decay),
// Adam and AdamW (amsgrad). Update rules and their order of operations:
// kernels/cpu/optim.h. Two entry points per rule, sharing one per-element
// update function (so their arithmetic is the same instructions):
//   *_step        one tensor, one launch;
//   *_step_multi  every tensor of a parameter group, one launch (what
//                 Optimizer::step uses on CUDA).
//
// Per-tensor decomposition. One thread per parameter element in a grid-stride
// loop; each thread reads p, g and the state of its element, computes the
// update in registers and writes p and the state back. Per-step scalars (bias
// corrections, step size) are computed once on the host in double and passed
// in, rounded to T, exactly as the CPU kernel does.
//
// Multi-tensor decomposition (the apex / PyTorch _foreach / llm.c idea). The
// host cuts every tensor of the list into chunks of kChunk elements and builds
// two small tables in one buffer:
//   tensors[t]  pointers to p, g and the state buffers of tensor t, its size,
//               and its own scalars (Adam's step size and bias correction
//               depend on the tensor's step count; SGD's first_step flag);
//   blocks[b]   (tensor t, chunk c): block b updates elements
//               [c * kChunk, min((c + 1) * kChunk, n_t)) of tensor t.
// One cudaMemcpyAsync puts the buffer on the device, then one launch of
// sum_t ceil(n_t / kChunk) blocks updates everything; a block looks up its row
// of `blocks` (8 bytes) and its tensor's row, then walks its chunk with a
// block-stride loop. Empty tensors get no blocks. The table costs 8 bytes per
// chunk plus ~64 bytes per tensor: noise next to the parameters themselves.
// A list of one tensor skips the table and takes the per-tensor launch.
//
// Cost. Bytes per element (s = sizeof(T)): SGD 3s (no momentum) to 5s, Adam and
// AdamW 7s (9s with amsgrad); ~10 FLOPs and one sqrt per element: bandwidth
// bound. An f32 model of N parameters moves 28N bytes per Adam step: ~6 us
// per million parameters on an H200 at ~4.8 TB/s. A kernel launch costs ~3-5 us
// of host time and leaves the GPU idle between small kernels, so per-tensor
// launches make a model with 200 parameter tensors (a small transformer: most
// are biases and norm weights of a few hundred elements) spend ~1 ms launching
// what the memory system does in ~0.1 ms (estimates from typical launch costs,
// not measured here). The multi-tensor launch makes that cost per step instead
// of per tensor (one copy of the table, one launch).
//
// Results equal the CPU's bit for bit (f32 and f64): the element functions
// round every operation explicitly (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn
// and their double twins). Plain a*b + c would be contracted by nvcc into one
// FMA (--fmad=true is the default), rounding once where the CPU rounds twice:
// ~1 ulp per step, which cancellation can blow up past a test's tolerance
// (e.g. m = beta1*m + (1-beta1)*g ~ 0 in a 1-element tensor), and which could
// even differ between two kernels inlining the same function. The CPU twin is
// built without contraction (ISO C++17, baseline x86-64), and IEEE division
// and square root are correctly rounded on both sides. The multi-tensor path
// uses the same element function on the same scalars, so it matches the
// per-tensor path bit for bit; tests/gpu/test_cuda_optim_multi.cpp checks that,
// but has not run on a GPU yet.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

// ---- the per-element updates (shared by both launch shapes) ----

template <class T>
struct SgdScalars {
  T wd, momentum, one_minus_dampening, neg_lr;
  bool use_momentum, use_wd, nesterov;
};

// Correctly rounded operations that nvcc never fuses into an FMA (see the top of
// this file): the update rules below are the CPU's expressions, one rounding each.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

template <class T>
__device__ __forceinline__ void sgd_element(int64_t i, T* p, const T* g, T* buf, bool first_step,
                                            const SgdScalars<T>& k) {
  T d = g[i];
  if (k.use_wd) d = add_rn(d, mul_rn(k.wd, p[i]));  // d + wd * p
  if (k.use_momentum) {
    // buf * momentum + (1 - dampening) * d
    const T b = first_step ? d : add_rn(mul_rn(buf[i], k.momentum), mul_rn(k.one_minus_dampening, d));
    buf[i] = b;
    d = k.nesterov ? add_rn(d, mul_rn(k.momentum, b)) : b;  // d + momentum * b
  }
  p[i] = add_rn(p[i], mul_rn(k.neg_lr, d));  // p + (-lr) * d
}

// Scalars shared by every tensor of a group; the two that depend on the step
// count are per tensor (AdamStepScalars).
template <class T>
struct AdamScalars {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay;
  bool use_l2, use_decay, amsgrad;
};
template <class T>
struct AdamStepScalars {
  T neg_step_size, bias_correction2_sqrt;
};

template <class T>
__device__ __forceinline__ void adam_element(int64_t i, T* p, const T* g, T* m, T* v, T* vmax,
                                             const AdamScalars<T>& k, AdamStepScalars<T> s) {
  T pi = p[i];
  if (k.use_decay) pi = mul_rn(pi, k.decay);
  T gi = g[i];
  if (k.use_l2) gi = add_rn(gi, mul_rn(k.l2, pi));                                  // g + l2 * p
  const T mi = add_rn(mul_rn(m[i], k.beta1), mul_rn(k.one_minus_beta1, gi));        // m*b1 + (1-b1)*g
  T vi = add_rn(mul_rn(v[i], k.beta2), mul_rn(k.one_minus_beta2, mul_rn(gi, gi)));  // v*b2 + (1-b2)*g*g
  m[i] = mi;
  v[i] = vi;
  if (k.amsgrad) {
    const T old = vmax[i];
    vi = (old != old || old >= vi) ? old : vi;  // NaN-propagating max, as torch.maximum
    vmax[i] = vi;
  }
  const T denom = add_rn(div_rn(sqrt_rn(vi), s.bias_correction2_sqrt), k.eps);  // sqrt(v)/bc2 + eps
  p[i] = add_rn(pi, mul_rn(s.neg_step_size, div_rn(mi, denom)));                // p + (-step) * (m/denom)
}

// ---- one tensor ----

template <class T>
__global__ void sgd_kernel(int64_t n, T* p, const T* g, T* buf, bool first_step, SgdScalars<T> k) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    sgd_element(i, p, g, buf, first_step, k);
}

template <class T>
__global__ void adam_kernel(int64_t n, T* p, const T* g, T* m, T* v, T* vmax, AdamScalars<T> k,
                            AdamStepScalars<T> s) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    adam_element(i, p, g, m, v, vmax, k, s);
}

// ---- many tensors: the tables (see the top of this file) ----

constexpr int64_t kChunk = 16384;  // elements per block: 64 per thread at 256 threads

template <class T>
struct SgdTensorRow {
  T* p;
  const T* g;
  T* buf;
  int64_t n;
  bool first_step;
};
template <class T>
struct AdamTensorRow {
  T* p;
  const T* g;
  T* m;
  T* v;
  T* vmax;
  int64_t n;
  AdamStepScalars<T> s;
};
struct BlockRow {
  int32_t tensor;
  int32_t chunk;
};

template <class T>
__global__ void sgd_multi_kernel(const SgdTensorRow<T>* tensors, const BlockRow* blocks, SgdScalars<T> k) {
  const BlockRow b = blocks[blockIdx.x];
  const SgdTensorRow<T> t = tensors[b.tensor];
  const int64_t begin = int64_t(b.chunk) * kChunk;
  const int64_t end = min(begin + kChunk, t.n);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    sgd_element(i, t.p, t.g, t.buf, t.first_step, k);
}

template <class T>
__global__ void adam_multi_kernel(const AdamTensorRow<T>* tensors, const BlockRow* blocks, AdamScalars<T> k) {
  const BlockRow b = blocks[blockIdx.x];
  const AdamTensorRow<T> t = tensors[b.tensor];
  const int64_t begin = int64_t(b.chunk) * kChunk;
  const int64_t end = min(begin + kChunk, t.n);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    adam_element(i, t.p, t.g, t.m, t.v, t.vmax, k, t.s);
}

// Puts `rows` (one per tensor) and the block table for `sizes` into one device
// buffer borrowed from `scratch`, launches `launch(tensors, blocks,
// number_of_blocks)` on `stream`, and hands the buffer back. Scratch is reused
// in stream order, so giving it back right after the launch is safe: later work
// on this stream that gets the buffer runs after the kernel.
template <class Row, class Launch>
void launch_multi(cudaStream_t stream, ScratchAllocator& scratch, const char* what,
                  const std::vector<Row>& rows, const std::vector<int64_t>& sizes, Launch&& launch) {
  std::vector<BlockRow> blocks;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t chunks = (sizes[t] + kChunk - 1) / kChunk;
    check(chunks <= INT32_MAX && t <= INT32_MAX, what, " (CUDA): tensor ", t, " has ", sizes[t],
          " elements, more than the block table can address (", int64_t(INT32_MAX) * kChunk, ")");
    for (int64_t c = 0; c < chunks; ++c) blocks.push_back(BlockRow{int32_t(t), int32_t(c)});
  }
  if (blocks.empty()) return;  // every tensor is empty
  check(blocks.size() <= size_t(INT32_MAX), what, " (CUDA): ", blocks.size(),
        " blocks exceed the grid limit ", INT32_MAX);
  // One host buffer [rows | blocks] (rows first: their alignment is the larger),
  // copied with one cudaMemcpyAsync. From pageable memory the copy returns once
  // the bytes are staged, so `host` may go out of scope right after.
  const size_t row_bytes = rows.size() * sizeof(Row), block_bytes = blocks.size() * sizeof(BlockRow);
  std::vector<unsigned char> host(row_bytes + block_bytes);
  std::memcpy(host.data(), rows.data(), row_bytes);
  std::memcpy(host.data() + row_bytes, blocks.data(), block_bytes);
  Workspace table(scratch, host.size());
  MG_CUDA_CHECK(cudaMemcpyAsync(table.get(), host.data(), host.size(), cudaMemcpyHostToDevice, stream));
  const auto* device_rows = static_cast<const Row*>(table.get());
  const auto* device_blocks =
      reinterpret_cast<const BlockRow*>(static_cast<unsigned char*>(table.get()) + row_bytes);
  launch(device_rows, device_blocks, static_cast<unsigned>(blocks.size()));
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

template <class T>
SgdScalars<T> sgd_scalars(const SgdHyper& h) {
  SgdScalars<T> k;
  k.wd = static_cast<T>(h.weight_decay);
  k.momentum = static_cast<T>(h.momentum);
  k.one_minus_dampening = static_cast<T>(1.0 - h.dampening);
  k.neg_lr = static_cast<T>(-h.lr);
  k.use_momentum = h.momentum != 0.0;
  k.use_wd = h.weight_decay != 0.0;
  k.nesterov = h.nesterov;
  return k;
}

// Adam uses l2 = weight_decay, decay = 1; AdamW l2 = 0, decay = 1 - lr * weight_decay.
template <class T>
AdamScalars<T> adam_scalars(const AdamHyper& h, double l2, double decay) {
  AdamScalars<T> k;
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
  return k;
}

// The bias-corrected step size and sqrt(1 - beta2^t), in double, rounded to T.
template <class T>
AdamStepScalars<T> adam_step_scalars(const AdamHyper& h, int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  return {static_cast<T>(-(h.lr / bias_correction1)), static_cast<T>(std::sqrt(bias_correction2))};
}

void check_adam_tensor(const char* what, const AdamHyper& h, int64_t step, const void* max_exp_avg_sq,
                       size_t index) {
  check(!h.amsgrad || max_exp_avg_sq != nullptr, what, ": amsgrad needs a max_exp_avg_sq buffer (tensor ",
        index, ")");
  check(step >= 1, what, ": step counts from 1, got ", step, " (tensor ", index, ")");
}

void adam_common(cudaStream_t stream, const char* what, DType dtype, int64_t n, void* param, const void* grad,
                 void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h, double l2,
                 double decay) {
  check_adam_tensor(what, h, h.step, max_exp_avg_sq, 0);
  if (n == 0) return;
  visit_param(dtype, what, [&](auto tg) {
    using T = typename decltype(tg)::type;
    launch_kernel<adam_kernel<T>>(grid_for(n), kThreads, 0, stream, n, static_cast<T*>(param),
                                  static_cast<const T*>(grad), static_cast<T*>(exp_avg),
                                  static_cast<T*>(exp_avg_sq), static_cast<T*>(max_exp_avg_sq),
                                  adam_scalars<T>(h, l2, decay), adam_step_scalars<T>(h, h.step));
  });
}

void adam_multi_common(cudaStream_t stream, ScratchAllocator& scratch, const char* what, DType dtype,
                       const std::vector<AdamTensor>& tensors, const AdamHyper& h, double l2, double decay) {
  for (size_t t = 0; t < tensors.size(); ++t)
    check_adam_tensor(what, h, tensors[t].step, tensors[t].max_exp_avg_sq, t);
  if (tensors.size() == 1) {  // no table to build: the per-tensor launch
    const AdamTensor& t = tensors.front();
    AdamHyper ht = h;
    ht.step = t.step;
    return adam_common(stream, what, dtype, t.n, t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq,
                       ht, l2, decay);
  }
  visit_param(dtype, what, [&](auto tg) {
    using T = typename decltype(tg)::type;
    std::vector<AdamTensorRow<T>> rows;
    std::vector<int64_t> sizes;
    for (const AdamTensor& t : tensors) {
      rows.push_back(AdamTensorRow<T>{static_cast<T*>(t.param), static_cast<const T*>(t.grad),
                                      static_cast<T*>(t.exp_avg), static_cast<T*>(t.exp_avg_sq),
                                      static_cast<T*>(t.max_exp_avg_sq), t.n,
                                      adam_step_scalars<T>(h, t.step)});
      sizes.push_back(t.n);
    }
    const AdamScalars<T> k = adam_scalars<T>(h, l2, decay);
    launch_multi(stream, scratch, what, rows, sizes,
                 [&](const AdamTensorRow<T>* r, const BlockRow* b, unsigned grid) {
                   launch_kernel<adam_multi_kernel<T>>(grid, kThreads, 0, stream, r, b, k);
                 });
  });
}

}  // namespace

void sgd_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad,
              void* momentum_buffer, bool first_step, const SgdHyper& h) {
  check(h.momentum == 0.0 || momentum_buffer != nullptr, "sgd_step (CUDA): momentum needs a momentum buffer");
  if (n == 0) return;
  visit_param(dtype, "sgd_step", [&](auto tg) {
    using T = typename decltype(tg)::type;
    launch_kernel<sgd_kernel<T>>(grid_for(n), kThreads, 0, stream, n, static_cast<T*>(param),
                                 static_cast<const T*>(grad), static_cast<T*>(momentum_buffer), first_step,
                                 sgd_scalars<T>(h));
  });
}

void adam_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* exp_avg,
               void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h) {
  adam_common(stream, "adam_step", dtype, n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h,
              h.weight_decay, 1.0);
}

void adamw_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* exp_avg,
                void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h) {
  adam_common(stream, "adamw_step", dtype, n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, 0.0,
              1.0 - h.lr * h.weight_decay);
}

void sgd_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                    const std::vector<SgdTensor>& tensors, const SgdHyper& h) {
  for (size_t t = 0; t < tensors.size(); ++t)
    check(h.momentum == 0.0 || tensors[t].momentum_buffer != nullptr,
          "sgd_step_multi (CUDA): momentum needs a momentum buffer (tensor ", t, ")");
  if (tensors.size() == 1) {  // no table to build: the per-tensor launch
    const SgdTensor& t = tensors.front();
    // Qualified: SgdHyper would make argument-dependent lookup find cpu::sgd_step as well.
    return cuda::sgd_step(stream, dtype, t.n, t.param, t.grad, t.momentum_buffer, t.first_step, h);
  }
  visit_param(dtype, "sgd_step_multi", [&](auto tg) {
    using T = typename decltype(tg)::type;
    std::vector<SgdTensorRow<T>> rows;
    std::vector<int64_t> sizes;
    for (const SgdTensor& t : tensors) {
      rows.push_back(SgdTensorRow<T>{static_cast<T*>(t.param), static_cast<const T*>(t.grad),
                                     static_cast<T*>(t.momentum_buffer), t.n, t.first_step});
      sizes.push_back(t.n);
    }
    const SgdScalars<T> k = sgd_scalars<T>(h);
    launch_multi(stream, scratch, "sgd_step_multi", rows, sizes,
                 [&](const SgdTensorRow<T>* r, const BlockRow* b, unsigned grid) {
                   launch_kernel<sgd_multi_kernel<T>>(grid, kThreads, 0, stream, r, b, k);
                 });
  });
}

void adam_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                     const std::vector<AdamTensor>& tensors, const AdamHyper& h) {
  adam_multi_common(stream, scratch, "adam_step_multi", dtype, tensors, h, h.weight_decay, 1.0);
}

void adamw_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                      const std::vector<AdamTensor>& tensors, const AdamHyper& h) {
  adam_multi_common(stream, scratch, "adamw_step_multi", dtype, tensors, h, 0.0, 1.0 - h.lr * h.weight_decay);
}

}  // namespace mg::kernels::cuda
