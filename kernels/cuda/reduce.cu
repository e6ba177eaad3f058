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
// Blocks loop over outer indices (grid.y capped at 65535).
//
// Cost. Reads outer*reduce*inner elements once (twice for var), writes
// outer*inner: memory bound.
//
// Split reduce. With small outer*inner and a long reduce (one scalar out of 100M
// elements: sum() of a whole tensor) the grid above has a handful of blocks and
// most of the GPU idles. Then the reduced axis is cut into `slices` of at least
// kMinSliceRows rows, so that about kSplitBlocks blocks run: pass 1
// (reduce_slices_kernel) leaves one Partial per (outer, slice, inner) in a
// workspace, pass 2 (reduce_finish_kernel, one thread per output) combines each
// output's slices in order and finishes it. Var keeps the single pass: it needs
// the mean before the deviations.
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

// The split reduce's targets: about two blocks per SM of an H200, slices of at least 4096 rows.
constexpr int64_t kSplitBlocks = 264;
constexpr int64_t kMinSliceRows = 4096;

// Sums accumulate in acc_t<T> (core/base/dtype.h), with integers and bool widened further to
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

// Combines the ty partials of each column of the block; row 0 gets the result.
template <class A>
__device__ Partial<A> block_combine(int op, Partial<A> p, Partial<A>* shared) {
  const int tx = blockDim.x, ty = blockDim.y;
  const int x = threadIdx.x, y = threadIdx.y;
  shared[y * tx + x] = p;
  __syncthreads();
  for (int half = ty / 2; half > 0; half /= 2) {
    if (y < half) {
      Partial<A> mine = shared[y * tx + x];
      combine(op, mine, shared[(y + half) * tx + x]);
      shared[y * tx + x] = mine;
    }
    __syncthreads();
  }
  Partial<A> result = shared[x];
  __syncthreads();  // the caller may reuse `shared`
  return result;
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
  Partial<A>* shared = reinterpret_cast<Partial<A>*>(dynamic_shared_memory());
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = i < inner;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* base = in + o * reduce * inner + (active ? i : 0);
    Partial<A> p{A(op == int(ReduceOp::Prod) ? 1 : 0), -1};
    if (active) {
      for (int64_t r = threadIdx.y; r < reduce; r += blockDim.y) {
        const A v = static_cast<A>(load(base + r * inner));
        combine(op, p, Partial<A>{v, r});
      }
    }
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
  Partial<A>* shared = reinterpret_cast<Partial<A>*>(dynamic_shared_memory());
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = i < inner;
  const int64_t first = int64_t(blockIdx.z) * slice_rows;
  const int64_t last = first + slice_rows < reduce ? first + slice_rows : reduce;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* base = in + o * reduce * inner + (active ? i : 0);
    Partial<A> p{A(op == int(ReduceOp::Prod) ? 1 : 0), -1};
    if (active)
      for (int64_t r = first + threadIdx.y; r < last; r += blockDim.y)
        combine(op, p, Partial<A>{static_cast<A>(load(base + r * inner)), r});
    const Partial<A> total = block_combine(op, p, shared);
    if (threadIdx.y == 0 && active) partials[(o * gridDim.z + blockIdx.z) * inner + i] = total;
  }
}

// Pass 2: one thread per output combines its slices in order and finishes it.
template <class T>
__global__ void reduce_finish_kernel(int op, int64_t outer, int64_t reduce, int64_t inner, int64_t slices,
                                     const Partial<reduce_acc_t<T>>* partials, void* out, DType out_dtype) {
  using A = reduce_acc_t<T>;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < outer * inner;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = e / inner, i = e % inner;
    Partial<A> total{A(op == int(ReduceOp::Prod) ? 1 : 0), -1};
    for (int64_t z = 0; z < slices; ++z) combine(op, total, partials[(o * slices + z) * inner + i]);
    finish(op, total, reduce, 0, out, e, out_dtype);
  }
}

}  // namespace

void reduce(cudaStream_t stream, ScratchAllocator& scratch, ReduceOp op, const ReduceShape& shape,
            const void* input, DType in_dtype, void* output, DType out_dtype, int64_t correction) {
  const char* name = reduce_op_name(op);
  const bool arg = op == ReduceOp::Argmax || op == ReduceOp::Argmin;
  check(shape.reduce > 0 || !(arg || op == ReduceOp::Max || op == ReduceOp::Min), name,
        " (CUDA): cannot reduce over an empty dimension (no identity)");
  check(!arg || out_dtype == DType::i64, name, " (CUDA): the output must be i64, got ",
        dtype_name(out_dtype));
  check(!(op == ReduceOp::Mean || op == ReduceOp::Var) || (is_floating(in_dtype) && is_floating(out_dtype)),
        name, " (CUDA): needs floating input and output, got ", dtype_name(in_dtype), " -> ",
        dtype_name(out_dtype));
  check(!(op == ReduceOp::Max || op == ReduceOp::Min) || out_dtype == in_dtype, name,
        " (CUDA): output dtype must equal the input's");
  if (shape.outer == 0 || shape.inner == 0) return;
  int tx = 1;
  while (tx < 32 && tx < shape.inner) tx *= 2;
  const int ty = kThreads / tx;
  const dim3 block(tx, ty);
  const int64_t tiles = (shape.inner + tx - 1) / tx;
  check(tiles < (int64_t(1) << 31), name, " (CUDA): inner size ", shape.inner, " too large");
  const unsigned outer_blocks = static_cast<unsigned>(shape.outer < 65535 ? shape.outer : 65535);
  // Split the reduced axis when the plain grid would leave the GPU idle (see the top).
  const int64_t blocks = tiles * outer_blocks;
  int64_t slices = 1;
  if (op != ReduceOp::Var && blocks < kSplitBlocks && shape.reduce >= 2 * kMinSliceRows) {
    slices = std::min<int64_t>(shape.reduce / kMinSliceRows, kSplitBlocks / blocks);
  }
  visit_all(in_dtype, [&](auto t) {
    using T = typename decltype(t)::type;
    using A = reduce_acc_t<T>;
    const size_t smem = sizeof(Partial<A>) * kThreads;
    if (slices == 1) {
      launch_kernel<reduce_kernel<T>>(dim3(static_cast<unsigned>(tiles), outer_blocks), block, smem, stream,
                                      static_cast<int>(op), shape.outer, shape.reduce, shape.inner,
                                      static_cast<const T*>(input), output, out_dtype, correction);
      return;
    }
    const int64_t slice_rows = (shape.reduce + slices - 1) / slices;
    Workspace partials(scratch, sizeof(Partial<A>) * static_cast<size_t>(shape.outer * slices * shape.inner));
    auto* p = static_cast<Partial<A>*>(partials.get());
    launch_kernel<reduce_slices_kernel<T>>(
        dim3(static_cast<unsigned>(tiles), outer_blocks, static_cast<unsigned>(slices)), block, smem, stream,
        static_cast<int>(op), shape.outer, shape.reduce, shape.inner, slice_rows,
        static_cast<const T*>(input), p);
    launch_kernel<reduce_finish_kernel<T>>(grid_for(shape.outer * shape.inner), kThreads, 0, stream,
                                           static_cast<int>(op), shape.outer, shape.reduce, shape.inner,
                                           slices, static_cast<const Partial<A>*>(p), output, out_dtype);
  });
}

}  // namespace mg::kernels::cuda
