// im2col / col2im for Conv2d on the CPU (a batch of NCHW images per call).
//
// Cost. Neither function does arithmetic worth counting; they move memory.
// im2col reads the C*H*W image and writes C*kh*kw * out_h*out_w column
// entries -- for a 3x3 stride-1 "same" convolution that is 9x the image, which
// is the price of turning the convolution into a GEMM (the GEMM then does
// 2*Cout*C*kh*kw*out_h*out_w flops on it, and usually dominates). col2im reads
// that many entries and adds each into the image.
//
// Batches. Both functions take `images` consecutive NCHW images and lay their
// columns side by side: image b owns columns [b*out_h*out_w, (b+1)*out_h*out_w)
// of a [C*kh*kw, images*out_h*out_w] matrix. One GEMM then convolves the whole
// batch (conv2d in core/ops/conv_ops.cpp): one library call instead of one per
// image, which matters because every OpenBLAS call wakes its threads, and for
// small images that wake-up costs more than the arithmetic.
//
// Decomposition. im2col: each (image, row) pair -- one (c, i, j) kernel tap of
// one image; its row segment is the image's channel c shifted by
// (i*dh - ph, j*dw - pw) and subsampled by the stride -- is filled
// independently, so the pairs split across threads. col2im: rows of the same
// channel add into the same image plane, so the unit of work is an (image,
// channel) plane: a thread owns the plane, adds all kh*kw taps into a acc_t
// copy of it (float for halves, so the sum is rounded once instead of once per
// tap) and stores it back.
//
// Boundaries. For a tap with offset off = i*d - p, output index o reads input
// o*s + off, which is inside [0, H) exactly for o in [lo, hi) computed by
// valid_range below. The inner loops run over that range without a per-element
// bounds test; the rest of the row is padding (zeros in im2col, dropped in col2im).
#include "kernels/cpu/conv.h"

#include <algorithm>
#include <vector>

#include "base/error.h"

