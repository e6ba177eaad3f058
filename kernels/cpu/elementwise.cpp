// Elementwise CPU kernels (see elementwise.h for the contract).
//
// Why it is written this way. Every kernel here is a map over the output's
// elements, and every one is memory bound: a unary f32 op reads 4 B and writes
// 4 B per element, a binary op moves 12 B, where 13 B, while even tanh or the
// GELU costs only a few tens of FLOPs. The target is therefore the bandwidth a
// plain memcpy reaches, and the code is organised around streaming memory:
//
//   1. Coalesce. Size-1 dims are dropped and neighbouring dims merged whenever
//      every operand steps through them as one (stride[d] == stride[d+1] *
//      shape[d+1]). A contiguous tensor of any shape becomes a single row; a
//      bias add [N, C] + [C] becomes N rows of C in which the bias has stride
//      1 and row stride 0.
//   2. Rows. The innermost remaining dim is a "row". A row whose strides are
//      all 1 runs a flat loop over __restrict pointers with the op inlined (it
//      is a lambda, a template argument, never a function pointer), which the
//      compiler turns into SIMD. A row whose right operand has stride 0 (a
//      scalar, or x * y[:, None]) loads that value once. Anything else runs a
//      plain strided loop.
//   3. The outer dims are walked with StridedIndexer, one step per row, so its
//      carry logic costs once per row rather than once per element.
//   4. Maps of at least kElementwiseParallelNumel elements split their rows (or their
//      single long row) across OpenMP threads when the build has OpenMP.
//   5. A copy that transposes (x.t().contiguous()) goes tile by tile instead
//      of row by row, so that each cache line of the input it loads is used
//      whole before it is evicted (several times faster on a 4096^2 f32 matrix).
//
// f16/bf16 are storage formats only: an element is widened to float, the op
// runs in float, and the result is rounded to nearest even on store.
#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>

#include "base/float_to_int.h"
#include "kernels/cpu/parallel_for.h"

