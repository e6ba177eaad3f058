// The emulated NCCL's types and reductions: every rank's bytes are reduced locally in rank order
// 0..n-1, so all ranks get bitwise-identical results. fp16 and bf16 reduce in float, rounded to
// nearest even after every step like NCCL's per-step reduction. Avg is NCCL's: floats pre-multiply
// each input by 1/n, integers sum then divide. Integers wrap around.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "cuda_emu/nccl_internal.h"

namespace mg_emu::nccl {

size_t type_size(int type) {  // int8 uint8 int32 uint32 int64 uint64 f16 f32 f64 bf16 f8e4m3 f8e5m2
  static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return type >= 0 && type < int(ncclNumTypes) ? sizes[type] : 0;
}

// How a type is reduced: S is how it is stored, V what it is reduced in; up and down convert.
template <class T>
struct Plain {
  using S = T;
  using V = T;
  static V up(S s) { return s; }
  static S down(V v) { return v; }
};
struct Half {  // fp16 in float, rounded to nearest even after every step
  using S = __half;
  using V = float;
  static V up(S s) { return __half2float(s); }
  static S down(V v) { return __float2half_rn(v); }
};
struct BHalf {  // bf16 likewise
  using S = __nv_bfloat16;
  using V = float;
  static V up(S s) { return __bfloat162float(s); }
  static S down(V v) { return __float2bfloat16_rn(v); }
};

template <class V>
V combine(ncclRedOp_t op, V a, V b) {
  if (op == ncclMax) return a < b ? b : a;
  if (op == ncclMin) return b < a ? b : a;
  if constexpr (std::is_integral<V>::value) {  // unsigned arithmetic: wraps, no signed overflow
    using U = std::make_unsigned_t<V>;
    return op == ncclProd ? V(U(a) * U(b)) : V(U(a) + U(b));
  } else {
    return op == ncclProd ? a * b : a + b;
  }
}

// out[i] = in_0[i] op in_1[i] op ... op in_{n-1}[i], left to right; in_r starts at in + r * stride.
template <class Tr>
void reduce_typed(ncclRedOp_t op, int n, const char* in, size_t stride, size_t elems, char* out) {
  using S = typename Tr::S;
  using V = typename Tr::V;
  const auto load = [in](size_t offset) {
    S s;
    std::memcpy(&s, in + offset, sizeof(S));
    return Tr::up(s);
  };
  const auto round = [](V v) { return Tr::up(Tr::down(v)); };
  // Avg as NCCL: floats pre-multiply by 1/n (float, or double for double, rounded to the type).
  const bool premultiply = op == ncclAvg && std::is_floating_point<V>::value;
  const V factor = round(V(1) / V(n));
  for (size_t i = 0; i < elems; ++i) {
    V acc = load(i * sizeof(S));
    if (premultiply) acc = round(acc * factor);
    for (int r = 1; r < n; ++r) {
      V v = load(size_t(r) * stride + i * sizeof(S));
      if (premultiply) v = round(v * factor);
      acc = round(combine(op, acc, v));
    }
    if constexpr (std::is_integral<V>::value) {  // integers: sum, then divide
      using Wide = std::conditional_t<std::is_signed<V>::value, long long, unsigned long long>;
      if (op == ncclAvg) acc = V(Wide(acc) / Wide(n));
    }
    const S s = Tr::down(acc);
    std::memcpy(out + i * sizeof(S), &s, sizeof(S));
  }
}

void reduce(int type, int op_value, int n, const char* in, size_t stride, size_t elems, char* out) {
  const auto op = ncclRedOp_t(op_value);
  switch (type) {
    case ncclInt8: return reduce_typed<Plain<int8_t>>(op, n, in, stride, elems, out);
    case ncclUint8: return reduce_typed<Plain<uint8_t>>(op, n, in, stride, elems, out);
    case ncclInt32: return reduce_typed<Plain<int32_t>>(op, n, in, stride, elems, out);
    case ncclUint32: return reduce_typed<Plain<uint32_t>>(op, n, in, stride, elems, out);
    case ncclInt64: return reduce_typed<Plain<int64_t>>(op, n, in, stride, elems, out);
    case ncclUint64: return reduce_typed<Plain<uint64_t>>(op, n, in, stride, elems, out);
    case ncclFloat16: return reduce_typed<Half>(op, n, in, stride, elems, out);
    case ncclFloat32: return reduce_typed<Plain<float>>(op, n, in, stride, elems, out);
    case ncclFloat64: return reduce_typed<Plain<double>>(op, n, in, stride, elems, out);
    case ncclBfloat16: return reduce_typed<BHalf>(op, n, in, stride, elems, out);
    default: return;  // refused at call time
  }
}

}  // namespace mg_emu::nccl
