// Elementwise CUDA kernels: unary math and its fused backward, binary arithmetic
// and comparisons (broadcast inputs arrive with stride 0), axpby, where, clamp,
// fill, arange and the dtype-converting copy. Semantics are those of
// kernels/cpu/elementwise.h; this file only says how the GPU does them. A
// same-dtype copy that is not one block of bytes (transposes, permutations,
// slices) is transpose.cu's; the pack machinery is vectorized.cuh's.
//
// Decomposition. A grid-stride loop (a fixed grid of at most 65536 blocks x 256
// threads walks tensors of any size). Consecutive threads take consecutive
// elements (or packs of them), so a warp's loads of a contiguous operand are
// coalesced into a few full 128-byte lines. Three paths, chosen on the host:
//   - Pack path (every kernel here but arange; binary and binary_scalar except
//     on bool inputs and for integer-vs-scalar comparisons): each thread moves
//     16 bytes per load: a "pack" of V = 16 / sizeof(widest dtype) consecutive
//     elements (4 f32, 8 bf16/f16, 2 f64; a cast f32 -> bf16 reads 4 floats,
//     16 B, and writes 4 halves, 8 B; where reads V condition bytes with one
//     V-byte load), with one ld/st.global.v4 (or v2) per operand instead of V
//     scalar ones. It needs every operand whose innermost (merged) dim has
//     stride 1 to start each pack aligned to the pack's size (V elements of its
//     own dtype): when all operands are 1-d the first `head` (< V) elements are
//     done one by one until they do (possible when every operand is misaligned
//     by the same number of elements, e.g. views at offset 1 of aligned
//     tensors), and so are the (n - head) mod V after the last pack. With more
//     dims (broadcasting, slices) the inner size and the outer strides must be
//     multiples of V. An operand whose inner stride is 0 (a scalar, or a
//     column broadcast along rows) is read once per pack. The per-pack offsets
//     cost one div/mod per merged dim, shared by the V elements.
//   - Contiguous scalar path (misaligned views): element i is at offset i in
//     every operand; each thread handles 4 elements spaced one grid apart, so 4
//     independent loads are in flight per thread.
//   - Strided path (rows that are not a multiple of V, operands misaligned
//     differently, transposed operands): each thread turns its linear index
//     into per-operand offsets with one div/mod per (merged) dim. Reads of a
//     stride-0 operand hit the same address across the warp and are served by
//     one transaction.
//
// Why packs matter. An H200 streams ~4.8 TB/s from HBM3e. With ~600-800 ns
// of DRAM latency under load, Little's law says ~3-4 MB must be in flight at
// all times, ~25-30 KB per SM. An SM holds at most 2048 threads: with 4-byte
// loads each thread must keep 3-4 loads outstanding to get there, and with the
// 2-byte loads of bf16/f16 (64 bytes, 2 sectors per warp request) even the
// 4-way unrolled scalar path (16 KB per SM) falls short. One 16-byte load per
// thread (512 bytes, 16 sectors per warp request) gives 32 KB per SM by itself, and moves the
// same bytes with a quarter (f32) or an eighth (16-bit) of the load/store
// instructions, address computations and loop iterations, each of which also
// passes through the SM's load/store units and L1 tag stage once per warp.
// The emulator's access tracer shows it: a bf16 where, clamp or unary
// backward on 16M elements went from 2 sectors per request (latency bound in
// the H200 model) to 16 (DRAM bound); docs/kernels.md has the predicted times.
//
// Cost. A unary op on n elements of s bytes moves 2 n s bytes, its backward 3 n s
// (2 n s for neg/sign), a binary op 3 n s (less when an operand is broadcast),
// where 3 n s + n, a cast n (s_in + s_out), and each does 1-20 FLOPs per
// element: every kernel here is memory-bandwidth bound. On an H200 a
// contiguous f32 add of 16M elements (192 MB) should take ~45 us at ~90% of
// peak. Small tensors (< ~100K elements) are bound by the ~3-5 us launch cost.
// benchmarks/bench_kernels (family "memory") measures these against a
// device-to-device copy of the same run.
//
// The operation is a kernel argument switched on per element (see common.cuh):
// one instantiation per dtype keeps compile time small. The pack path adds no
// instantiations except the floating casts (12 (from, to) pairs); every other
// pair keeps the one runtime-switched kernel, instantiated once per pack width
// (2, 4 or 8), whose packs are raw bytes converted element by element.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "base/float_to_int.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/vectorized.cuh"