namespace mg::kernels::cpu {

namespace {

constexpr int64_t kElementwiseParallelNumel = int64_t{1}
                                              << 16;  // below this, starting threads costs more than it saves

// ---- element types -----------------------------------------------------------

// Elements are computed in acc_t<T> (base/dtype.h): float for f16/bf16, and int
// for bool so that true + true == 2 (stored back as true) and `x == 2` is false.
template <class T>
inline acc_t<T> load(T v) {
  return static_cast<acc_t<T>>(v);
}

// Rounds a computed value into the storage type: nonzero -> true for bool,
// round-to-nearest-even for f16/bf16 (their float constructors).
template <class T, class V>
inline T store(V v) {
  if constexpr (std::is_same<T, bool>::value) {
    return v != V(0);
  } else {
    return static_cast<T>(v);
  }
}

// copy()'s conversion between any two storage types.
template <class To, class From>
inline To convert(From v) {
  if constexpr (std::is_same<To, From>::value) {
    return v;
  } else if constexpr (std::is_same<To, bool>::value) {
    return static_cast<acc_t<From>>(v) != 0;
  } else if constexpr (std::is_same<To, f16>::value || std::is_same<To, bf16>::value) {
    return To(static_cast<float>(v));  // f64 -> float -> half: rounds twice, as documented
  } else if constexpr (std::is_integral<To>::value && std::is_floating_point<acc_t<From>>::value) {
    // float -> int truncates toward zero; NaN -> 0 and out of range -> the nearest bound, as the GPU
    return saturating_cast<To>(static_cast<acc_t<From>>(v));
  } else {
    return static_cast<To>(static_cast<acc_t<From>>(v));
  }
}

// ---- error messages ------------------------------------------------------------

std::string shape_str(const StridedView& v) {
  std::string s = "[";
  for (int d = 0; d < v.ndim; ++d) s += (d ? ", " : "") + std::to_string(v.shape[d]);
  return s + "]";
}

bool same_shape(const StridedView& a, const StridedView& b) {
  if (a.ndim != b.ndim) return false;
  for (int d = 0; d < a.ndim; ++d)
    if (a.shape[d] != b.shape[d]) return false;
  return true;
}

void check_shape(const char* what, const char* name, const StridedView& v, const StridedView& out) {
  MG_CHECK(same_shape(v, out), what, ": ", name, " has shape ", shape_str(v), " but the output has shape ",
           shape_str(out), " (inputs must already be broadcast to the output shape)");
}

void check_dtype(const char* what, const char* name, const StridedView& v, DType expected) {
  MG_CHECK(v.dtype == expected, what, ": ", name, " has dtype ", dtype_name(v.dtype), ", expected ",
           dtype_name(expected));
}

// ---- the row loop ----------------------------------------------------------------

// Drops size-1 dims and merges neighbouring dims that every operand walks as
// one. All views have views[0]'s shape. Leaves at least one dim.
template <int N>
std::array<StridedView, N> coalesce(std::array<StridedView, N> v) {
  int nd = 0;
  for (int d = 0; d < v[0].ndim; ++d) {
    const int64_t size = v[0].shape[d];
    if (size == 1) continue;
    bool merge = nd > 0;
    for (int k = 0; k < N && merge; ++k) merge = v[k].strides[nd - 1] == v[k].strides[d] * size;
    for (int k = 0; k < N; ++k) {
      if (merge) {
        v[k].shape[nd - 1] *= size;
        v[k].strides[nd - 1] = v[k].strides[d];
      } else {
        v[k].shape[nd] = size;
        v[k].strides[nd] = v[k].strides[d];
      }
    }
    if (!merge) ++nd;
  }
  if (nd == 0) {  // a scalar, or all dims of size 1
    for (int k = 0; k < N; ++k) {
      v[k].shape[0] = 1;
      v[k].strides[0] = 1;
    }
    nd = 1;
  }
  for (int k = 0; k < N; ++k) v[k].ndim = nd;
  return v;
}

using Offsets2 = std::array<int64_t, 2>;

// Calls row(offsets, strides, n) once per innermost row of the (coalesced)
// iteration space: element i of operand k in that row sits at
// offsets[k] + i * strides[k] elements from views[k].data.
template <int N, class Row>
void for_each_row(const std::array<StridedView, N>& views, const Row& row) {
  const int64_t numel = views[0].numel();
  if (numel == 0) return;
  const std::array<StridedView, N> v = coalesce<N>(views);
  const int last = v[0].ndim - 1;
  const int64_t inner = v[0].shape[last];
  std::array<int64_t, N> inner_strides;
  for (int k = 0; k < N; ++k) inner_strides[k] = v[k].strides[last];
  const int64_t rows = numel / inner;
  const bool parallel = numel >= kElementwiseParallelNumel;

  if (rows == 1) {  // one long row: split it
    parallel_for(inner, parallel, [&](int64_t begin, int64_t end) {
      std::array<int64_t, N> offsets;
      for (int k = 0; k < N; ++k) offsets[k] = begin * inner_strides[k];
      row(offsets, inner_strides, end - begin);
    });
    return;
  }
  StridedView outer = v[0];
  outer.ndim = last;
  std::array<const StridedView*, N> operands;
  for (int k = 0; k < N; ++k) operands[k] = &v[k];
  parallel_for(rows, parallel, [&](int64_t begin, int64_t end) {
    StridedIndexer<N> it(outer, operands);
    it.seek(begin);
    for (int64_t r = begin; r < end; ++r) {
      row(it.offset, inner_strides, inner);
      it.next();
    }
  });
}

// out[i] = f(in[i]) along one row.
template <class In, class Out, class F>
void unary_row(const In* __restrict in, int64_t in_stride, Out* __restrict out, int64_t out_stride, int64_t n,
               const F& f) {
  if (in_stride == 1 && out_stride == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = store<Out>(f(load(in[i])));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i * out_stride] = store<Out>(f(load(in[i * in_stride])));
  }
}

// out[i] = f(a[i], b[i]) along one row.
template <class T, class Out, class F>
void binary_row(const T* __restrict a, int64_t sa, const T* __restrict b, int64_t sb, Out* __restrict out,
                int64_t so, int64_t n, const F& f) {
  if (sa == 1 && sb == 1 && so == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = store<Out>(f(load(a[i]), load(b[i])));
  } else if (sa == 1 && sb == 0 && so == 1) {
    const acc_t<T> y = load(b[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = store<Out>(f(load(a[i]), y));
  } else if (sa == 0 && sb == 1 && so == 1) {
    const acc_t<T> x = load(a[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = store<Out>(f(x, load(b[i])));
  } else {
    for (int64_t i = 0; i < n; ++i) out[i * so] = store<Out>(f(load(a[i * sa]), load(b[i * sb])));
  }
}

template <class In, class Out, class F>
void map_unary(const StridedView& in, const StridedView& out, const F& f) {
  const In* x = in.ptr<const In>();
  Out* y = out.ptr<Out>();
  for_each_row<2>({out, in}, [&](const Offsets2& off, const Offsets2& st, int64_t n) {
    unary_row(x + off[1], st[1], y + off[0], st[0], n, f);
  });
}

template <class T, class Out, class F>
void map_binary(const StridedView& a, const StridedView& b, const StridedView& out, const F& f) {
  const T* x = a.ptr<const T>();
  const T* y = b.ptr<const T>();
  Out* z = out.ptr<Out>();
  for_each_row<3>({out, a, b},
                  [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& st, int64_t n) {
                    binary_row(x + off[1], st[1], y + off[2], st[2], z + off[0], st[0], n, f);
                  });
}

// ---- unary -----------------------------------------------------------------------

template <class T>
void unary_typed(UnaryOp op, const StridedView& in, const StridedView& out, double scalar) {
  using C = acc_t<T>;
  auto run = [&](const auto& f) { map_unary<T, T>(in, out, f); };
  switch (op) {  // ops defined for integers and floats
    case UnaryOp::Neg: return run([](C x) -> C { return -x; });
    case UnaryOp::Abs: return run([](C x) -> C { return std::abs(x); });
    case UnaryOp::Relu: return run([](C x) -> C { return x < C(0) ? C(0) : x; });  // NaN stays NaN
    case UnaryOp::Square: return run([](C x) -> C { return x * x; });
    case UnaryOp::Sign:
      return run([](C x) -> C { return is_nan(x) ? x : static_cast<C>((C(0) < x) - (x < C(0))); });
    default: break;
  }
  if constexpr (std::is_floating_point<C>::value) {
    switch (op) {
      case UnaryOp::Exp: return run([](C x) { return std::exp(x); });
      case UnaryOp::Log: return run([](C x) { return std::log(x); });
      case UnaryOp::Sqrt: return run([](C x) { return std::sqrt(x); });
      case UnaryOp::Rsqrt: return run([](C x) { return C(1) / std::sqrt(x); });
      case UnaryOp::Tanh: return run([](C x) { return std::tanh(x); });
      case UnaryOp::Sigmoid: return run([](C x) { return C(1) / (C(1) + std::exp(-x)); });
      case UnaryOp::GeluTanh:
        return run([](C x) {
          const C k = C(0.7978845608028654);  // sqrt(2 / pi)
          return C(0.5) * x * (C(1) + std::tanh(k * (x + C(0.044715) * x * x * x)));
        });
      case UnaryOp::PowScalar: {
        if (scalar == 2.0) return run([](C x) { return x * x; });  // exact, and 10x cheaper than pow
        const C p = static_cast<C>(scalar);
        return run([p](C x) { return std::pow(x, p); });
      }
      case UnaryOp::Reciprocal: return run([](C x) { return C(1) / x; });
      default: break;
    }
  }
  throw Error(str_cat("unary ", unary_op_name(op), ": unsupported dtype ", dtype_name(in.dtype)));
}

// ---- unary backward -------------------------------------------------------------

template <class T>
void unary_backward_typed(UnaryOp op, const StridedView& grad_out, const StridedView& input,
                          const StridedView& output, const StridedView& grad_in, double scalar) {
  using C = acc_t<T>;
  const bool have_output = output.data != nullptr;
  // f(g) with no saved tensor; f(g, x) reading the input; f(g, y) reading the output.
  auto from_grad = [&](const auto& f) { map_unary<T, T>(grad_out, grad_in, f); };
  auto from_input = [&](const auto& f) { map_binary<T, T>(grad_out, input, grad_in, f); };
  auto from_output = [&](const auto& f) { map_binary<T, T>(grad_out, output, grad_in, f); };
  switch (op) {
    case UnaryOp::Neg: return from_grad([](C g) { return -g; });
    case UnaryOp::Sign: return from_grad([](C) { return C(0); });
    case UnaryOp::Exp:
      if (have_output) return from_output([](C g, C y) { return g * y; });
      return from_input([](C g, C x) { return g * std::exp(x); });
    case UnaryOp::Sqrt:
      if (have_output) return from_output([](C g, C y) { return g / (C(2) * y); });
      return from_input([](C g, C x) { return g / (C(2) * std::sqrt(x)); });
    case UnaryOp::Rsqrt:
      if (have_output) return from_output([](C g, C y) { return C(-0.5) * g * y * y * y; });
      return from_input([](C g, C x) {
        const C y = C(1) / std::sqrt(x);
        return C(-0.5) * g * y * y * y;
      });
    case UnaryOp::Tanh:
      if (have_output) return from_output([](C g, C y) { return g * (C(1) - y * y); });
      return from_input([](C g, C x) {
        const C y = std::tanh(x);
        return g * (C(1) - y * y);
      });
    case UnaryOp::Sigmoid:
      if (have_output) return from_output([](C g, C y) { return g * y * (C(1) - y); });
      return from_input([](C g, C x) {
        const C y = C(1) / (C(1) + std::exp(-x));
        return g * y * (C(1) - y);
      });
    case UnaryOp::Reciprocal:
      if (have_output) return from_output([](C g, C y) { return -g * y * y; });
      return from_input([](C g, C x) {
        const C y = C(1) / x;
        return -g * y * y;
      });
    case UnaryOp::Log: return from_input([](C g, C x) { return g / x; });
    case UnaryOp::Abs: return from_input([](C g, C x) { return x > C(0) ? g : (x < C(0) ? -g : C(0)); });
    case UnaryOp::Relu: return from_input([](C g, C x) { return x > C(0) ? g : C(0); });
    case UnaryOp::GeluTanh:
      // y = 0.5 x (1 + t), t = tanh(u), u = k (x + a x^3):
      // dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) k (1 + 3 a x^2)
      return from_input([](C g, C x) {
        const C k = C(0.7978845608028654), a = C(0.044715);
        const C t = std::tanh(k * (x + a * x * x * x));
        return g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * k * (C(1) + C(3) * a * x * x));
      });
    case UnaryOp::PowScalar: {
      const C p = static_cast<C>(scalar);
      if (scalar == 0.0) return from_grad([](C) { return C(0); });
      if (scalar == 2.0) return from_input([](C g, C x) { return C(2) * g * x; });
      return from_input([p](C g, C x) { return g * p * std::pow(x, p - C(1)); });
    }
    case UnaryOp::Square: return from_input([](C g, C x) { return C(2) * g * x; });
  }
  throw Error(str_cat("unary_backward: unknown op ", static_cast<int>(op)));
}

// Which saved tensor unary_backward reads for `op` (see the table in elementwise.h).
enum class Saved { None, Input, Output };

Saved saved_operand(UnaryOp op, bool have_output) {
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::Sign: return Saved::None;
    case UnaryOp::Exp:
    case UnaryOp::Sqrt:
    case UnaryOp::Rsqrt:
    case UnaryOp::Tanh:
    case UnaryOp::Sigmoid:
    case UnaryOp::Reciprocal: return have_output ? Saved::Output : Saved::Input;
    case UnaryOp::PowScalar:  // (p == 0 reads nothing, but asking for x keeps the rule simple)
    default: return Saved::Input;
  }
}

// ---- binary ----------------------------------------------------------------------

// Integer +, - and * in unsigned arithmetic, so overflow wraps modulo 2^bits (as in PyTorch, and
// as the GPU's add/sub/mul do) instead of being undefined: a loaded int64 counter at INT64_MAX
// plus one is INT64_MIN, not anything at all. Floats are computed as they are.
template <class X, class Op>
X wrapping(X x, X y, Op op) {
  if constexpr (std::is_integral<X>::value && !std::is_same<X, bool>::value) {
    using U = std::make_unsigned_t<X>;
    return static_cast<X>(op(static_cast<U>(x), static_cast<U>(y)));
  } else {
    return op(x, y);
  }
}

// Integer power by squaring, in unsigned arithmetic so overflow wraps (as in
// PyTorch) instead of being undefined. Floats use std::pow.
template <class X, class Y>
auto pow_op(X x, Y y) {
  if constexpr (std::is_floating_point<X>::value || std::is_floating_point<Y>::value) {
    return std::pow(x, y);
  } else {
    using U = std::make_unsigned_t<X>;
    if (y < 0) return static_cast<X>(x == 1 ? 1 : (x == -1 ? ((y & 1) ? -1 : 1) : 0));
    U result = 1;
    U base = static_cast<U>(x);
    for (Y e = y; e > 0; e >>= 1) {
      if (e & 1) result *= base;
      base *= base;
    }
    return static_cast<X>(result);
  }
}

// The binary op table, written once for binary() and binary_scalar(). Each
// entry hands `launch` the output element type and the element function;
// the launcher decides where the right operand comes from.
template <class Launch>
void dispatch_binary(BinaryOp op, const Launch& launch) {
  using T = typename Launch::type;
  switch (op) {
    case BinaryOp::Add:
      return launch.template run<T>(
          [](auto x, auto y) { return wrapping<decltype(x)>(x, y, std::plus<>()); });
    case BinaryOp::Sub:
      return launch.template run<T>(
          [](auto x, auto y) { return wrapping<decltype(x)>(x, y, std::minus<>()); });
    case BinaryOp::Mul:
      return launch.template run<T>(
          [](auto x, auto y) { return wrapping<decltype(x)>(x, y, std::multiplies<>()); });
    case BinaryOp::Div: return launch.template run<T>([](auto x, auto y) { return x / y; });
    // NaN wins: if y is NaN then x > y is false and y is returned.
    case BinaryOp::Maximum:
      return launch.template run<T>([](auto x, auto y) { return (x > y || is_nan(x)) ? x : y; });
    case BinaryOp::Minimum:
      return launch.template run<T>([](auto x, auto y) { return (x < y || is_nan(x)) ? x : y; });
    case BinaryOp::Pow: return launch.template run<T>([](auto x, auto y) { return pow_op(x, y); });
    case BinaryOp::Eq: return launch.template run<bool>([](auto x, auto y) { return x == y; });
    case BinaryOp::Ne: return launch.template run<bool>([](auto x, auto y) { return x != y; });
    case BinaryOp::Lt: return launch.template run<bool>([](auto x, auto y) { return x < y; });
    case BinaryOp::Le: return launch.template run<bool>([](auto x, auto y) { return x <= y; });
    case BinaryOp::Gt: return launch.template run<bool>([](auto x, auto y) { return x > y; });
    case BinaryOp::Ge: return launch.template run<bool>([](auto x, auto y) { return x >= y; });
    case BinaryOp::LogicalAnd:
      return launch.template run<bool>([](auto x, auto y) { return x != 0 && y != 0; });
    case BinaryOp::LogicalOr:
      return launch.template run<bool>([](auto x, auto y) { return x != 0 || y != 0; });
  }
}

// Right operand from a tensor.
template <class T>
struct TensorLaunch {
  using type = T;
  const StridedView& a;
  const StridedView& b;
  const StridedView& out;
  template <class Out, class F>
  void run(const F& f) const {
    map_binary<T, Out>(a, b, out, f);
  }
};

// True when `s` converts to C without loss (always, for floating C).
template <class C>
bool scalar_fits(double s) {
  if constexpr (std::is_floating_point<C>::value) {
    return true;
  } else {
    // For int64 the upper bound 2^63 is exact in double; for int32 so is 2^31 - 1.
    return std::trunc(s) == s && s >= static_cast<double>(std::numeric_limits<C>::lowest()) &&
           s < -static_cast<double>(std::numeric_limits<C>::lowest());
  }
}

// Right operand is a scalar, converted once to the compute type, or kept in
// double for an integer comparison against a non-integer (e.g. x < 2.5).
template <class T>
struct ScalarLaunch {
  using type = T;
  const StridedView& a;
  const StridedView& out;
  double scalar;
  template <class Out, class F>
  void run(const F& f) const {
    using C = acc_t<T>;
    if (scalar_fits<C>(scalar)) {
      const C s = static_cast<C>(scalar);
      map_unary<T, Out>(a, out, [&f, s](C x) { return f(x, s); });
    } else {
      const double s = scalar;
      map_unary<T, Out>(a, out, [&f, s](C x) { return f(static_cast<double>(x), s); });
    }
  }
};

bool is_arithmetic(BinaryOp op) { return !binary_op_returns_bool(op); }

// Rejects integer/bool combinations that have no sensible integer result.
void check_binary_dtype(const char* what, BinaryOp op, DType dtype) {
  MG_CHECK(dtype != DType::boolean || !(op == BinaryOp::Sub || op == BinaryOp::Pow), what, " ",
           binary_op_name(op),
           ": not supported for bool (PyTorch also refuses); convert to an integer dtype first");
  MG_CHECK(is_floating(dtype) || op != BinaryOp::Div, what,
           " div: integer division is not supported for dtype ", dtype_name(dtype),
           "; promote to a floating dtype first");
}

// ---- transposing copy ------------------------------------------------------------

constexpr int64_t kTransposeTile = 32;  // 32 x 32 elements: the lines a tile reads stay in L1

// True when, after coalescing, the input walks the innermost dim with a large
// stride but the one before it with stride 1: x.t().contiguous() and friends.
bool is_transposing(const std::array<StridedView, 2>& v) {
  const int last = v[0].ndim - 1;
  return last >= 1 && v[1].strides[last - 1] == 1 && std::abs(v[1].strides[last]) > 1 &&
         v[0].shape[last] > 1 && v[0].shape[last - 1] > 1;
}

// Copies the last two dims in kTransposeTile x kTransposeTile tiles. Row by
// row, each load of the input would touch a new cache line (and soon a new
// page); in a tile, the 32 lines it reads are used whole (16 floats each)
// before they leave L1. v[0] is the output, v[1] the input, both coalesced.
template <class From, class To>
void copy_transposing(const std::array<StridedView, 2>& v) {
  const int nd = v[0].ndim;
  const int64_t rows = v[0].shape[nd - 2], cols = v[0].shape[nd - 1];
  const int64_t out_rs = v[0].strides[nd - 2], out_cs = v[0].strides[nd - 1];
  const int64_t in_rs = v[1].strides[nd - 2], in_cs = v[1].strides[nd - 1];
  const int64_t planes = v[0].numel() / (rows * cols);
  const int64_t row_tiles = (rows + kTransposeTile - 1) / kTransposeTile;
  StridedView outer = v[0];
  outer.ndim = nd - 2;
  const std::array<const StridedView*, 2> operands = {&v[0], &v[1]};
  const From* x = v[1].ptr<const From>();
  To* y = v[0].ptr<To>();
  parallel_for(planes * row_tiles, v[0].numel() >= kElementwiseParallelNumel,
               [&](int64_t begin, int64_t end) {
                 StridedIndexer<2> it(outer, operands);
                 for (int64_t t = begin; t < end; ++t) {
                   const int64_t r0 = (t % row_tiles) * kTransposeTile;
                   const int64_t r1 = std::min(rows, r0 + kTransposeTile);
                   it.seek(t / row_tiles);
                   const From* __restrict src = x + it.offset[1];
                   To* __restrict dst = y + it.offset[0];
                   for (int64_t c0 = 0; c0 < cols; c0 += kTransposeTile) {
                     const int64_t c1 = std::min(cols, c0 + kTransposeTile);
                     for (int64_t r = r0; r < r1; ++r)
                       for (int64_t c = c0; c < c1; ++c)
                         dst[r * out_rs + c * out_cs] = convert<To>(src[r * in_rs + c * in_cs]);
                   }
                 }
               });
}

// ---- clamp / fill helpers ---------------------------------------------------------

// Converts a double to integer type C, saturating at C's range.
template <class C>
C saturate(double v) {
  const double lo = static_cast<double>(std::numeric_limits<C>::lowest());
  if (v <= lo) return std::numeric_limits<C>::lowest();
  if (v >= -lo) return std::numeric_limits<C>::max();  // -lowest == max + 1 == 2^(bits-1), exact
  return static_cast<C>(v);
}

}  // namespace

// ---- entry points ------------------------------------------------------------------

void unary(UnaryOp op, const StridedView& in, const StridedView& out, double scalar) {
  const char* name = unary_op_name(op);
  check_shape(name, "input", in, out);
  check_dtype(name, "output", out, in.dtype);
  MG_CHECK(is_floating(in.dtype) || (is_integral(in.dtype) && unary_op_accepts_integers(op)), name,
           ": unsupported dtype ", dtype_name(in.dtype),
           unary_op_accepts_integers(op) ? " (expected a floating or integer dtype)"
                                         : " (expected a floating dtype)");
  visit_dtype(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same<T, bool>::value) unary_typed<T>(op, in, out, scalar);
  });
}