namespace mg::kernels::cpu {

namespace {

constexpr int64_t kConvMinParallelElements = 1 << 15;  // below this, threads cost more than they save

struct Range {
  int64_t lo, hi;  // [lo, hi), possibly empty
};

// Output indices o in [0, out) whose input index o*stride + offset lies in [0, in).
Range valid_range(int64_t offset, int64_t stride, int64_t in, int64_t out) {
  // o*stride + offset >= 0   <=>  o >= ceil(-offset / stride)
  const int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  // o*stride + offset < in   <=>  o < ceil((in - offset) / stride)
  const int64_t hi = in - offset <= 0 ? 0 : (in - offset + stride - 1) / stride;
  const int64_t clipped_lo = std::min(lo, out);
  return Range{clipped_lo, std::max(clipped_lo, std::min(hi, out))};
}

// One column row of a "same"-size convolution (stride 1, output as wide as the input: e.g. 3x3
// with padding 1), the common CNN case. There, output (oh, ow) of this kernel tap reads input
// element oh*W + ow + shift of the channel plane, a constant shift, so the whole valid block is
// ONE contiguous copy instead of one short copy per output row (a 14-wide row made each copy a
// ~5 ns memmove call for 56 bytes). The copy's rows wrap into their neighbours where the tap
// reads padding (ow outside valid_w); those few elements per row are zeroed afterwards.
template <class T>
void same_size_row(const T* plane, T* dst, int64_t out_h, int64_t out_w, int64_t shift, Range valid_h,
                   Range valid_w) {
  const T zero = static_cast<T>(0.0f);
  if (valid_h.lo >= valid_h.hi || valid_w.lo >= valid_w.hi) {  // the tap only ever reads padding
    std::fill(dst, dst + out_h * out_w, zero);
    return;
  }
  const int64_t first = valid_h.lo * out_w + valid_w.lo;      // first element read from the input
  const int64_t end = (valid_h.hi - 1) * out_w + valid_w.hi;  // one past the last
  std::fill(dst, dst + first, zero);
  std::copy(plane + first + shift, plane + end + shift, dst + first);
  std::fill(dst + end, dst + out_h * out_w, zero);
  for (int64_t oh = valid_h.lo; oh < valid_h.hi; ++oh) {
    T* row = dst + oh * out_w;
    std::fill(row, row + valid_w.lo, zero);
    std::fill(row + valid_w.hi, row + out_w, zero);
  }
}

template <class T>
void im2col_typed(const Conv2dGeometry& g, const T* images, T* columns, int64_t count) {
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t rows = g.column_rows(), cols = out_h * out_w;
  const int64_t row_length = count * cols;  // one row of `columns` spans every image
  const int64_t image_size = g.channels * g.height * g.width;
  const T zero = static_cast<T>(0.0f);
  const bool worth_threads = rows * row_length >= kConvMinParallelElements;
  (void)worth_threads;  // only read by the OpenMP pragma

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (worth_threads)
#endif
  for (int64_t unit = 0; unit < count * rows; ++unit) {
    const int64_t b = unit / rows, r = unit % rows;  // image b, column row r
    const T* image = images + b * image_size;
    const int64_t c = r / (g.kernel_h * g.kernel_w);
    const int64_t i = (r / g.kernel_w) % g.kernel_h;
    const int64_t j = r % g.kernel_w;
    const int64_t offset_h = i * g.dilation_h - g.pad_h;
    const int64_t offset_w = j * g.dilation_w - g.pad_w;
    const Range valid_h = valid_range(offset_h, g.stride_h, g.height, out_h);
    const Range valid_w = valid_range(offset_w, g.stride_w, g.width, out_w);
    const T* plane = image + c * g.height * g.width;
    T* dst_row = columns + r * row_length + b * cols;

    if (g.stride_h == 1 && g.stride_w == 1 && out_w == g.width) {
      same_size_row(plane, dst_row, out_h, out_w, offset_h * g.width + offset_w, valid_h, valid_w);
      continue;
    }
    for (int64_t oh = 0; oh < out_h; ++oh) {
      T* dst = dst_row + oh * out_w;
      if (oh < valid_h.lo || oh >= valid_h.hi) {  // the whole output row reads padding
        std::fill(dst, dst + out_w, zero);
        continue;
      }
      const T* src = plane + (oh * g.stride_h + offset_h) * g.width;  // input row ih
      std::fill(dst, dst + valid_w.lo, zero);
      if (g.stride_w == 1) {  // a contiguous run of the input row: a plain copy
        std::copy(src + valid_w.lo + offset_w, src + valid_w.hi + offset_w, dst + valid_w.lo);
      } else {
        for (int64_t ow = valid_w.lo; ow < valid_w.hi; ++ow) dst[ow] = src[ow * g.stride_w + offset_w];
      }
      std::fill(dst + valid_w.hi, dst + out_w, zero);
    }
  }
}

template <class T>
void col2im_typed(const Conv2dGeometry& g, const T* columns, T* images, int64_t count) {
  using Acc = acc_t<T>;
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t cols = out_h * out_w;
  const int64_t row_length = count * cols;
  const int64_t taps = g.kernel_h * g.kernel_w;
  const int64_t plane_size = g.height * g.width;
  const int64_t planes = count * g.channels;  // (image, channel) pairs
  const bool worth_threads = planes > 1 && g.column_rows() * row_length >= kConvMinParallelElements;
  (void)worth_threads;  // only read by the OpenMP pragma

#ifdef _OPENMP
#pragma omp parallel if (worth_threads)
#endif
  {
    std::vector<Acc> sum(plane_size);  // this thread's accumulator for one channel
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t unit = 0; unit < planes; ++unit) {
      const int64_t b = unit / g.channels, c = unit % g.channels;  // image b, channel c
      T* plane = images + unit * plane_size;
      for (int64_t e = 0; e < plane_size; ++e) sum[e] = static_cast<Acc>(plane[e]);

      for (int64_t tap = 0; tap < taps; ++tap) {
        const int64_t i = tap / g.kernel_w, j = tap % g.kernel_w;
        const int64_t offset_h = i * g.dilation_h - g.pad_h;
        const int64_t offset_w = j * g.dilation_w - g.pad_w;
        const Range valid_h = valid_range(offset_h, g.stride_h, g.height, out_h);
        const Range valid_w = valid_range(offset_w, g.stride_w, g.width, out_w);
        const T* src_row = columns + (c * taps + tap) * row_length + b * cols;
        for (int64_t oh = valid_h.lo; oh < valid_h.hi; ++oh) {
          const T* src = src_row + oh * out_w;
          Acc* dst = sum.data() + (oh * g.stride_h + offset_h) * g.width;  // input row ih
          for (int64_t ow = valid_w.lo; ow < valid_w.hi; ++ow) {
            dst[ow * g.stride_w + offset_w] += static_cast<Acc>(src[ow]);
          }
        }
      }

      for (int64_t e = 0; e < plane_size; ++e) plane[e] = static_cast<T>(sum[e]);
    }
  }
}

}  // namespace

void im2col(const Conv2dGeometry& g, DType dtype, const void* image, void* columns, int64_t images) {
  check_conv2d_geometry(g);
  MG_CHECK(images >= 0, "im2col: the number of images must be non-negative, got ", images);
  MG_CHECK(g.column_rows() == 0 || images == 0 || (image != nullptr && columns != nullptr),
           "im2col: null buffer");
  visit_floating(dtype, "im2col", [&](auto tag) {
    using T = typename decltype(tag)::type;
    im2col_typed(g, static_cast<const T*>(image), static_cast<T*>(columns), images);
  });
}

void col2im(const Conv2dGeometry& g, DType dtype, const void* columns, void* image, int64_t images) {
  check_conv2d_geometry(g);
  MG_CHECK(images >= 0, "col2im: the number of images must be non-negative, got ", images);
  MG_CHECK(g.column_rows() == 0 || images == 0 || (image != nullptr && columns != nullptr),
           "col2im: null buffer");
  visit_floating(dtype, "col2im", [&](auto tag) {
    using T = typename decltype(tag)::type;
    col2im_typed(g, static_cast<const T*>(columns), static_cast<T*>(image), images);
  });
}

}  // namespace mg::kernels::cpu