namespace mg::kernels::cuda {
namespace {

// ---- the math, per element ---------------------------------------------------------------------
template <class C>
__device__ __forceinline__ bool isnan_(C x) {
  if constexpr (std::is_floating_point<C>::value) {
    return x != x;
  } else {
    return false;
  }
}

template <class C>
__device__ __forceinline__ C unary_math(int op, C x, C p) {
  switch (static_cast<UnaryOp>(op)) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Abs: return x < C(0) ? -x : x;
    case UnaryOp::Relu: return x < C(0) ? C(0) : x;
    case UnaryOp::Square: return x * x;
    case UnaryOp::Sign: return isnan_(x) ? x : static_cast<C>((C(0) < x) - (x < C(0)));
    default: break;
  }
  if constexpr (std::is_floating_point<C>::value) {
    switch (static_cast<UnaryOp>(op)) {
      case UnaryOp::Exp: return exp(x);
      case UnaryOp::Log: return log(x);
      case UnaryOp::Sqrt: return sqrt(x);
      case UnaryOp::Rsqrt: return C(1) / sqrt(x);
      case UnaryOp::Tanh: return tanh(x);
      case UnaryOp::Sigmoid: return C(1) / (C(1) + exp(-x));
      case UnaryOp::GeluTanh: {
        const C k = C(0.7978845608028654);  // sqrt(2 / pi)
        return C(0.5) * x * (C(1) + tanh(k * (x + C(0.044715) * x * x * x)));
      }
      case UnaryOp::PowScalar: return p == C(2) ? x * x : pow(x, p);
      case UnaryOp::Reciprocal: return C(1) / x;
      default: break;
    }
  }
  return x;  // not reached: the host checked the op against the dtype
}

// grad_in given grad g, input x (or output y where the op reads the output).
template <class C>
__device__ __forceinline__ C unary_grad(int op, C g, C v, bool v_is_output, C p) {
  switch (static_cast<UnaryOp>(op)) {
    case UnaryOp::Neg: return -g;
    case UnaryOp::Sign: return C(0);
    case UnaryOp::Exp: return g * (v_is_output ? v : exp(v));
    case UnaryOp::Sqrt: return g / (C(2) * (v_is_output ? v : sqrt(v)));
    case UnaryOp::Rsqrt: {
      const C y = v_is_output ? v : C(1) / sqrt(v);
      return C(-0.5) * g * y * y * y;
    }
    case UnaryOp::Tanh: {
      const C y = v_is_output ? v : tanh(v);
      return g * (C(1) - y * y);
    }
    case UnaryOp::Sigmoid: {
      const C y = v_is_output ? v : C(1) / (C(1) + exp(-v));
      return g * y * (C(1) - y);
    }
    case UnaryOp::Reciprocal: {
      const C y = v_is_output ? v : C(1) / v;
      return -g * y * y;
    }
    case UnaryOp::Log: return g / v;
    case UnaryOp::Abs: return v > C(0) ? g : (v < C(0) ? -g : C(0));
    case UnaryOp::Relu: return v > C(0) ? g : C(0);
    case UnaryOp::GeluTanh: {
      const C k = C(0.7978845608028654), a = C(0.044715);
      const C t = tanh(k * (v + a * v * v * v));
      return g * (C(0.5) * (C(1) + t) + C(0.5) * v * (C(1) - t * t) * k * (C(1) + C(3) * a * v * v));
    }
    case UnaryOp::PowScalar:
      if (p == C(0)) return C(0);
      if (p == C(2)) return C(2) * g * v;
      return g * p * pow(v, p - C(1));
    case UnaryOp::Square: return C(2) * g * v;
  }
  return g;
}

template <class C>
__device__ __forceinline__ C pow_int(C x, C y) {
  using U = std::make_unsigned_t<C>;
  if (y < 0) return static_cast<C>(x == 1 ? 1 : (x == -1 ? ((y & 1) ? -1 : 1) : 0));
  U result = 1, base = static_cast<U>(x);
  for (C e = y; e > 0; e >>= 1) {
    if (e & 1) result *= base;
    base *= base;
  }
  return static_cast<C>(result);
}

// Arithmetic ops return C; comparisons and logical ops return 0/1 in C. Integer +, - and * are
// computed unsigned, so overflow wraps modulo 2^bits as the GPU's add and mul do and as the CPU
// kernels compute; a signed overflow in C++ would be undefined (and the emulator runs this as C++).
template <class C>
__device__ __forceinline__ C binary_math(int op, C x, C y) {
  if constexpr (std::is_integral<C>::value && !std::is_same<C, bool>::value) {
    using U = std::make_unsigned_t<std::common_type_t<C, int>>;  // no promotion back to int
    const U ux = static_cast<U>(x), uy = static_cast<U>(y);
    switch (static_cast<BinaryOp>(op)) {
      case BinaryOp::Add: return static_cast<C>(ux + uy);
      case BinaryOp::Sub: return static_cast<C>(ux - uy);
      case BinaryOp::Mul: return static_cast<C>(ux * uy);
      default: break;
    }
  }
  switch (static_cast<BinaryOp>(op)) {
    case BinaryOp::Add: return x + y;
    case BinaryOp::Sub: return x - y;
    case BinaryOp::Mul: return x * y;
    case BinaryOp::Div: return x / y;  // integer Div is refused on the host
    case BinaryOp::Maximum: return (x > y || isnan_(x)) ? x : y;
    case BinaryOp::Minimum: return (x < y || isnan_(x)) ? x : y;
    case BinaryOp::Pow:
      if constexpr (std::is_floating_point<C>::value) {
        return pow(x, y);
      } else {
        return pow_int(x, y);
      }
    case BinaryOp::Eq: return x == y;
    case BinaryOp::Ne: return x != y;
    case BinaryOp::Lt: return x < y;
    case BinaryOp::Le: return x <= y;
    case BinaryOp::Gt: return x > y;
    case BinaryOp::Ge: return x >= y;
    case BinaryOp::LogicalAnd: return x != C(0) && y != C(0);
    case BinaryOp::LogicalOr: return x != C(0) || y != C(0);
  }
  return x;
}

// ---- kernels -----------------------------------------------------------------------------------

// out = f(in) for one input and one output, element by element or as packs (run_elements): the
// loop unary_kernel and clamp_kernel share. f maps an element's value (loaded as acc_t<T>).
// `oc` by reference: a by-value copy indexed at run time became a 200-byte stack frame in local
// memory in every thread, which made relu 4x slower on an H200 (docs/gpu-h200.md).
template <class T, class F>
__device__ __forceinline__ void map_elements(const OffsetCalc<2>& oc, bool contiguous, PackPlan plan,
                                             int64_t n, const T* in, T* out, F f) {
  auto element = [&](int64_t i) {
    int64_t off[2] = {i, i};
    if (!contiguous) oc.get(i, off);
    store(out + off[0], f(load(in + off[1])));
  };
  constexpr int V = pack_width<T>();
  run_elements<V>(n, plan, element, [&](int64_t i) {
    int64_t off[2];
    pack_offsets(oc, contiguous, i, off);
    const Pack<T, V> x = load_pack_or_splat<V>(in + off[1], plan.unit & 2u);
    Pack<T, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) store(&y.v[j], f(load(&x.v[j])));
    store_pack(out + off[0], y);
  });
}

