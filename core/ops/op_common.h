// Small helpers every op file uses: output allocation, broadcasting views,
// dtype promotion, and shaping a gradient back to its input.
#pragma once

#include <vector>

#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/kernels.h"  // declarations only: no CUDA headers
#if defined(MG_HAS_CUDA)
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#endif

namespace mg::ops_detail {

// Contiguous output with the given shape/dtype on `like`'s device.
inline Tensor new_output(const Shape& shape, DType dtype, const Tensor& like) {
  return empty(shape, TensorOptions{dtype, like.device(), false});
}

// A kernel view of `t` broadcast to `shape` (stride 0 on broadcast dims), no autograd.
inline StridedView broadcast_view(const Tensor& t, const Shape& shape) {
  return t.detach().expand(shape).view_for_kernel();
}

// `t` converted to `dtype` (records ToBackward when needed); no-op when equal.
inline Tensor promote(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// Gradient `g` of a broadcast result, summed back to `input`'s shape and cast to its dtype.
inline Tensor grad_like(const Tensor& g, const autograd::TensorMeta& input) {
  Tensor r = sum_to(g, input.shape);
  return r.dtype() == input.dtype ? r : r.to(input.dtype);
}

inline autograd::TensorMeta meta_of(const Tensor& t) {
  return autograd::TensorMeta{t.shape(), t.dtype(), t.device()};
}

inline void check_defined(const char* op, const std::vector<Tensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i)
    MG_CHECK(tensors[i].defined(), op, ": argument ", i, " is an undefined tensor");
}

inline void check_floating(const char* op, const Tensor& t) {
  MG_CHECK(is_floating(t.dtype()), op, ": expected a floating tensor (f32, f64, f16, bf16), got ", t.dtype());
}

// MG_KERNEL(device, fn, args...) runs kernels::cpu::fn(args...) for a CPU device
// and kernels::cuda::fn(stream, args...) for a CUDA one, with that GPU made current
// and `stream` its current stream on this thread (the CUDA twin takes the same
// arguments after the stream; see kernels/cuda/kernels.h). MG_KERNEL_SCRATCH is the
// same for the CUDA kernels that also borrow scratch memory,
// kernels::cuda::fn(stream, scratch, args...), `scratch` being the caching allocator
// (core/cuda_scratch.h). Only for ops that have both kernels: the others call
// require_cpu, whose error names the op, so a CUDA tensor never falls back to the
// CPU silently.
#if defined(MG_HAS_CUDA)
#define MG_KERNEL(device, fn, ...)                                                            \
  ([&]() {                                                                                    \
    if ((device).is_cuda()) {                                                                 \
      ::mg::cuda::DeviceGuard mg_kernel_guard_((device).index);                               \
      return ::mg::kernels::cuda::fn(::mg::cuda::kernel_stream((device).index), __VA_ARGS__); \
    }                                                                                         \
    return ::mg::kernels::cpu::fn(__VA_ARGS__);                                               \
  }())
#define MG_KERNEL_SCRATCH(device, fn, ...)                                                          \
  ([&]() {                                                                                          \
    if ((device).is_cuda()) {                                                                       \
      ::mg::cuda::DeviceGuard mg_kernel_guard_((device).index);                                     \
      ::mg::cuda::DeviceScratch mg_kernel_scratch_((device).index);                                 \
      return ::mg::kernels::cuda::fn(::mg::cuda::kernel_stream((device).index), mg_kernel_scratch_, \
                                     __VA_ARGS__);                                                  \
    }                                                                                               \
    return ::mg::kernels::cpu::fn(__VA_ARGS__);                                                     \
  }())
#else
#define MG_KERNEL(device, fn, ...)                                                  \
  ([&]() {                                                                          \
    MG_CHECK((device).is_cpu(), #fn, ": ", (device),                                \
             " needs the CUDA backend, and this multigrad was built without CUDA"); \
    return ::mg::kernels::cpu::fn(__VA_ARGS__);                                     \
  }())
#define MG_KERNEL_SCRATCH MG_KERNEL
#endif

}  // namespace mg::ops_detail
