// Reductions on the GPU: sum, mean, max, min, argmax, argmin, var, prod over the
// middle axis of a contiguous [outer, reduce, inner] tensor (the same view of a
// reduction as kernels/cpu/reduce.h; the op layer makes it contiguous first).
//
// Decomposition. One thread block per (outer index, tile of 32 inner indices).
// The block is 2-d, tx x ty = 256 threads:
//   - tx threads cover neighbouring inner indices, so at each step of the loop a
//     warp reads consecutive addresses (coalesced). tx is 32 when inner >= 32,
//     else the next power of two >= inner;
//   - ty = 256 / tx threads split the reduced axis: thread y reads rows y, y + ty,
//     y + 2 ty, ... and keeps a private running result.
// Then the ty partial results of each column are combined through shared memory
// in a log2(ty)-step tree, and row 0 writes the column's answer.
//   inner == 1 (sum of a whole row, the common "reduce the last dim" case) gives
//   tx = 1, ty = 256: the whole block works on one row, reading it front to back
//   in coalesced 256-element sweeps.
//   Var needs the mean first: the block reduces twice (sum, then the squared
//   deviations from the mean), reading the data twice.
// Blocks loop over outer indices (grid.y capped at 65535). Each thread issues
// four loads before folding them in (fold_rows), so it has four reads in flight.
//
// Cost. Reads outer*reduce*inner elements once (twice for var), writes
// outer*inner, one add or compare per element: ~0.25 op per byte in f32, memory
// bound. To reach the H200's ~4.8 TB/s the grid must put enough reads in flight
// on every one of the 132 SMs.
//
// Split reduce. When outer*inner is small the grid above has few blocks: a
// bias gradient (sum_to of [8192, 768] to [768]) gets 24, a sum() or var() of
// a whole tensor 1 (one 256-thread block reading 16M floats, twice for var),
// and most of the GPU idles. Then, whenever the plain grid has under
// kSplitBlocks = 4 x 132 blocks and the reduced axis is long enough, it is cut
// into slices so that the grid has about kSplitBlocks blocks, each slice at
// least kMinRowsPerThread = 32 rows per thread of the reduced axis (256 rows with
// 32 x 8 threads, 8192 with 1 x 256: split_slices). Pass 1 (reduce_slices_kernel)
// runs the same block layout on grid (tiles, outer, slices) and leaves one
// Partial per (outer, slice, inner) in a scratch workspace; pass 2
// (reduce_finish_kernel) is laid out as pass 1 with the slices as the reduced
// axis: a warp reads adjacent partials, each thread combines every ty-th slice
// in order, and the block's tree combines the ty results and finishes them.
// Examples: [8192, 768] -> [768]: 24 tiles x 22 slices of 373 rows = 528
// blocks, then 24 blocks combine 22 partials per column. A 16M-element sum or
// var: 528 slices of 31776 elements, then one block combines 528 partials.
// The partials are small next to the input (f32 [8192, 768]: 270 KB of 16-byte
// Partials for 25 MB read), and both passes have a fixed order: deterministic.
// In the H200 model (cuda_emu/h200_model.h, docs/performance-model.md; a
// prediction), f32 [8192, 768] -> [768] has pass 1 DRAM bound, where the old
// 4096-row slices (48 blocks) were bound by bytes in flight, and a 16M-element
// sum or var is 4-5x faster than unsplit; docs/kernels.md has the times.
//   Var's split path reads the data once. Pass 1 (var_slices_kernel): each
//   thread sums the deviations of its values from a shift, its first value (so
//   sum(d^2) - sum(d)^2 / n does not cancel when |mean| >> std), giving its
//   count, mean and M2 (sum of squared deviations from the mean); the block
//   merges its threads' moments with Chan et al.'s pairwise formula
//   (mean += delta nb / n, M2 = M2a + M2b + delta^2 na nb / n) in its tree, and
//   writes one Moments per (outer, slice, inner). Pass 2 (var_finish_kernel)
//   merges the slices' moments the same way and divides M2 by reduce -
//   correction. Without a split var keeps the two-pass kernel above.
//
// Accumulation: float for f32/f16/bf16 (tree order, so error grows ~log n, not
// n), double for f64, int64 for integers and bool, as the CPU does for ints.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