template <class T>
__global__ void unary_kernel(int op, OffsetCalc<2> oc, bool contiguous, PackPlan plan, int64_t n, const T* in,
                             T* out, acc_t<T> p) {
  using C = acc_t<T>;
  map_elements(oc, contiguous, plan, n, in, out, [&](C v) { return unary_math<C>(op, v, p); });
}

// v == nullptr: the formula reads no saved tensor (neg, sign).
template <class T>
__global__ void unary_backward_kernel(int op, OffsetCalc<3> oc, bool contiguous, PackPlan plan, int64_t n,
                                      const T* g, const T* v, bool v_is_output, T* grad_in, acc_t<T> p) {
  using C = acc_t<T>;
  auto element = [&](int64_t i) {
    int64_t off[3] = {i, i, i};
    if (!contiguous) oc.get(i, off);
    const C value = v ? load(v + off[2]) : C(0);
    store(grad_in + off[0], unary_grad<C>(op, load(g + off[1]), value, v_is_output, p));
  };
  constexpr int V = pack_width<T>();
  run_elements<V>(n, plan, element, [&](int64_t i) {
    int64_t off[3];
    pack_offsets(oc, contiguous, i, off);
    const Pack<T, V> gp = load_pack_or_splat<V>(g + off[1], plan.unit & 2u);
    Pack<T, V> vp = gp;
    if (v) vp = load_pack_or_splat<V>(v + off[2], plan.unit & 4u);
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j)
      store(&o.v[j], unary_grad<C>(op, load(&gp.v[j]), v ? load(&vp.v[j]) : C(0), v_is_output, p));
    store_pack(grad_in + off[0], o);
  });
}

// b == nullptr: the right operand is `scalar` (binary_scalar). Integer
// comparisons with a scalar run in double so that 3 < 2.5 is exact.
template <class C>
__device__ __forceinline__ C binary_value(int op, bool exact_scalar_compare, C x, C y, double scalar) {
  if (exact_scalar_compare) return static_cast<C>(binary_math<double>(op, static_cast<double>(x), scalar));
  return binary_math<C>(op, x, y);
}

template <class T>
__global__ void binary_kernel(int op, bool to_bool, OffsetCalc<3> oc, bool contiguous, PackPlan plan,
                              int64_t n, const T* a, const T* b, double scalar, void* out) {
  using C = acc_t<T>;
  const bool exact = b == nullptr && to_bool && !std::is_floating_point<C>::value;
  const C y_scalar = static_cast<C>(scalar);
  auto element = [&](int64_t i) {
    int64_t off[3] = {i, i, i};
    if (!contiguous) oc.get(i, off);
    const C r = binary_value<C>(op, exact, load(a + off[1]), b ? load(b + off[2]) : y_scalar, scalar);
    if (to_bool) {
      store(static_cast<bool*>(out) + off[0], r);
    } else {
      store(static_cast<T*>(out) + off[0], r);
    }
  };
  constexpr int V = pack_width<T>();
  run_elements<V, !std::is_same<T, bool>::value>(n, plan, element, [&](int64_t i) {
    int64_t off[3];
    pack_offsets(oc, contiguous, i, off);
    const Pack<T, V> x = load_pack_or_splat<V>(a + off[1], plan.unit & 2u);
    Pack<T, V> y;
    if (b) y = load_pack_or_splat<V>(b + off[2], plan.unit & 4u);
    C r[V];
#pragma unroll
    for (int j = 0; j < V; ++j) r[j] = binary_math<C>(op, load(&x.v[j]), b ? load(&y.v[j]) : y_scalar);
    if (to_bool) {
      Pack<bool, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) store(&o.v[j], r[j]);
      store_pack(static_cast<bool*>(out) + off[0], o);
    } else {
      Pack<T, V> o;
#pragma unroll
      for (int j = 0; j < V; ++j) store(&o.v[j], r[j]);
      store_pack(static_cast<T*>(out) + off[0], o);
    }
  });
}

