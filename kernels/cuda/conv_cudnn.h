// Conv2d through cuDNN, and the switch between it and im2col + GEMM.
//
// Two ways to run a CUDA conv2d live side by side:
//   cudnn   cuDNN's forward, backward-data and backward-filter (kernels/cuda/conv_cudnn.cu).
//           The default when this build has cuDNN.
//   im2col  im2col/col2im (kernels/cuda/conv.cu) around cuBLAS GEMMs, assembled in
//           core/ops/conv_ops.cpp: the readable version, and the fallback.
// Pick one with set_conv_backend() or MG_CUDA_CONV=cudnn|im2col in the environment (read at
// the first conv). core/ops/conv_ops.cpp asks conv_backend() at each forward and uses the same
// backend for that call's backward. cuDNN covers f32, f16 and bf16 tensors whose sizes fit its
// 32-bit indexing (cudnn_conv2d_supported); anything else (f64 gradient checks, huge tensors)
// takes im2col whatever the setting.
//
// Numerics. f32 runs with CUDNN_FMA_MATH: plain float FMAs, no TF32 tensor cores (which would
// round the inputs to 10 mantissa bits and no longer match the CPU). f16/bf16 may use tensor
// cores; they accumulate in float (cuDNN's "pseudo half" configurations) and round once.
//
// Algorithms. For each problem (sizes, dtype, device, direction) cuDNN's heuristics
// (cudnnGet*Algorithm_v7) rank its algorithms once; the ranking is cached under a mutex and
// every later call with the same problem reuses it. The first algorithm whose workspace can
// be allocated runs. Workspaces come from the caller's ScratchAllocator (kernels/cuda/stream.h;
// the op layer passes the caching allocator), so a steady-state training step calls cudaMalloc for
// them never.
//
// Like the other kernels these see raw device pointers of contiguous NCHW tensors, run on the
// stream they are given on the runtime's current device (the op layer picks both), and throw
// mg::Error with the call site and cuDNN's own message when cuDNN fails. No CUDA or cuDNN headers here.
#pragma once

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "kernels/cuda/stream.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cuda {

// ---- selection ---------------------------------------------------------------------------------

enum class ConvBackend { cudnn, im2col };

const char* conv_backend_name(ConvBackend backend);  // "cudnn", "im2col"
// "cudnn" or "im2col"; anything else throws mg::Error listing the choices.
ConvBackend parse_conv_backend(const std::string& name);

// Whether this build has cuDNN (MG_HAS_CUDNN).
bool built_with_cudnn();

// The backend CUDA conv2d uses now. Until set_conv_backend() is called: MG_CUDA_CONV if set
// (read once; an unknown value, or cudnn in a build without cuDNN, throws), else cudnn when
// built with it, else im2col.
ConvBackend conv_backend();
// Process-wide. ConvBackend::cudnn in a build without cuDNN throws mg::Error.
void set_conv_backend(ConvBackend backend);

// Sets the backend for a scope and restores the previous one.
class ConvBackendGuard {
 public:
  explicit ConvBackendGuard(ConvBackend backend) : previous_(conv_backend()) { set_conv_backend(backend); }
  ~ConvBackendGuard() { set_conv_backend(previous_); }
  ConvBackendGuard(const ConvBackendGuard&) = delete;
  ConvBackendGuard& operator=(const ConvBackendGuard&) = delete;

 private:
  ConvBackend previous_;
};

// ---- the cuDNN convolution ---------------------------------------------------------------------
// Shapes: x [batch, g.channels, g.height, g.width], w [out_channels, g.channels, kh, kw],
// y and dy [batch, out_channels, g.out_h(), g.out_w()], bias [out_channels]; all contiguous.

// True when the cuDNN path can take this problem: a build with cuDNN, dtype f32/f16/bf16, and
// every tensor under 2^31 elements with every size under 2^31.
bool cudnn_conv2d_supported(const Conv2dGeometry& g, int64_t batch, int64_t out_channels, DType dtype);

// y = conv2d(x, w) (+ bias broadcast over [batch, ., OH, OW] when bias != nullptr). Overwrites y.
void cudnn_conv2d_forward(cudaStream_t stream, ScratchAllocator& scratch, const Conv2dGeometry& g,
                          DType dtype, int64_t batch, int64_t out_channels, const void* x, const void* w,
                          const void* bias, void* y);
// dx = the gradient of conv2d with respect to x, given dy. Overwrites dx (it is not read).
void cudnn_conv2d_backward_data(cudaStream_t stream, ScratchAllocator& scratch, const Conv2dGeometry& g,
                                DType dtype, int64_t batch, int64_t out_channels, const void* dy,
                                const void* w, void* dx);
// dw = (accumulate ? dw : 0) + the gradient of conv2d with respect to w, given x and dy.
void cudnn_conv2d_backward_filter(cudaStream_t stream, ScratchAllocator& scratch, const Conv2dGeometry& g,
                                  DType dtype, int64_t batch, int64_t out_channels, const void* x,
                                  const void* dy, void* dw, bool accumulate);

// The algorithms cuDNN runs for this problem, e.g. "fwd IMPLICIT_PRECOMP_GEMM, bwd-data ALGO_1,
// bwd-filter ALGO_1" (searching, and caching, those not searched yet). For benchmarks and logs.
std::string cudnn_conv2d_algorithms(const Conv2dGeometry& g, int64_t batch, int64_t out_channels,
                                    DType dtype);

// The algorithm cache: `searches` counts heuristic queries (one per new problem and direction),
// `hits` the calls served from the cache, `entries` the problems cached now.
struct ConvAlgoCacheStats {
  int64_t searches = 0;
  int64_t hits = 0;
  int64_t entries = 0;
};
ConvAlgoCacheStats conv_algo_cache_stats();
// Forgets every cached choice and zeroes the counters.
void clear_conv_algo_cache();

}  // namespace mg::kernels::cuda