// The split reduce's targets (see the top): about four blocks per SM of an H200 (4 x 132), and at
// least kMinRowsPerThread rows of a slice per thread (a slice of 32 ty rows: 256 rows with 32 x 8
// threads, 8192 with 1 x 256).
constexpr int64_t kSplitBlocks = 4 * 132;
constexpr int64_t kMinRowsPerThread = 32;

// Sums accumulate in acc_t<T> (base/dtype.h), with integers and bool widened further to
// int64 so that they cannot overflow, as on the CPU.
template <class T>
using reduce_acc_t = std::conditional_t<std::is_integral<T>::value, int64_t, acc_t<T>>;

template <class A>
struct Partial {
  A v;
  int64_t idx;  // -1: empty (no element seen yet); else the index of v (arg ops)
};

template <class A>
__device__ __forceinline__ bool nan_(A v) {
  return v != v;  // never true for integers
}

// Merges `b` into `a` for op. The arg rules are PyTorch's: a NaN beats every
// number, the first index wins ties (and among NaNs).
template <class A>
__device__ __forceinline__ void combine(int op, Partial<A>& a, const Partial<A>& b) {
  if (b.idx < 0) return;
  if (a.idx < 0) {
    a = b;
    return;
  }
  switch (static_cast<ReduceOp>(op)) {
    case ReduceOp::Sum:
    case ReduceOp::Mean:
    case ReduceOp::Var: a.v += b.v; return;
    case ReduceOp::Prod: a.v *= b.v; return;
    case ReduceOp::Max:
    case ReduceOp::Argmax:
    case ReduceOp::Min:
    case ReduceOp::Argmin: {
      const bool is_max = op == static_cast<int>(ReduceOp::Max) || op == static_cast<int>(ReduceOp::Argmax);
      bool take;
      if (nan_(a.v)) {
        take = nan_(b.v) && b.idx < a.idx;
      } else if (nan_(b.v)) {
        take = true;
      } else {
        take = (is_max ? b.v > a.v : b.v < a.v) || (b.v == a.v && b.idx < a.idx);
      }
      if (take) a = b;
      return;
    }
  }
}

// Combines the ty partials of each column of the block with merge(a, b) in a fixed log2(ty)-step
// tree; row 0 gets the result.
template <class P, class Merge>
__device__ P block_merge(P p, P* shared, Merge merge) {
  const int tx = blockDim.x, ty = blockDim.y;
  const int x = threadIdx.x, y = threadIdx.y;
  shared[y * tx + x] = p;
  __syncthreads();
  for (int half = ty / 2; half > 0; half /= 2) {
    if (y < half) {
      // Whole-struct copies: one 8- or 16-byte shared access per lane each. Merging straight from
      // shared memory would read the members one by one, a lane's 4- and 8-byte reads 16 bytes
      // apart: twice the wavefronts the bytes need.
      P mine = shared[y * tx + x];
      const P other = shared[(y + half) * tx + x];
      merge(mine, other);
      shared[y * tx + x] = mine;
    }
    __syncthreads();
  }
  P result = shared[x];
  __syncthreads();  // the caller may reuse `shared`
  return result;
}

template <class A>
__device__ Partial<A> block_combine(int op, Partial<A> p, Partial<A>* shared) {
  return block_merge(p, shared, [op](Partial<A>& a, const Partial<A>& b) { combine(op, a, b); });
}

