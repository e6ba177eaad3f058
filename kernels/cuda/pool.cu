// 2-d max and average pooling on the GPU over contiguous [planes, H, W]
// inputs (planes = N*C). Semantics: kernels/cpu/pool.h.
//
// Decomposition.
//   Forward (max and avg), general path: one thread per output element
//     (plane, oh, ow) in a grid-stride loop. It walks its kh x kw window clipped
//     to the input, in row-major order like the CPU (the same first-wins tie
//     rule, NaN wins), and writes the value (and, for max, the flat argmax
//     ih*W + iw).
//   Backward (max and avg), general path: one thread per INPUT element (plane,
//     ih, iw). It gathers from the few windows that contain it -- outputs oh
//     with oh*sh - ph <= ih < oh*sh - ph + kh, and the same for ow -- instead of
//     scattering every output into its window with atomics. No two threads
//     write the same address, so there are no atomics, the result is
//     deterministic, and since the windows are visited in ascending (oh, ow)
//     order (the CPU's order) and summed in float for halves, the result
//     matches the CPU bit for bit. Max backward adds grad_output[o] where
//     argmax[o] names this element.
//   The pair paths: 2x2 windows, stride 2, no padding (every CNN's "maxpool 2"),
//     an even width and a buffer aligned to two elements. A window's two rows
//     are then two pairs of neighbours at an even element offset, each moved
//     with one load or store of 2 * sizeof(T) bytes (8 for f32), and the
//     windows tile the input (an odd height leaves a last row in none: zeros),
//     so the backward runs a thread per OUTPUT that writes its window's four
//     gradients (the one window's term, 0 + g, exactly the general loop's sum).
//     The general path's thread per output reads every other element per load
//     (half of each sector, the other half by its next tap: 50% sector
//     efficiency), and its backward reads grad_output only in the lanes argmax
//     names. Two ways to cut the pairs:
//       row pairs (out_w <= 32): input rows 2oh and 2oh + 1 of a plane are 2W
//         contiguous elements, out_w pairs each. A warp takes K = 32 / out_w
//         whole row pairs: its 2 out_w K <= 64 pairs are contiguous, moved by two
//         coalesced loads (or stores) of consecutive pairs, and handed to (or
//         from) the lane of their output, lane r * out_w + ow, with shuffles.
//         Every sector is used whole even where a row is not a multiple of 32
//         bytes (28 f32 = 112 bytes: the CNN's 28x28 and 14x14 pools), which a
//         thread per output loading its own two rows is not.
//       a thread per output (wider rows): loads its window's top and bottom
//         pairs itself; rows of >= 256 bytes lose at most a sector at a row end.
//
// Cost. ~1 compare or add per window element, and each input element is read
// by about (kh/sh)*(kw/sw) windows from L1/L2: memory bound. Max forward
// reads the input once and writes out_h*out_w values plus as many 8-byte
// argmax entries (which outweigh f32 values 2:1); max backward reads
// grad_output and argmax (once on the pair paths, ~(kh/sh)*(kw/sw) times from
// cache otherwise) and writes the input-sized gradient once. For a 2x2/2 pool
// of a 128 x 32 x 28 x 28 f32 batch (12.8 MB in, 3.2 MB + 6.4 MB out) that is
// ~5 us at HBM speed. At the bench_kernels FashionCNN shapes (32 x 32 x 28 x 28
// and 32 x 64 x 14 x 14, f32) the emulator's H200 model calls each launch
// bound by the launch latency (docs/kernels.md); on the row-pair path the window
// loads and gradient stores use every sector byte (1.00, was 0.42 / 0.33 on
// loads), DRAM bytes equal the ideal, and the per-output 4-byte accesses are at
// 0.875 (28 of a warp's 32 lanes have an output when out_w is 14 or 7).
//
// One kernel per (dtype, direction, kind): 4 dtypes x 4 kernels, the path a
// (warp-uniform) kernel argument.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cstdint>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/vectorized.cuh"

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

// ---- the 2x2, stride-2 pair paths (see the top) ----------------------------------------------
// Which loop a launch runs: the general window walk, or for 2x2 windows at stride 2 without
// padding over an even width, the pair paths: a thread per output moving its window's two rows as
// two 2-element pairs (kPairs), or a warp per K = 32 / out_w whole row pairs (kRowPairs, out_w <=
// 32), whose window pairs are contiguous and go through two coalesced loads or stores per warp and
// shuffles to and from the lanes of their outputs.
enum PoolPath : int { kGeneral = 0, kPairs = 1, kRowPairs = 2 };

