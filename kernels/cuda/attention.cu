// Fused scaled-dot-product attention on the GPU: the CUDA-core kernels (any floating dtype, any
// D <= 256), forward and backward, and the entry points. Semantics, the online softmax and the
// backward's formulas: kernels/cpu/attention.h and .cpp (the CPU twin); docs/attention.md derives
// them. bf16/f16 with D = 64 or 128 take the tensor-core kernels on sm_80+ instead
// (attention_tensor_core.cu, attention_tensor_core_backward.cu).
//
// Why fused: the composed path writes the [Tq, Tk] scores of every head to DRAM several times and
// keeps one copy for backward. Here a block owns a few query rows; K and V stream through shared
// memory in tiles of 32 keys; only O and one log-sum-exp (LSE) per row are written.
//
// Decomposition, forward (flash_forward_simt): a block of 4 warps owns 16 query rows of one (b, h),
// 4 rows per warp, held in shared memory. Per key tile, lane j computes the 4 scores of key j
// against its warp's rows (the dot over D reads K[j][d] from a row padded to an odd pitch, so the
// 32 lanes hit 32 banks, and q[d] as a broadcast); warp shuffles take the row max and sum; then
// lanes own the output's dims (lane + 32 c) and add sum_j p_j v_j[d], p_j broadcast by shuffle.
// Backward: two kernels that each write their outputs alone, deterministic and without atomics, as
// on the CPU:
//   flash_backward_q_simt, first: a block owns 16 query rows, computes their delta_i = rowsum(dO O)
//     (a warp per row, written for the next kernel) and streams 32-key tiles, the forward's shape:
//     dQ_i += scale dS_ij k_j;
//   flash_backward_kv_simt: a block owns 16 keys (4 per warp) and streams 32-row query tiles (Q, dO,
//     LSE, delta): lane i rebuilds p_ij = exp(s_ij - LSE_i) and dp_ij = dO_i . v_j, then the warp
//     adds dV_j += p~_ij dO_i and dK_j += scale dS_ij q_i.
// Bytes and FLOPs, one head, no mask: the forward does 4 Tq Tk D FLOPs and Tq Tk exps, reads Q once
// and K, V once per 16-row block (2 Tk D (Tq / 16) elements, mostly from L2) and writes Tq D + Tq.
// The backward does 4 products in the first kernel (S, dP, dV, dK) and 3 in the second (S, dP,
// dQ): 14 Tq Tk D FLOPs, where FlashAttention-2 does 5 products; the price of determinism is
// recomputing S and dP twice. Causal skips the key tiles above the
// diagonal, about half. Nothing of size Tq x Tk touches DRAM. (Counters and the predicted H200
// time: docs/kernels.md and docs/attention.md.)
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <type_traits>

#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/online_softmax.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace attention_internal;

constexpr int kWarps = 4;
constexpr int kBlockThreads = 32 * kWarps;
constexpr int kRowsPerWarp = 4;                    // query rows (forward, dQ) or keys (dK, dV)
constexpr int kBlockRows = kWarps * kRowsPerWarp;  // 16 per block
constexpr int kTile = 32;                          // keys (forward, dQ) or query rows (dK, dV) per tile
constexpr int kMaxDimsPerLane = 8;                 // D <= 256 = 32 lanes x 8
constexpr int kMaxHeadDim = 32 * kMaxDimsPerLane;

// Rows that lane j reads across d (K[j][d] while all lanes take another j) are padded to an odd
// number of words, so the 32 lanes fall on 32 different banks.
__host__ __device__ __forceinline__ int odd_pitch(int D) { return D % 2 == 0 ? D + 1 : D; }

// dst[r * pitch + c] = x[b, h, t0 + r, c] in the accumulation type, zero where t0 + r >= t_end.
template <class T, class A>
__device__ __forceinline__ void load_rows(const View<T>& x, int64_t b, int64_t h, int64_t t0, int rows,
                                          int64_t t_end, int D, int pitch, A* dst) {
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, c = idx % D;
    const int64_t t = t0 + r;
    dst[r * pitch + c] = t < t_end ? load(x.at(b, h, t) + c) : A(0);
  }
}

