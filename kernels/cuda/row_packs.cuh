// A row of a [rows, cols] tensor as 16-byte packs, for the row kernels that read a row once and
// keep it (softmax.cu, layer_norm.cu: the "registers" and "online" rungs of the kernel lab,
// kernels/cuda/kernel_lab.h).
//
// The cut. A row starts wherever rows * cols puts it, so when cols is no multiple of the pack
// width V (16 bytes: 4 f32, 2 f64, 8 f16/bf16) its first element is not 16-byte aligned. The row is
// cut into `head` loose elements up to the first 16-byte boundary, `packs` whole packs of V, and
// `tail` (< V) loose elements. The host allows packs (`vector`) when the input and the output have
// the same misalignment (x % 16 == y % 16) and elements are naturally aligned; otherwise head is 0
// and every pack is V element loads and stores (the same code, narrower accesses).
//
// The threads of a row (a warp, or a block) share it: thread `rank` of `threads` holds packs
// rank, rank + threads, rank + 2 threads, ... (so the k-th pack of every thread is one coalesced
// request: 32 lanes x 16 bytes = 512 contiguous bytes a warp), and at most one loose element:
// ranks [0, head) the head's, ranks [head, head + tail) the tail's (head + tail <= 2V - 2 = 14 <
// 32 threads).
//
// RowRegisters<T, P> is a thread's share held in registers, up to P packs (P x 4 registers
// whatever the dtype: packs stay in the storage type and are widened to acc_t<T> on use). Its P
// loads are issued together, one round trip, before any is used.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vectorized.cuh"

// A loop with a constant trip count unrolled whole: nvcc's `#pragma unroll`, and under the CUDA
// emulation g++'s, so that the emulator's access tracer sees P different load instructions (in
// flight together, one round trip) as the GPU would, not one instruction P times.
#if defined(__CUDACC__)
#define MG_ROW_UNROLL _Pragma("unroll")
#else
#define MG_ROW_UNROLL _Pragma("GCC unroll 16")
#endif

namespace mg::kernels::cuda {

// Where a row's packs are (see the top).
struct RowCut {
  int head = 0;       // loose elements [0, head) before the first pack
  int tail = 0;       // loose elements after the last pack
  int64_t packs = 0;  // whole packs, the first at element `head`
};

template <class T>
__device__ __forceinline__ RowCut row_cut(const T* row, int64_t cols, bool vector) {
  constexpr int V = pack_width<T>();
  RowCut c;
  if (vector) {
    const int misaligned =
        static_cast<int>(reinterpret_cast<uintptr_t>(row) % 16) / static_cast<int>(sizeof(T));
    c.head = misaligned == 0 ? 0 : V - misaligned;
    if (c.head > cols) c.head = static_cast<int>(cols);
  }
  c.packs = (cols - c.head) / V;
  c.tail = static_cast<int>(cols - c.head - c.packs * V);
  return c;
}

// The loose element thread `rank` holds (its column), or -1.
template <class T>
__device__ __forceinline__ int64_t loose_column(const RowCut& c, int rank) {
  if (rank < c.head) return rank;
  if (rank < c.head + c.tail) return c.head + c.packs * pack_width<T>() + (rank - c.head);
  return -1;
}

// The 16-byte word a pack moves: on the GPU uint4 (16-byte aligned, one 128-bit load or store).
// Under the CUDA emulation g++ is told 4-byte alignment only: it may merge a pack access with the
// element accesses of the other branch below (the same bytes) into one 16-byte access, and must not
// then assume the element path's address aligned (with uint4 it did: an aligned 16-byte load, off
// a boundary, when x and y were misaligned differently).
#if defined(__CUDACC__)
using RowWord = uint4;
#else
typedef uint4 RowWord __attribute__((aligned(4)));
#endif

// One pack at p: a 16-byte access when `vector` (p is then 16-byte aligned), else V element accesses.
template <class T>
__device__ __forceinline__ Pack<T, pack_width<T>()> load_row_pack(const T* p, bool vector) {
  constexpr int V = pack_width<T>();
  static_assert(V * sizeof(T) == sizeof(RowWord), "a pack is 16 bytes");
  Pack<T, V> out;
  if (vector) {
    const RowWord raw = *reinterpret_cast<const RowWord*>(p);
    memcpy(&out, &raw, sizeof(RowWord));
    return out;
  }
  MG_ROW_UNROLL
  for (int j = 0; j < V; ++j) out.v[j] = p[j];
  return out;
}
template <class T>
__device__ __forceinline__ void store_row_pack(T* p, const Pack<T, pack_width<T>()>& pack, bool vector) {
  constexpr int V = pack_width<T>();
  if (vector) {
    RowWord raw;
    memcpy(&raw, &pack, sizeof(RowWord));
    *reinterpret_cast<RowWord*>(p) = raw;
    return;
  }
  MG_ROW_UNROLL
  for (int j = 0; j < V; ++j) p[j] = pack.v[j];
}

// The streaming (online) kernels' step: packs q0, q0 + threads, ..., q0 + (U - 1) threads of the
// row (those before c.packs), loaded together: U packs in flight, one round trip.
constexpr int kRowStreamUnroll = 4;
template <int U, class T>
__device__ __forceinline__ void load_row_packs(Pack<T, pack_width<T>()> (&p)[U], const T* row,
                                               const RowCut& c, int64_t q0, int threads, bool vector) {
  MG_ROW_UNROLL
  for (int u = 0; u < U; ++u) {
    const int64_t q = q0 + int64_t(u) * threads;
    if (q < c.packs) p[u] = load_row_pack(row + c.head + q * pack_width<T>(), vector);
  }
}

// The streaming kernels' write sweep: out[c] = f(x[c]) over the row, U packs in flight per
// thread, then the loose column; f.pack(pack, col) maps a pack starting at column col and
// f.one(value, col) one element, in the accumulation type A.
template <int U, class A, class T, class F>
__device__ __forceinline__ void map_row_packs(T* out, const T* x, const RowCut& c, int64_t loose, int rank,
                                              int threads, bool vector, const F& f) {
  constexpr int V = pack_width<T>();
  for (int64_t q0 = rank; q0 < c.packs; q0 += int64_t(U) * threads) {
    Pack<T, V> p[U]{};
    load_row_packs(p, x, c, q0, threads, vector);
    MG_ROW_UNROLL
    for (int u = 0; u < U; ++u) {
      const int64_t col = c.head + (q0 + int64_t(u) * threads) * V;
      if (q0 + int64_t(u) * threads < c.packs) store_row_pack(out + col, f.pack(p[u], col), vector);
    }
  }
  if (loose >= 0) store(out + loose, f.one(A(load(x + loose)), loose));
}

// ---- a thread's share of a row, in registers -------------------------------------------------------
template <class T, int P>
struct RowRegisters {
  static constexpr int V = pack_width<T>();
  Pack<T, V> pack[P]{};    // pack k: the row's pack k * threads + rank, valid while that is < packs
  T loose{};               // valid when loose_col >= 0
  int64_t loose_col = -1;  // its column
  int count = 0;           // elements held