// A loop with a constant trip count unrolled whole: nvcc's `#pragma unroll`, and under the CUDA
// emulation g++'s, so that the emulator's access tracer sees the row-pair path's two loads as two
// instructions in flight together, as the GPU would.
#if defined(__CUDACC__)
#define MG_POOL_UNROLL _Pragma("unroll")
#else
#define MG_POOL_UNROLL _Pragma("GCC unroll 2")
#endif

// Pair c of row pair R (= plane * out_h + oh: input rows 2oh and 2oh + 1 of its plane, the inputs
// of output row oh): its first element. Pairs 0..out_w-1 are the top row's and out_w..2out_w-1 the
// bottom row's: the bottom row starts W = 2 out_w elements after the top one, so pair c is 2c
// elements into the row pair either way.
__device__ __forceinline__ int64_t pair_at(const PoolParams& p, int64_t row_pair, int64_t c) {
  const int64_t plane = row_pair / p.out_h, oh = row_pair - plane * p.out_h;
  return (plane * p.height + 2 * oh) * p.width + 2 * c;
}

// `pick_b ? b : a` of lane `src` (every lane of the warp calls it with its own a and b), moved as
// 32-bit words: both shuffled, then one picked word by word (a select, not a branch).
template <class T>
__device__ __forceinline__ Pack<T, 2> shuffle_pick(const Pack<T, 2>& a, const Pack<T, 2>& b, int src,
                                                   bool pick_b) {
  constexpr int kWords = static_cast<int>(sizeof(Pack<T, 2>) / 4);
  uint32_t wa[kWords], wb[kWords];
  memcpy(wa, &a, sizeof wa);
  memcpy(wb, &b, sizeof wb);
  MG_POOL_UNROLL
  for (int k = 0; k < kWords; ++k) {
    const uint32_t x = __shfl_sync(0xffffffffu, wa[k], src), y = __shfl_sync(0xffffffffu, wb[k], src);
    wa[k] = pick_b ? y : x;
  }
  Pack<T, 2> out;
  memcpy(&out, wa, sizeof wa);
  return out;
}

// The row-pair path's warp: it takes row pairs [first, first + per_warp), whose 2 out_w pairs each
// are its slots 0 .. 2 out_w per_warp - 1 (<= 64) in order, slot s in register s / 32 of lane s % 32
// (two loads or stores a warp, each of contiguous pairs); the output lane of row pair first + r,
// column ow is lane r * out_w + ow.
struct RowPairWarp {
  int64_t out_w, per_warp, row_pairs, first;
  int lane;

  __device__ RowPairWarp(const PoolParams& p, int64_t first_row_pair)
      : out_w(p.out_w),
        per_warp(32 / p.out_w),
        row_pairs(p.planes * p.out_h),
        first(first_row_pair),
        lane(static_cast<int>(threadIdx.x % 32)) {}
  // Slot i * 32 + lane: its row pair (offset r from `first`) and pair c, and whether it is one.
  __device__ bool slot(int i, int64_t& r, int64_t& c) const {
    const int64_t s = i * 32 + lane;
    r = s / (2 * out_w);
    c = s - r * 2 * out_w;
    return r < per_warp && first + r < row_pairs;
  }
  // This lane's output: its row pair offset r and column ow, and whether it has one.
  __device__ bool output(int64_t& r, int64_t& ow) const {
    r = lane / out_w;
    ow = lane - r * out_w;
    return r < per_warp && first + r < row_pairs;
  }
};

