// The cuDNN entry points multigrad calls (kernels/cuda/conv_cudnn.cpp), emulated on the host
// (build mode -DMG_CUDA=EMULATE).
//
// What is emulated. Handles (cudnnCreate/Destroy, SetStream), error strings (cudnnGetErrorString
// gives the enumerator's name; cudnnGetLastErrorString this thread's explanation of its last
// failure, then forgets it), 4-d tensor, filter and 2-d convolution descriptors, the output-shape
// helper, the v7 heuristics, workspace sizes, and the three convolutions:
//   forward          y  = alpha conv(x, w) + beta y
//   backward data    dx = alpha conv_transpose(dy, w) + beta dx
//   backward filter  dw = alpha sum over the batch of corr(x, dy) + beta dw
// with padding, stride and dilation, CUDNN_CROSS_CORRELATION or CUDNN_CONVOLUTION (flipped
// filter), one group. Tensors: any 4-d strides (cudnnSetTensor4dDescriptor's NCHW or NHWC, or
// cudnnSetTensor4dDescriptorEx). Filters: NCHW (KCRS) or NHWC (KRSC). Configurations (data type /
// compute type of the convolution descriptor), as cuDNN's legacy API lists them:
//   FLOAT/FLOAT, DOUBLE/DOUBLE (double sums), HALF/FLOAT ("pseudo half"), HALF/HALF (true half:
//   here also summed in float), BFLOAT16/FLOAT; 16-bit results are rounded to nearest even once.
// Math type: float data with CUDNN_DEFAULT_MATH or a tensor-op math type sees its inputs rounded
// to TF32 (as cuDNN runs it on tensor cores since Ampere); CUDNN_FMA_MATH keeps full float.
// alpha and beta are host scalars, double for double data and float otherwise, read at the call;
// beta == 0 never reads the output (it may hold NaN).
//
// Algorithms. Forward offers IMPLICIT_PRECOMP_GEMM (then IMPLICIT_GEMM, GEMM), backward data
// and backward filter ALGO_1 (then ALGO_0). IMPLICIT_GEMM and the two ALGO_0 need no workspace;
// the others need one image's column buffer (C*R*S*OH*OW accumulators), which they really keep in
// the caller's workspace and which is overwritten with 0xff bytes when the call is done, so a
// workspace that is too small, shared, or read afterwards shows. All algorithms compute the same
// numbers. Other algorithms: CUDNN_STATUS_NOT_SUPPORTED (listed as such by the heuristics).
//
// What is checked, on the caller's thread, before anything is queued:
//   CUDNN_STATUS_BAD_PARAM        null or unknown handle, descriptor or pointer (also an unset
//                                 descriptor, null alpha/beta); bad descriptor values (a size
//                                 < 1, a negative stride or padding, a stride or dilation < 1, an
//                                 invalid enumerant); x and w channel counts differ; data types of
//                                 x, w, y differ; a dilated filter larger than the padded input; y's
//                                 N or C not x's N and w's K; an algorithm outside the enumeration;
//                                 a workspace smaller than the algorithm needs (or null); memory
//                                 that is not device memory over a tensor's extent (an emulation
//                                 check: cuDNN would fault); a stream that no longer exists;
//   CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH  the stream belongs to another device than the handle;
//   CUDNN_STATUS_NOT_SUPPORTED    a data/compute type configuration above does not list; y's H, W
//                                 not cudnnGetConvolution2dForwardOutputDim's (as cuDNN documents);
//                                 a tensor over 2^31 elements; NCHW_VECT_C; an algorithm not offered.
// Every failure leaves its explanation for cudnnGetLastErrorString.
//
// Execution runs in mg_emu::enqueue on the handle's stream, one image at a time: the image is
// converted to the accumulation type (float, double for DOUBLE), unfolded into columns (im2col)
// and multiplied by the filter matrix four rows at a time with a contiguous inner loop (backward
// data: the filter's transpose times dy, folded back with col2im; backward filter: dy times the
// transposed columns, one partial sum per image added to the total). Queued work holds copies of
// the descriptors, so they may be changed or destroyed once the call returns.
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda_emu/elements.h"
#include "cuda_emu/runtime_internal.h"