void unary_backward(UnaryOp op, const StridedView& grad_out, const StridedView& input,
                    const StridedView& output, const StridedView& grad_in, double scalar) {
  const std::string what = str_cat(unary_op_name(op), " backward");
  check_shape(what.c_str(), "grad_out", grad_out, grad_in);
  check_dtype(what.c_str(), "grad_in", grad_in, grad_out.dtype);
  const Saved saved = saved_operand(op, output.data != nullptr);
  if (saved == Saved::Input) {
    MG_CHECK(input.data != nullptr, what, ": needs the forward input, got an empty view");
    check_shape(what.c_str(), "input", input, grad_in);
    check_dtype(what.c_str(), "input", input, grad_out.dtype);
  } else if (saved == Saved::Output) {
    check_shape(what.c_str(), "output", output, grad_in);
    check_dtype(what.c_str(), "output", output, grad_out.dtype);
  }
  visit_floating(grad_out.dtype, what.c_str(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_backward_typed<T>(op, grad_out, input, output, grad_in, scalar);
  });
}

void binary(BinaryOp op, const StridedView& a, const StridedView& b, const StridedView& out) {
  const char* name = binary_op_name(op);
  check_shape(name, "a", a, out);
  check_shape(name, "b", b, out);
  check_dtype(name, "b", b, a.dtype);
  check_dtype(name, "output", out, binary_op_returns_bool(op) ? DType::boolean : a.dtype);
  check_binary_dtype("binary", op, a.dtype);
  visit_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_binary(op, TensorLaunch<T>{a, b, out});
  });
}