// The forward's pair paths: f(e, here, top, bottom) for each output e, `here` its window's first
// element (ih * W + iw in its plane), top and bottom its window's two rows.
template <class T, class F>
__device__ __forceinline__ void for_each_pair_window(const PoolParams& p, const T* input, int path, F f) {
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (path == kRowPairs) {
    const int64_t per_warp = 32 / p.out_w, step = int64_t(gridDim.x) * (blockDim.x / 32) * per_warp;
    for (int64_t first = thread / 32 * per_warp; first < p.planes * p.out_h; first += step) {  // warp-uniform
      const RowPairWarp w(p, first);
      Pack<T, 2> x[2];
      MG_POOL_UNROLL
      for (int i = 0; i < 2; ++i) {
        int64_t r, c;
        x[i] = w.slot(i, r, c) ? load_pack<2>(input + pair_at(p, first + r, c)) : Pack<T, 2>{};
      }
      int64_t r, ow;
      const bool has_output = w.output(r, ow);
      const int top_slot = has_output ? static_cast<int>(r * 2 * p.out_w + ow) : 0;
      const int bottom_slot = has_output ? top_slot + static_cast<int>(p.out_w) : 0;
      const Pack<T, 2> top = shuffle_pick(x[0], x[1], top_slot % 32, top_slot >= 32);
      const Pack<T, 2> bottom = shuffle_pick(x[0], x[1], bottom_slot % 32, bottom_slot >= 32);
      if (has_output) {
        const int64_t row_pair = first + r;
        f(row_pair * p.out_w + ow, (row_pair % p.out_h) * 2 * p.width + 2 * ow, top, bottom);
      }
    }
    return;
  }
  const int64_t total = p.planes * p.out_h * p.out_w;
  for (int64_t e = thread; e < total; e += int64_t(gridDim.x) * blockDim.x) {  // kPairs
    const int64_t row_pair = e / p.out_w, ow = e - row_pair * p.out_w, top = pair_at(p, row_pair, ow);
    f(e, (row_pair % p.out_h) * 2 * p.width + 2 * ow, load_pack<2>(input + top),
      load_pack<2>(input + top + p.width));
  }
}

// The backward's pair paths (2x2 windows tile the input): value(e, here, top, bottom) fills an
// output's window (the four inputs whose gradient it alone makes), which is stored as two pairs;
// with an odd height the input row below the last output row, in no window, gets zeros.
template <class T, class Value>
__device__ __forceinline__ void for_each_pair_window_gradient(const PoolParams& p, T* grad_input, int path,
                                                              Value value) {
  const int64_t thread = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool odd_height = (p.height & 1) != 0;
  Pack<T, 2> zero;
  store(&zero.v[0], 0.0f);
  store(&zero.v[1], 0.0f);
  if (path == kRowPairs) {
    const int64_t per_warp = 32 / p.out_w, step = int64_t(gridDim.x) * (blockDim.x / 32) * per_warp;
    for (int64_t first = thread / 32 * per_warp; first < p.planes * p.out_h; first += step) {  // warp-uniform
      const RowPairWarp w(p, first);
      Pack<T, 2> top = zero, bottom = zero;
      int64_t r, ow;
      if (w.output(r, ow)) {
        const int64_t row_pair = first + r;
        value(row_pair * p.out_w + ow, (row_pair % p.out_h) * 2 * p.width + 2 * ow, top, bottom);
      }
      MG_POOL_UNROLL
      for (int i = 0; i < 2; ++i) {
        int64_t c;
        const bool is_slot = w.slot(i, r, c);
        const bool upper = c < p.out_w;
        const int from = is_slot ? static_cast<int>(r * p.out_w + (upper ? c : c - p.out_w)) : 0;
        const Pack<T, 2> pair = shuffle_pick(top, bottom, from, !upper);
        if (is_slot) {
          const int64_t at = pair_at(p, first + r, c);
          store_pack<2>(grad_input + at, pair);
          if (odd_height && upper && (first + r) % p.out_h == p.out_h - 1)
            store_pack<2>(grad_input + at + 2 * p.width, zero);
        }
      }
    }
    return;
  }
  const int64_t total = p.planes * p.out_h * p.out_w;
  for (int64_t e = thread; e < total; e += int64_t(gridDim.x) * blockDim.x) {  // kPairs
    const int64_t row_pair = e / p.out_w, ow = e - row_pair * p.out_w, at = pair_at(p, row_pair, ow);
    Pack<T, 2> top, bottom;
    value(e, (row_pair % p.out_h) * 2 * p.width + 2 * ow, top, bottom);
    store_pack<2>(grad_input + at, top);
    store_pack<2>(grad_input + at + p.width, bottom);
    if (odd_height && row_pair % p.out_h == p.out_h - 1) store_pack<2>(grad_input + at + 2 * p.width, zero);
  }
}

// ---- the kernels -----------------------------------------------------------------------------