// Writes a warp's rows of a [rows, D] result (acc[r][c] is dim lane + 32 c of row r) times `inv`.
template <class T, class A>
__device__ __forceinline__ void store_row(T* row, const A (&acc)[kMaxDimsPerLane], A inv, int D, int lane) {
#pragma unroll
  for (int c = 0; c < kMaxDimsPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < D) store(row + d, acc[c] * inv);
  }
}

// acc[r][c] += sum over jj < n of w_r(jj) tile[jj * pitch + lane + 32 c], where w_r(jj) is
// weights[r] of lane jj (broadcast by shuffle): lanes own the output's dims, and each row of the
// tile is read once for the warp's 4 rows. O += P V, dQ += dS K, dV += P~ dO and dK += dS Q alike.
template <class A>
__device__ __forceinline__ void accumulate_rows(A (&acc)[kRowsPerWarp][kMaxDimsPerLane],
                                                const A (&weights)[kRowsPerWarp], const A* tile, int pitch,
                                                int n, int D, int lane) {
  for (int jj = 0; jj < n; ++jj) {
    A x[kMaxDimsPerLane];
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c)
      x[c] = lane + 32 * c < D ? tile[jj * pitch + lane + 32 * c] : A(0);
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const A w = __shfl_sync(0xffffffffu, weights[r], jj);
#pragma unroll
      for (int c = 0; c < kMaxDimsPerLane; ++c) acc[r][c] += w * x[c];
    }
  }
}

// ---- forward ---------------------------------------------------------------------------------
// Shared: Q [16][D], K [32][odd pitch], V [32][D], in the accumulation type.
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    flash_forward_simt(const Params p, const View<T> q, const View<T> k, const View<T> v, T* o,
                       acc_t<T>* lse) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = p.D, pitch = odd_pitch(D);
  A* const qs = reinterpret_cast<A*>(smem_raw);
  A* const ks = qs + kBlockRows * D;
  A* const vs = ks + kTile * pitch;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n_qt = (p.Tq + kBlockRows - 1) / kBlockRows;
  const int64_t bh = blockIdx.x / n_qt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = (n_qt - 1 - blockIdx.x % n_qt) * kBlockRows;  // the longest causal rows first
  const A scale = A(p.scale), keep_scale = A(p.keep_scale), minus_inf = neg_inf<A>();
  load_rows(q, b, h, i0, kBlockRows, p.Tq, D, D, qs);

  A m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = minus_inf, l[r] = A(0);
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) acc[r][c] = A(0);
  }
  const A* const my_q = qs + warp * kRowsPerWarp * D;
  const int64_t end = key_end(p, i0, kBlockRows);
  for (int64_t j0 = 0; j0 < end; j0 += kTile) {
    __syncthreads();  // everyone is done with the previous tile
    load_rows(k, b, h, j0, kTile, end, D, pitch, ks);
    load_rows(v, b, h, j0, kTile, end, D, D, vs);
    __syncthreads();
    // Lane j: the scores of key j0 + j against the warp's 4 rows.
    A s[kRowsPerWarp] = {};
    for (int d = 0; d < D; ++d) {
      const A kd = ks[lane * pitch + d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) s[r] += my_q[r * D + d] * kd;
    }
    const int64_t j = j0 + lane;
    A pv[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = i0 + warp * kRowsPerWarp + r;
      const bool visible = j < end && (!p.causal || j <= i);
      const A x = visible ? s[r] * scale : minus_inf;
      const A tile_max = warp_max(x), m_new = tile_max > m[r] ? tile_max : m[r];  // the same in every lane
      pv[r] = A(0);
      if (m_new == minus_inf) continue;  // nothing visible yet: exp(-inf - -inf) is NaN
      const A alpha = exp_(m[r] - m_new);
      const A e = exp_(x - m_new);
      l[r] = l[r] * alpha + warp_sum(e);
      m[r] = m_new;
      pv[r] = e;
      if (p.dropout) pv[r] = visible && dropout_keeps(p, bh, i, j) ? e * keep_scale : A(0);
#pragma unroll
      for (int c = 0; c < kMaxDimsPerLane; ++c) acc[r][c] *= alpha;
    }
    // Lanes own dims: acc[r][c] += sum_j p_rj v_j[lane + 32 c].
    accumulate_rows(acc, pv, vs, D, static_cast<int>(end - j0 < kTile ? end - j0 : kTile), D, lane);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kRowsPerWarp + r;
    if (i >= p.Tq) continue;
    const bool seen = l[r] > A(0);  // a row that saw no key: O = 0 and LSE = -inf
    store_row(o + (bh * p.Tq + i) * D, acc[r], seen ? A(1) / l[r] : A(0), D, lane);
    if (lane == 0) lse[bh * p.Tq + i] = seen ? m[r] + log_(l[r]) : minus_inf;
  }
}