void binary_scalar(BinaryOp op, const StridedView& a, double scalar, const StridedView& out) {
  const char* name = binary_op_name(op);
  check_shape(name, "a", a, out);
  check_dtype(name, "output", out, binary_op_returns_bool(op) ? DType::boolean : a.dtype);
  check_binary_dtype("binary_scalar", op, a.dtype);
  visit_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    MG_CHECK(!is_arithmetic(op) || scalar_fits<acc_t<T>>(scalar), "binary_scalar ", name, ": scalar ", scalar,
             " is not representable in dtype ", dtype_name(a.dtype), "; promote the tensor first");
    dispatch_binary(op, ScalarLaunch<T>{a, out, scalar});
  });
}

void axpby(const StridedView& a, double alpha, const StridedView& b, const StridedView& out) {
  check_shape("axpby", "a", a, out);
  check_shape("axpby", "b", b, out);
  check_dtype("axpby", "b", b, a.dtype);
  check_dtype("axpby", "output", out, a.dtype);
  visit_floating(a.dtype, "axpby", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    const C s = static_cast<C>(alpha);
    map_binary<T, T>(a, b, out, [s](C x, C y) { return x + s * y; });
  });
}

void where(const StridedView& condition, const StridedView& a, const StridedView& b, const StridedView& out) {
  check_shape("where", "condition", condition, out);
  check_shape("where", "a", a, out);
  check_shape("where", "b", b, out);
  check_dtype("where", "condition", condition, DType::boolean);
  check_dtype("where", "b", b, a.dtype);
  check_dtype("where", "output", out, a.dtype);
  visit_dtype(a.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool* c = condition.ptr<const bool>();
    const T* x = a.ptr<const T>();
    const T* y = b.ptr<const T>();
    T* z = out.ptr<T>();
    using Offsets4 = std::array<int64_t, 4>;
    for_each_row<4>({out, condition, a, b}, [&](const Offsets4& off, const Offsets4& st, int64_t n) {
      const bool* __restrict cp = c + off[1];
      const T* __restrict xp = x + off[2];
      const T* __restrict yp = y + off[3];
      T* __restrict zp = z + off[0];
      if (st[0] == 1 && st[1] == 1 && st[2] == 1 && st[3] == 1) {
        for (int64_t i = 0; i < n; ++i) zp[i] = cp[i] ? xp[i] : yp[i];
      } else {
        for (int64_t i = 0; i < n; ++i) zp[i * st[0]] = cp[i * st[1]] ? xp[i * st[2]] : yp[i * st[3]];
      }
    });
  });
}

