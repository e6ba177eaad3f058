// Reductions over the middle axis of a contiguous [outer, reduce, inner] buffer.
//
// Cost. A reduction reads every input element once (sizeof(T) bytes) and does
// one add/compare/multiply with it; Var reads the input twice. Writes are
// outer * inner elements, negligible. So it is memory bound, and the yardstick
// is read bandwidth: a sum of N f32 should take about as long as memcpy of
// N * 4 / 2 bytes (memcpy both reads and writes).
//
// Decomposition:
//  * inner == 1: each output is the fold of one contiguous row. A single
//    accumulator would serialise every add behind the previous one (4-cycle
//    latency, so 1/4 of one SIMD lane's throughput). fold_row keeps kLanes = 16
//    independent accumulators (four SSE / two AVX registers of float), which
//    the compiler vectorises, and combines them as a tree at the end of each
//    block. Rows are split across threads; when there are only a few rows a
//    long row is cut into fixed chunks of kChunk elements instead, whose
//    partial results are combined in order, so the answer never depends on
//    the thread count.
//  * inner > 1: the reduced elements of one output are `inner` apart, so
//    folding one output at a time would touch a new cache line per element. A
//    task instead owns a tile of up to kReduceTile adjacent outputs and sweeps the
//    `reduce` rows, adding each contiguous row segment into kReduceTile accumulators:
//    every load is contiguous and the inner loop vectorises across outputs.
//    Tiles are independent, so they split across threads even when outer == 1.
//
// Accuracy. A float accumulator that has absorbed n values has lost about
// n * 2^-24 relative precision, and once the running sum reaches 2^24 adding
// 1.0f does nothing at all. Both kernels therefore fold at most kBlock values
// into one float accumulator lane (256 per lane in a row, kBlockRows per output
// in a tile) and then add that block's float result into a double total. The
// hot loop stays in float (full SIMD width, half the register pressure of
// double), while the error stays that of a 256-element float sum plus a
// double sum: 16M ones sum to exactly 16777216. f64 accumulates in double,
// integers and bool in int64.
#include "kernels/cpu/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>

#include "kernels/cpu/parallel_for.h"