template <class T>
__global__ void axpby_kernel(OffsetCalc<3> oc, bool contiguous, PackPlan plan, int64_t n, const T* a,
                             acc_t<T> alpha, const T* b, T* out) {
  auto element = [&](int64_t i) {
    int64_t off[3] = {i, i, i};
    if (!contiguous) oc.get(i, off);
    store(out + off[0], load(a + off[1]) + alpha * load(b + off[2]));
  };
  constexpr int V = pack_width<T>();
  run_elements<V>(n, plan, element, [&](int64_t i) {
    int64_t off[3];
    pack_offsets(oc, contiguous, i, off);
    const Pack<T, V> x = load_pack_or_splat<V>(a + off[1], plan.unit & 2u);
    const Pack<T, V> y = load_pack_or_splat<V>(b + off[2], plan.unit & 4u);
    Pack<T, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) store(&o.v[j], load(&x.v[j]) + alpha * load(&y.v[j]));
    store_pack(out + off[0], o);
  });
}

// where only moves bytes: one instantiation per element size. A pack of V elements
// reads V condition bytes with one load (16 bytes of bf16 values: 8 bytes of bools).
template <class W>
__global__ void where_kernel(OffsetCalc<4> oc, bool contiguous, PackPlan plan, int64_t n, const bool* c,
                             const W* a, const W* b, W* out) {
  auto element = [&](int64_t i) {
    int64_t off[4] = {i, i, i, i};
    if (!contiguous) oc.get(i, off);
    out[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]];
  };
  constexpr int V = pack_width<W>();
  run_elements<V>(n, plan, element, [&](int64_t i) {
    int64_t off[4];
    pack_offsets(oc, contiguous, i, off);
    const Pack<bool, V> cp = load_pack_or_splat<V>(c + off[1], plan.unit & 2u);
    const Pack<W, V> ap = load_pack_or_splat<V>(a + off[2], plan.unit & 4u);
    const Pack<W, V> bp = load_pack_or_splat<V>(b + off[3], plan.unit & 8u);
    Pack<W, V> o;
#pragma unroll
    for (int j = 0; j < V; ++j) o.v[j] = cp.v[j] ? ap.v[j] : bp.v[j];
    store_pack(out + off[0], o);
  });
}

template <class C>
__device__ __forceinline__ C clamp_value(C x, C lo, C hi, bool lo_above_hi) {
  if (lo_above_hi) return isnan_(x) ? x : hi;
  if (isnan_(x)) return x;
  return x < lo ? lo : (x > hi ? hi : x);
}

template <class T>
__global__ void clamp_kernel(OffsetCalc<2> oc, bool contiguous, PackPlan plan, int64_t n, const T* in, T* out,
                             acc_t<T> lo, acc_t<T> hi, bool lo_above_hi) {
  map_elements(oc, contiguous, plan, n, in, out,
               [&](acc_t<T> v) { return clamp_value(v, lo, hi, lo_above_hi); });
}

template <class T>
__global__ void fill_kernel(OffsetCalc<1> oc, bool contiguous, PackPlan plan, int64_t n, T* out, T value) {
  auto element = [&](int64_t i) {
    int64_t off[1] = {i};
    if (!contiguous) oc.get(i, off);
    out[off[0]] = value;
  };
  constexpr int V = pack_width<T>();
  Pack<T, V> pack;
#pragma unroll
  for (int j = 0; j < V; ++j) pack.v[j] = value;
  run_elements<V>(n, plan, element, [&](int64_t i) {
    int64_t off[1];
    pack_offsets(oc, contiguous, i, off);
    store_pack(out + off[0], pack);
  });
}

template <class T>
__global__ void arange_kernel(int64_t n, int64_t stride, T* out, double start, double step) {
  for_each_index(n, [&](int64_t i) { store(out + i * stride, start + static_cast<double>(i) * step); });
}

// Converting copy: both dtypes are runtime arguments, so this ONE kernel serves
// all 42 pairs of different dtypes (a pair-templated kernel would compile 42
// instantiations). A value travels as double for floating/bool sources and as
// int64 for integer sources, so i64 -> i32/f64 keep every bit the C++ cast keeps.
struct Value {
  double f;
  int64_t i;
  bool is_int;
};