// ---- backward: delta_i = rowsum(dO_i O_i), one row by one warp (lanes over d) -------------------
template <class T>
__device__ __forceinline__ acc_t<T> row_delta(const Params& p, const View<T>& dout, const T* o, int64_t bh,
                                              int64_t i, int lane) {
  using A = acc_t<T>;
  const T* g = dout.at(bh / p.H, bh % p.H, i);
  const T* out = o + (bh * p.Tq + i) * p.D;
  A sum = A(0);
  for (int d = lane; d < p.D; d += 32) sum += load(g + d) * load(out + d);
  return warp_sum(sum);
}

// p~ (dropped and rescaled) and scale * dS of one score, from its raw dot s and dp = dO_i . v_j.
template <class A>
struct ScoreGrad {
  A p_dropped, ds;
};
template <class A>
__device__ __forceinline__ ScoreGrad<A> score_grad(const Params& p, int64_t bh, int64_t i, int64_t j,
                                                   bool visible, A s, A dp, A lse_i, A delta_i) {
  const A P = visible && lse_i != neg_inf<A>() ? exp_(s * A(p.scale) - lse_i) : A(0);
  A z = A(1);
  if (p.dropout) z = visible && dropout_keeps(p, bh, i, j) ? A(p.keep_scale) : A(0);
  return {P * z, P * (dp * z - delta_i) * A(p.scale)};
}