void clamp(const StridedView& in, const StridedView& out, double lo, double hi) {
  check_shape("clamp", "input", in, out);
  check_dtype("clamp", "output", out, in.dtype);
  MG_CHECK(in.dtype != DType::boolean, "clamp: not supported for bool");
  MG_CHECK(!std::isnan(lo) && !std::isnan(hi), "clamp: bounds must not be NaN (got ", lo, ", ", hi, ")");
  visit_dtype(in.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    C lower, upper;
    if constexpr (std::is_floating_point<C>::value) {
      lower = static_cast<C>(lo);
      upper = static_cast<C>(hi);
    } else {  // x >= 1.5 <=> x >= 2 for integers: round the bounds inward
      lower = saturate<C>(std::ceil(lo));
      upper = saturate<C>(std::floor(hi));
    }
    map_unary<T, T>(in, out, [lower, upper](C x) {
      const C t = x < lower ? lower : x;  // comparisons with NaN are false: NaN passes through
      return t > upper ? upper : t;
    });
  });
}

void fill(const StridedView& out, double value) {
  visit_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    if constexpr (std::is_same<T, bool>::value) {
      v = value != 0;
    } else if constexpr (std::is_integral<T>::value) {
      MG_CHECK(std::isfinite(value) && value >= static_cast<double>(std::numeric_limits<T>::lowest()) &&
                   value < -static_cast<double>(std::numeric_limits<T>::lowest()),
               "fill: value ", value, " is out of range for dtype ", dtype_name(out.dtype));
      v = static_cast<T>(value);
    } else {
      v = static_cast<T>(value);  // f16/bf16 via float
    }
    T* p = out.ptr<T>();
    for_each_row<1>({out},
                    [&](const std::array<int64_t, 1>& off, const std::array<int64_t, 1>& st, int64_t n) {
                      T* __restrict row = p + off[0];
                      if (st[0] == 1) {
                        std::fill(row, row + n, v);
                      } else {
                        for (int64_t i = 0; i < n; ++i) row[i * st[0]] = v;
                      }
                    });
  });
}