__device__ __forceinline__ Value load_any(const void* p, int64_t off, DType t) {
  switch (t) {
    case DType::f32: return {static_cast<const float*>(p)[off], 0, false};
    case DType::f64: return {static_cast<const double*>(p)[off], 0, false};
    case DType::f16: return {to_float(static_cast<const f16_t*>(p)[off]), 0, false};
    case DType::bf16: return {to_float(static_cast<const bf16_t*>(p)[off]), 0, false};
    case DType::i32: return {0.0, static_cast<const int32_t*>(p)[off], true};
    case DType::i64: return {0.0, static_cast<const int64_t*>(p)[off], true};
    case DType::boolean: return {static_cast<const bool*>(p)[off] ? 1.0 : 0.0, 0, false};
  }
  return {0.0, 0, false};
}

__device__ __forceinline__ void store_any(void* p, int64_t off, DType t, Value v, DType from) {
  switch (t) {
    case DType::f32:
      // f32 source -> exact; f64 -> rounds once; integers -> one rounding from int64.
      static_cast<float*>(p)[off] = v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.f);
      return;
    case DType::f64: static_cast<double*>(p)[off] = v.is_int ? static_cast<double>(v.i) : v.f; return;
    case DType::f16: {
      const float f = v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.f);
      static_cast<f16_t*>(p)[off] = make_f16(f);
      return;
    }
    case DType::bf16: {
      const float f = v.is_int ? static_cast<float>(v.i) : static_cast<float>(v.f);
      static_cast<bf16_t*>(p)[off] = make_bf16(f);
      return;
    }
    case DType::i32:
      // float -> int truncates toward zero, NaN -> 0, out of range -> the nearest bound (cvt.rzi's
      // saturation, written out so the emulator's host build gives the same); f32 sources convert
      // from float as the CPU does.
      static_cast<int32_t*>(p)[off] =
          v.is_int ? static_cast<int32_t>(v.i)
                   : (from == DType::f32 ? saturating_cast<int32_t>(static_cast<float>(v.f))
                                         : saturating_cast<int32_t>(v.f));
      return;
    case DType::i64:
      static_cast<int64_t*>(p)[off] =
          v.is_int ? v.i
                   : (from == DType::f32 ? saturating_cast<int64_t>(static_cast<float>(v.f))
                                         : saturating_cast<int64_t>(v.f));
      return;
    case DType::boolean: static_cast<bool*>(p)[off] = v.is_int ? v.i != 0 : v.f != 0.0; return;
  }
}

// Copies Bytes bytes between two addresses aligned to Bytes (one load and one store).
template <int Bytes>
__device__ __forceinline__ void move_raw(const void* from, void* to) {
  *static_cast<raw_t<Bytes>*>(to) = *static_cast<const raw_t<Bytes>*>(from);
}
// move_raw of `bytes` (2, 4, 8 or 16) known only at run time.
__device__ __forceinline__ void move_raw_any(int bytes, const void* from, void* to) {
  switch (bytes) {
    case 2: return move_raw<2>(from, to);
    case 4: return move_raw<4>(from, to);
    case 8: return move_raw<8>(from, to);
    default: return move_raw<16>(from, to);
  }
}

// V = 16 / the wider element size (2, 4 or 8): one instantiation per pack width. A pack reads V
// source elements (V * in_size bytes, one load), converts them one by one through registers with
// the runtime-switched load_any / store_any, and writes V * out_size bytes with one store.
template <int V>
__global__ void convert_kernel(OffsetCalc<2> oc, bool contiguous, PackPlan plan, int64_t n, const void* in,
                               DType from, int in_size, void* out, DType to, int out_size) {
  run_elements<V>(
      n, plan,
      [&](int64_t i) {
        int64_t off[2] = {i, i};
        if (!contiguous) oc.get(i, off);
        store_any(out, off[0], to, load_any(in, off[1], from), from);
      },
      [&](int64_t i) {
        int64_t off[2];
        pack_offsets(oc, contiguous, i, off);
        alignas(16) unsigned char src[16], dst[16];
        if (plan.unit & 2u) {
          move_raw_any(V * in_size, static_cast<const char*>(in) + off[1] * in_size, src);
#pragma unroll
          for (int j = 0; j < V; ++j) store_any(dst, j, to, load_any(src, j, from), from);
        } else {  // a broadcast source: one element, converted once
          store_any(dst, 0, to, load_any(in, off[1], from), from);
#pragma unroll
          for (int j = 1; j < V; ++j) memcpy(dst + j * out_size, dst, static_cast<size_t>(out_size));
        }
        move_raw_any(V * out_size, dst, static_cast<char*>(out) + off[0] * out_size);
      });
}