namespace mg::kernels::cpu {

namespace {

constexpr int kLanes = 16;                                  // independent accumulators per row
constexpr int64_t kBlock = 4096;                            // row elements per float block (256 per lane)
constexpr int64_t kBlockRows = 256;                         // rows per float block in the tiled kernel
constexpr int64_t kReduceTile = 1024;                       // outputs per task when inner > 1
constexpr int64_t kChunk = int64_t{1} << 18;                // elements per task when one long row is split
constexpr int64_t kRowBatch = 256;                          // rows folded before one batched store
constexpr int64_t kReduceParallelNumel = int64_t{1} << 16;  // below this, threads cost more than they save

// Accumulator types for Sum/Mean/Var/Prod: `Acc` in the hot loop, `Wide` for
// the total of the blocks.
template <class T>
struct SumTypes {
  static constexpr bool kFloating = std::is_floating_point<acc_t<T>>::value;
  using Acc = std::conditional_t<kFloating, acc_t<T>, int64_t>;  // float, double or int64
  using Wide = std::conditional_t<kFloating, double, int64_t>;
};

// How two partial results combine. Max/Min let a NaN on either side win. They
// are written as two selects rather than `(b > a || is_nan(b)) ? b : a`,
// which GCC compiles to branches; this form becomes compare + blend in SIMD.
struct Plus {
  template <class A>
  A operator()(A a, A b) const {
    return a + b;
  }
};
struct Times {
  template <class A>
  A operator()(A a, A b) const {
    return a * b;
  }
};
struct MaxOp {
  template <class A>
  A operator()(A a, A b) const {
    const A larger = is_nan(a) ? a : (b > a ? b : a);
    return is_nan(b) ? b : larger;
  }
};
struct MinOp {
  template <class A>
  A operator()(A a, A b) const {
    const A smaller = is_nan(a) ? a : (b < a ? b : a);
    return is_nan(b) ? b : smaller;
  }
};

// Converts a result to the output's storage type.
template <class O, class W>
inline O cast_to(W v) {
  if constexpr (std::is_same<O, bool>::value) {
    return v != W(0);
  } else if constexpr (std::is_same<O, f16>::value || std::is_same<O, bf16>::value) {
    return O(static_cast<float>(v));
  } else {
    return static_cast<O>(v);
  }
}

// output[offset + k] = values[k] for k < n, converted to out_dtype.
template <class W>
void store_values(const W* values, int64_t n, void* output, DType out_dtype, int64_t offset) {
  visit_dtype(out_dtype, [&](auto tag) {
    using O = typename decltype(tag)::type;
    O* dst = static_cast<O*>(output) + offset;
    for (int64_t k = 0; k < n; ++k) dst[k] = cast_to<O>(values[k]);
  });
}

// ---- inner == 1: fold contiguous rows ----------------------------------------------

// Folds map(x[i]) for i < n with `op`, starting from `identity`. Each block of
// kBlock elements is folded into kLanes Acc lanes (vectorised), the lanes are
// combined as a tree, and the block result is folded into a Wide total.
template <class Acc, class Wide, class T, class Op, class Map>
Wide fold_row(const T* __restrict x, int64_t n, Acc identity, Op op, const Map& map) {
  Wide total = static_cast<Wide>(identity);
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t m = std::min(kBlock, n - start);
    const T* __restrict p = x + start;
    Acc lane[kLanes];
    for (int j = 0; j < kLanes; ++j) lane[j] = identity;
    int64_t i = 0;
    for (; i + kLanes <= m; i += kLanes)
      for (int j = 0; j < kLanes; ++j) lane[j] = op(lane[j], map(p[i + j], 0));
    for (; i < m; ++i) lane[0] = op(lane[0], map(p[i], 0));
    for (int width = kLanes / 2; width > 0; width /= 2)
      for (int j = 0; j < width; ++j) lane[j] = op(lane[j], lane[j + width]);
    total = op(total, static_cast<Wide>(lane[0]));
  }
  return total;
}

// fold_row over a possibly very long row. Rows of at least 2 * kChunk elements
// are cut into kChunk pieces folded in parallel (when `parallel`), whose
// results are then combined in order: the same answer on any thread count.
template <class Acc, class Wide, class T, class Op, class Map>
Wide fold_long_row(const T* x, int64_t n, Acc identity, Op op, const Map& map, bool parallel) {
  if (n < 2 * kChunk) return fold_row<Acc, Wide>(x, n, identity, op, map);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::unique_ptr<Wide[]> partial(new Wide[chunks]);
  parallel_for(chunks, parallel, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c)
      partial[c] = fold_row<Acc, Wide>(x + c * kChunk, std::min(kChunk, n - c * kChunk), identity, op, map);
  });
  Wide total = partial[0];
  for (int64_t c = 1; c < chunks; ++c) total = op(total, partial[c]);
  return total;
}

// Stores row_value(o) for every outer row o, in batches of kRowBatch.
template <class W, class RowValue>
void for_each_row(const ReduceShape& s, void* output, DType out_dtype, bool parallel,
                  const RowValue& row_value) {
  parallel_for(s.outer, parallel, [&](int64_t begin, int64_t end) {
    W values[kRowBatch];
    for (int64_t r0 = begin; r0 < end; r0 += kRowBatch) {
      const int64_t n = std::min(kRowBatch, end - r0);
      for (int64_t k = 0; k < n; ++k) values[k] = row_value(r0 + k);
      store_values(values, n, output, out_dtype, r0);
    }
  });
}

// ---- inner > 1: fold a tile of columns ---------------------------------------------

