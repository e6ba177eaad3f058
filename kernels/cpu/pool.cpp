// Max / average pooling over [planes, H, W] (CPU).
//
// Decomposition: planes (= N*C) are independent, so they are the unit of
// parallel work; within a plane each output walks its kh x kw window, clipped
// to the real input (the padded border contributes -inf to a max and 0 to a
// sum, so clipping is the same as padding).
//
// Cost: each input element is read by about (kh/sh)*(kw/sw) windows, all from
// cache, so DRAM traffic is one pass over the input plus the outputs:
// max forward writes out_h*out_w values and as many int64 argmax entries (the
// 8-byte indices often outweigh the values); the backward passes read
// grad_output (and argmax) once and write grad_input once. ~1 compare or add
// per window element: these kernels are memory bound.
//
// Backward accumulates: overlapping windows (stride < kernel) send several
// gradients to the same input. Each plane is summed in a acc_t scratch
// copy (float for halves) and rounded to T once, and since a plane belongs to
// one thread no atomics are needed.
#include "kernels/cpu/pool.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/error.h"

namespace mg::kernels::cpu {

namespace {

constexpr int64_t kPoolMinParallelElements = 1 << 15;  // below this, threads cost more than they save

// The part of one pooling window that lies inside the input: rows [h0, h1), cols [w0, w1).
struct Window {
  int64_t h0, h1, w0, w1;
  int64_t pool_size;  // window size clipped to the padded input (== kh*kw in floor mode)