// Folds rows first, first + step, ... < last of one column (base: its row 0, rows `inner` apart)
// into p, in that order. Four loads are issued before their four combines, so a thread has four
// reads in flight rather than one; the order of the combines, and so the result, is unchanged.
template <class T, class A>
__device__ __forceinline__ void fold_rows(int op, Partial<A>& p, const T* base, int64_t inner, int64_t first,
                                          int64_t last, int64_t step) {
  int64_t r = first;
  for (; r + 3 * step < last; r += 4 * step) {
    A v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = static_cast<A>(load(base + (r + u * step) * inner));
#pragma unroll
    for (int u = 0; u < 4; ++u) combine(op, p, Partial<A>{v[u], r + u * step});
  }
  for (; r < last; r += step) combine(op, p, Partial<A>{static_cast<A>(load(base + r * inner)), r});
}

// ---- var's split path: per-slice moments merged with Chan et al.'s formula ----
// n values with mean `mean` and sum of squared deviations from it `m2` (var = m2 / (n - correction)).
template <class A>
struct Moments {
  A mean;
  A m2;
  int64_t n;
};

// Chan, Golub and LeVeque's pairwise update: the moments of the union of a's and b's values.
template <class A>
__device__ __forceinline__ void merge_moments(Moments<A>& a, const Moments<A>& b) {
  if (b.n == 0) return;
  if (a.n == 0) {
    a = b;
    return;
  }
  const int64_t n = a.n + b.n;
  const A delta = b.mean - a.mean;
  const A b_share = A(b.n) / A(n);
  a.mean += delta * b_share;
  a.m2 += b.m2 + delta * delta * A(a.n) * b_share;
  a.n = n;
}

__device__ __forceinline__ void store_out(void* out, int64_t off, DType t, double f, int64_t i, bool is_int) {
  switch (t) {
    case DType::f32: static_cast<float*>(out)[off] = is_int ? float(i) : float(f); return;
    case DType::f64: static_cast<double*>(out)[off] = is_int ? double(i) : f; return;
    case DType::f16: static_cast<f16_t*>(out)[off] = make_f16(is_int ? float(i) : float(f)); return;
    case DType::bf16: static_cast<bf16_t*>(out)[off] = make_bf16(is_int ? float(i) : float(f)); return;
    case DType::i32: static_cast<int32_t*>(out)[off] = is_int ? int32_t(i) : int32_t(f); return;
    case DType::i64: static_cast<int64_t*>(out)[off] = is_int ? i : int64_t(f); return;
    case DType::boolean: static_cast<bool*>(out)[off] = is_int ? i != 0 : f != 0.0; return;
  }
}

// Writes one output from its combined partial: the op's identity for an empty reduction, the
// mean/variance division, the arg index, in the output dtype.
template <class A>
__device__ void finish(int op, const Partial<A>& total, int64_t reduce, int64_t correction, void* out,
                       int64_t off, DType out_dtype) {
  if (op == int(ReduceOp::Argmax) || op == int(ReduceOp::Argmin)) {
    store_out(out, off, out_dtype, 0.0, total.idx, true);
    return;
  }
  A v = total.idx < 0 ? A(op == int(ReduceOp::Prod) ? 1 : 0) : total.v;
  double f = static_cast<double>(v);
  if (op == int(ReduceOp::Mean)) f = static_cast<double>(A(v / A(reduce)));
  if (op == int(ReduceOp::Var)) {
    const int64_t dof = reduce - correction > 0 ? reduce - correction : 0;
    f = static_cast<double>(A(v / A(dof)));
  }
  if (std::is_floating_point<A>::value || op == int(ReduceOp::Mean) || op == int(ReduceOp::Var)) {
    store_out(out, off, out_dtype, f, 0, false);
  } else {
    store_out(out, off, out_dtype, 0.0, static_cast<int64_t>(v), true);
  }
}