// The opaque types cudnn.h forward-declares.
struct cudnnContext {
  int device = 0;                 // current at cudnnCreate
  cudaStream_t stream = nullptr;  // nullptr: the legacy default stream
};
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int dims[4] = {0, 0, 0, 0};  // n, c, h, w
  long long strides[4] = {0, 0, 0, 0};
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int dims[4] = {0, 0, 0, 0};  // k, c, r (height), s (width)
  long long strides[4] = {0, 0, 0, 0};
};
struct cudnnConvolutionStruct {
  bool set = false;
  int pad[2] = {0, 0}, stride[2] = {1, 1}, dilation[2] = {1, 1};
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

using mg_emu::bf16_to_float;
using mg_emu::Elem;
using mg_emu::elem_bytes;
using mg_emu::float_to_bf16;
using mg_emu::float_to_half;
using mg_emu::half_to_float;
using mg_emu::load;
using mg_emu::store;
using mg_emu::to_tf32;

namespace {

// ---- object registries and the last error -----------------------------------------------------
template <class T>
struct Registry {
  std::mutex mutex;
  std::unordered_set<const T*> live;
};
template <class T>
Registry<T>& registry() {
  static auto* r = new Registry<T>();
  return *r;
}
template <class T>
bool is_live(const T* p) {
  if (p == nullptr) return false;
  Registry<T>& r = registry<T>();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.live.count(p) != 0;
}
template <class T>
cudnnStatus_t create(T** out) {
  if (out == nullptr) return CUDNN_STATUS_BAD_PARAM;
  T* p = new T();
  Registry<T>& r = registry<T>();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.insert(p);
  *out = p;
  return CUDNN_STATUS_SUCCESS;
}
// Null is a no-op for descriptors, as in cuDNN; an unknown pointer (destroyed twice?) is refused.
template <class T>
cudnnStatus_t destroy(T* p) {
  if (p == nullptr) return CUDNN_STATUS_SUCCESS;
  Registry<T>& r = registry<T>();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.live.erase(p) == 0) return CUDNN_STATUS_BAD_PARAM;
  }
  delete p;
  return CUDNN_STATUS_SUCCESS;
}

thread_local std::string t_last_error;

cudnnStatus_t fail(const char* fn, cudnnStatus_t status, const std::string& why) {
  t_last_error = std::string(fn) + ": " + why;
  return status;
}

// ---- element types -----------------------------------------------------------------------------

bool valid_data_type(cudnnDataType_t t) {
  return int(t) >= CUDNN_DATA_FLOAT && int(t) <= CUDNN_DATA_COMPLEX_FP64;
}

// ---- the problem, resolved from the descriptors (by value: queued work keeps a copy) ----------
struct Problem {
  Elem elem = Elem::f32;
  bool f64 = false, tf32 = false, flip = false;
  int n = 0, c = 0, h = 0, w = 0;  // x (or dx)
  int k = 0, r = 0, s = 0;         // the filter
  int oh = 0, ow = 0;              // y (or dy)
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  long long xs[4] = {}, ys[4] = {}, ws[4] = {};  // element strides of x, y and the filter
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  long long crs() const { return static_cast<long long>(c) * r * s; }
  long long pixels() const { return static_cast<long long>(oh) * ow; }
};

// One spatial output size, or -1 when the dilated filter does not fit the padded input.
int output_size(int in, int pad, int filter, int dilation, int stride) {
  const long long span = static_cast<long long>(filter - 1) * dilation + 1;
  const long long room = static_cast<long long>(in) + 2LL * pad - span;
  return room < 0 ? -1 : static_cast<int>(room / stride + 1);
}

