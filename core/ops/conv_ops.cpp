// conv2d as im2col + GEMM, and 2-d max/avg pooling.
//
// Three paths, chosen per call (the backward takes the forward's):
//   CPU, f32/f64     kernels/cpu/conv2d.h: the batch split across threads, one image at a
//                    time: im2col into a per-thread column buffer that stays in cache, one GEMM
//                    per image written straight into y (no permutes); backward likewise, with
//                    one partial weight gradient per thread.
//   CUDA             cuDNN by default (kernels/cuda/conv_cudnn.h; set_conv_backend /
//                    MG_CUDA_CONV choose), except what cuDNN does not take (f64).
//   otherwise        (CUDA im2col backend or f64; 16-bit floats on the CPU) chunks of B images
//                    (B = the whole batch while the column buffer stays under kColumnBudget):
//   forward:   columns = im2col(x[n0:n0+B])          [C*kh*kw, B*OH*OW]
//              out     = W[O, C*kh*kw] @ columns     [O, B, OH*OW]
//              y[n0:n0+B] = out permuted to           [B, O, OH*OW]
//   backward:  gyp     = dy[n0:n0+B] permuted to     [O, B*OH*OW]
//              dW     += gyp @ columns^T
//              dx[n0:n0+B] = col2im(W^T @ gyp)
// One big GEMM per chunk suits cuBLAS, and the CPU's blocked GEMM for halves accumulates the
// whole chunk in float before rounding once. On the GPU, im2col/col2im come from
// kernels/cuda/conv.cu and the GEMMs from cuBLAS (MG_KERNEL picks the twin); pooling likewise
// uses kernels/cuda/pool.cu. Column buffers are recomputed in backward instead of saved: they
// are kh*kw times larger than the input, so saving them would dominate activation memory.
#include "core/autocast.h"
#include "core/ops/op_common.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv2d.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/pool.h"
#if defined(MG_HAS_CUDA)
#include "kernels/cuda/conv_cudnn.h"
#endif

