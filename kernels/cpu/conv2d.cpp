// conv2d forward and backward on the CPU, one image per thread. The why is in conv2d.h.
//
// Cost per image: the GEMMs do 2*O*CK*S flops each (forward; and twice that backward), on a
// column buffer of CK*S elements that this thread has just written and that stays in its L2
// (im2col and col2im move memory only: conv.cpp). Nothing is written per batch except the
// outputs themselves and one O*CK partial weight gradient per thread.
#include "kernels/cpu/conv2d.h"

#include <algorithm>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/gemm.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace mg::kernels::cpu {

namespace {

// The calling thread's column buffer: grown on demand and kept for the next call (the same
// shapes come back every training step), unless it grew past kKeepBytes.
constexpr size_t kKeepBytes = size_t{16} << 20;

template <class T>
T* column_buffer(std::vector<T>& buffer, int64_t elements) {
  if (buffer.size() < static_cast<size_t>(elements)) buffer.resize(static_cast<size_t>(elements));
  return buffer.data();
}

template <class T>
void release_if_large(std::vector<T>& buffer) {
  if (buffer.size() * sizeof(T) > kKeepBytes) std::vector<T>().swap(buffer);
}

template <class T>
std::vector<T>& thread_columns() {
  thread_local std::vector<T> buffer;
  return buffer;
}

// How many threads share the batch: one per image at most.
int threads_for(int64_t batch) {
#ifdef _OPENMP
  if (omp_in_parallel()) return 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), batch)));
#else
  (void)batch;
  return 1;
#endif
}

int thread_index() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// Images [begin, end) of `batch` for thread t of n: contiguous, sizes differing by at most one.
void share(int64_t batch, int t, int n, int64_t& begin, int64_t& end) {
  begin = batch * t / n;
  end = batch * (t + 1) / n;
}

template <class T>
void forward_typed(const Conv2dGeometry& g, int64_t batch, int64_t out_channels, const T* x, const T* w,
                   T* y) {
  const DType dtype = dtype_of<T>();
  const int64_t ck = g.column_rows(), spatial = g.column_cols();
  const int64_t image = g.channels * g.height * g.width, output = out_channels * spatial;
  const int threads = threads_for(batch);
  (void)threads;  // only read by the OpenMP pragma

#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1)
#endif
  {
    int64_t begin, end;
#ifdef _OPENMP
    share(batch, thread_index(), omp_get_num_threads(), begin, end);
#else
    share(batch, 0, 1, begin, end);
#endif
    std::vector<T>& buffer = thread_columns<T>();
    T* cols = column_buffer(buffer, ck * spatial);
    for (int64_t b = begin; b < end; ++b) {
      im2col(g, dtype, x + b * image, cols, 1);
      gemm(gemm_args(dtype, false, false, out_channels, spatial, ck, w, ck, cols, spatial, y + b * output,
                     spatial, 0.0));
    }
    release_if_large(buffer);
  }
}

template <class T>
void backward_typed(const Conv2dGeometry& g, int64_t batch, int64_t out_channels, const T* x, const T* w,
                    const T* gy, T* gx, T* gw) {
  const DType dtype = dtype_of<T>();
  const int64_t ck = g.column_rows(), spatial = g.column_cols();
  const int64_t image = g.channels * g.height * g.width, output = out_channels * spatial;
  const int threads = threads_for(batch);
  // Thread t's partial weight gradient; t = 0 writes gw itself.
  std::vector<T> partials(gw ? static_cast<size_t>(std::max(threads - 1, 0) * out_channels * ck) : 0);

#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1)
#endif
  {
    const int t = threads > 1 ? thread_index() : 0;
    int64_t begin, end;
#ifdef _OPENMP
    share(batch, t, threads > 1 ? omp_get_num_threads() : 1, begin, end);
#else
    share(batch, 0, 1, begin, end);
#endif
    std::vector<T>& buffer = thread_columns<T>();
    T* cols = column_buffer(buffer, ck * spatial);
    T* my_gw = gw ? (t == 0 ? gw : partials.data() + (t - 1) * out_channels * ck) : nullptr;
    if (my_gw) std::fill(my_gw, my_gw + out_channels * ck, T(0));
    for (int64_t b = begin; b < end; ++b) {
      const T* gy_b = gy + b * output;  // [O, S]: already the GEMM's layout
      if (my_gw) {
        im2col(g, dtype, x + b * image, cols, 1);
        gemm(gemm_args(dtype, false, true, out_channels, ck, spatial, gy_b, spatial, cols, spatial, my_gw, ck,
                       1.0));
      }
      if (gx) {
        gemm(gemm_args(dtype, true, false, ck, spatial, out_channels, w, ck, gy_b, spatial, cols, spatial,
                       0.0));
        T* gx_b = gx + b * image;
        std::fill(gx_b, gx_b + image, T(0));
        col2im(g, dtype, cols, gx_b, 1);
      }
    }
    release_if_large(buffer);
  }
  // The partials, added in thread order (the same order on every run).
  for (int t = 1; t < threads && gw; ++t) {
    const T* part = partials.data() + (t - 1) * out_channels * ck;
    for (int64_t e = 0; e < out_channels * ck; ++e) gw[e] += part[e];
  }
}

void check_arguments(const char* name, const Conv2dGeometry& g, DType dtype, int64_t batch,
                     int64_t out_channels) {
  check_conv2d_geometry(g);
  MG_CHECK(dtype == DType::f32 || dtype == DType::f64, name, ": takes f32 or f64, got ", dtype);
  MG_CHECK(batch >= 0 && out_channels >= 0, name, ": negative batch (", batch, ") or output channels (",
           out_channels, ")");
}

}  // namespace

void conv2d_forward(const Conv2dGeometry& g, DType dtype, int64_t batch, int64_t out_channels, const void* x,
                    const void* w, void* y) {
  check_arguments("conv2d_forward", g, dtype, batch, out_channels);
  if (batch == 0 || out_channels == 0) return;
  if (dtype == DType::f32)
    forward_typed(g, batch, out_channels, static_cast<const float*>(x), static_cast<const float*>(w),
                  static_cast<float*>(y));
  else
    forward_typed(g, batch, out_channels, static_cast<const double*>(x), static_cast<const double*>(w),
                  static_cast<double*>(y));
}

void conv2d_backward(const Conv2dGeometry& g, DType dtype, int64_t batch, int64_t out_channels, const void* x,
                     const void* w, const void* gy, void* gx, void* gw) {
  check_arguments("conv2d_backward", g, dtype, batch, out_channels);
  if (gw && (batch == 0 || g.column_cols() == 0)) {  // no output position: the gradient is zero
    const int64_t n = out_channels * g.column_rows();
    if (dtype == DType::f32)
      std::fill(static_cast<float*>(gw), static_cast<float*>(gw) + n, 0.0f);
    else
      std::fill(static_cast<double*>(gw), static_cast<double*>(gw) + n, 0.0);
  }
  if (batch == 0) return;
  if (dtype == DType::f32)
    backward_typed(g, batch, out_channels, static_cast<const float*>(x), static_cast<const float*>(w),
                   static_cast<const float*>(gy), static_cast<float*>(gx), static_cast<float*>(gw));
  else
    backward_typed(g, batch, out_channels, static_cast<const double*>(x), static_cast<const double*>(w),
                   static_cast<const double*>(gy), static_cast<double*>(gx), static_cast<double*>(gw));
}

}  // namespace mg::kernels::cpu