  Window(const Pool2dGeometry& g, int64_t oh, int64_t ow) {
    const int64_t h_start = oh * g.stride_h - g.pad_h, w_start = ow * g.stride_w - g.pad_w;
    const int64_t h_end = std::min(h_start + g.kernel_h, g.height + g.pad_h);
    const int64_t w_end = std::min(w_start + g.kernel_w, g.width + g.pad_w);
    pool_size = (h_end - h_start) * (w_end - w_start);
    h0 = std::max<int64_t>(h_start, 0);
    w0 = std::max<int64_t>(w_start, 0);
    h1 = std::min(h_end, g.height);
    w1 = std::min(w_end, g.width);
  }
  int64_t divisor(bool count_include_pad) const {
    return count_include_pad ? pool_size : (h1 - h0) * (w1 - w0);
  }
};

bool worth_threads(const Pool2dGeometry& g) {
  return g.planes > 1 && g.planes * g.height * g.width >= kPoolMinParallelElements;
}

// The window rule of max pooling: a larger value, or any NaN (PyTorch's rule: a NaN beats
// everything), replaces the best so far; on a tie the first element in row-major order stays.
//
// Without a branch: on real activations which element of a window wins is unpredictable, and a
// mispredicted branch per candidate cost more than all the arithmetic (the 2x2 forward ran at
// ~2 ns per input element). A `take ? v : best` is turned back into a branch by the compiler,
// so the choice is made with an all-ones/all-zeros mask on the bits instead.
template <class Acc>
inline void consider(Acc v, int64_t i, Acc& best, int64_t& best_index) {
  using Bits = std::conditional_t<sizeof(Acc) == 8, uint64_t, uint32_t>;
  static_assert(sizeof(Acc) == sizeof(Bits), "max pooling compares in float or double");
  const bool take = (v > best) | (v != v);  // v != v: v is NaN
  const Bits mask = Bits(0) - Bits(take);
  Bits v_bits, best_bits;
  std::memcpy(&v_bits, &v, sizeof v);
  std::memcpy(&best_bits, &best, sizeof best);
  best_bits = (v_bits & mask) | (best_bits & ~mask);
  std::memcpy(&best, &best_bits, sizeof best);
  const int64_t index_mask = -static_cast<int64_t>(take);
  best_index = (i & index_mask) | (best_index & ~index_mask);
}

// The common 2x2, stride 2, unpadded case (every CNN's "maxpool 2"): each window lies inside
// the input, so the four candidates are read directly, in the generic loop's order.
template <class T>
void max_forward_2x2(const Pool2dGeometry& g, const T* x, T* y, int64_t* index) {
  using Acc = acc_t<T>;
  const int64_t out_h = g.out_h(), out_w = g.out_w(), width = g.width;
  for (int64_t oh = 0; oh < out_h; ++oh) {
    const int64_t top = 2 * oh * width, bottom = top + width;  // the window's two input rows
    for (int64_t ow = 0; ow < out_w; ++ow) {
      const int64_t left = 2 * ow;
      Acc best = -std::numeric_limits<Acc>::infinity();
      int64_t best_index = top + left;
      consider(static_cast<Acc>(x[top + left]), top + left, best, best_index);
      consider(static_cast<Acc>(x[top + left + 1]), top + left + 1, best, best_index);
      consider(static_cast<Acc>(x[bottom + left]), bottom + left, best, best_index);
      consider(static_cast<Acc>(x[bottom + left + 1]), bottom + left + 1, best, best_index);
      y[oh * out_w + ow] = static_cast<T>(best);
      index[oh * out_w + ow] = best_index;
    }
  }
}

template <class T>
void max_forward_typed(const Pool2dGeometry& g, const T* input, T* output, int64_t* argmax) {
  using Acc = acc_t<T>;
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const bool parallel = worth_threads(g);
  (void)parallel;  // only read by the OpenMP pragma
  const bool two_by_two = g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 &&
                          g.pad_h == 0 && g.pad_w == 0;

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* x = input + p * g.height * g.width;
    T* y = output + p * out_h * out_w;
    int64_t* index = argmax + p * out_h * out_w;
    if (two_by_two) {
      max_forward_2x2(g, x, y, index);
      continue;
    }
    for (int64_t oh = 0; oh < out_h; ++oh) {
      for (int64_t ow = 0; ow < out_w; ++ow) {
        const Window win(g, oh, ow);
        Acc best = -std::numeric_limits<Acc>::infinity();
        int64_t best_index = win.h0 * g.width + win.w0;  // wins if every element is -inf
        for (int64_t ih = win.h0; ih < win.h1; ++ih)
          for (int64_t iw = win.w0; iw < win.w1; ++iw)
            consider(static_cast<Acc>(x[ih * g.width + iw]), ih * g.width + iw, best, best_index);
        y[oh * out_w + ow] = static_cast<T>(best);
        index[oh * out_w + ow] = best_index;
      }
    }
  }
}

template <class T>
void max_backward_typed(const Pool2dGeometry& g, const T* grad_output, const int64_t* argmax, T* grad_input) {
  using Acc = acc_t<T>;
  const int64_t outputs = g.out_h() * g.out_w();
  const int64_t plane_size = g.height * g.width;
  const bool parallel = worth_threads(g);
  (void)parallel;                      // only read by the OpenMP pragma
  std::atomic<bool> bad_index{false};  // exceptions must not escape an OpenMP region: throw after it

#ifdef _OPENMP
#pragma omp parallel if (parallel)
#endif
  {
    std::vector<Acc> sum(plane_size);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t p = 0; p < g.planes; ++p) {
      const T* gy = grad_output + p * outputs;
      const int64_t* index = argmax + p * outputs;
      std::fill(sum.begin(), sum.end(), Acc(0));
      for (int64_t o = 0; o < outputs; ++o) {
        if (index[o] < 0 || index[o] >= plane_size) {
          bad_index.store(true, std::memory_order_relaxed);
          continue;
        }
        sum[index[o]] += static_cast<Acc>(gy[o]);
      }
      T* gx = grad_input + p * plane_size;
      for (int64_t e = 0; e < plane_size; ++e) gx[e] = static_cast<T>(sum[e]);
    }
  }
  MG_CHECK(!bad_index.load(), "max_pool2d_backward: argmax holds an index outside [0, H*W) = [0, ",
           plane_size, ")");
}