template <class T>
__global__ void reduce_kernel(int op, int64_t outer, int64_t reduce, int64_t inner, const T* in, void* out,
                              DType out_dtype, int64_t correction) {
  using A = reduce_acc_t<T>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  Partial<A>* shared = reinterpret_cast<Partial<A>*>(dynamic_smem);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = i < inner;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* base = in + o * reduce * inner + (active ? i : 0);
    Partial<A> p{A(op == int(ReduceOp::Prod) ? 1 : 0), -1};
    if (active) fold_rows(op, p, base, inner, threadIdx.y, reduce, blockDim.y);
    Partial<A> total = block_combine(op, p, shared);
    if (op == int(ReduceOp::Var)) {
      // Second pass: squared deviations from the mean.
      const A mean = total.v / A(reduce);
      Partial<A> q{A(0), -1};
      if (active)
        for (int64_t r = threadIdx.y; r < reduce; r += blockDim.y) {
          const A d = static_cast<A>(load(base + r * inner)) - mean;
          combine(op, q, Partial<A>{d * d, r});
        }
      total = block_combine(op, q, shared);
    }
    if (threadIdx.y == 0 && active) finish(op, total, reduce, correction, out, o * inner + i, out_dtype);
  }
}

// Pass 1 of the split reduce: block (x, y, z) reduces rows [z len, (z + 1) len) of its columns.
template <class T>
__global__ void reduce_slices_kernel(int op, int64_t outer, int64_t reduce, int64_t inner, int64_t slice_rows,
                                     const T* in, Partial<reduce_acc_t<T>>* partials) {
  using A = reduce_acc_t<T>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  Partial<A>* shared = reinterpret_cast<Partial<A>*>(dynamic_smem);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = i < inner;
  const int64_t first = int64_t(blockIdx.z) * slice_rows;
  const int64_t last = first + slice_rows < reduce ? first + slice_rows : reduce;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* base = in + o * reduce * inner + (active ? i : 0);
    Partial<A> p{A(op == int(ReduceOp::Prod) ? 1 : 0), -1};
    if (active) fold_rows(op, p, base, inner, first + threadIdx.y, last, blockDim.y);
    const Partial<A> total = block_combine(op, p, shared);
    if (threadIdx.y == 0 && active) partials[(o * gridDim.z + blockIdx.z) * inner + i] = total;
  }
}

// Pass 2, laid out as pass 1 with the slices as the reduced axis: block (x, y) finishes outputs
// (o, x tx .. x tx + tx - 1) for o = y, y + gridDim.y, ...; thread (tx, ty) combines slices
// ty, ty + blockDim.y, ... in order (a warp reads adjacent partials of one slice), then the block's
// fixed tree combines the ty results.
template <class T>
__global__ void reduce_finish_kernel(int op, int64_t outer, int64_t reduce, int64_t inner, int64_t slices,
                                     const Partial<reduce_acc_t<T>>* partials, void* out, DType out_dtype) {
  using A = reduce_acc_t<T>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  Partial<A>* shared = reinterpret_cast<Partial<A>*>(dynamic_smem);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = i < inner;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    Partial<A> p{A(op == int(ReduceOp::Prod) ? 1 : 0), -1};
    if (active)
      for (int64_t z = threadIdx.y; z < slices; z += blockDim.y)
        combine(op, p, partials[(o * slices + z) * inner + i]);
    const Partial<A> total = block_combine(op, p, shared);
    if (threadIdx.y == 0 && active) finish(op, total, reduce, 0, out, o * inner + i, out_dtype);
  }
}