// The pack path of the casts between floating dtypes, one instantiation per
// (from, to) pair: store(load(x)) converts exactly as store_any(load_any(x))
// does (halves widen to float, f64 -> f16/bf16 rounds through float).
template <class From, class To>
__global__ void convert_pack_kernel(OffsetCalc<2> oc, bool contiguous, PackPlan plan, int64_t n,
                                    const From* in, To* out) {
  constexpr int V = pack_width<From>() < pack_width<To>() ? pack_width<From>() : pack_width<To>();
  auto element = [&](int64_t i) {
    int64_t off[2] = {i, i};
    if (!contiguous) oc.get(i, off);
    store(out + off[0], load(in + off[1]));
  };
  run_packs<V>(n, plan, element, [&](int64_t i) {
    int64_t off[2];
    pack_offsets(oc, contiguous, i, off);
    const Pack<From, V> x = load_pack_or_splat<V>(in + off[1], plan.unit & 2u);
    Pack<To, V> y;
#pragma unroll
    for (int j = 0; j < V; ++j) store(&y.v[j], load(&x.v[j]));
    store_pack(out + off[0], y);
  });
}

// ---- host side ---------------------------------------------------------------------------------
void check_same_shape(const char* what, const StridedView& v, const StridedView& out) {
  bool same = v.ndim == out.ndim;
  for (int d = 0; same && d < v.ndim; ++d) same = v.shape[d] == out.shape[d];
  MG_CHECK(same, what,
           " (CUDA): an operand's shape differs from the output's (inputs must be broadcast first)");
}

void check_dtype(const char* what, const StridedView& v, DType expected) {
  MG_CHECK(v.dtype == expected, what, " (CUDA): operand dtype ", dtype_name(v.dtype), ", expected ",
           dtype_name(expected));
}

}  // namespace

void unary(cudaStream_t stream, UnaryOp op, const StridedView& in, const StridedView& out, double scalar) {
  const char* name = unary_op_name(op);
  check_same_shape(name, in, out);
  check_dtype(name, out, in.dtype);
  MG_CHECK(is_floating(in.dtype) || (is_integral(in.dtype) && unary_op_accepts_integers(op)), name,
           " (CUDA): unsupported dtype ", dtype_name(in.dtype));
  const int64_t n = out.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[2] = {&out, &in};
  const OffsetCalc<2> oc = make_offset_calc<2>(views, &contiguous);
  visit_all(in.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (!std::is_same<T, bool>::value) {
      constexpr int V = pack_width<T>();
      const PackPlan plan = plan_packs<2>(oc, views, n, V);
      launch_kernel<unary_kernel<T>>(grid_of(n, plan, V), kThreads, 0, stream, static_cast<int>(op), oc,
                                     contiguous, plan, n, in.ptr<const T>(), out.ptr<T>(),
                                     static_cast<acc_t<T>>(scalar));
    }
  });
}

void unary_backward(cudaStream_t stream, UnaryOp op, const StridedView& grad_out, const StridedView& input,
                    const StridedView& output, const StridedView& grad_in, double scalar) {
  const char* name = unary_op_name(op);
  check_same_shape(name, grad_out, grad_in);
  check_dtype(name, grad_in, grad_out.dtype);
  // Which saved tensor the formula reads (kernels/cpu/elementwise.h's table).
  const bool reads_nothing = op == UnaryOp::Neg || op == UnaryOp::Sign;
  const bool may_read_output = op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt ||
                               op == UnaryOp::Tanh || op == UnaryOp::Sigmoid || op == UnaryOp::Reciprocal;
  const bool use_output = may_read_output && output.data != nullptr;
  const StridedView* saved = reads_nothing ? nullptr : (use_output ? &output : &input);
  if (saved) {
    MG_CHECK(saved->data != nullptr, name, " backward (CUDA): needs the forward input, got an empty view");
    check_same_shape(name, *saved, grad_in);
    check_dtype(name, *saved, grad_out.dtype);
  }
  const int64_t n = grad_in.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[3] = {&grad_in, &grad_out, saved ? saved : &grad_out};
  const OffsetCalc<3> oc = make_offset_calc<3>(views, &contiguous);
  visit_float(grad_out.dtype, name, [&](auto t) {
    using T = typename decltype(t)::type;
    constexpr int V = pack_width<T>();
    const PackPlan plan = plan_packs<3>(oc, views, n, V);
    launch_kernel<unary_backward_kernel<T>>(grid_of(n, plan, V), kThreads, 0, stream, static_cast<int>(op),
                                            oc, contiguous, plan, n, grad_out.ptr<const T>(),
                                            saved ? saved->ptr<const T>() : nullptr, use_output,
                                            grad_in.ptr<T>(), static_cast<acc_t<T>>(scalar));
  });
}