cudnnStatus_t output_dims(const char* fn, const cudnnConvolutionStruct* cd, const cudnnTensorStruct* xd,
                          const cudnnFilterStruct* wd, int out[4]) {
  if (!is_live(cd) || !cd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the convolution descriptor is null or unset");
  if (!is_live(xd) || !xd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the input tensor descriptor is null or unset");
  if (!is_live(wd) || !wd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the filter descriptor is null or unset");
  if (xd->dims[1] != wd->dims[1])
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "the input has " + std::to_string(xd->dims[1]) + " channels but the filter takes " +
                    std::to_string(wd->dims[1]) + " (one group)");
  out[0] = xd->dims[0], out[1] = wd->dims[0];
  for (int i = 0; i < 2; ++i) {
    out[2 + i] = output_size(xd->dims[2 + i], cd->pad[i], wd->dims[2 + i], cd->dilation[i], cd->stride[i]);
    if (out[2 + i] < 1)
      return fail(fn, CUDNN_STATUS_BAD_PARAM,
                  std::string("the dilated filter is larger than the padded input in ") +
                      (i == 0 ? "height" : "width"));
  }
  return CUDNN_STATUS_SUCCESS;
}

// Checks the descriptors of one convolution (x: the input or dx, y: the output or dy).
cudnnStatus_t resolve(const char* fn, cudnnHandle_t handle, const cudnnTensorStruct* xd,
                      const cudnnFilterStruct* wd, const cudnnConvolutionStruct* cd,
                      const cudnnTensorStruct* yd, Problem* p) {
  if (!is_live(handle))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the handle is null or not one cudnnCreate made");
  if (!is_live(yd) || !yd->set)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the output tensor descriptor is null or unset");
  int out[4];
  const cudnnStatus_t dims = output_dims(fn, cd, xd, wd, out);
  if (dims != CUDNN_STATUS_SUCCESS) return dims;
  if (xd->type != wd->type || xd->type != yd->type)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the tensors' and the filter's data types differ");
  const cudnnDataType_t data = xd->type, compute = cd->compute;
  if (data == CUDNN_DATA_FLOAT && compute == CUDNN_DATA_FLOAT)
    p->elem = Elem::f32;
  else if (data == CUDNN_DATA_DOUBLE && compute == CUDNN_DATA_DOUBLE)
    p->elem = Elem::f64;
  else if (data == CUDNN_DATA_HALF && (compute == CUDNN_DATA_FLOAT || compute == CUDNN_DATA_HALF))
    p->elem = Elem::f16;
  else if (data == CUDNN_DATA_BFLOAT16 && compute == CUDNN_DATA_FLOAT)
    p->elem = Elem::bf16;
  else
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED,
                "data type " + std::to_string(int(data)) + " with compute type " +
                    std::to_string(int(compute)) +
                    " is not a supported configuration (FLOAT/FLOAT, DOUBLE/DOUBLE, HALF/FLOAT, HALF/HALF, "
                    "BFLOAT16/FLOAT)");
  if (yd->dims[0] != out[0] || yd->dims[1] != out[1])
    return fail(
        fn, CUDNN_STATUS_BAD_PARAM,
        "the output tensor has N=" + std::to_string(yd->dims[0]) + ", C=" + std::to_string(yd->dims[1]) +
            " where the input and filter give N=" + std::to_string(out[0]) + ", C=" + std::to_string(out[1]));
  if (yd->dims[2] != out[2] || yd->dims[3] != out[3])
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED,
                "the output tensor is " + std::to_string(yd->dims[2]) + "x" + std::to_string(yd->dims[3]) +
                    " where cudnnGetConvolution2dForwardOutputDim gives " + std::to_string(out[2]) + "x" +
                    std::to_string(out[3]));
  p->f64 = p->elem == Elem::f64;
  p->tf32 = p->elem == Elem::f32 && cd->math != CUDNN_FMA_MATH;
  p->flip = cd->mode == CUDNN_CONVOLUTION;
  p->math = cd->math;
  p->n = xd->dims[0], p->c = xd->dims[1], p->h = xd->dims[2], p->w = xd->dims[3];
  p->k = wd->dims[0], p->r = wd->dims[2], p->s = wd->dims[3];
  p->oh = out[2], p->ow = out[3];
  p->pad_h = cd->pad[0], p->pad_w = cd->pad[1];
  p->stride_h = cd->stride[0], p->stride_w = cd->stride[1];
  p->dil_h = cd->dilation[0], p->dil_w = cd->dilation[1];
  for (int i = 0; i < 4; ++i) p->xs[i] = xd->strides[i], p->ys[i] = yd->strides[i], p->ws[i] = wd->strides[i];
  return CUDNN_STATUS_SUCCESS;
}

// ---- algorithms --------------------------------------------------------------------------------
enum class Dir { forward, backward_data, backward_filter };

struct Algo {
  int id;
  bool workspace;  // keeps the column buffer in the caller's workspace
  cudnnDeterminism_t determinism;
  float cost;  // relative, for the heuristics' time estimate
};

