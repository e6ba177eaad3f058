// 2-d max and average pooling on the GPU over contiguous [planes, H, W]
// inputs (planes = N*C). Semantics: kernels/cpu/pool.h.
//
// Decomposition.
//   Forward (max and avg): one thread per output element (plane, oh, ow) in a
//     grid-stride loop. It walks its kh x kw window clipped to the input, in
//     row-major order like the CPU (the same first-wins tie rule, NaN wins),
//     and writes the value (and, for max, the flat argmax ih*W + iw).
//   Backward (max and avg): one thread per INPUT element (plane, ih, iw). It
//     gathers from the few windows that contain it -- outputs oh with
//     oh*sh - ph <= ih < oh*sh - ph + kh, and the same for ow -- instead of
//     scattering every output into its window with atomics. No two threads
//     write the same address, so there are no atomics, the result is
//     deterministic, and since the windows are visited in ascending (oh, ow)
//     order (the CPU's order) and summed in float for halves, the result
//     matches the CPU bit for bit. Max backward adds grad_output[o] where
//     argmax[o] names this element.
//
// Cost. ~1 compare or add per window element, and each input element is read
// by about (kh/sh)*(kw/sw) windows from L1/L2: memory bound. Max forward
// reads the input once and writes out_h*out_w values plus as many 8-byte
// argmax entries (which outweigh f32 values 2:1); max backward reads
// grad_output and argmax ~(kh/sh)*(kw/sw) times (from cache) and writes the
// input-sized gradient once. For a 2x2/2 pool of a 128 x 32 x 28 x 28 f32
// batch (12.8 MB in, 3.2 MB + 6.4 MB out) that is ~5 us at HBM speed.
//
// One kernel per (dtype, direction, kind): 4 dtypes x 4 kernels.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace mg::kernels::cuda {
namespace {

struct PoolParams {
  int64_t planes, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, out_h, out_w;
};

PoolParams make_params(const Pool2dGeometry& g) {
  return PoolParams{g.planes,   g.height, g.width, g.kernel_h, g.kernel_w, g.stride_h,
                    g.stride_w, g.pad_h,  g.pad_w, g.out_h(),  g.out_w()};
}

// The part of output (oh, ow)'s window inside the input (kernels/cpu/pool.cpp's Window).
struct Window {
  int64_t h0, h1, w0, w1, pool_size;
  __device__ Window(const PoolParams& p, int64_t oh, int64_t ow) {
    const int64_t h_start = oh * p.stride_h - p.pad_h, w_start = ow * p.stride_w - p.pad_w;
    const int64_t h_end = min(h_start + p.kernel_h, p.height + p.pad_h);
    const int64_t w_end = min(w_start + p.kernel_w, p.width + p.pad_w);
    pool_size = (h_end - h_start) * (w_end - w_start);
    h0 = max(h_start, int64_t(0));
    w0 = max(w_start, int64_t(0));
    h1 = min(h_end, p.height);
    w1 = min(w_end, p.width);
  }
  __device__ int64_t divisor(bool count_include_pad) const {
    return count_include_pad ? pool_size : (h1 - h0) * (w1 - w0);
  }
};

// Outputs [lo, hi) of one dim whose windows contain input index `in`.
struct OutRange {
  int64_t lo, hi;
};
__device__ __forceinline__ OutRange outputs_containing(int64_t in, int64_t kernel, int64_t stride,
                                                       int64_t pad, int64_t out) {
  // o*stride - pad <= in  and  in < o*stride - pad + kernel
  const int64_t first = in + pad - kernel + 1;  // o*stride >= first
  const int64_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  const int64_t hi = min((in + pad) / stride + 1, out);
  return OutRange{lo, hi > lo ? hi : lo};
}

template <class T>
__global__ void max_forward_kernel(PoolParams p, const T* input, T* output, int64_t* argmax) {
  using A = acc_t<T>;
  const int64_t outs = p.out_h * p.out_w, total = p.planes * outs;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = e / outs, oh = (e % outs) / p.out_w, ow = e % p.out_w;
    const T* x = input + plane * p.height * p.width;
    const Window win(p, oh, ow);
    A best = -INFINITY;
    int64_t best_index = win.h0 * p.width + win.w0;  // wins if every element is -inf
    for (int64_t ih = win.h0; ih < win.h1; ++ih) {
      for (int64_t iw = win.w0; iw < win.w1; ++iw) {
        const A v = load(x + ih * p.width + iw);
        if (v > best || v != v) {
          best = v;
          best_index = ih * p.width + iw;
        }
      }
    }
    store(output + e, best);
    argmax[e] = best_index;
  }
}