namespace {
void binary_impl(cudaStream_t stream, BinaryOp op, const StridedView& a, const StridedView* b, double scalar,
                 const StridedView& out) {
  const char* name = binary_op_name(op);
  const bool to_bool = binary_op_returns_bool(op);
  check_same_shape(name, a, out);
  if (b) {
    check_same_shape(name, *b, out);
    check_dtype(name, *b, a.dtype);
  }
  check_dtype(name, out, to_bool ? DType::boolean : a.dtype);
  MG_CHECK(a.dtype != DType::boolean || !(op == BinaryOp::Sub || op == BinaryOp::Pow), name,
           " (CUDA): not supported for bool; convert to an integer dtype first");
  MG_CHECK(is_floating(a.dtype) || op != BinaryOp::Div, name,
           " (CUDA): integer division is not supported; promote to a floating dtype first");
  if (!b && !to_bool && !is_floating(a.dtype)) {
    // The scalar must fit the compute type (int32 for i32 and bool, int64 for i64), as on the CPU.
    const double limit = a.dtype == DType::i64 ? 9223372036854775808.0 : 2147483648.0;
    MG_CHECK(std::trunc(scalar) == scalar && scalar >= -limit && scalar < limit, "binary_scalar ", name,
             " (CUDA): scalar ", scalar, " is not representable in dtype ", dtype_name(a.dtype),
             "; promote the tensor first");
  }
  const int64_t n = out.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[3] = {&out, &a, b ? b : &a};
  const OffsetCalc<3> oc = make_offset_calc<3>(views, &contiguous);
  visit_all(a.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    constexpr int V = pack_width<T>();
    // bool operands and the exact integer-vs-scalar comparisons stay on the
    // scalar path: rare, and leaving them out keeps the pack code small.
    const bool scalar_only = a.dtype == DType::boolean || (!b && to_bool && !is_floating(a.dtype));
    const PackPlan plan = scalar_only ? PackPlan{} : plan_packs<3>(oc, views, n, V);
    launch_kernel<binary_kernel<T>>(grid_of(n, plan, V), kThreads, 0, stream, static_cast<int>(op), to_bool,
                                    oc, contiguous, plan, n, a.ptr<const T>(),
                                    b ? b->ptr<const T>() : nullptr, scalar, out.data);
  });
}
}  // namespace

void binary(cudaStream_t stream, BinaryOp op, const StridedView& a, const StridedView& b,
            const StridedView& out) {
  binary_impl(stream, op, a, &b, 0.0, out);
}

void binary_scalar(cudaStream_t stream, BinaryOp op, const StridedView& a, double scalar,
                   const StridedView& out) {
  binary_impl(stream, op, a, nullptr, scalar, out);
}

void axpby(cudaStream_t stream, const StridedView& a, double alpha, const StridedView& b,
           const StridedView& out) {
  check_same_shape("axpby", a, out);
  check_same_shape("axpby", b, out);
  check_dtype("axpby", b, a.dtype);
  check_dtype("axpby", out, a.dtype);
  const int64_t n = out.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[3] = {&out, &a, &b};
  const OffsetCalc<3> oc = make_offset_calc<3>(views, &contiguous);
  visit_float(a.dtype, "axpby", [&](auto t) {
    using T = typename decltype(t)::type;
    constexpr int V = pack_width<T>();
    const PackPlan plan = plan_packs<3>(oc, views, n, V);
    launch_kernel<axpby_kernel<T>>(grid_of(n, plan, V), kThreads, 0, stream, oc, contiguous, plan, n,
                                   a.ptr<const T>(), static_cast<acc_t<T>>(alpha), b.ptr<const T>(),
                                   out.ptr<T>());
  });
}

void where(cudaStream_t stream, const StridedView& condition, const StridedView& a, const StridedView& b,
           const StridedView& out) {
  check_same_shape("where", condition, out);
  check_same_shape("where", a, out);
  check_same_shape("where", b, out);
  check_dtype("where", condition, DType::boolean);
  check_dtype("where", b, a.dtype);
  check_dtype("where", out, a.dtype);
  const int64_t n = out.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[4] = {&out, &condition, &a, &b};
  const OffsetCalc<4> oc = make_offset_calc<4>(views, &contiguous);
  visit_width(dtype_size(a.dtype), [&](auto t) {
    using W = typename decltype(t)::type;
    constexpr int V = pack_width<W>();
    const PackPlan plan = plan_packs<4>(oc, views, n, V);
    launch_kernel<where_kernel<W>>(grid_of(n, plan, V), kThreads, 0, stream, oc, contiguous, plan, n,
                                   condition.ptr<const bool>(), a.ptr<const W>(), b.ptr<const W>(),
                                   out.ptr<W>());
  });
}

void clamp(cudaStream_t stream, const StridedView& in, const StridedView& out, double lo, double hi) {
  check_same_shape("clamp", in, out);
  check_dtype("clamp", out, in.dtype);
  MG_CHECK(in.dtype != DType::boolean, "clamp (CUDA): not supported for bool");
  const int64_t n = out.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[2] = {&out, &in};
  const OffsetCalc<2> oc = make_offset_calc<2>(views, &contiguous);
  visit_all(in.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    using C = acc_t<T>;
    if constexpr (!std::is_same<T, bool>::value) {
      C l, h;
      if constexpr (std::is_floating_point<C>::value) {
        l = static_cast<C>(lo);
        h = static_cast<C>(hi);
      } else {  // integer bounds: round inward, then saturate to the dtype's range
        const double min_v = static_cast<double>(std::numeric_limits<C>::lowest());
        const double lo_in = std::ceil(lo), hi_in = std::floor(hi);
        l = lo_in <= min_v ? std::numeric_limits<C>::lowest()
                           : (lo_in >= -min_v ? std::numeric_limits<C>::max() : static_cast<C>(lo_in));
        h = hi_in <= min_v ? std::numeric_limits<C>::lowest()
                           : (hi_in >= -min_v ? std::numeric_limits<C>::max() : static_cast<C>(hi_in));
      }
      constexpr int V = pack_width<T>();
      const PackPlan plan = plan_packs<2>(oc, views, n, V);
      launch_kernel<clamp_kernel<T>>(grid_of(n, plan, V), kThreads, 0, stream, oc, contiguous, plan, n,
                                     in.ptr<const T>(), out.ptr<T>(), l, h, lo > hi);
    }
  });
}

