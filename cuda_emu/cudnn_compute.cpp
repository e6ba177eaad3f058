// The emulated cuDNN's three convolutions: the checks of a call, its queueing on the handle's
// stream, and the arithmetic, one image at a time on contiguous arrays of the accumulation type
// (im2col, then a GEMM four rows at a time; col2im for backward data).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda_emu/axpy.h"
#include "cuda_emu/cudnn_internal.h"
#include "cuda_emu/runtime_internal.h"
#include "cuda_emu/trace.h"

namespace mg_emu::cudnn {
namespace {

// ---- the arithmetic, on contiguous arrays of the accumulation type -----------------------------
// [lo, hi): the outputs o < out whose input o*stride + offset lies in [0, in).
void valid_range(int out, int in, int stride, long long offset, int* lo, int* hi) {
  const long long first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const long long last = in - 1 - offset < 0 ? -1 : (in - 1 - offset) / stride;  // inclusive
  *lo = static_cast<int>(std::min<long long>(first, out));
  *hi = static_cast<int>(std::max<long long>(*lo, std::min<long long>(last + 1, out)));
}

// out[i1][i2][i3] (contiguous) from the d1 x d2 x d3 block at `offset` of a strided array.
template <class Acc>
void load_block(Elem e, const void* base, long long offset, const long long st[4], int d1, int d2, int d3,
                bool tf32, Acc* out) {
  for (int i1 = 0; i1 < d1; ++i1)
    for (int i2 = 0; i2 < d2; ++i2) {
      const long long row = offset + i1 * st[1] + i2 * st[2];
      Acc* dst = out + (static_cast<size_t>(i1) * d2 + i2) * d3;
      for (int i3 = 0; i3 < d3; ++i3) dst[i3] = load<Acc>(e, base, row + i3 * st[3]);
      if (tf32)
        for (int i3 = 0; i3 < d3; ++i3) dst[i3] = Acc(to_tf32(float(dst[i3])));
    }
}

// The block at `offset` = alpha src + beta block (the block unread when beta == 0).
template <class Acc>
void store_block(Elem e, void* base, long long offset, const long long st[4], int d1, int d2, int d3,
                 const Acc* src, Acc alpha, Acc beta) {
  for (int i1 = 0; i1 < d1; ++i1)
    for (int i2 = 0; i2 < d2; ++i2) {
      const long long row = offset + i1 * st[1] + i2 * st[2];
      const Acc* from = src + (static_cast<size_t>(i1) * d2 + i2) * d3;
      for (int i3 = 0; i3 < d3; ++i3) {
        Acc v = alpha * from[i3];
        if (beta != Acc(0)) v += beta * load<Acc>(e, base, row + i3 * st[3]);
        store<Acc>(e, base, row + i3 * st[3], v);
      }
    }
}

// Reverses the filter taps of every (k, c) of a [K*C][R][S] array (CUDNN_CONVOLUTION).
template <class Acc>
void flip_taps(const Problem& p, int planes, Acc* w) {
  const size_t taps = static_cast<size_t>(p.r) * p.s;
  for (int i = 0; i < planes; ++i) std::reverse(w + i * taps, w + (i + 1) * taps);
}

// C (rows x cols) += A (rows x inner) B (inner x cols), all row-major and contiguous; four rows
// of C at a time, so each row of B read feeds four accumulator rows.
template <class Acc>
void matmul_add(long long rows, long long inner, long long cols, const Acc* a, const Acc* b, Acc* c) {
  long long i = 0;
  for (; i + 4 <= rows; i += 4) {
    const Acc *a0 = a + i * inner, *a1 = a0 + inner, *a2 = a1 + inner, *a3 = a2 + inner;
    Acc* c0 = c + i * cols;
    for (long long j = 0; j < inner; ++j)
      axpy4<Acc>(cols, b + j * cols, a0[j], a1[j], a2[j], a3[j], c0, c0 + cols, c0 + 2 * cols, c0 + 3 * cols);
  }
  for (; i < rows; ++i)
    for (long long j = 0; j < inner; ++j) axpy1<Acc>(cols, b + j * cols, a[i * inner + j], c + i * cols);
}

// col[(c r s)][(oh ow)] = the input pixel tap (r, s) of output (oh, ow) sees, 0 in the padding.
template <class Acc>
void im2col(const Problem& p, const Acc* img, Acc* col) {
  for (int c = 0; c < p.c; ++c)
    for (int r = 0; r < p.r; ++r)
      for (int s = 0; s < p.s; ++s) {
        Acc* row = col + ((static_cast<size_t>(c) * p.r + r) * p.s + s) * static_cast<size_t>(p.pixels());
        const long long w_offset = static_cast<long long>(s) * p.dil_w - p.pad_w;
        int lo, hi;
        valid_range(p.ow, p.w, p.stride_w, w_offset, &lo, &hi);
        for (int oh = 0; oh < p.oh; ++oh) {
          Acc* dst = row + static_cast<size_t>(oh) * p.ow;
          const long long ih =
              static_cast<long long>(oh) * p.stride_h - p.pad_h + static_cast<long long>(r) * p.dil_h;
          if (ih < 0 || ih >= p.h) {
            std::fill(dst, dst + p.ow, Acc(0));
            continue;
          }
          const Acc* src = img + (static_cast<size_t>(c) * p.h + ih) * p.w + w_offset;
          std::fill(dst, dst + lo, Acc(0));
          for (int ow = lo; ow < hi; ++ow) dst[ow] = src[static_cast<long long>(ow) * p.stride_w];
          std::fill(dst + hi, dst + p.ow, Acc(0));
        }
      }
}

// The transpose: colT[(oh ow)][(c r s)].
template <class Acc>
void im2col_transposed(const Problem& p, const Acc* img, Acc* colT) {
  Acc* dst = colT;
  for (int oh = 0; oh < p.oh; ++oh)
    for (int ow = 0; ow < p.ow; ++ow)
      for (int c = 0; c < p.c; ++c) {
        const Acc* plane = img + static_cast<size_t>(c) * p.h * p.w;
        for (int r = 0; r < p.r; ++r) {
          const long long ih =
              static_cast<long long>(oh) * p.stride_h - p.pad_h + static_cast<long long>(r) * p.dil_h;
          const bool row_in = ih >= 0 && ih < p.h;
          for (int s = 0; s < p.s; ++s) {
            const long long iw =
                static_cast<long long>(ow) * p.stride_w - p.pad_w + static_cast<long long>(s) * p.dil_w;
            *dst++ = row_in && iw >= 0 && iw < p.w ? plane[ih * p.w + iw] : Acc(0);
          }
        }
      }
}

// img[c][h][w] = the sum of the column entries that image pixel feeds (the adjoint of im2col).
template <class Acc>
void col2im(const Problem& p, const Acc* col, Acc* img) {
  std::fill(img, img + static_cast<size_t>(p.c) * p.h * p.w, Acc(0));
  for (int c = 0; c < p.c; ++c)
    for (int r = 0; r < p.r; ++r)
      for (int s = 0; s < p.s; ++s) {
        const Acc* row =
            col + ((static_cast<size_t>(c) * p.r + r) * p.s + s) * static_cast<size_t>(p.pixels());
        const long long w_offset = static_cast<long long>(s) * p.dil_w - p.pad_w;
        int lo, hi;
        valid_range(p.ow, p.w, p.stride_w, w_offset, &lo, &hi);
        for (int oh = 0; oh < p.oh; ++oh) {
          const long long ih =
              static_cast<long long>(oh) * p.stride_h - p.pad_h + static_cast<long long>(r) * p.dil_h;
          if (ih < 0 || ih >= p.h) continue;
          Acc* dst = img + (static_cast<size_t>(c) * p.h + ih) * p.w + w_offset;
          const Acc* src = row + static_cast<size_t>(oh) * p.ow;
          for (int ow = lo; ow < hi; ++ow) dst[static_cast<long long>(ow) * p.stride_w] += src[ow];
        }
      }
}

// ---- the three convolutions --------------------------------------------------------------------
struct Call {
  Problem p;
  const void* x = nullptr;  // forward, backward filter
  const void* w = nullptr;  // forward, backward data
  const void* y = nullptr;  // dy: backward data, backward filter
  void* out = nullptr;      // y, dx or dw
  double alpha = 1, beta = 0;
  void* workspace = nullptr;   // the column buffer lives here when set
  size_t workspace_bytes = 0;  // what the algorithm needs (all of it is overwritten at the end)
};

template <class Acc>
std::vector<Acc> filter_matrix(const Call& call) {  // [K][C R S], taps flipped for CUDNN_CONVOLUTION
  const Problem& p = call.p;
  std::vector<Acc> w(static_cast<size_t>(p.k) * static_cast<size_t>(p.crs()));
  for (int k = 0; k < p.k; ++k)
    load_block<Acc>(p.elem, call.w, k * p.ws[0], p.ws, p.c, p.r, p.s, p.tf32, w.data() + k * p.crs());
  if (p.flip) flip_taps<Acc>(p, p.k * p.c, w.data());
  return w;
}

// The column buffer: the workspace for algorithms that have one, else memory of our own.
template <class Acc>
Acc* columns(const Call& call, std::vector<Acc>* own) {
  if (call.workspace != nullptr) return static_cast<Acc*>(call.workspace);
  own->resize(static_cast<size_t>(call.p.crs()) * static_cast<size_t>(call.p.pixels()));
  return own->data();
}

void finish(const Call& call) {  // the workspace's contents are garbage once the call is done
  if (call.workspace != nullptr) std::memset(call.workspace, 0xff, call.workspace_bytes);
}

template <class Acc>
void run_forward(const Call& call) {
  const Problem& p = call.p;
  const std::vector<Acc> w = filter_matrix<Acc>(call);
  std::vector<Acc> own, img(static_cast<size_t>(p.c) * p.h * p.w), acc(static_cast<size_t>(p.k) * p.pixels());
  Acc* col = columns<Acc>(call, &own);
  for (int n = 0; n < p.n; ++n) {
    load_block<Acc>(p.elem, call.x, n * p.xs[0], p.xs, p.c, p.h, p.w, p.tf32, img.data());
    im2col<Acc>(p, img.data(), col);
    std::fill(acc.begin(), acc.end(), Acc(0));
    matmul_add<Acc>(p.k, p.crs(), p.pixels(), w.data(), col, acc.data());
    store_block<Acc>(p.elem, call.out, n * p.ys[0], p.ys, p.k, p.oh, p.ow, acc.data(), Acc(call.alpha),
                     Acc(call.beta));
  }
  finish(call);
}

template <class Acc>
void run_backward_data(const Call& call) {
  const Problem& p = call.p;
  const std::vector<Acc> w = filter_matrix<Acc>(call);
  const long long crs = p.crs();
  std::vector<Acc> wt(w.size());  // [C R S][K]
  for (int k = 0; k < p.k; ++k)
    for (long long j = 0; j < crs; ++j) wt[j * p.k + k] = w[k * crs + j];
  std::vector<Acc> own, dy(static_cast<size_t>(p.k) * p.pixels()), img(static_cast<size_t>(p.c) * p.h * p.w);
  Acc* col = columns<Acc>(call, &own);
  for (int n = 0; n < p.n; ++n) {
    load_block<Acc>(p.elem, call.y, n * p.ys[0], p.ys, p.k, p.oh, p.ow, p.tf32, dy.data());
    std::fill(col, col + crs * p.pixels(), Acc(0));
    matmul_add<Acc>(crs, p.k, p.pixels(), wt.data(), dy.data(), col);
    col2im<Acc>(p, col, img.data());
    store_block<Acc>(p.elem, call.out, n * p.xs[0], p.xs, p.c, p.h, p.w, img.data(), Acc(call.alpha),
                     Acc(call.beta));
  }
  finish(call);
}

template <class Acc>
void run_backward_filter(const Call& call) {
  const Problem& p = call.p;
  const long long crs = p.crs();
  std::vector<Acc> own, img(static_cast<size_t>(p.c) * p.h * p.w), dy(static_cast<size_t>(p.k) * p.pixels());
  std::vector<Acc> part(static_cast<size_t>(p.k * crs)), total(part.size(), Acc(0));
  Acc* colT = columns<Acc>(call, &own);
  for (int n = 0; n < p.n; ++n) {
    load_block<Acc>(p.elem, call.x, n * p.xs[0], p.xs, p.c, p.h, p.w, p.tf32, img.data());
    load_block<Acc>(p.elem, call.y, n * p.ys[0], p.ys, p.k, p.oh, p.ow, p.tf32, dy.data());
    im2col_transposed<Acc>(p, img.data(), colT);
    std::fill(part.begin(), part.end(), Acc(0));
    matmul_add<Acc>(p.k, p.pixels(), crs, dy.data(), colT, part.data());
    for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];  // one partial sum per image
  }
  if (p.flip) flip_taps<Acc>(p, p.k * p.c, total.data());
  for (int k = 0; k < p.k; ++k)
    store_block<Acc>(p.elem, call.out, k * p.ws[0], p.ws, p.c, p.r, p.s, total.data() + k * crs,
                     Acc(call.alpha), Acc(call.beta));
  finish(call);
}

// Bytes from a strided 4-d array's start to one past its last element.
size_t extent_bytes(const int dims[4], const long long strides[4], Elem e) {
  long long last = 0;
  for (int i = 0; i < 4; ++i) last += static_cast<long long>(dims[i] - 1) * strides[i];
  return static_cast<size_t>(last + 1) * elem_bytes(e);
}

bool device_check(const char* fn, const char* what, const void* p, size_t bytes, cudnnStatus_t* status) {
  if (p != nullptr && mg_emu::is_device_range(p, bytes)) return true;
  char text[200];
  std::snprintf(text, sizeof text, "%s (%p, %zu bytes) is not device memory", what, p, bytes);
  *status = fail(fn, CUDNN_STATUS_BAD_PARAM, text);
  return false;
}

// The common part of the three convolution calls: check everything, then queue the work.

}  // namespace