// total[j] = fold over r < reduce of map(x[r * inner + j], j), for j < width.
// x points at the tile's first column in row 0.
template <class Acc, class Wide, class T, class Op, class Map>
void fold_columns(const T* x, int64_t reduce, int64_t inner, int64_t width, Acc identity, Op op,
                  const Map& map, Wide* __restrict total) {
  Acc acc[kReduceTile];
  for (int64_t j = 0; j < width; ++j) total[j] = static_cast<Wide>(identity);
  for (int64_t r0 = 0; r0 < reduce; r0 += kBlockRows) {
    const int64_t r1 = std::min(reduce, r0 + kBlockRows);
    for (int64_t j = 0; j < width; ++j) acc[j] = identity;
    for (int64_t r = r0; r < r1; ++r) {
      const T* __restrict row = x + r * inner;
      for (int64_t j = 0; j < width; ++j) acc[j] = op(acc[j], map(row[j], j));
    }
    for (int64_t j = 0; j < width; ++j) total[j] = op(total[j], static_cast<Wide>(acc[j]));
  }
}

// Calls tile_values(o, j0, width, values) for every tile of up to kReduceTile
// outputs and stores the values.
template <class W, class TileValues>
void for_each_tile(const ReduceShape& s, void* output, DType out_dtype, bool parallel,
                   const TileValues& tile_values) {
  const int64_t tiles = (s.inner + kReduceTile - 1) / kReduceTile;
  parallel_for(s.outer * tiles, parallel, [&](int64_t begin, int64_t end) {
    W values[kReduceTile];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / tiles;
      const int64_t j0 = (t % tiles) * kReduceTile;
      const int64_t width = std::min(kReduceTile, s.inner - j0);
      tile_values(o, j0, width, values);
      store_values(values, width, output, out_dtype, o * s.inner + j0);
    }
  });
}

// ---- the ops --------------------------------------------------------------------------

// For inner == 1 work worth threads: split the rows among threads, or, when
// there are only a few rows and they are long, split each row into chunks.
struct Plan {
  bool rows_parallel;
  bool split_rows;
};
Plan plan_rows(const ReduceShape& s) {
  const bool big = s.outer * s.reduce * s.inner >= kReduceParallelNumel;
  const bool few_long_rows = s.outer < 8 && s.reduce >= 2 * kChunk;
  return {big && !few_long_rows, big && few_long_rows};
}

// Sum, Mean, Prod, Max, Min: fold every value with `op`; Mean divides by reduce.
template <class Acc, class Wide, class T, class Op>
void fold_reduce(const ReduceShape& s, const T* x, void* output, DType out_dtype, Acc identity, Op op,
                 bool mean) {
  auto map = [](T v, int64_t) { return static_cast<Acc>(v); };
  const Wide count = static_cast<Wide>(s.reduce);
  if (s.inner == 1) {
    const Plan plan = plan_rows(s);
    for_each_row<Wide>(s, output, out_dtype, plan.rows_parallel, [&](int64_t o) {
      const Wide v = fold_long_row<Acc, Wide>(x + o * s.reduce, s.reduce, identity, op, map, plan.split_rows);
      return mean ? v / count : v;
    });
  } else {
    const bool parallel = s.outer * s.reduce * s.inner >= kReduceParallelNumel;
    for_each_tile<Wide>(s, output, out_dtype, parallel,
                        [&](int64_t o, int64_t j0, int64_t width, Wide* values) {
                          fold_columns<Acc, Wide>(x + o * s.reduce * s.inner + j0, s.reduce, s.inner, width,
                                                  identity, op, map, values);
                          if (mean)
                            for (int64_t j = 0; j < width; ++j) values[j] /= count;
                        });
  }
}

