// im2col / col2im on the GPU: the data movement around the cuBLAS GEMMs that
// make up conv2d (core/ops/conv_ops.cpp). Semantics and layout:
// kernels/cpu/conv.h (a batch of `images` NCHW images, image b owning columns
// [b*out_h*out_w, (b+1)*out_h*out_w) of a [C*kh*kw, images*out_h*out_w] matrix).
//
// Decomposition.
//   im2col: one thread per element of the column matrix, in a grid-stride
//     loop. Thread e = (row r, column q) works out its kernel tap (c, i, j)
//     from r and its output pixel (b, oh, ow) from q, and copies the one input
//     value that pixel sees through that tap (0 on padding). Neighbouring
//     threads write neighbouring columns, so the writes are coalesced; the
//     reads are too for stride 1 (neighbouring ow read neighbouring iw).
//   col2im: one thread per element of the image (b, c, ih, iw), which GATHERS
//     the column entries that fall on it -- for each tap (i, j), at most one
//     output pixel (oh, ow) reads (ih, iw) through it -- instead of scattering
//     the columns with atomics. No two threads write the same address, the
//     result is deterministic, and the taps are added in the CPU's order
//     (ascending (i, j), on top of what the image already held), in float for
//     halves and rounded once, so it matches the CPU bit for bit.
//
// Cost. No arithmetic to speak of: both are memory bound. im2col reads the
// image (C*H*W elements per image, mostly from L2 since each is read kh*kw
// times) and writes C*kh*kw*out_h*out_w elements; col2im reads that many and
// writes the image. For a 3x3 "same" convolution that is 9x the image size in
// each direction: an f32 batch of 128 Fashion-MNIST 32-channel maps (12.8 MB)
// becomes 115 MB of columns, ~25 us at an H200's ~4.8 TB/s. The GEMM after it
// does 2*Cout*C*kh*kw*out_h*out_w FLOPs and normally dominates.
//
// One kernel per dtype (4 x 2 instantiations); the index arithmetic is 64-bit.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace mg::kernels::cuda {
namespace {

// Conv2dGeometry's host-side member functions, evaluated once for the device.
struct ConvParams {
  int64_t channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h,
      dilation_w;
  int64_t out_h, out_w, images;
};

ConvParams make_params(const Conv2dGeometry& g, int64_t images) {
  return ConvParams{g.channels, g.height, g.width,      g.kernel_h,   g.kernel_w, g.stride_h, g.stride_w,
                    g.pad_h,    g.pad_w,  g.dilation_h, g.dilation_w, g.out_h(),  g.out_w(),  images};
}

template <class T>
__global__ void im2col_kernel(ConvParams p, const T* image, T* columns) {
  const int64_t cols = p.out_h * p.out_w, row_length = p.images * cols;
  const int64_t taps = p.kernel_h * p.kernel_w;
  const int64_t total = p.channels * taps * row_length;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / row_length, q = e % row_length;
    const int64_t c = r / taps, i = (r % taps) / p.kernel_w, j = r % p.kernel_w;
    const int64_t b = q / cols, oh = (q % cols) / p.out_w, ow = q % p.out_w;
    const int64_t ih = oh * p.stride_h - p.pad_h + i * p.dilation_h;
    const int64_t iw = ow * p.stride_w - p.pad_w + j * p.dilation_w;
    T v{};  // all-zero bits: 0 in every floating format
    if (ih >= 0 && ih < p.height && iw >= 0 && iw < p.width)
      v = image[((b * p.channels + c) * p.height + ih) * p.width + iw];
    columns[e] = v;
  }
}

// The output index o (one dim) whose window reads input index `in` through tap
// offset k*dilation, or -1: in = o*stride - pad + k*dilation.
__device__ __forceinline__ int64_t output_for(int64_t in, int64_t k, int64_t stride, int64_t pad,
                                              int64_t dilation, int64_t out) {
  const int64_t span = in + pad - k * dilation;
  if (span < 0 || span % stride != 0) return -1;
  const int64_t o = span / stride;
  return o < out ? o : -1;
}

template <class T>
__global__ void col2im_kernel(ConvParams p, const T* columns, T* image) {
  const int64_t cols = p.out_h * p.out_w, row_length = p.images * cols;
  const int64_t total = p.images * p.channels * p.height * p.width;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t iw = e % p.width, ih = (e / p.width) % p.height;
    const int64_t c = (e / (p.width * p.height)) % p.channels, b = e / (p.width * p.height * p.channels);
    acc_t<T> sum = load(image + e);  // col2im accumulates into the image
    for (int64_t i = 0; i < p.kernel_h; ++i) {
      const int64_t oh = output_for(ih, i, p.stride_h, p.pad_h, p.dilation_h, p.out_h);
      if (oh < 0) continue;
      for (int64_t j = 0; j < p.kernel_w; ++j) {
        const int64_t ow = output_for(iw, j, p.stride_w, p.pad_w, p.dilation_w, p.out_w);
        if (ow < 0) continue;
        const int64_t row = (c * p.kernel_h + i) * p.kernel_w + j;
        sum += load(columns + row * row_length + b * cols + oh * p.out_w + ow);
      }
    }
    store(image + e, sum);
  }
}

void check_args(const char* what, const Conv2dGeometry& g, int64_t images, const void* a, const void* b) {
  check_conv2d_geometry(g);
  MG_CHECK(images >= 0, what, " (CUDA): the number of images must be non-negative, got ", images);
  MG_CHECK(g.column_rows() == 0 || images == 0 || (a != nullptr && b != nullptr), what,
           " (CUDA): null buffer");
}

}  // namespace

void im2col(cudaStream_t stream, const Conv2dGeometry& g, DType dtype, const void* image, void* columns,
            int64_t images) {
  check_args("im2col", g, images, image, columns);
  const int64_t total = g.column_rows() * images * g.column_cols();
  if (total == 0) return;
  visit_float(dtype, "im2col", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<im2col_kernel<T>>(grid_for(total), kThreads, 0, stream, make_params(g, images),
                                    static_cast<const T*>(image), static_cast<T*>(columns));
  });
}

void col2im(cudaStream_t stream, const Conv2dGeometry& g, DType dtype, const void* columns, void* image,
            int64_t images) {
  check_args("col2im", g, images, columns, image);
  const int64_t total = images * g.channels * g.height * g.width;
  if (total == 0 || g.column_cols() == 0) return;
  visit_float(dtype, "col2im", [&](auto t) {
    using T = typename decltype(t)::type;
    launch_kernel<col2im_kernel<T>>(grid_for(total), kThreads, 0, stream, make_params(g, images),
                                    static_cast<const T*>(columns), static_cast<T*>(image));
  });
}

}  // namespace mg::kernels::cuda