// The general path of the forward kernels: a thread per output (grid-stride), f(e, x, win) with
// x the output's input plane and win its window.
template <class T, class F>
__device__ __forceinline__ void for_each_output_window(const PoolParams& p, const T* input, F f) {
  const int64_t outs = p.out_h * p.out_w, total = p.planes * outs;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t plane = e / outs, oh = (e % outs) / p.out_w, ow = e % p.out_w;
    f(e, input + plane * p.height * p.width, Window(p, oh, ow));
  }
}

template <class T>
__global__ void max_forward_kernel(PoolParams p, const T* input, T* output, int64_t* argmax, int path) {
  using A = acc_t<T>;
  if (path != kGeneral) {
    for_each_pair_window(
        p, input, path, [&](int64_t e, int64_t here, const Pack<T, 2>& top, const Pack<T, 2>& bottom) {
          const A v[4] = {load(&top.v[0]), load(&top.v[1]), load(&bottom.v[0]), load(&bottom.v[1])};
          const int64_t at[4] = {here, here + 1, here + p.width, here + p.width + 1};
          A best = -INFINITY;
          int64_t best_index = here;  // wins if every element is -inf
#pragma unroll
          for (int k = 0; k < 4; ++k) {  // row-major, as the loop below
            if (v[k] > best || v[k] != v[k]) {
              best = v[k];
              best_index = at[k];
            }
          }
          store(output + e, best);
          argmax[e] = best_index;
        });
    return;
  }
  for_each_output_window(p, input, [&](int64_t e, const T* x, const Window& win) {
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
  });
}

template <class T>
__global__ void max_backward_kernel(PoolParams p, const T* grad_output, const int64_t* argmax, T* grad_input,
                                    int path) {
  using A = acc_t<T>;
  const int64_t plane_size = p.height * p.width, outs = p.out_h * p.out_w, total = p.planes * plane_size;
  if (path != kGeneral) {
    for_each_pair_window_gradient(
        p, grad_input, path, [&](int64_t e, int64_t here, Pack<T, 2>& top, Pack<T, 2>& bottom) {
          const int64_t index = argmax[e];
          const A g = A(0) + load(grad_output + e);  // the loop's sum over the one window that names it
          store(&top.v[0], index == here ? g : A(0));
          store(&top.v[1], index == here + 1 ? g : A(0));
          store(&bottom.v[0], index == here + p.width ? g : A(0));
          store(&bottom.v[1], index == here + p.width + 1 ? g : A(0));
        });
    return;
  }
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
__global__ void avg_forward_kernel(PoolParams p, const T* input, T* output, bool count_include_pad,
                                   int path) {
  using A = acc_t<T>;
  if (path != kGeneral) {  // the window lies inside the input: 4 elements, the divisor 4 either way
    for_each_pair_window(p, input, path,
                         [&](int64_t e, int64_t, const Pack<T, 2>& top, const Pack<T, 2>& bottom) {
                           A sum = 0;  // row-major, as the loop below
                           sum += load(&top.v[0]);
                           sum += load(&top.v[1]);
                           sum += load(&bottom.v[0]);
                           sum += load(&bottom.v[1]);
                           store(output + e, sum / A(4));
                         });
    return;
  }
  for_each_output_window(p, input, [&](int64_t e, const T* x, const Window& win) {
    A sum = 0;
    for (int64_t ih = win.h0; ih < win.h1; ++ih)
      for (int64_t iw = win.w0; iw < win.w1; ++iw) sum += load(x + ih * p.width + iw);
    store(output + e, sum / A(win.divisor(count_include_pad)));
  });
}

template <class T>
__global__ void avg_backward_kernel(PoolParams p, const T* grad_output, T* grad_input, bool count_include_pad,
                                    int path) {
  using A = acc_t<T>;
  const int64_t plane_size = p.height * p.width, outs = p.out_h * p.out_w, total = p.planes * plane_size;
  if (path != kGeneral) {
    for_each_pair_window_gradient(
        p, grad_input, path, [&](int64_t e, int64_t, Pack<T, 2>& top, Pack<T, 2>& bottom) {
          const A g = A(0) + load(grad_output + e) / A(4);  // the loop's sum over its one window
          store(&top.v[0], g);
          store(&top.v[1], g);
          store(&bottom.v[0], g);
          store(&bottom.v[1], g);
        });
    return;
  }
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

// The launch's path (see PoolPath): the pair paths need 2x2 windows, stride 2, no padding, an even
// width (every window row is a pair at an even element offset) and `data` (the forward's input,
// the backward's grad_input) aligned to a pair; rows of up to 32 outputs take the row-pair path.
int pool_path(const Pool2dGeometry& g, const void* data, size_t element) {
  const bool pairs = g.kernel_h == 2 && g.kernel_w == 2 && g.stride_h == 2 && g.stride_w == 2 &&
                     g.pad_h == 0 && g.pad_w == 0 && g.width % 2 == 0 &&
                     reinterpret_cast<uintptr_t>(data) % (2 * element) == 0;
  if (!pairs) return kGeneral;
  return g.out_w() <= 32 ? kRowPairs : kPairs;
}

// Threads of a launch: a warp per 32 / out_w row pairs, a thread per output, or (the general
// backward) a thread per input element.
unsigned pool_grid(const Pool2dGeometry& g, int path, int64_t general_threads) {
  if (path == kRowPairs) {
    const int64_t per_warp = 32 / g.out_w(), warps = (g.planes * g.out_h() + per_warp - 1) / per_warp;
    return grid_for(32 * warps);
  }
  return grid_for(path == kPairs ? g.planes * g.out_h() * g.out_w() : general_threads);
}

void check_args(const Pool2dGeometry& g, const char* what, const void* in, const void* out) {
  check_pool2d_geometry(g);
  MG_CHECK(g.planes * g.height * g.width == 0 || (in != nullptr && out != nullptr), what,
           " (CUDA): null buffer");
}

}  // namespace

void max_pool2d_forward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* input,
                        void* output, int64_t* argmax) {
  check_args(g, "max_pool2d_forward", input, output);
  MG_CHECK(g.planes == 0 || argmax != nullptr, "max_pool2d_forward (CUDA): argmax is null");
  const int64_t total = g.planes * g.out_h() * g.out_w();
  if (total == 0) return;
  visit_float(dtype, "max_pool2d_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    const int path = pool_path(g, input, sizeof(T));
    launch_kernel<max_forward_kernel<T>>(pool_grid(g, path, total), kThreads, 0, stream, make_params(g),
                                         static_cast<const T*>(input), static_cast<T*>(output), argmax, path);
  });
}