// ---- backward: dK and dV. Shared: K, V [16][D]; Q, dO [32][odd pitch]; LSE, delta [32] ----------
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_kv_simt(const Params p, const View<T> q, const View<T> k, const View<T> v,
                           const View<T> dout, const acc_t<T>* lse, const acc_t<T>* delta, T* dk, T* dv) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = p.D, pitch = odd_pitch(D);
  A* const kb = reinterpret_cast<A*>(smem_raw);
  A* const vb = kb + kBlockRows * D;
  A* const qs = vb + kBlockRows * D;
  A* const gs = qs + kTile * pitch;
  A* const lse_s = gs + kTile * pitch;
  A* const delta_s = lse_s + kTile;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n_kt = (p.Tk + kBlockRows - 1) / kBlockRows;
  const int64_t bh = blockIdx.x / n_kt, b = bh / p.H, h = bh % p.H;
  const int64_t j0 = (blockIdx.x % n_kt) * kBlockRows;
  load_rows(k, b, h, j0, kBlockRows, p.Tk, D, D, kb);
  load_rows(v, b, h, j0, kBlockRows, p.Tk, D, D, vb);

  A acc_k[kRowsPerWarp][kMaxDimsPerLane], acc_v[kRowsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) acc_k[r][c] = acc_v[r][c] = A(0);
  const A* const my_k = kb + warp * kRowsPerWarp * D;
  const A* const my_v = vb + warp * kRowsPerWarp * D;
  // Causal: query i sees key j only when i >= j, so the query tiles before j0 contribute nothing.
  for (int64_t i0 = p.causal ? (j0 / kTile) * kTile : 0; i0 < p.Tq; i0 += kTile) {
    __syncthreads();
    load_rows(q, b, h, i0, kTile, p.Tq, D, pitch, qs);
    load_rows(dout, b, h, i0, kTile, p.Tq, D, pitch, gs);
    if (threadIdx.x < kTile) {
      const int64_t i = i0 + threadIdx.x;
      lse_s[threadIdx.x] = i < p.Tq ? lse[bh * p.Tq + i] : neg_inf<A>();
      delta_s[threadIdx.x] = i < p.Tq ? delta[bh * p.Tq + i] : A(0);
    }
    __syncthreads();
    // Lane i: s and dp of query i0 + i against the warp's 4 keys.
    A s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    for (int d = 0; d < D; ++d) {
      const A qd = qs[lane * pitch + d], gd = gs[lane * pitch + d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        s[r] += qd * my_k[r * D + d];
        dp[r] += gd * my_v[r * D + d];
      }
    }
    const int64_t i = i0 + lane;
    A pd[kRowsPerWarp], ds[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t j = j0 + warp * kRowsPerWarp + r;
      const bool visible = i < p.Tq && j < p.Tk && (!p.causal || j <= i);
      const ScoreGrad<A> g = score_grad(p, bh, i, j, visible, s[r], dp[r], lse_s[lane], delta_s[lane]);
      pd[r] = g.p_dropped, ds[r] = g.ds;
    }
    // Lanes own dims: dV_j += sum_i p~_ij dO_i, dK_j += sum_i dS_ij q_i.
    const int nr = static_cast<int>(p.Tq - i0 < kTile ? p.Tq - i0 : kTile);
    accumulate_rows(acc_v, pd, gs, pitch, nr, D, lane);
    accumulate_rows(acc_k, ds, qs, pitch, nr, D, lane);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t j = j0 + warp * kRowsPerWarp + r;
    if (j >= p.Tk) continue;
    store_row(dk + (bh * p.Tk + j) * D, acc_k[r], A(1), D, lane);
    store_row(dv + (bh * p.Tk + j) * D, acc_v[r], A(1), D, lane);
  }
}

// ---- backward: dQ. Shared: Q, dO [16][D]; K, V [32][odd pitch] ----------------------------------
template <class T>
__global__ void __launch_bounds__(kBlockThreads)
    flash_backward_q_simt(const Params p, const View<T> q, const View<T> k, const View<T> v,
                          const View<T> dout, const T* o, const acc_t<T>* lse, acc_t<T>* delta, T* dq) {
  using A = acc_t<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int D = p.D, pitch = odd_pitch(D);
  A* const qb = reinterpret_cast<A*>(smem_raw);
  A* const gb = qb + kBlockRows * D;
  A* const ks = gb + kBlockRows * D;
  A* const vs = ks + kTile * pitch;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n_qt = (p.Tq + kBlockRows - 1) / kBlockRows;
  const int64_t bh = blockIdx.x / n_qt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = (n_qt - 1 - blockIdx.x % n_qt) * kBlockRows;
  load_rows(q, b, h, i0, kBlockRows, p.Tq, D, D, qb);
  load_rows(dout, b, h, i0, kBlockRows, p.Tq, D, D, gb);
  A L[kRowsPerWarp], dl[kRowsPerWarp], acc[kRowsPerWarp][kMaxDimsPerLane];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kRowsPerWarp + r;
    L[r] = i < p.Tq ? lse[bh * p.Tq + i] : neg_inf<A>();
    dl[r] = i < p.Tq ? row_delta(p, dout, o, bh, i, lane) : A(0);  // warp-uniform branch
    if (i < p.Tq && lane == 0) delta[bh * p.Tq + i] = dl[r];       // for the dK/dV kernel, launched next
#pragma unroll
    for (int c = 0; c < kMaxDimsPerLane; ++c) acc[r][c] = A(0);
  }
  const A* const my_q = qb + warp * kRowsPerWarp * D;
  const A* const my_g = gb + warp * kRowsPerWarp * D;
  const int64_t end = key_end(p, i0, kBlockRows);
  for (int64_t j0 = 0; j0 < end; j0 += kTile) {
    __syncthreads();
    load_rows(k, b, h, j0, kTile, end, D, pitch, ks);
    load_rows(v, b, h, j0, kTile, end, D, pitch, vs);
    __syncthreads();
    A s[kRowsPerWarp] = {}, dp[kRowsPerWarp] = {};
    for (int d = 0; d < D; ++d) {
      const A kd = ks[lane * pitch + d], vd = vs[lane * pitch + d];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        s[r] += my_q[r * D + d] * kd;
        dp[r] += my_g[r * D + d] * vd;
      }
    }
    const int64_t j = j0 + lane;
    A ds[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t i = i0 + warp * kRowsPerWarp + r;
      const bool visible = j < end && (!p.causal || j <= i);
      ds[r] = score_grad(p, bh, i, j, visible, s[r], dp[r], L[r], dl[r]).ds;
    }
    accumulate_rows(acc, ds, ks, pitch, static_cast<int>(end - j0 < kTile ? end - j0 : kTile), D, lane);
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = i0 + warp * kRowsPerWarp + r;
    if (i < p.Tq) store_row(dq + (bh * p.Tq + i) * D, acc[r], A(1), D, lane);
  }
}