template <class T>
__global__ void max_backward_kernel(PoolParams p, const T* grad_output, const int64_t* argmax,
                                    T* grad_input) {
  using A = acc_t<T>;
  const int64_t plane_size = p.height * p.width, outs = p.out_h * p.out_w, total = p.planes * plane_size;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = e / plane_size, here = e % plane_size;
    const int64_t ih = here / p.width, iw = here % p.width;
    const OutRange rows = outputs_containing(ih, p.kernel_h, p.stride_h, p.pad_h, p.out_h);
    const OutRange cols = outputs_containing(iw, p.kernel_w, p.stride_w, p.pad_w, p.out_w);
    const int64_t* index = argmax + plane * outs;
    const T* gy = grad_output + plane * outs;
    A sum = 0;
    for (int64_t oh = rows.lo; oh < rows.hi; ++oh)
      for (int64_t ow = cols.lo; ow < cols.hi; ++ow)
        if (index[oh * p.out_w + ow] == here) sum += load(gy + oh * p.out_w + ow);
    store(grad_input + e, sum);
  }
}

template <class T>
__global__ void avg_forward_kernel(PoolParams p, const T* input, T* output, bool count_include_pad) {
  using A = acc_t<T>;
  const int64_t outs = p.out_h * p.out_w, total = p.planes * outs;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = e / outs, oh = (e % outs) / p.out_w, ow = e % p.out_w;
    const T* x = input + plane * p.height * p.width;
    const Window win(p, oh, ow);
    A sum = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih)
      for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += load(x + ih * p.width + iw);
    store(output + e, sum / A(win.divisor(count_include_pad)));
  }
}

template <class T>
__global__ void avg_backward_kernel(PoolParams p, const T* grad_output, T* grad_input,
                                    bool count_include_pad) {
  using A = acc_t<T>;
  const int64_t plane_size = p.height * p.width, outs = p.out_h * p.out_w, total = p.planes * plane_size;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = e / plane_size, ih = (e % plane_size) / p.width, iw = e % p.width;
    const OutRange rows = outputs_containing(ih, p.kernel_h, p.stride_h, p.pad_h, p.out_h);
    const OutRange cols = outputs_containing(iw, p.kernel_w, p.stride_w, p.pad_w, p.out_w);
    const T* gy = grad_output + plane * outs;
    A sum = 0;
    for (int64_t oh = rows.lo; oh < rows.hi; ++oh) {
      for (int64_t ow = cols.lo; ow < cols.hi; ++ow) {
        const Window win(p, oh, ow);
        sum += load(gy + oh * p.out_w + ow) / A(win.divisor(count_include_pad));
      }
    }
    store(grad_input + e, sum);
  }
}

void check_args(const Pool2dGeometry& g, const char* what, const void* in, const void* out) {
  check_pool2d_geometry(g);
  check(g.planes * g.height * g.width == 0 || (in != nullptr && out != nullptr), what,
        " (CUDA): null buffer");
}

}  // namespace

void max_pool2d_forward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* input,
                        void* output, int64_t* argmax) {
  check_args(g, "max_pool2d_forward", input, output);
  check(g.planes == 0 || argmax != nullptr, "max_pool2d_forward (CUDA): argmax is null");
  const int64_t total = g.planes * g.out_h() * g.out_w();
  if (total == 0) return;
  visit_float(dtype, "max_pool2d_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<max_forward_kernel<T>>(grid_for(total), kThreads, 0, stream, make_params(g),
                                         static_cast<const T*>(input), static_cast<T*>(output), argmax);
  });
}

void max_pool2d_backward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* grad_output,
                         const int64_t* argmax, void* grad_input) {
  check_args(g, "max_pool2d_backward", grad_output, grad_input);
  check(g.planes == 0 || argmax != nullptr, "max_pool2d_backward (CUDA): argmax is null");
  const int64_t total = g.planes * g.height * g.width;
  if (total == 0) return;
  visit_float(dtype, "max_pool2d_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<max_backward_kernel<T>>(grid_for(total), kThreads, 0, stream, make_params(g),
                                          static_cast<const T*>(grad_output), argmax,
                                          static_cast<T*>(grad_input));
  });
}

void avg_pool2d_forward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* input,
                        void* output, bool count_include_pad) {
  check_args(g, "avg_pool2d_forward", input, output);
  const int64_t total = g.planes * g.out_h() * g.out_w();
  if (total == 0) return;
  visit_float(dtype, "avg_pool2d_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<avg_forward_kernel<T>>(grid_for(total), kThreads, 0, stream, make_params(g),
                                         static_cast<const T*>(input), static_cast<T*>(output),
                                         count_include_pad);
  });
}

void avg_pool2d_backward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* grad_output,
                         void* grad_input, bool count_include_pad) {
  check_args(g, "avg_pool2d_backward", grad_output, grad_input);
  const int64_t total = g.planes * g.height * g.width;
  if (total == 0) return;
  visit_float(dtype, "avg_pool2d_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<avg_backward_kernel<T>>(grid_for(total), kThreads, 0, stream, make_params(g),
                                          static_cast<const T*>(grad_output), static_cast<T*>(grad_input),
                                          count_include_pad);
  });
}

}  // namespace mg::kernels::cuda