void max_pool2d_backward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* grad_output,
                         const int64_t* argmax, void* grad_input) {
  check_args(g, "max_pool2d_backward", grad_output, grad_input);
  MG_CHECK(g.planes == 0 || argmax != nullptr, "max_pool2d_backward (CUDA): argmax is null");
  const int64_t total = g.planes * g.height * g.width;
  if (total == 0) return;
  visit_float(dtype, "max_pool2d_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    const int path = pool_path(g, grad_input, sizeof(T));
    launch_kernel<max_backward_kernel<T>>(pool_grid(g, path, total), kThreads, 0, stream, make_params(g),
                                          static_cast<const T*>(grad_output), argmax,
                                          static_cast<T*>(grad_input), path);
  });
}

void avg_pool2d_forward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* input,
                        void* output, bool count_include_pad) {
  check_args(g, "avg_pool2d_forward", input, output);
  const int64_t total = g.planes * g.out_h() * g.out_w();
  if (total == 0) return;
  visit_float(dtype, "avg_pool2d_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    const int path = pool_path(g, input, sizeof(T));
    launch_kernel<avg_forward_kernel<T>>(pool_grid(g, path, total), kThreads, 0, stream, make_params(g),
                                         static_cast<const T*>(input), static_cast<T*>(output),
                                         count_include_pad, path);
  });
}

void avg_pool2d_backward(cudaStream_t stream, const Pool2dGeometry& g, DType dtype, const void* grad_output,
                         void* grad_input, bool count_include_pad) {
  check_args(g, "avg_pool2d_backward", grad_output, grad_input);
  const int64_t total = g.planes * g.height * g.width;
  if (total == 0) return;
  visit_float(dtype, "avg_pool2d_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    const int path = pool_path(g, grad_input, sizeof(T));
    launch_kernel<avg_backward_kernel<T>>(pool_grid(g, path, total), kThreads, 0, stream, make_params(g),
                                          static_cast<const T*>(grad_output), static_cast<T*>(grad_input),
                                          count_include_pad, path);
  });
}

}  // namespace mg::kernels::cuda