void fill(cudaStream_t stream, const StridedView& out, double value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[1] = {&out};
  const OffsetCalc<1> oc = make_offset_calc<1>(views, &contiguous);
  // The value is converted on the host with the CPU's own rules (base/half.h),
  // then written as raw bits of the element's width.
  uint64_t bits = 0;
  ::mg::visit_dtype(out.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    T v;
    if constexpr (std::is_same<T, bool>::value) {
      v = value != 0.0;
    } else if constexpr (std::is_same<T, f16>::value || std::is_same<T, bf16>::value) {
      v = T(static_cast<float>(value));
    } else {
      v = static_cast<T>(value);
    }
    std::memcpy(&bits, &v, sizeof(T));
  });
  visit_width(dtype_size(out.dtype), [&](auto t) {
    using W = typename decltype(t)::type;
    W w;
    std::memcpy(&w, &bits, sizeof(W));
    constexpr int V = pack_width<W>();
    const PackPlan plan = plan_packs<1>(oc, views, n, V);
    launch_kernel<fill_kernel<W>>(grid_of(n, plan, V), kThreads, 0, stream, oc, contiguous, plan, n,
                                  out.ptr<W>(), w);
  });
}

void arange(cudaStream_t stream, const StridedView& out, double start, double step) {
  MG_CHECK(out.ndim == 1, "arange (CUDA): expected a 1-d output");
  MG_CHECK(out.dtype != DType::boolean, "arange (CUDA): not supported for bool");
  const int64_t n = out.numel();
  if (n == 0) return;
  visit_all(out.dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (!std::is_same<T, bool>::value)
      launch_kernel<arange_kernel<T>>(grid_for(n, 4), kThreads, 0, stream, n, out.strides[0], out.ptr<T>(),
                                      start, step);
  });
}

void copy(cudaStream_t stream, const StridedView& in, const StridedView& out) {
  check_same_shape("copy", in, out);
  const int64_t n = out.numel();
  if (n == 0) return;
  bool contiguous = false;
  const StridedView* views[2] = {&out, &in};
  const OffsetCalc<2> oc = make_offset_calc<2>(views, &contiguous);
  if (in.dtype == out.dtype) {
    if (contiguous) {  // one block of bytes: the copy engine does it at full bandwidth
      MG_CUDA_CHECK(cudaMemcpyAsync(out.data, in.data, static_cast<size_t>(n) * dtype_size(in.dtype),
                                    cudaMemcpyDeviceToDevice, stream));
      return;
    }
    copy_same_dtype(stream, in, out, oc);  // transpose.cu
    return;
  }
  // Casts between floating dtypes take their own kernel's pack path when they can; every
  // other pair goes through the one runtime-switched kernel (with packs when it can).
  const int V = static_cast<int>(16 / std::max(dtype_size(in.dtype), dtype_size(out.dtype)));
  const PackPlan plan = plan_packs<2>(oc, views, n, V);
  const bool both_floating = is_floating(in.dtype) && is_floating(out.dtype);
  if (both_floating && plan.head >= 0) {
    visit_float(in.dtype, "copy", [&](auto from) {
      visit_float(out.dtype, "copy", [&](auto to) {
        using From = typename decltype(from)::type;
        using To = typename decltype(to)::type;
        if constexpr (!std::is_same<From, To>::value) {
          launch_kernel<convert_pack_kernel<From, To>>(grid_of(n, plan, V), kThreads, 0, stream, oc,
                                                       contiguous, plan, n, in.ptr<const From>(),
                                                       out.ptr<To>());
        }
      });
    });
    return;
  }
  const PackPlan any_plan = both_floating ? PackPlan{} : plan;
  const int in_size = static_cast<int>(dtype_size(in.dtype)),
            out_size = static_cast<int>(dtype_size(out.dtype));
  auto launch = [&](auto kernel_tag) {
    constexpr int kV = decltype(kernel_tag)::value;
    launch_kernel<convert_kernel<kV>>(grid_of(n, any_plan, kV), kThreads, 0, stream, oc, contiguous, any_plan,
                                      n, in.data, in.dtype, in_size, out.data, out.dtype, out_size);
  };
  switch (V) {
    case 2: return launch(std::integral_constant<int, 2>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    default: return launch(std::integral_constant<int, 8>{});
  }
}

}  // namespace mg::kernels::cuda