// Var, pass 1: block (x, y, z) computes the moments of rows [z len, (z + 1) len) of its columns. Each
// thread sums its values' deviations d = v - k and their squares from a shift k, its first value (so
// that sum(d^2) - sum(d)^2 / n does not cancel when |mean| >> std: k is within a few std of the mean),
// reading the data once; the threads' moments are then merged with Chan's formula in the block's tree.
template <class T>
__global__ void var_slices_kernel(int64_t outer, int64_t reduce, int64_t inner, int64_t slice_rows,
                                  const T* in, Moments<acc_t<T>>* partials) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  Moments<A>* shared = reinterpret_cast<Moments<A>*>(dynamic_smem);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = i < inner;
  const int64_t first = int64_t(blockIdx.z) * slice_rows + threadIdx.y;
  const int64_t last =
      int64_t(blockIdx.z + 1) * slice_rows < reduce ? int64_t(blockIdx.z + 1) * slice_rows : reduce;
  const int64_t step = blockDim.y;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* base = in + o * reduce * inner + (active ? i : 0);
    Moments<A> m{A(0), A(0), 0};
    if (active && first < last) {
      const A shift = load(base + first * inner);
      A sum = 0, squares = 0;
      int64_t r = first;
      for (; r + 3 * step < last; r += 4 * step) {
        A d[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) d[u] = load(base + (r + u * step) * inner) - shift;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          sum += d[u];
          squares += d[u] * d[u];
        }
      }
      for (; r < last; r += step) {
        const A d = load(base + r * inner) - shift;
        sum += d;
        squares += d * d;
      }
      m.n = (last - first + step - 1) / step;
      const A mean_d = sum / A(m.n);
      m.mean = shift + mean_d;
      m.m2 = max(A(0), squares - sum * mean_d);
    }
    const Moments<A> total =
        block_merge(m, shared, [](Moments<A>& a, const Moments<A>& b) { merge_moments(a, b); });
    if (threadIdx.y == 0 && active) partials[(o * gridDim.z + blockIdx.z) * inner + i] = total;
  }
}

// Var, pass 2: as reduce_finish_kernel, merging the slices' moments with Chan's formula, then
// var = m2 / max(reduce - correction, 0).
template <class T>
__global__ void var_finish_kernel(int64_t outer, int64_t reduce, int64_t inner, int64_t slices,
                                  const Moments<acc_t<T>>* partials, void* out, DType out_dtype,
                                  int64_t correction) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char dynamic_smem[];
  Moments<A>* shared = reinterpret_cast<Moments<A>*>(dynamic_smem);
  const auto merge = [](Moments<A>& a, const Moments<A>& b) { merge_moments(a, b); };
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = i < inner;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    Moments<A> m{A(0), A(0), 0};
    if (active)
      for (int64_t z = threadIdx.y; z < slices; z += blockDim.y)
        merge(m, partials[(o * slices + z) * inner + i]);
    const Moments<A> total = block_merge(m, shared, merge);
    if (threadIdx.y == 0 && active) {
      // As finish() does for the single-pass var: the division in A, a zero dof gives inf or NaN.
      const Partial<A> sum_of_squares{total.m2, total.n > 0 ? 0 : -1};
      finish(int(ReduceOp::Var), sum_of_squares, reduce, correction, out, o * inner + i, out_dtype);
    }
  }
}

// How many slices the reduced axis is cut into (1: no split). The plain grid has `blocks` blocks of
// 256 threads, ty of them along the reduced axis. When that is under kSplitBlocks and the axis is long
// enough, cut it so that the grid has about kSplitBlocks blocks, each slice at least
// kMinRowsPerThread rows per thread; none of the slices is empty.
int64_t split_slices(int64_t blocks, int64_t reduce, int ty) {
  const int64_t min_slice_rows = kMinRowsPerThread * ty;
  if (blocks >= kSplitBlocks || reduce < 2 * min_slice_rows) return 1;
  const int64_t slices = std::min((kSplitBlocks + blocks - 1) / blocks, reduce / min_slice_rows);
  const int64_t slice_rows = (reduce + slices - 1) / slices;
  return (reduce + slice_rows - 1) / slice_rows;
}

}  // namespace