// The algorithms offered, best first.
std::vector<Algo> offered(Dir d) {
  switch (d) {
    case Dir::forward:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, CUDNN_DETERMINISTIC, 1.0f},
              {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, false, CUDNN_DETERMINISTIC, 1.4f},
              {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, true, CUDNN_DETERMINISTIC, 1.8f}};
    case Dir::backward_data:
      return {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, CUDNN_DETERMINISTIC, 1.0f},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false, CUDNN_NON_DETERMINISTIC, 1.5f}};
    case Dir::backward_filter:
      return {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, CUDNN_DETERMINISTIC, 1.0f},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false, CUDNN_NON_DETERMINISTIC, 1.5f}};
  }
  return {};
}

int algo_count(Dir d) {
  switch (d) {
    case Dir::forward: return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Dir::backward_data: return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case Dir::backward_filter: return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
  return 0;
}

size_t column_bytes(const Problem& p) {
  return static_cast<size_t>(p.crs()) * static_cast<size_t>(p.pixels()) *
         (p.f64 ? sizeof(double) : sizeof(float));
}

// The workspace `algo` needs for p, or a failure for an algorithm not offered / out of range.
cudnnStatus_t workspace_for(const char* fn, Dir d, const Problem& p, int algo, size_t* bytes) {
  if (algo < 0 || algo >= algo_count(d))
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "algorithm " + std::to_string(algo) + " is not in the enumeration");
  for (const Algo& a : offered(d))
    if (a.id == algo) {
      *bytes = a.workspace ? column_bytes(p) : 0;
      return CUDNN_STATUS_SUCCESS;
    }
  return fail(fn, CUDNN_STATUS_NOT_SUPPORTED, "algorithm " + std::to_string(algo) + " is not available here");
}

// What cudnnGet*Algorithm_v7 reports: the offered algorithms, then the rest as not supported.
template <class Perf, class AlgoEnum>
cudnnStatus_t heuristics(const char* fn, Dir d, cudnnStatus_t resolved, const Problem& p, int requested,
                         int* returned, Perf* perf) {
  if (resolved != CUDNN_STATUS_SUCCESS) return resolved;
  if (requested < 1 || returned == nullptr || perf == nullptr)
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "requestedAlgoCount < 1, or a null returnedAlgoCount or perfResults");
  const double flops = 2.0 * p.n * p.k * double(p.crs()) * double(p.pixels());
  std::vector<Perf> list;
  std::vector<bool> listed(static_cast<size_t>(algo_count(d)), false);
  for (const Algo& a : offered(d)) {
    Perf e{};
    e.algo = static_cast<AlgoEnum>(a.id);
    e.status = CUDNN_STATUS_SUCCESS;
    e.time = static_cast<float>(flops / 1e9 * a.cost);  // a model: milliseconds at 1 TFLOP/s
    e.memory = a.workspace ? column_bytes(p) : 0;
    e.determinism = a.determinism;
    e.mathType = p.math;
    list.push_back(e);
    listed[static_cast<size_t>(a.id)] = true;
  }
  for (int id = 0; id < algo_count(d); ++id) {
    if (listed[static_cast<size_t>(id)]) continue;
    Perf e{};
    e.algo = static_cast<AlgoEnum>(id);
    e.status = CUDNN_STATUS_NOT_SUPPORTED;
    e.time = -1.0f;
    e.determinism = CUDNN_NON_DETERMINISTIC;
    e.mathType = p.math;
    list.push_back(e);
  }
  const int count = std::min<int>(requested, static_cast<int>(list.size()));
  std::copy(list.begin(), list.begin() + count, perf);
  *returned = count;
  return CUDNN_STATUS_SUCCESS;
}

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

template <class Acc>
void axpy4(long long n, const Acc* __restrict b, Acc a0, Acc a1, Acc a2, Acc a3, Acc* __restrict c0,
           Acc* __restrict c1, Acc* __restrict c2, Acc* __restrict c3) {
  for (long long i = 0; i < n; ++i) {
    const Acc v = b[i];
    c0[i] += a0 * v;
    c1[i] += a1 * v;
    c2[i] += a2 * v;
    c3[i] += a3 * v;
  }
}