void arange(const StridedView& out, double start, double step) {
  MG_CHECK(out.ndim == 1, "arange: expected a 1-d output, got shape ", shape_str(out));
  MG_CHECK(out.dtype != DType::boolean, "arange: not supported for bool");
  visit_dtype(out.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.ptr<T>();
    const int64_t n = out.shape[0], stride = out.strides[0];
    for (int64_t i = 0; i < n; ++i) p[i * stride] = store<T>(start + static_cast<double>(i) * step);
  });
}

void copy(const StridedView& in, const StridedView& out) {
  check_shape("copy", "input", in, out);
  const int64_t numel = out.numel();
  if (numel == 0) return;
  if (in.dtype == out.dtype && in.is_contiguous() && out.is_contiguous()) {
    if (in.data == out.data) return;
    const size_t bytes = dtype_size(in.dtype);
    const char* src = static_cast<const char*>(in.data);
    char* dst = static_cast<char*>(out.data);
    parallel_for(numel, numel >= kElementwiseParallelNumel, [&](int64_t begin, int64_t end) {
      std::memcpy(dst + begin * bytes, src + begin * bytes, static_cast<size_t>(end - begin) * bytes);
    });
    return;
  }
  visit_dtype(in.dtype, [&](auto in_tag) {
    using From = typename decltype(in_tag)::type;
    visit_dtype(out.dtype, [&](auto out_tag) {
      using To = typename decltype(out_tag)::type;
      const std::array<StridedView, 2> coalesced = coalesce<2>({out, in});
      if (is_transposing(coalesced)) return copy_transposing<From, To>(coalesced);
      const From* x = in.ptr<const From>();
      To* y = out.ptr<To>();
      for_each_row<2>({out, in}, [&](const Offsets2& off, const Offsets2& st, int64_t n) {
        const From* __restrict src = x + off[1];
        To* __restrict dst = y + off[0];
        if (st[0] == 1 && st[1] == 1) {
          for (int64_t i = 0; i < n; ++i) dst[i] = convert<To>(src[i]);
        } else {
          for (int64_t i = 0; i < n; ++i) dst[i * st[0]] = convert<To>(src[i * st[1]]);
        }
      });
    });
  });
}

}  // namespace mg::kernels::cpu
