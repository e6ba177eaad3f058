// What every CUDA kernel file shares: 16-bit float loads/stores, the compute
// type of each storage type, the strided-offset calculator, launch sizes and
// the host-side dtype switch. Included by kernels/cuda/*.cu only.
//
// Compile-time budget: kernels pick their operation (add, exp, sum, ...) with a
// runtime switch inside one kernel per dtype instead of one template
// instantiation per (op, dtype) pair. The switch is on a kernel argument, so
// every thread of a warp takes the same branch and it costs one predictable
// jump per element; the build stays fast (CI compiles this on 2 cores).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "base/cuda_check.cuh"
#include "base/dtype.h"
#include "base/strided_view.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/native.cuh"

namespace mg::kernels::cuda {

// ---- 16-bit floats ---------------------------------------------------------------------------
// Device-side twins of mg::bf16 / mg::f16 (base/half.h, host only): the same 16
// bits, converted with the same rounding (to nearest even; NaN stays NaN).
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

__device__ __forceinline__ float to_float(bf16_t x) { return __uint_as_float(uint32_t(x.bits) << 16); }
__device__ __forceinline__ float to_float(f16_t x) { return cvt_f32_f16(x.bits); }
__device__ __forceinline__ bf16_t make_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x0040u)};
  return bf16_t{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
__device__ __forceinline__ f16_t make_f16(float f) { return f16_t{cvt_rn_f16_f32(f)}; }

}  // namespace mg::kernels::cuda

// The type arithmetic happens in (mg::acc_t, base/dtype.h) for the device-side 16-bit floats:
// float, as for mg::bf16 / mg::f16.
namespace mg {
template <>
struct AccType<kernels::cuda::bf16_t> {
  using type = float;
};
template <>
struct AccType<kernels::cuda::f16_t> {
  using type = float;
};
}  // namespace mg

namespace mg::kernels::cuda {

template <class T>
__device__ __forceinline__ acc_t<T> load(const T* p) {
  if constexpr (std::is_same<T, bf16_t>::value || std::is_same<T, f16_t>::value) {
    return to_float(*p);
  } else {
    return static_cast<acc_t<T>>(*p);
  }
}
template <class T, class V>
__device__ __forceinline__ void store(T* p, V v) {
  if constexpr (std::is_same<T, bf16_t>::value) {
    *p = make_bf16(static_cast<float>(v));
  } else if constexpr (std::is_same<T, f16_t>::value) {
    *p = make_f16(static_cast<float>(v));
  } else if constexpr (std::is_same<T, bool>::value) {
    *p = v != V(0);
  } else {
    *p = static_cast<T>(v);
  }
}

// A 16-byte vector load or store needs its address 16-byte aligned (host and device alike).
__host__ __device__ __forceinline__ bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// ---- raw words -------------------------------------------------------------------------------
// The unsigned type of a given width: what one load or store of that many bytes moves, for code
// that copies elements without looking at them (uint2 and uint4 are CUDA's 8- and 16-byte vector
// types, each one instruction).
template <int Bytes>
struct RawOf;
template <>
struct RawOf<1> {
  using type = uint8_t;
};
template <>
struct RawOf<2> {
  using type = uint16_t;
};
template <>
struct RawOf<4> {
  using type = uint32_t;
};
template <>
struct RawOf<8> {
  using type = uint2;
};
template <>
struct RawOf<16> {
  using type = uint4;
};
template <int Bytes>
using raw_t = typename RawOf<Bytes>::type;

// ---- strided offsets -------------------------------------------------------------------------
// Element `linear` (row-major over the output's shape) of N operands lives at
// offsets[k] = sum_d index_d * strides[k][d]. One division per dim per element:
// cheap next to the memory access for the few dims left after coalescing.
template <int N>
struct OffsetCalc {
  int ndim;
  int64_t shape[kMaxDims];
  int64_t strides[N][kMaxDims];

  __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t size = shape[d];
      const int64_t i = linear % size;
      linear /= size;
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[k][d];
    }
  }
};

