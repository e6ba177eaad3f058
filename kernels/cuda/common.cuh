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
#if defined(MG_CUDA_EMULATE)
#include <cuda_fp16.h>  // the host-side conversions stand in for the cvt instructions
#endif

#include <cstdint>
#include <type_traits>

#include "core/cuda_check.cuh"
#include "core/dtype.h"
#include "core/strided_view.h"
#include "kernels/cuda/launch.cuh"

namespace mg::kernels::cuda {

// ---- 16-bit floats ---------------------------------------------------------------------------
// Device-side twins of mg::bf16 / mg::f16 (core/half.h, host only): the same 16
// bits, converted with the same rounding (to nearest even; NaN stays NaN).
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

__device__ __forceinline__ float to_float(bf16_t x) { return __uint_as_float(uint32_t(x.bits) << 16); }
__device__ __forceinline__ float to_float(f16_t x) {
#if defined(MG_CUDA_EMULATE)
  return __half2float(__ushort_as_half(x.bits));  // cvt.f32.f16: exact
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
#endif
}
__device__ __forceinline__ bf16_t make_bf16(float f) {
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((u >> 16) | 0x0040u)};
  return bf16_t{uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16)};
}
__device__ __forceinline__ f16_t make_f16(float f) {
#if defined(MG_CUDA_EMULATE)
  return f16_t{__half_as_ushort(__float2half_rn(f))};  // cvt.rn.f16.f32: to nearest even
#else
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return f16_t{h};
#endif
}

// The type arithmetic happens in: float for halves, int for bool, else T itself.
template <class T>
struct Calc {
  using type = T;
};
template <>
struct Calc<bf16_t> {
  using type = float;
};
template <>
struct Calc<f16_t> {
  using type = float;
};
template <>
struct Calc<bool> {
  using type = int;
};
template <class T>
using calc_t = typename Calc<T>::type;

template <class T>
__device__ __forceinline__ calc_t<T> load(const T* p) {
  if constexpr (std::is_same<T, bf16_t>::value || std::is_same<T, f16_t>::value) {
    return to_float(*p);
  } else {
    return static_cast<calc_t<T>>(*p);
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

template <class T>
constexpr bool is_float_v = std::is_floating_point<calc_t<T>>::value;

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
// ---- statically sized shared memory ------------------------------------------------------------
// A __shared__ array of type A (e.g. float[32][33]), declared through a function so that the CUDA
// emulation can see it: there a plain __shared__ variable is thread-local storage, which no
// launch knows the size of. shared_array poisons it at each block's first use (NaN bytes, as the
// dynamic shared memory) and counts it, with the dynamic bytes, against the 48 KiB a block may
// have without cudaFuncSetAttribute. On a GPU it is exactly `__shared__ A storage`. `Id` tells
// apart two arrays of one type in one kernel:
//   auto& a_tile = shared_array<float[32][33], 0>();
//   auto& b_tile = shared_array<float[32][33], 1>();
template <class A, int Id>
__device__ __forceinline__ A& shared_array() {
#if defined(MG_CUDA_EMULATE)
  return mg_emu::static_shared_array<A, Id>(__FILE__, __LINE__);
#else
  __shared__ __align__(16) A storage;
  return storage;
#endif
}

// Sum / max over the whole block (blockDim.x a multiple of 32, <= 1024); every
// thread gets the result. Uses 32 V of shared memory each; callable repeatedly.
template <class V>
__device__ V block_sum(V v) {
  V(&partial)[32] = shared_array<V[32], 1000>();
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
  V(&partial)[32] = shared_array<V[32], 1001>();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : partial[0];
  return warp_max(v);
}

}  // namespace mg::kernels::cuda