void reduce(cudaStream_t stream, ScratchAllocator& scratch, ReduceOp op, const ReduceShape& shape,
            const void* input, DType in_dtype, void* output, DType out_dtype, int64_t correction) {
  const char* name = reduce_op_name(op);
  const bool arg = op == ReduceOp::Argmax || op == ReduceOp::Argmin;
  MG_CHECK(shape.reduce > 0 || !(arg || op == ReduceOp::Max || op == ReduceOp::Min), name,
           " (CUDA): cannot reduce over an empty dimension (no identity)");
  MG_CHECK(!arg || out_dtype == DType::i64, name, " (CUDA): the output must be i64, got ",
           dtype_name(out_dtype));
  MG_CHECK(
      !(op == ReduceOp::Mean || op == ReduceOp::Var) || (is_floating(in_dtype) && is_floating(out_dtype)),
      name, " (CUDA): needs floating input and output, got ", dtype_name(in_dtype), " -> ",
      dtype_name(out_dtype));
  MG_CHECK(!(op == ReduceOp::Max || op == ReduceOp::Min) || out_dtype == in_dtype, name,
           " (CUDA): output dtype must equal the input's");
  if (shape.outer == 0 || shape.inner == 0) return;
  int tx = 1;
  while (tx < 32 && tx < shape.inner) tx *= 2;
  const int ty = kThreads / tx;
  const dim3 block(tx, ty);
  const int64_t tiles = (shape.inner + tx - 1) / tx;
  MG_CHECK(tiles < (int64_t(1) << 31), name, " (CUDA): inner size ", shape.inner, " too large");
  const unsigned outer_blocks = static_cast<unsigned>(shape.outer < 65535 ? shape.outer : 65535);
  // Split the reduced axis when the plain grid would leave the GPU idle (see the top).
  const int64_t slices = split_slices(tiles * outer_blocks, shape.reduce, ty);
  const dim3 grid(static_cast<unsigned>(tiles), outer_blocks);
  if (slices == 1) {
    visit_all(in_dtype, [&](auto t) {
      using T = typename decltype(t)::type;
      launch_kernel<reduce_kernel<T>>(grid, block, sizeof(Partial<reduce_acc_t<T>>) * kThreads, stream,
                                      static_cast<int>(op), shape.outer, shape.reduce, shape.inner,
                                      static_cast<const T*>(input), output, out_dtype, correction);
    });
    return;
  }
  const int64_t slice_rows = (shape.reduce + slices - 1) / slices;
  const dim3 slice_grid(static_cast<unsigned>(tiles), outer_blocks, static_cast<unsigned>(slices));
  const size_t count = static_cast<size_t>(shape.outer * slices * shape.inner);
  if (op == ReduceOp::Var) {
    visit_float(in_dtype, name, [&](auto t) {
      using T = typename decltype(t)::type;
      using M = Moments<acc_t<T>>;
      Workspace partials(scratch, sizeof(M) * count);
      auto* p = static_cast<M*>(partials.get());
      launch_kernel<var_slices_kernel<T>>(slice_grid, block, sizeof(M) * kThreads, stream, shape.outer,
                                          shape.reduce, shape.inner, slice_rows, static_cast<const T*>(input),
                                          p);
      launch_kernel<var_finish_kernel<T>>(grid, block, sizeof(M) * kThreads, stream, shape.outer,
                                          shape.reduce, shape.inner, slices, static_cast<const M*>(p), output,
                                          out_dtype, correction);
    });
    return;
  }
  visit_all(in_dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    using P = Partial<reduce_acc_t<T>>;
    Workspace partials(scratch, sizeof(P) * count);
    auto* p = static_cast<P*>(partials.get());
    launch_kernel<reduce_slices_kernel<T>>(slice_grid, block, sizeof(P) * kThreads, stream,
                                           static_cast<int>(op), shape.outer, shape.reduce, shape.inner,
                                           slice_rows, static_cast<const T*>(input), p);
    launch_kernel<reduce_finish_kernel<T>>(grid, block, sizeof(P) * kThreads, stream, static_cast<int>(op),
                                           shape.outer, shape.reduce, shape.inner, slices,
                                           static_cast<const P*>(p), output, out_dtype);
  });
}

}  // namespace mg::kernels::cuda