// Views 0..N-1 share a shape (view 0 is the output). Drops size-1 dims and merges
// neighbours that are contiguous in every operand, so a contiguous tensor becomes
// one dim; `contiguous` is then true when every operand has stride 1.
template <int N>
OffsetCalc<N> make_offset_calc(const StridedView* const (&views)[N], bool* contiguous) {
  OffsetCalc<N> c{};
  int nd = 0;
  for (int d = 0; d < views[0]->ndim; ++d) {
    const int64_t size = views[0]->shape[d];
    if (size == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k) merge = c.strides[k][nd - 1] == views[k]->strides[d] * size;
    if (merge) {
      c.shape[nd - 1] *= size;
      for (int k = 0; k < N; ++k) c.strides[k][nd - 1] = views[k]->strides[d];
    } else {
      c.shape[nd] = size;
      for (int k = 0; k < N; ++k) c.strides[k][nd] = views[k]->strides[d];
      ++nd;
    }
  }
  if (nd == 0) {
    nd = 1;
    c.shape[0] = 1;
    for (int k = 0; k < N; ++k) c.strides[k][0] = 1;
  }
  c.ndim = nd;
  bool all_unit = nd == 1;
  for (int k = 0; k < N && all_unit; ++k) all_unit = c.strides[k][0] == 1;
  *contiguous = all_unit;
  return c;
}

// ---- launch sizes ----------------------------------------------------------------------------
constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill the GPU several times over, capped so
// huge tensors reuse threads instead of launching millions of blocks.
inline unsigned grid_for(int64_t n, int64_t per_thread = 1) {
  const int64_t threads = (n + per_thread - 1) / per_thread;
  const int64_t blocks = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

// A block per row (softmax, cross-entropy, layer norm): the smallest power of two >= the row
// length, clamped to 32..256 threads, so short rows waste no warps and long ones stride.
inline int row_block(int64_t row_length) {
  int threads = 32;
  while (threads < 256 && threads < row_length) threads *= 2;
  return threads;
}
// One block per row, at least 1 and at most 65535 blocks (a grid-stride loop covers more rows).
inline unsigned row_grid(int64_t rows) {
  return static_cast<unsigned>(rows < 65535 ? (rows < 1 ? 1 : rows) : 65535);
}

// ---- host-side dtype switch ------------------------------------------------------------------
template <class T>
struct tag {
  using type = T;
};

// f(tag<T>{}) with T the device storage type of `dtype` (all seven dtypes).
template <class F>
void visit_all(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f(tag<float>{});
    case DType::f64: return f(tag<double>{});
    case DType::f16: return f(tag<f16_t>{});
    case DType::bf16: return f(tag<bf16_t>{});
    case DType::i32: return f(tag<int32_t>{});
    case DType::i64: return f(tag<int64_t>{});
    case DType::boolean: return f(tag<bool>{});
  }
  throw Error("cuda kernel: unknown dtype");
}

// Floating dtypes only; `what` names the op in the error.
template <class F>
void visit_float(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::f32: return f(tag<float>{});
    case DType::f64: return f(tag<double>{});
    case DType::f16: return f(tag<f16_t>{});
    case DType::bf16: return f(tag<bf16_t>{});
    default: break;
  }
  throw Error(
      str_cat(what, " (CUDA): expected a floating dtype (f32, f64, f16, bf16), got ", dtype_name(dtype)));
}

// ---- block reductions ------------------------------------------------------------------------
template <class V>
__device__ __forceinline__ V warp_sum(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class V>
__device__ __forceinline__ V warp_max(V v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const V w = __shfl_xor_sync(0xffffffffu, v, o);
    v = (w > v || w != w) ? w : v;  // NaN wins, like the CPU's max
  }
  return v;
}
// ---- block-wide reductions through shared memory -------------------------------------------------

// Sum / max over the whole block (blockDim.x a multiple of 32, <= 1024); every
// thread gets the result. Uses 32 V of shared memory each; callable repeatedly.
template <class V>
__device__ V block_sum(V v) {
  __shared__ V partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading `partial`
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : V(0);
  return warp_sum(v);
}
template <class V>
__device__ V block_max(V v) {
  __shared__ V partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : partial[0];
  return warp_max(v);
}

}  // namespace mg::kernels::cuda