// ================================================================================================
// Host side
// ================================================================================================

void check_problem(const char* what, const AttentionProblem& p) {
  MG_CHECK(p.B >= 0 && p.H >= 0 && p.Tq >= 0 && p.Tk >= 0 && p.D > 0, what, ": bad sizes B=", p.B, " H=", p.H,
           " Tq=", p.Tq, " Tk=", p.Tk, " D=", p.D);
  MG_CHECK(p.D <= kMaxHeadDim, what, " (CUDA): head dim D = ", p.D, " is over the kernels' ", kMaxHeadDim);
  MG_CHECK(p.dropout_p >= 0.0 && p.dropout_p <= 1.0, what, ": dropout_p must be in [0, 1], got ",
           p.dropout_p);
}

// One block per `rows_per_block` rows of every (b, h): the grid's x, checked against CUDA's limit.
unsigned blocks_for(const char* what, const AttentionProblem& p, int64_t rows, int64_t rows_per_block) {
  const int64_t blocks = p.B * p.H * ((rows + rows_per_block - 1) / rows_per_block);
  MG_CHECK(blocks <= 0x7fffffff, what, " (CUDA): ", blocks, " blocks exceed the grid's 2^31 - 1");
  return static_cast<unsigned>(blocks);
}

// The dynamic shared memory a kernel asks for, with the opt-in above 48 KiB; a D whose tiles do not
// fit the device (f64 at large D on some GPUs) is an error naming the sizes.
template <auto Kernel>
int prepare_smem(const char* what, int64_t elements, size_t element_size) {
  const int64_t bytes = elements * static_cast<int64_t>(element_size);
  int device = 0, limit = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  MG_CHECK(bytes <= limit, what, " (CUDA): the tiles need ", bytes,
           " bytes of shared memory, the device allows ", limit, " per block");
  if (bytes > 48 * 1024) allow_dynamic_smem(reinterpret_cast<const void*>(Kernel), static_cast<int>(bytes));
  return static_cast<int>(bytes);
}

template <class T>
void forward_simt(cudaStream_t stream, const Params& prm, const AttentionProblem& p, const void* q,
                  const AttentionStrides& qs, const void* k, const AttentionStrides& ks, const void* v,
                  const AttentionStrides& vs, void* o, void* lse) {
  using A = acc_t<T>;
  const int D = prm.D;
  const int smem = prepare_smem<flash_forward_simt<T>>(
      "attention_forward", int64_t(kBlockRows) * D + int64_t(kTile) * odd_pitch(D) + int64_t(kTile) * D,
      sizeof(A));
  launch_kernel<flash_forward_simt<T>>(blocks_for("attention_forward", p, p.Tq, kBlockRows), kBlockThreads,
                                       smem, stream, prm, make_view<T>(q, qs), make_view<T>(k, ks),
                                       make_view<T>(v, vs), static_cast<T*>(o), static_cast<A*>(lse));
}