  // The thread's packs and loose element of `row`, every load issued before any is used.
  __device__ __forceinline__ void load(const T* row, const RowCut& c, int rank, int threads, bool vector) {
    count = 0;
    MG_ROW_UNROLL
    for (int k = 0; k < P; ++k) {
      const int64_t q = int64_t(k) * threads + rank;
      if (q < c.packs) {
        pack[k] = load_row_pack(row + c.head + q * V, vector);
        count += V;
      }
    }
    loose_col = loose_column<T>(c, rank);
    if (loose_col >= 0) {
      loose = row[loose_col];
      ++count;
    }
  }

  // f(value) for every element held, widened to acc_t<T>.
  template <class F>
  __device__ __forceinline__ void for_each(const RowCut& c, int rank, int threads, F f) const {
    MG_ROW_UNROLL
    for (int k = 0; k < P; ++k) {
      if (int64_t(k) * threads + rank < c.packs) {
        MG_ROW_UNROLL
        for (int j = 0; j < V; ++j) f(cuda::load(&pack[k].v[j]));
      }
    }
    if (loose_col >= 0) f(cuda::load(&loose));
  }

  // The outputs of the elements held, from an output functor g: g.pack(x, col) -> Pack<T, V>, the
  // pack of outputs of the pack x whose first column is col (stored as one pack, `vector` as for
  // load), and g.one(x, col) -> acc_t<T>, one output from one element (widened).
  template <class G>
  __device__ __forceinline__ void store(T* out, const RowCut& c, int rank, int threads, bool vector,
                                        const G& g) const {
    MG_ROW_UNROLL
    for (int k = 0; k < P; ++k) {
      const int64_t q = int64_t(k) * threads + rank;
      if (q < c.packs) store_row_pack(out + c.head + q * V, g.pack(pack[k], c.head + q * V), vector);
    }
    if (loose_col >= 0) cuda::store(out + loose_col, g.one(cuda::load(&loose), loose_col));
  }
};

// ---- sums over the threads of a row: a warp's (shuffles) or the block's ----------------------------
template <class V>
struct SumPair {
  V a, b;
};

// Both sums over the block in one exchange (one pair of barriers, not two); every thread gets them.
template <class V>
__device__ SumPair<V> block_sum_pair(V a, V b) {
  __shared__ V partial[2][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  a = warp_sum(a);
  b = warp_sum(b);
  __syncthreads();  // a previous call may still be reading `partial`
  if (lane == 0) {
    partial[0][warp] = a;
    partial[1][warp] = b;
  }
  __syncthreads();
  a = lane < warps ? partial[0][lane] : V(0);
  b = lane < warps ? partial[1][lane] : V(0);
  return SumPair<V>{warp_sum(a), warp_sum(b)};
}

template <bool Warp, class V>
__device__ __forceinline__ V row_sum(V v) {
  if constexpr (Warp) {
    return warp_sum(v);
  } else {
    return block_sum(v);
  }
}
template <bool Warp, class V>
__device__ __forceinline__ SumPair<V> row_sum_pair(V a, V b) {
  if constexpr (Warp) {
    return SumPair<V>{warp_sum(a), warp_sum(b)};
  } else {
    return block_sum_pair(a, b);
  }
}

// ---- launch shapes (host) --------------------------------------------------------------------------
// Packs a thread holds in registers: 8 x 16 bytes = 32 registers, whatever the dtype.
constexpr int kRowPacks = 8;
constexpr int kRowWarpsPerBlock = 8;  // the warp-per-row kernels: 256-thread blocks, 8 rows at a time
// The most threads a block per row has: 1024, or 512 for 16-bit types, whose 1024-thread kernels
// (at most 64 registers a thread) spilled ~300 bytes a thread under nvcc (widening the packs to
// float takes registers the 32-bit types do not need); at 512 they have 128.
template <class T>
constexpr int max_row_threads() {
  return sizeof(T) == 2 ? 512 : 1024;
}
// A warp per row up to 32 x kRowPacks packs (f32: 1024 elements), a block per row up to
// max_row_threads x kRowPacks (f32: 32768, f64: 16384, f16/bf16: 32768); longer rows are streamed
// (the online design).
template <class T>
constexpr int64_t warp_row_capacity() {
  return int64_t(32) * kRowPacks * pack_width<T>();
}
template <class T>
constexpr int64_t block_row_capacity() {
  return int64_t(max_row_threads<T>()) * kRowPacks * pack_width<T>();
}

// Threads for a block per row of `cols` elements held in registers: about 4 packs each (the
// smallest power of two >= packs / 4), 128 to max_row_threads.
template <class T>
inline int row_register_threads(int64_t cols) {
  const int64_t packs = (cols + pack_width<T>() - 1) / pack_width<T>();
  int threads = 128;
  while (threads < max_row_threads<T>() && int64_t(threads) * 4 < packs) threads *= 2;
  return threads;
}

// Threads for a block streaming a row of `cols` elements (the online design): one pack each per
// sweep step, 32 to 512 threads.
template <class T>
inline int row_stream_threads(int64_t cols) {
  const int64_t packs = (cols + pack_width<T>() - 1) / pack_width<T>();
  int threads = 32;
  while (threads < 512 && threads < packs) threads *= 2;
  return threads;
}

// Blocks of `threads` for `units` rows (or groups of rows) taken in a grid-stride loop: enough
// to fill the GPU twice over, few enough that what a block loads once (layer norm's weight and
// bias) serves many rows: at most two waves on an H200 (132 SMs x 2048 / threads blocks each).
// Past that each block takes `iterations` units, and the grid is as small as that allows, so
// that every block but the last few takes exactly that many (a grid of exactly the cap would
// leave some blocks a unit more than the others: a tail on the GPU, and a biased sample for the
// emulator's tracer, which extrapolates from the first blocks).
inline unsigned row_blocks(int64_t units, int threads) {
  const int64_t max_blocks = int64_t(2) * 132 * (2048 / threads);
  if (units < 1) return 1;
  const int64_t iterations = (units + max_blocks - 1) / max_blocks;
  return static_cast<unsigned>((units + iterations - 1) / iterations);
}

// Whether a row kernel may use packs: the input and the output are misaligned alike (their rows
// then start at the same offset from a 16-byte boundary) and their elements are naturally aligned.
inline bool rows_vector_ok(const void* x, const void* y, size_t element_bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(x), b = reinterpret_cast<uintptr_t>(y);
  return a % 16 == b % 16 && a % element_bytes == 0;
}

}  // namespace mg::kernels::cuda