template <class T>
void avg_forward_typed(const Pool2dGeometry& g, const T* input, T* output, bool count_include_pad) {
  using Acc = acc_t<T>;
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const bool parallel = worth_threads(g);
  (void)parallel;  // only read by the OpenMP pragma

#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (parallel)
#endif
  for (int64_t p = 0; p < g.planes; ++p) {
    const T* x = input + p * g.height * g.width;
    T* y = output + p * out_h * out_w;
    for (int64_t oh = 0; oh < out_h; ++oh) {
      for (int64_t ow = 0; ow < out_w; ++ow) {
        const Window win(g, oh, ow);
        Acc sum = 0;
        for (int64_t ih = win.h0; ih < win.h1; ++ih) {
          for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += static_cast<Acc>(x[ih * g.width + iw]);
        }
        y[oh * out_w + ow] = static_cast<T>(sum / static_cast<Acc>(win.divisor(count_include_pad)));
      }
    }
  }
}

template <class T>
void avg_backward_typed(const Pool2dGeometry& g, const T* grad_output, T* grad_input,
                        bool count_include_pad) {
  using Acc = acc_t<T>;
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  const int64_t plane_size = g.height * g.width;
  const bool parallel = worth_threads(g);
  (void)parallel;  // only read by the OpenMP pragma

#ifdef _OPENMP
#pragma omp parallel if (parallel)
#endif
  {
    std::vector<Acc> sum(plane_size);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t p = 0; p < g.planes; ++p) {
      const T* gy = grad_output + p * out_h * out_w;
      std::fill(sum.begin(), sum.end(), Acc(0));
      for (int64_t oh = 0; oh < out_h; ++oh) {
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const Window win(g, oh, ow);
          const Acc share =
              static_cast<Acc>(gy[oh * out_w + ow]) / static_cast<Acc>(win.divisor(count_include_pad));
          for (int64_t ih = win.h0; ih < win.h1; ++ih) {
            for (int64_t iw = win.w0; iw < win.w1; ++iw) sum[ih * g.width + iw] += share;
          }
        }
      }
      T* gx = grad_input + p * plane_size;
      for (int64_t e = 0; e < plane_size; ++e) gx[e] = static_cast<T>(sum[e]);
    }
  }
}

void check_buffers(const Pool2dGeometry& g, const char* what, const void* in, const void* out) {
  MG_CHECK(g.planes * g.height * g.width == 0 || (in != nullptr && out != nullptr), what, ": null buffer");
}

}  // namespace

void max_pool2d_forward(const Pool2dGeometry& g, DType dtype, const void* input, void* output,
                        int64_t* argmax) {
  check_pool2d_geometry(g);
  check_buffers(g, "max_pool2d_forward", input, output);
  MG_CHECK(g.planes == 0 || argmax != nullptr, "max_pool2d_forward: argmax is null");
  visit_floating(dtype, "max_pool2d_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_forward_typed(g, static_cast<const T*>(input), static_cast<T*>(output), argmax);
  });
}

void max_pool2d_backward(const Pool2dGeometry& g, DType dtype, const void* grad_output, const int64_t* argmax,
                         void* grad_input) {
  check_pool2d_geometry(g);
  check_buffers(g, "max_pool2d_backward", grad_output, grad_input);
  MG_CHECK(g.planes == 0 || argmax != nullptr, "max_pool2d_backward: argmax is null");
  visit_floating(dtype, "max_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    max_backward_typed(g, static_cast<const T*>(grad_output), argmax, static_cast<T*>(grad_input));
  });
}

void avg_pool2d_forward(const Pool2dGeometry& g, DType dtype, const void* input, void* output,
                        bool count_include_pad) {
  check_pool2d_geometry(g);
  check_buffers(g, "avg_pool2d_forward", input, output);
  visit_floating(dtype, "avg_pool2d_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_forward_typed(g, static_cast<const T*>(input), static_cast<T*>(output), count_include_pad);
  });
}

void avg_pool2d_backward(const Pool2dGeometry& g, DType dtype, const void* grad_output, void* grad_input,
                         bool count_include_pad) {
  check_pool2d_geometry(g);
  check_buffers(g, "avg_pool2d_backward", grad_output, grad_input);
  visit_floating(dtype, "avg_pool2d_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    avg_backward_typed(g, static_cast<const T*>(grad_output), static_cast<T*>(grad_input), count_include_pad);
  });
}

}  // namespace mg::kernels::cpu