namespace mg {
using namespace ops_detail;

namespace {

// Column-buffer elements per conv2d chunk (16 MiB of f32): big enough that a Fashion-MNIST
// batch of 128 is one or two GEMMs, small enough to stay a modest temporary for large images.
constexpr int64_t kColumnBudget = int64_t{1} << 22;

// Images per chunk: as many as fit the budget, at least one.
int64_t images_per_chunk(int64_t batch, int64_t column_elements_per_image) {
  const int64_t fit = kColumnBudget / std::max<int64_t>(column_elements_per_image, 1);
  return std::max<int64_t>(1, std::min(batch, fit));
}

char* element_ptr(const Tensor& t, int64_t element) {
  return static_cast<char*>(t.data_ptr()) + element * static_cast<int64_t>(t.itemsize());
}

kernels::Conv2dGeometry conv_geometry(const Tensor& x, const Tensor& w, const Conv2dOptions& o) {
  kernels::Conv2dGeometry g;
  g.channels = x.size(1);
  g.height = x.size(2);
  g.width = x.size(3);
  g.kernel_h = w.size(2);
  g.kernel_w = w.size(3);
  g.stride_h = o.stride_h;
  g.stride_w = o.stride_w;
  g.pad_h = o.pad_h;
  g.pad_w = o.pad_w;
  g.dilation_h = o.dilation_h;
  g.dilation_w = o.dilation_w;
  kernels::check_conv2d_geometry(g);
  return g;
}

// ---- the CPU path for f32/f64 (kernels/cpu/conv2d.h) -----------------------------------------
// One image per thread with a column buffer that stays in cache, and no permuting copies. The
// batched chunks below remain for CUDA tensors (without cuDNN) and for 16-bit floats on the CPU,
// whose blocked GEMM accumulates a whole chunk in float before rounding once.
bool per_image_cpu(const Tensor& x) {
  return x.device().is_cpu() && (x.dtype() == DType::f32 || x.dtype() == DType::f64);
}

// ---- the cuDNN path (kernels/cuda/conv_cudnn.h) ----------------------------------------------
// A CUDA conv2d runs through cuDNN when that backend is selected and cuDNN takes the problem
// (f32/f16/bf16, sizes within 32 bits); otherwise, and always on the CPU, as im2col + GEMM.
// cuDNN computes the whole batch in one call (no chunks, no column buffer) and writes every
// output element, so its gradients need no zero fill.
bool use_cudnn(const Tensor& x, const kernels::Conv2dGeometry& g, int64_t out_channels) {
#if defined(MG_HAS_CUDA)
  using namespace kernels::cuda;
  return x.device().is_cuda() && conv_backend() == ConvBackend::cudnn &&
         cudnn_conv2d_supported(g, x.size(0), out_channels, x.dtype());
#else
  (void)x, (void)g, (void)out_channels;
  return false;
#endif
}

// cuDNN's fastest kernels load 16 bytes at a time; a view that starts mid-vector (a narrow at an
// odd offset) is copied to a fresh, aligned allocation first.
Tensor aligned_for_cudnn(const Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

#if defined(MG_HAS_CUDA)
void cudnn_forward(const kernels::Conv2dGeometry& g, const Tensor& x, const Tensor& w, Tensor& y) {
  cuda::DeviceGuard guard(x.device().index);
  cuda::DeviceScratch scratch(x.device().index);
  kernels::cuda::cudnn_conv2d_forward(cuda::kernel_stream(x.device().index), scratch, g, x.dtype(), x.size(0),
                                      w.size(0), x.data_ptr(), w.data_ptr(), nullptr, y.data_ptr());
}
// gx / gw: outputs to fill, or undefined when not needed.
void cudnn_backward(const kernels::Conv2dGeometry& g, const Tensor& x, const Tensor& w, const Tensor& gy,
                    Tensor& gx, Tensor& gw) {
  cuda::DeviceGuard guard(x.device().index);
  cuda::DeviceScratch scratch(x.device().index);
  const cudaStream_t stream = cuda::kernel_stream(x.device().index);
  const Tensor dy = aligned_for_cudnn(gy);
  if (gx.defined())
    kernels::cuda::cudnn_conv2d_backward_data(stream, scratch, g, x.dtype(), x.size(0), w.size(0),
                                              dy.data_ptr(), w.data_ptr(), gx.data_ptr());
  if (gw.defined())
    kernels::cuda::cudnn_conv2d_backward_filter(stream, scratch, g, x.dtype(), x.size(0), w.size(0),
                                                x.data_ptr(), dy.data_ptr(), gw.data_ptr(),
                                                /*accumulate=*/false);
}
#else
// Never called: use_cudnn() is false in a build without CUDA.
void cudnn_forward(const kernels::Conv2dGeometry&, const Tensor&, const Tensor&, Tensor&) {
  throw Error("conv2d: the cuDNN path needs a CUDA build");
}
void cudnn_backward(const kernels::Conv2dGeometry&, const Tensor&, const Tensor&, const Tensor&, Tensor&,
                    Tensor&) {
  throw Error("conv2d: the cuDNN path needs a CUDA build");
}
#endif

}  // namespace

Tensor conv2d(const Tensor& x_arg, const Tensor& w_arg, const Tensor& bias_arg,
              const Conv2dOptions& options) {
  const Tensor x_in = autocast_to_low_precision(x_arg), w_in = autocast_to_low_precision(w_arg);
  const Tensor bias =
      bias_arg.defined() && x_in.defined() && bias_arg.dtype() != x_in.dtype() && autocast_state().enabled
          ? bias_arg.to(x_in.dtype())
          : bias_arg;
  check_defined("conv2d", {x_in, w_in});
  check_same_device("conv2d", {x_in, w_in, bias});
  check_floating("conv2d", x_in);
  MG_CHECK(x_in.dim() == 4, "conv2d: input must be [N, C, H, W], got ", shape_str(x_in.shape()));
  MG_CHECK(w_in.dim() == 4, "conv2d: weight must be [out_channels, in_channels, kh, kw], got ",
           shape_str(w_in.shape()));
  MG_CHECK(x_in.size(1) == w_in.size(1), "conv2d: input of shape ", shape_str(x_in.shape()), " has ",
           x_in.size(1), " channels but weight of shape ", shape_str(w_in.shape()), " expects ",
           w_in.size(1));
  MG_CHECK(x_in.dtype() == w_in.dtype(), "conv2d: input dtype ", x_in.dtype(), " differs from weight dtype ",
           w_in.dtype());
  if (bias.defined())
    MG_CHECK(bias.dim() == 1 && bias.size(0) == w_in.size(0), "conv2d: bias of shape ",
             shape_str(bias.shape()), " does not match ", w_in.size(0), " output channels");
  Tensor x = x_in.detach().contiguous(), w = w_in.detach().contiguous();
  const kernels::Conv2dGeometry geo = conv_geometry(x, w, options);
  const int64_t batch = x.size(0), out_channels = w.size(0);
  const int64_t ck = geo.column_rows(), spatial = geo.column_cols();
  const int64_t image_elems = geo.channels * geo.height * geo.width;
  MG_CHECK(geo.out_h() > 0 && geo.out_w() > 0, "conv2d: kernel ", geo.kernel_h, "x", geo.kernel_w,
           " (dilated) is larger than the padded input of shape ", shape_str(x.shape()));
  Tensor y = new_output({batch, out_channels, geo.out_h(), geo.out_w()}, x.dtype(), x);
  const int64_t chunk = images_per_chunk(batch, ck * spatial);
  const bool via_cudnn = use_cudnn(x, geo, out_channels);  // this call's backward takes the same path
  const bool per_image = per_image_cpu(x);                 // likewise
  if (via_cudnn) {
    x = aligned_for_cudnn(x);
    w = aligned_for_cudnn(w);
    cudnn_forward(geo, x, w, y);
  } else if (per_image) {
    kernels::cpu::conv2d_forward(geo, x.dtype(), batch, out_channels, x.data_ptr(), w.data_ptr(),
                                 y.data_ptr());
  } else {
    NoGradGuard no_grad;  // the permuting copy below is bookkeeping, not part of the graph
    for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
      const int64_t b = std::min(chunk, batch - n0);
      Tensor columns = new_output({ck, b * spatial}, x.dtype(), x);
      Tensor out = new_output({out_channels, b, spatial}, x.dtype(), x);
      MG_KERNEL(x.device(), im2col, geo, x.dtype(), element_ptr(x, n0 * image_elems), columns.data_ptr(), b);
      MG_KERNEL_SCRATCH(
          x.device(), gemm,
          kernels::gemm_args(x.dtype(), false, false, out_channels, b * spatial, ck, w.data_ptr(), ck,
                             columns.data_ptr(), b * spatial, out.data_ptr(), b * spatial, 0.0));
      y.narrow(0, n0, b).view({b, out_channels, spatial}).copy_(out.permute({1, 0, 2}));
    }
  }
  if (bias.defined()) {
    NoGradGuard no_grad;
    y = add(y, bias.detach().reshape({1, out_channels, 1, 1}));
  }
  if (autograd::any_requires_grad({x_in, w_in, bias})) {
    autograd::SavedTensor saved_x(x, "conv2d"), saved_w(w, "conv2d");
    const bool need_x = x_in.requires_grad(), need_w = w_in.requires_grad();
    const bool need_b = bias.defined() && bias.requires_grad();
    autograd::record("Conv2dBackward", {x_in, w_in, bias}, {y}, [=](const std::vector<Tensor>& g) {
      Tensor xs = saved_x.unpack(), ws = saved_w.unpack(), gy = g[0].contiguous();
      const DType dt = xs.dtype();
      if (via_cudnn) {
        Tensor gx = need_x ? new_output(xs.shape(), dt, xs) : Tensor();
        Tensor gw = need_w ? new_output(ws.shape(), dt, ws) : Tensor();
        cudnn_backward(geo, xs, ws, gy, gx, gw);
        return std::vector<Tensor>{gx, gw, need_b ? sum(gy, {0, 2, 3}) : Tensor()};
      }
      if (per_image) {
        Tensor gx = need_x ? new_output(xs.shape(), dt, xs) : Tensor();
        Tensor gw = need_w ? new_output(ws.shape(), dt, ws) : Tensor();
        kernels::cpu::conv2d_backward(geo, dt, batch, out_channels, xs.data_ptr(), ws.data_ptr(),
                                      gy.data_ptr(), need_x ? gx.data_ptr() : nullptr,
                                      need_w ? gw.data_ptr() : nullptr);
        return std::vector<Tensor>{gx, gw, need_b ? sum(gy, {0, 2, 3}) : Tensor()};
      }
      Tensor gx = need_x ? zeros(xs.shape(), TensorOptions{dt, xs.device()}) : Tensor();
      Tensor gw = need_w ? zeros(ws.shape(), TensorOptions{dt, ws.device()}) : Tensor();
      for (int64_t n0 = 0; n0 < batch; n0 += chunk) {
        const int64_t b = std::min(chunk, batch - n0);
        // [b, O, S] -> [O, b, S]: the layout of the forward GEMM's output.
        Tensor gyp = gy.narrow(0, n0, b).view({b, out_channels, spatial}).permute({1, 0, 2}).contiguous();
        Tensor cols = new_output({ck, b * spatial}, dt, xs);
        if (need_w) {
          MG_KERNEL(xs.device(), im2col, geo, dt, element_ptr(xs, n0 * image_elems), cols.data_ptr(), b);
          MG_KERNEL_SCRATCH(
              xs.device(), gemm,
              kernels::gemm_args(dt, false, true, out_channels, ck, b * spatial, gyp.data_ptr(), b * spatial,
                                 cols.data_ptr(), b * spatial, gw.data_ptr(), ck, 1.0));
        }
        if (need_x) {
          MG_KERNEL_SCRATCH(
              xs.device(), gemm,
              kernels::gemm_args(dt, true, false, ck, b * spatial, out_channels, ws.data_ptr(), ck,
                                 gyp.data_ptr(), b * spatial, cols.data_ptr(), b * spatial, 0.0));
          MG_KERNEL(xs.device(), col2im, geo, dt, cols.data_ptr(), element_ptr(gx, n0 * image_elems), b);
        }
      }
      Tensor gb = need_b ? sum(gy, {0, 2, 3}) : Tensor();
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return y;
}

namespace {

kernels::Pool2dGeometry pool_geometry(const char* name, const Tensor& x, const Pool2dOptions& o) {
  MG_CHECK(x.dim() == 3 || x.dim() == 4, name, ": input must be [N, C, H, W] or [C, H, W], got ",
           shape_str(x.shape()));
  kernels::Pool2dGeometry g;
  g.height = x.size(-2);
  g.width = x.size(-1);
  g.planes = x.numel() / std::max<int64_t>(g.height * g.width, 1);
  g.kernel_h = o.kernel_h;
  g.kernel_w = o.kernel_w;
  g.stride_h = o.stride_h > 0 ? o.stride_h : o.kernel_h;
  g.stride_w = o.stride_w > 0 ? o.stride_w : o.kernel_w;
  g.pad_h = o.pad_h;
  g.pad_w = o.pad_w;
  kernels::check_pool2d_geometry(g);
  MG_CHECK(g.out_h() > 0 && g.out_w() > 0, name, ": kernel ", g.kernel_h, "x", g.kernel_w,
           " is larger than the padded input of shape ", shape_str(x.shape()));
  return g;
}

Shape pooled_shape(const Tensor& x, const kernels::Pool2dGeometry& g) {
  Shape s = x.shape();
  s[s.size() - 2] = g.out_h();
  s[s.size() - 1] = g.out_w();
  return s;
}

}  // namespace

Tensor max_pool2d(const Tensor& x_in, const Pool2dOptions& options) {
  check_defined("max_pool2d", {x_in});
  check_floating("max_pool2d", x_in);
  Tensor x = x_in.detach().contiguous();
  const kernels::Pool2dGeometry geo = pool_geometry("max_pool2d", x, options);
  Tensor y = new_output(pooled_shape(x, geo), x.dtype(), x);
  Tensor argmax = new_output(y.shape(), DType::i64, x);
  MG_KERNEL(x.device(), max_pool2d_forward, geo, x.dtype(), x.data_ptr(), y.data_ptr(),
            argmax.data<int64_t>());
  if (autograd::any_requires_grad({x_in})) {
    const Shape input_shape = x.shape();
    autograd::record("MaxPool2dBackward", {x_in}, {y}, [=](const std::vector<Tensor>& g) {
      Tensor gy = g[0].contiguous();
      Tensor gx = new_output(input_shape, gy.dtype(), gy);
      MG_KERNEL(gy.device(), max_pool2d_backward, geo, gy.dtype(), gy.data_ptr(), argmax.data<int64_t>(),
                gx.data_ptr());
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

Tensor max_pool2d(const Tensor& x, int64_t kernel) { return max_pool2d(x, Pool2dOptions{kernel, kernel}); }

Tensor avg_pool2d(const Tensor& x_in, const Pool2dOptions& options) {
  check_defined("avg_pool2d", {x_in});
  check_floating("avg_pool2d", x_in);
  Tensor x = x_in.detach().contiguous();
  const kernels::Pool2dGeometry geo = pool_geometry("avg_pool2d", x, options);
  Tensor y = new_output(pooled_shape(x, geo), x.dtype(), x);
  const bool include_pad = options.count_include_pad;
  MG_KERNEL(x.device(), avg_pool2d_forward, geo, x.dtype(), x.data_ptr(), y.data_ptr(), include_pad);
  if (autograd::any_requires_grad({x_in})) {
    const Shape input_shape = x.shape();
    autograd::record("AvgPool2dBackward", {x_in}, {y}, [=](const std::vector<Tensor>& g) {
      Tensor gy = g[0].contiguous();
      Tensor gx = new_output(input_shape, gy.dtype(), gy);
      MG_KERNEL(gy.device(), avg_pool2d_backward, geo, gy.dtype(), gy.data_ptr(), gx.data_ptr(), include_pad);
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel) { return avg_pool2d(x, Pool2dOptions{kernel, kernel}); }

}  // namespace mg