// Var: pass 1 computes the mean, pass 2 the sum of squared deviations from it
// (numerically safe, unlike E[x^2] - E[x]^2, which cancels catastrophically
// when the mean is large compared with the spread).
template <class T>
void var_reduce(const ReduceShape& s, const T* x, void* output, DType out_dtype, int64_t correction) {
  using Acc = typename SumTypes<T>::Acc;
  using Wide = typename SumTypes<T>::Wide;
  const Wide n = static_cast<Wide>(s.reduce);
  const Wide divisor = std::max<Wide>(0, n - static_cast<Wide>(correction));  // 0 -> inf or NaN, like PyTorch
  auto to_acc = [](T v, int64_t) { return static_cast<Acc>(v); };
  if (s.inner == 1) {
    const Plan plan = plan_rows(s);
    for_each_row<Wide>(s, output, out_dtype, plan.rows_parallel, [&](int64_t o) {
      const T* row = x + o * s.reduce;
      const Acc mean = static_cast<Acc>(
          fold_long_row<Acc, Wide>(row, s.reduce, Acc(0), Plus{}, to_acc, plan.split_rows) / n);
      auto squared_deviation = [mean](T v, int64_t) {
        const Acc d = static_cast<Acc>(v) - mean;
        return d * d;
      };
      return fold_long_row<Acc, Wide>(row, s.reduce, Acc(0), Plus{}, squared_deviation, plan.split_rows) /
             divisor;
    });
  } else {
    const bool parallel = s.outer * s.reduce * s.inner >= kReduceParallelNumel;
    for_each_tile<Wide>(
        s, output, out_dtype, parallel, [&](int64_t o, int64_t j0, int64_t width, Wide* values) {
          const T* tile = x + o * s.reduce * s.inner + j0;
          fold_columns<Acc, Wide>(tile, s.reduce, s.inner, width, Acc(0), Plus{}, to_acc, values);
          Acc mean[kReduceTile];
          for (int64_t j = 0; j < width; ++j) mean[j] = static_cast<Acc>(values[j] / n);
          auto squared_deviation = [&mean](T v, int64_t j) {
            const Acc d = static_cast<Acc>(v) - mean[j];
            return d * d;
          };
          fold_columns<Acc, Wide>(tile, s.reduce, s.inner, width, Acc(0), Plus{}, squared_deviation, values);
          for (int64_t j = 0; j < width; ++j) values[j] /= divisor;
        });
  }
}

// True when v should replace the current best: strictly greater (argmax) or
// smaller (argmin), or the first NaN. Once best is NaN nothing replaces it,
// and equal values never do, so the first index wins.
template <bool kMax, class C>
inline bool beats(C v, C best) {
  return (kMax ? v > best : v < best) || (is_nan(v) && !is_nan(best));
}

template <bool kMax, class T>
void arg_reduce(const ReduceShape& s, const T* x, void* output) {
  using C = acc_t<T>;
  const bool parallel = s.outer * s.reduce * s.inner >= kReduceParallelNumel;
  if (s.inner == 1) {
    for_each_row<int64_t>(s, output, DType::i64, parallel, [&](int64_t o) {
      const T* row = x + o * s.reduce;
      C best = static_cast<C>(row[0]);
      int64_t index = 0;
      for (int64_t i = 1; i < s.reduce; ++i) {
        const C v = static_cast<C>(row[i]);
        if (beats<kMax>(v, best)) {
          best = v;
          index = i;
        }
      }
      return index;
    });
  } else {
    for_each_tile<int64_t>(s, output, DType::i64, parallel,
                           [&](int64_t o, int64_t j0, int64_t width, int64_t* index) {
                             const T* tile = x + o * s.reduce * s.inner + j0;
                             C best[kReduceTile];
                             for (int64_t j = 0; j < width; ++j) {
                               best[j] = static_cast<C>(tile[j]);
                               index[j] = 0;
                             }
                             for (int64_t r = 1; r < s.reduce; ++r) {
                               const T* __restrict row = tile + r * s.inner;
                               for (int64_t j = 0; j < width; ++j) {
                                 const C v = static_cast<C>(row[j]);
                                 const bool take = beats<kMax>(v, best[j]);
                                 best[j] = take ? v : best[j];
                                 index[j] = take ? r : index[j];
                               }
                             }
                           });
  }
}