template <class Acc>
void axpy1(long long n, const Acc* __restrict b, Acc a, Acc* __restrict c) {
  for (long long i = 0; i < n; ++i) c[i] += a * b[i];
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

// Strides of a packed 4-d array of dims (n, c, h, w) in NCHW or NHWC order.
cudnnStatus_t packed_strides(const char* fn, cudnnTensorFormat_t format, const int d[4], long long st[4]) {
  const long long c = d[1], h = d[2], w = d[3];
  if (format == CUDNN_TENSOR_NCHW) {
    st[0] = c * h * w, st[1] = h * w, st[2] = w, st[3] = 1;
  } else if (format == CUDNN_TENSOR_NHWC) {
    st[0] = h * w * c, st[1] = 1, st[2] = w * c, st[3] = c;
  } else if (format == CUDNN_TENSOR_NCHW_VECT_C) {
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED, "CUDNN_TENSOR_NCHW_VECT_C is not emulated");
  } else {
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid tensor format " + std::to_string(int(format)));
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t check_dims(const char* fn, cudnnDataType_t type, const int d[4]) {
  if (!valid_data_type(type))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid data type " + std::to_string(int(type)));
  for (int i = 0; i < 4; ++i)
    if (d[i] < 1) return fail(fn, CUDNN_STATUS_BAD_PARAM, "a dimension is < 1: " + std::to_string(d[i]));
  if (double(d[0]) * d[1] * d[2] * d[3] > double(INT_MAX))
    return fail(fn, CUDNN_STATUS_NOT_SUPPORTED, "more than 2^31 - 1 elements");
  return CUDNN_STATUS_SUCCESS;
}

// Sets a tensor or filter descriptor: packed in `format`, or with explicit `strides`.
template <class Desc>
cudnnStatus_t set_4d(const char* fn, Desc* desc, cudnnDataType_t type, const int dims[4],
                     cudnnTensorFormat_t format, const long long* strides) {
  if (!is_live(desc)) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the descriptor is null or unknown");
  long long st[4];
  cudnnStatus_t status = check_dims(fn, type, dims);
  if (status == CUDNN_STATUS_SUCCESS && strides == nullptr) status = packed_strides(fn, format, dims, st);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  for (int i = 0; strides != nullptr && i < 4; ++i) {
    if (strides[i] < 0) return fail(fn, CUDNN_STATUS_BAD_PARAM, "a stride is negative");
    st[i] = strides[i];
  }
  desc->type = type;
  std::copy(dims, dims + 4, desc->dims);
  std::copy(st, st + 4, desc->strides);
  desc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

// cudnnStatus_t's names (as cudnnGetErrorString gives them), by category (code / 1000) and
// specific error (code % 1000), the way cudnn_graph.h numbers them.
const char* status_name(int code) {
  static const char* const kNames[6][16] = {
      {"CUDNN_STATUS_SUCCESS"},
      {nullptr, "CUDNN_STATUS_NOT_INITIALIZED", "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
       "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH", "CUDNN_STATUS_DEPRECATED", "CUDNN_STATUS_LICENSE_ERROR",
       "CUDNN_STATUS_RUNTIME_IN_PROGRESS", "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
       "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"},
      {"CUDNN_STATUS_BAD_PARAM", "CUDNN_STATUS_INVALID_VALUE", "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
       "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER", "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
       "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND", "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
       "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH", "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
       "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES", "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
       "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH", "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE"},
      {"CUDNN_STATUS_NOT_SUPPORTED", "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
       "CUDNN_STATUS_NOT_SUPPORTED_SHAPE", "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
       "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT", "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
       "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART", "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
       "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
       "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
       "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT", "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
       "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM", "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
       "CUDNN_STATUS_NOT_SUPPORTED_INVALID_DYNAMIC_SHAPE"},
      {"CUDNN_STATUS_INTERNAL_ERROR", "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
       "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE", "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
       "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
       "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED"},
      {"CUDNN_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
       "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS", "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
       "CUDNN_STATUS_EXECUTION_FAILED_CURAND"},
  };
  const int category = code / 1000, specific = code % 1000;
  const char* name = code >= 0 && category < 6 && specific < 16 ? kNames[category][specific] : nullptr;
  return name != nullptr ? name : "CUDNN_UNKNOWN_STATUS";
}

}  // namespace

extern "C" {

const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) { return status_name(int(status)); }

void CUDNNWINAPI cudnnGetLastErrorString(char* message, size_t max_size) {
  if (message == nullptr || max_size == 0) return;
  const size_t n = std::min(max_size - 1, t_last_error.size());
  std::memcpy(message, t_last_error.data(), n);
  message[n] = '\0';
  t_last_error.clear();
}

cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t* handle) {
  if (handle == nullptr) return fail("cudnnCreate", CUDNN_STATUS_BAD_PARAM, "handle is a null pointer");
  const cudnnStatus_t status = create(handle);
  if (status == CUDNN_STATUS_SUCCESS) (*handle)->device = mg_emu::current_device();
  return status;
}

cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle) {
  if (handle == nullptr || destroy(handle) != CUDNN_STATUS_SUCCESS)
    return fail("cudnnDestroy", CUDNN_STATUS_BAD_PARAM, "the handle is null or not one cudnnCreate made");
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  const char* fn = "cudnnSetStream";
  if (!is_live(handle))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "the handle is null or not one cudnnCreate made");
  const int device = mg_emu::stream_device(streamId);
  if (device < 0) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the stream does not exist");
  if (device != handle->device)
    return fail(fn, CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH,
                "the handle belongs to device " + std::to_string(handle->device) +
                    " but the stream to device " + std::to_string(device));
  handle->stream = streamId;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) {
  return create(tensorDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  return destroy(tensorDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* filterDesc) {
  return create(filterDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc) {
  return destroy(filterDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* convDesc) {
  return create(convDesc);
}
cudnnStatus_t CUDNNWINAPI cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc) {
  return destroy(convDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                                     cudnnTensorFormat_t format, cudnnDataType_t dataType,
                                                     int n, int c, int h, int w) {
  const int dims[4] = {n, c, h, w};
  return set_4d("cudnnSetTensor4dDescriptor", tensorDesc, dataType, dims, format, nullptr);
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc,
                                                       cudnnDataType_t dataType, int n, int c, int h, int w,
                                                       int nStride, int cStride, int hStride, int wStride) {
  const int dims[4] = {n, c, h, w};
  const long long strides[4] = {nStride, cStride, hStride, wStride};
  return set_4d("cudnnSetTensor4dDescriptorEx", tensorDesc, dataType, dims, CUDNN_TENSOR_NCHW, strides);
}

// NHWC filters are KRSC.
cudnnStatus_t CUDNNWINAPI cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc,
                                                     cudnnDataType_t dataType, cudnnTensorFormat_t format,
                                                     int k, int c, int h, int w) {
  const int dims[4] = {k, c, h, w};
  return set_4d("cudnnSetFilter4dDescriptor", filterDesc, dataType, dims, format, nullptr);
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc, int pad_h,
                                                          int pad_w, int u, int v, int dilation_h,
                                                          int dilation_w, cudnnConvolutionMode_t mode,
                                                          cudnnDataType_t computeType) {
  const char* fn = "cudnnSetConvolution2dDescriptor";
  if (!is_live(convDesc)) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the descriptor is null or unknown");
  if (pad_h < 0 || pad_w < 0 || u < 1 || v < 1 || dilation_h < 1 || dilation_w < 1)
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "padding must be >= 0, strides and dilations >= 1 (pad " + std::to_string(pad_h) + "," +
                    std::to_string(pad_w) + ", stride " + std::to_string(u) + "," + std::to_string(v) +
                    ", dilation " + std::to_string(dilation_h) + "," + std::to_string(dilation_w) + ")");
  if (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid convolution mode " + std::to_string(int(mode)));
  if (!valid_data_type(computeType))
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid compute type " + std::to_string(int(computeType)));
  convDesc->pad[0] = pad_h, convDesc->pad[1] = pad_w;
  convDesc->stride[0] = u, convDesc->stride[1] = v;
  convDesc->dilation[0] = dilation_h, convDesc->dilation[1] = dilation_w;
  convDesc->mode = mode;
  convDesc->compute = computeType;
  convDesc->set = true;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
                                                      cudnnMathType_t mathType) {
  const char* fn = "cudnnSetConvolutionMathType";
  if (!is_live(convDesc)) return fail(fn, CUDNN_STATUS_BAD_PARAM, "the descriptor is null or unknown");
  if (int(mathType) < CUDNN_DEFAULT_MATH || int(mathType) > CUDNN_FMA_MATH)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "invalid math type " + std::to_string(int(mathType)));
  convDesc->math = mathType;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
                                                                const cudnnTensorDescriptor_t inputTensorDesc,
                                                                const cudnnFilterDescriptor_t filterDesc,
                                                                int* n, int* c, int* h, int* w) {
  const char* fn = "cudnnGetConvolution2dForwardOutputDim";
  if (n == nullptr || c == nullptr || h == nullptr || w == nullptr)
    return fail(fn, CUDNN_STATUS_BAD_PARAM, "an output pointer is null");
  int out[4];
  const cudnnStatus_t status = output_dims(fn, convDesc, inputTensorDesc, filterDesc, out);
  if (status != CUDNN_STATUS_SUCCESS) return status;
  *n = out[0], *c = out[1], *h = out[2], *w = out[3];
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  const char* fn = "cudnnGetConvolutionForwardAlgorithm_v7";
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, srcDesc, filterDesc, convDesc, destDesc, &p);
  return heuristics<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      fn, Dir::forward, status, p, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  const char* fn = "cudnnGetConvolutionBackwardDataAlgorithm_v7";
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, gradDesc, filterDesc, convDesc, diffDesc, &p);
  return heuristics<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      fn, Dir::backward_data, status, p, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    const int requestedAlgoCount, int* returnedAlgoCount, cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  const char* fn = "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, srcDesc, gradDesc, convDesc, diffDesc, &p);
  return heuristics<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      fn, Dir::backward_filter, status, p, requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionForwardWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  const char* fn = "cudnnGetConvolutionForwardWorkspaceSize";
  if (sizeInBytes == nullptr) return fail(fn, CUDNN_STATUS_BAD_PARAM, "sizeInBytes is a null pointer");
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, xDesc, wDesc, convDesc, yDesc, &p);
  return status != CUDNN_STATUS_SUCCESS ? status : workspace_for(fn, Dir::forward, p, algo, sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  const char* fn = "cudnnGetConvolutionBackwardDataWorkspaceSize";
  if (sizeInBytes == nullptr) return fail(fn, CUDNN_STATUS_BAD_PARAM, "sizeInBytes is a null pointer");
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, dxDesc, wDesc, convDesc, dyDesc, &p);
  return status != CUDNN_STATUS_SUCCESS ? status
                                        : workspace_for(fn, Dir::backward_data, p, algo, sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, size_t* sizeInBytes) {
  const char* fn = "cudnnGetConvolutionBackwardFilterWorkspaceSize";
  if (sizeInBytes == nullptr) return fail(fn, CUDNN_STATUS_BAD_PARAM, "sizeInBytes is a null pointer");
  Problem p;
  const cudnnStatus_t status = resolve(fn, handle, xDesc, gradDesc, convDesc, dyDesc, &p);
  return status != CUDNN_STATUS_SUCCESS ? status
                                        : workspace_for(fn, Dir::backward_filter, p, algo, sizeInBytes);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha,
                                                  const cudnnTensorDescriptor_t xDesc, const void* x,
                                                  const cudnnFilterDescriptor_t wDesc, const void* w,
                                                  const cudnnConvolutionDescriptor_t convDesc,
                                                  cudnnConvolutionFwdAlgo_t algo, void* workSpace,
                                                  size_t workSpaceSizeInBytes, const void* beta,
                                                  const cudnnTensorDescriptor_t yDesc, void* y) {
  return convolve("cudnnConvolutionForward", Dir::forward, handle, alpha, xDesc, x, wDesc, w, convDesc, algo,
                  workSpace, workSpaceSizeInBytes, beta, yDesc, nullptr, y);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha,
                                                       const cudnnFilterDescriptor_t wDesc, const void* w,
                                                       const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                                       const cudnnConvolutionDescriptor_t convDesc,
                                                       cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                                       size_t workSpaceSizeInBytes, const void* beta,
                                                       const cudnnTensorDescriptor_t dxDesc, void* dx) {
  return convolve("cudnnConvolutionBackwardData", Dir::backward_data, handle, alpha, dxDesc, nullptr, wDesc,
                  w, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dyDesc, dy, dx);
}

cudnnStatus_t CUDNNWINAPI cudnnConvolutionBackwardFilter(
    cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc, const void* x,
    const cudnnTensorDescriptor_t dyDesc, const void* dy, const cudnnConvolutionDescriptor_t convDesc,
    cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
    const cudnnFilterDescriptor_t dwDesc, void* dw) {
  return convolve("cudnnConvolutionBackwardFilter", Dir::backward_filter, handle, alpha, xDesc, x, dwDesc,
                  nullptr, convDesc, algo, workSpace, workSpaceSizeInBytes, beta, dyDesc, dy, dw);
}

}  // extern "C"