cudnnStatus_t convolve(const char* fn, Dir d, cudnnHandle_t handle, const void* alpha,
                       const cudnnTensorStruct* xd, const void* x, const cudnnFilterStruct* wd, const void* w,
                       const cudnnConvolutionStruct* cd, int algo, void* workspace, size_t workspace_bytes,
                       const void* beta, const cudnnTensorStruct* yd, const void* y, void* out) {
  Call call;
  cudnnStatus_t status = resolve(fn, handle, xd, wd, cd, yd, &call.p);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  const Problem& p = call.p;
  if (alpha == nullptr || beta == nullptr)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "alpha or beta is a null pointer");
  size_t needed = 0;
  status = workspace_for(fn, d, p, algo, &needed);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  if (needed > 0 && (workspace == nullptr || workspace_bytes < needed))
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "algorithm " + std::to_string(algo) + " needs a workspace of " + std::to_string(needed) +
                    " bytes, given " +
                    (workspace == nullptr ? std::string("none") : std::to_string(workspace_bytes)));
  const int device = mg_emu::stream_device(handle->stream);
  if (device < 0) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the handle's stream does not exist (destroyed?)");
  if (device != handle->device)
    return fail(fn, CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH,
                "the handle belongs to device " + std::to_string(handle->device) +
                    " but its stream to device " + std::to_string(device));
  const size_t x_bytes = extent_bytes(xd->dims, xd->strides, p.elem);
  const size_t y_bytes = extent_bytes(yd->dims, yd->strides, p.elem);
  const size_t w_bytes = extent_bytes(wd->dims, wd->strides, p.elem);
  const char* out_name = d == Dir::forward ? "y" : d == Dir::backward_data ? "dx" : "dw";
  const size_t out_bytes = d == Dir::forward ? y_bytes : d == Dir::backward_data ? x_bytes : w_bytes;
  const bool ok = (d == Dir::backward_data || device_check(fn, "x", x, x_bytes, &status)) &&
                  (d == Dir::backward_filter || device_check(fn, "w", w, w_bytes, &status)) &&
                  (d == Dir::forward || device_check(fn, "dy", y, y_bytes, &status)) &&
                  device_check(fn, out_name, out, out_bytes, &status) &&
                  (needed == 0 || device_check(fn, "the workspace", workspace, needed, &status));
  if (!ok) return status;
  call.x = x, call.w = w, call.y = y, call.out = out;
  call.alpha = p.f64 ? *static_cast<const double*>(alpha) : double(*static_cast<const float*>(alpha));
  call.beta = p.f64 ? *static_cast<const double*>(beta) : double(*static_cast<const float*>(beta));
  call.workspace = needed > 0 ? workspace : nullptr;
  call.workspace_bytes = needed;
  // The profiler (cuda_emu/profiler.h) prices this call at its roofline: 2 N K C R S P Q FLOPs in
  // every direction, on tensor cores for 16-bit data or TF32, x, w and y moved once each.
  mg_emu::trace_library_call(fn, 2.0 * double(p.n) * p.k * double(p.crs()) * double(p.pixels()),
                             p.elem == Elem::bf16 || p.elem == Elem::f16 || p.tf32,
                             double(x_bytes + w_bytes + y_bytes));
  mg_emu::enqueue(handle->stream, fn, [call, d] {
    switch (d) {
      case Dir::forward: return call.p.f64 ? run_forward<double>(call) : run_forward<float>(call);
      case Dir::backward_data:
        return call.p.f64 ? run_backward_data<double>(call) : run_backward_data<float>(call);
      case Dir::backward_filter:
        return call.p.f64 ? run_backward_filter<double>(call) : run_backward_filter<float>(call);
    }
  });
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace mg_emu::cudnn