template <class C>
C lowest_value() {
  return std::numeric_limits<C>::has_infinity ? -std::numeric_limits<C>::infinity()
                                              : std::numeric_limits<C>::lowest();
}
template <class C>
C highest_value() {
  return std::numeric_limits<C>::has_infinity ? std::numeric_limits<C>::infinity()
                                              : std::numeric_limits<C>::max();
}

bool needs_identity(ReduceOp op) {
  return op == ReduceOp::Max || op == ReduceOp::Min || op == ReduceOp::Argmax || op == ReduceOp::Argmin;
}

}  // namespace

void reduce(ReduceOp op, const ReduceShape& shape, const void* input, DType in_dtype, void* output,
            DType out_dtype, int64_t correction) {
  const char* name = reduce_op_name(op);
  MG_CHECK(shape.outer >= 0 && shape.reduce >= 0 && shape.inner >= 0, name, ": negative shape [", shape.outer,
           ", ", shape.reduce, ", ", shape.inner, "]");
  switch (op) {
    case ReduceOp::Mean:
    case ReduceOp::Var:
      MG_CHECK(is_floating(in_dtype) && is_floating(out_dtype), name,
               ": expected floating dtypes, got input ", dtype_name(in_dtype), " and output ",
               dtype_name(out_dtype));
      break;
    case ReduceOp::Max:
    case ReduceOp::Min:
      MG_CHECK(out_dtype == in_dtype, name, ": output dtype ", dtype_name(out_dtype),
               " must equal input dtype ", dtype_name(in_dtype));
      break;
    case ReduceOp::Argmax:
    case ReduceOp::Argmin:
      MG_CHECK(out_dtype == DType::i64, name, ": output dtype must be i64, got ", dtype_name(out_dtype));
      break;
    case ReduceOp::Sum:
    case ReduceOp::Prod: break;
  }
  if (shape.reduce == 0) {
    MG_CHECK(!needs_identity(op), name, ": cannot reduce over an empty dimension (the op has no identity)");
    const double value = op == ReduceOp::Sum    ? 0.0
                         : op == ReduceOp::Prod ? 1.0
                                                : std::numeric_limits<double>::quiet_NaN();
    for (int64_t i = 0; i < shape.outer * shape.inner; ++i) store_values(&value, 1, output, out_dtype, i);
    return;
  }
  if (shape.outer == 0 || shape.inner == 0) return;

  visit_dtype(in_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = typename SumTypes<T>::Acc;
    using Wide = typename SumTypes<T>::Wide;
    using C = acc_t<T>;
    const T* x = static_cast<const T*>(input);
    switch (op) {
      case ReduceOp::Sum: return fold_reduce<Acc, Wide>(shape, x, output, out_dtype, Acc(0), Plus{}, false);
      case ReduceOp::Mean: return fold_reduce<Acc, Wide>(shape, x, output, out_dtype, Acc(0), Plus{}, true);
      case ReduceOp::Prod: return fold_reduce<Acc, Wide>(shape, x, output, out_dtype, Acc(1), Times{}, false);
      case ReduceOp::Max:
        return fold_reduce<C, C>(shape, x, output, out_dtype, lowest_value<C>(), MaxOp{}, false);
      case ReduceOp::Min:
        return fold_reduce<C, C>(shape, x, output, out_dtype, highest_value<C>(), MinOp{}, false);
      case ReduceOp::Argmax: return arg_reduce<true>(shape, x, output);
      case ReduceOp::Argmin: return arg_reduce<false>(shape, x, output);
      case ReduceOp::Var:
        if constexpr (SumTypes<T>::kFloating) return var_reduce(shape, x, output, out_dtype, correction);
        break;
    }
  });
}

}  // namespace mg::kernels::cpu