// Whether a call takes the tensor-core kernels: `automatic` where they apply; forcing them where they
// do not is an error that says why. One device query per call.
bool use_tensor_cores(const char* what, AttentionKernel kernel, DType dtype, int64_t D) {
  if (kernel == AttentionKernel::cuda_cores) return false;
  const bool applies = tensor_cores_apply(dtype, D);
  MG_CHECK(applies || kernel == AttentionKernel::automatic, what,
           " (CUDA): the tensor-core kernels take bf16 or f16 with D = 64 or 128 on sm_80+, got ",
           dtype_name(dtype), " with D = ", D);
  return applies;
}

}  // namespace

void attention_forward(cudaStream_t stream, DType dtype, const AttentionProblem& p, const void* q,
                       AttentionStrides q_strides, const void* k, AttentionStrides k_strides, const void* v,
                       AttentionStrides v_strides, void* o, void* lse, AttentionKernel kernel) {
  check_problem("attention_forward", p);
  if (p.B * p.H * p.Tq == 0) return;
  const Params prm = make_params(p);
  if (use_tensor_cores("attention_forward", kernel, dtype, p.D)) {
    return launch_forward_tensor_core(stream, dtype, prm, q, q_strides, k, k_strides, v, v_strides, o,
                                      static_cast<float*>(lse));
  }
  visit_float(dtype, "attention_forward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    forward_simt<T>(stream, prm, p, q, q_strides, k, k_strides, v, v_strides, o, lse);
  });
}

void attention_backward(cudaStream_t stream, DType dtype, const AttentionProblem& p, const void* q,
                        AttentionStrides q_strides, const void* k, AttentionStrides k_strides, const void* v,
                        AttentionStrides v_strides, const void* o, const void* lse, const void* dout,
                        AttentionStrides dout_strides, void* delta, void* dq, void* dk, void* dv,
                        AttentionKernel kernel) {
  check_problem("attention_backward", p);
  const Params prm = make_params(p);
  const bool tensor_cores = use_tensor_cores("attention_backward", kernel, dtype, p.D);
  visit_float(dtype, "attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const View<T> vq = make_view<T>(q, q_strides), vk = make_view<T>(k, k_strides),
                  vv = make_view<T>(v, v_strides), vg = make_view<T>(dout, dout_strides);
    const A* lse_rows = static_cast<const A*>(lse);
    A* delta_rows = static_cast<A*>(delta);
    const int D = prm.D, pitch = odd_pitch(D);
    // Two launches on either path: the dQ kernel first, which computes delta for its rows and
    // writes it, then the dK/dV kernel, which reads it.
    if (tensor_cores) {
      if constexpr (std::is_same<T, bf16_t>::value || std::is_same<T, f16_t>::value)
        launch_backward_tensor_core(stream, dtype, prm, q, q_strides, k, k_strides, v, v_strides, o, dout,
                                    dout_strides, lse_rows, delta_rows, dq, dk, dv);
      return;
    }
    if (p.B * p.H * p.Tq > 0) {
      const int smem = prepare_smem<flash_backward_q_simt<T>>(
          "attention_backward", 2 * int64_t(kBlockRows) * D + 2 * int64_t(kTile) * pitch, sizeof(A));
      launch_kernel<flash_backward_q_simt<T>>(
          blocks_for("attention_backward", p, p.Tq, kBlockRows), kBlockThreads, smem, stream, prm, vq, vk, vv,
          vg, static_cast<const T*>(o), lse_rows, delta_rows, static_cast<T*>(dq));
    }
    if (p.B * p.H * p.Tk > 0) {
      const int smem = prepare_smem<flash_backward_kv_simt<T>>(
          "attention_backward", 2 * int64_t(kBlockRows) * D + 2 * int64_t(kTile) * pitch + 2 * kTile,
          sizeof(A));
      launch_kernel<flash_backward_kv_simt<T>>(blocks_for("attention_backward", p, p.Tk, kBlockRows),
                                               kBlockThreads, smem, stream, prm, vq, vk, vv, vg, lse_rows,
                                               delta_rows, static_cast<T*>(dk), static_cast<T*>(dv));
    }
  });
}

}  // namespace mg::kernels::cuda
