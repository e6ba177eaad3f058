// The attention backward on tensor cores, bf16/f16 with D = 64 or 128, sm_80+. Semantics and the
// formulas: kernels/cpu/attention.h and .cpp; the shared tensor-core pieces:
// attention_tensor_core.cuh.
//
// Every output is written by one block alone (deterministic, no atomics), and every block rebuilds
// P = exp(S scale - LSE) from Q, K and the forward's LSE; nothing of size Tq x Tk is stored.
//   flash_backward_keys_tensor_core: a block owns 64 kM keys (16 kM a warp) and streams 32-query
//     tiles of Q and dO (and the LSE and delta) through two cp.async stages. It computes the
//     TRANSPOSED scores S^T = K Q^T (the warp's K rows are its A fragments, held in registers), so
//     that the accumulators of P~^T, keys by queries, are already the A fragments of the products
//     into the keys' gradients (Q and dO read as B by ldmatrix.trans): nothing is transposed through
//     shared memory. Its blocks come in pairs for one key block:
//       even blocks  dV += P~^T dO                           2 products a tile (S^T, dV)
//       odd blocks   dP^T = V dO^T,  dK += dS^T Q             3 products a tile (S^T, dP^T, dK)
//   flash_backward_queries_tensor_core: a block owns 64 kM query rows (16 kM a warp, Q and dO as A
//     fragments) and streams 32-key tiles of K and V, like the forward: S = Q K^T, dP = dO V^T, and
//     dS as the A fragment of dQ += dS K (K by ldmatrix.trans). 3 products a tile.
// Eight products in all, where FlashAttention-2 computes five (one kernel, dQ added with f32 atomics,
// which makes the result depend on the order the blocks run in) and this file's first version seven
// (dK and dV in one block). The split is what lets a warp own two m16 tiles at D = 64 (kM = 2):
// every Q, dO, K or V fragment read from shared memory then feeds two mma instead of one, and shared
// memory is what binds (docs/attention.md, "The backward"). Per warp, a block holding dK and dV
// together would need their 2 x kM x D/2 f32 accumulators plus 4 kM D/16 fragment registers of K
// and V: 256 registers a thread at kM = 2, over the 255 a thread may have. One gradient a block
// needs 128 (dV) or 192 (dK).
// Shared memory per 16 x 16 fragment (ldmatrix.x4, 4 wavefronts) per warp: 2 kM mma. At kM = 2 that
// is 1 wavefront per mma (the forward's ratio), against 2 with one m-tile.
// dS and P~ are rounded to bf16/f16 for their products, as in FlashAttention; every accumulator is
// f32. FLOPs: 8 x 2 Tq Tk D, causal about half (the declared, useful count is FlashAttention's 5).
// Bytes from L2: Q and dO twice per 64 kM keys, K and V once per 64 kM query rows.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_tensor_core.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace attention_internal;
using namespace attention_tc;

constexpr int kStep = 32;  // queries per tile of the keys' kernel, keys per tile of the queries' kernel

template <int D>
struct BackwardConfig {
  static_assert(D == 64 || D == 128, "specialised head dims");
  // m16 tiles a warp: 2 at D = 64, 1 at D = 128 (the keys' dK block: 2 x kM x D/16 x 4 fragment
  // registers of K and V plus kM x D/2 accumulators, 128 + 128 at D = 128 with kM = 2: too many).
  static constexpr int kM = D == 64 ? 2 : 1;
  static constexpr int kWarpRows = 16 * kM;
  static constexpr int kRows = 4 * kWarpRows;  // keys (first kernel) or query rows (second) a block
  static constexpr int kSteps = D / 16;        // k-steps over d
  // First kernel: K and V, then 2 stages of (Q, dO, LSE, delta).
  static constexpr int kStageElems = 2 * kStep * D;
  static constexpr int kKeysSmem = (2 * kRows * D + 2 * kStageElems) * 2 + 2 * 2 * kStep * 4;
  // Second kernel: Q and dO, 2 stages of (K, V), then O (for delta).
  static constexpr int kQueriesSmem = (3 * kRows * D + 2 * 2 * kStep * D) * 2;
};

// P = exp(s scale - lse) of a visible score (0 otherwise), and the dropout factor z that P~ = P z
// applies in the forward (1 without dropout, 0 or 1 / (1 - p) with it).
__device__ __forceinline__ float probability(const Params& p, int64_t bh, int64_t i, int64_t j, bool visible,
                                             float s, float lse_i, float& z) {
  const float P = visible && lse_i != -INFINITY ? expf(s * static_cast<float>(p.scale) - lse_i) : 0.f;
  z = 1.f;
  if (p.dropout) z = visible && dropout_keeps(p, bh, i, j) ? static_cast<float>(p.keep_scale) : 0.f;
  return P;
}

// The sum of the products of the two 16-bit pairs in x and y (same element layout).
template <class T>
__device__ __forceinline__ float pair_dot(uint32_t x, uint32_t y) {
  const T x0{static_cast<uint16_t>(x & 0xffffu)}, x1{static_cast<uint16_t>(x >> 16)};
  const T y0{static_cast<uint16_t>(y & 0xffffu)}, y1{static_cast<uint16_t>(y >> 16)};
  return to_float(x0) * to_float(y0) + to_float(x1) * to_float(y1);
}

// One block of the keys' kernel: dV (kGradK false) or dK (true) of 64 kM keys.
template <class T, int D, bool kGradK>
__device__ __forceinline__ void keys_block(const Params& p, const View<T>& q, const View<T>& k,
                                           const View<T>& v, const View<T>& dout, const float* lse,
                                           const float* delta, T* grad, int64_t bh, int64_t j0,
                                           unsigned char* smem_raw) {
  using Cfg = BackwardConfig<D>;
  constexpr int kM = Cfg::kM, kSteps = Cfg::kSteps, kRows = Cfg::kRows;
  uint16_t* const k_tile = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* const v_tile = k_tile + kRows * D;
  auto q_tile = [&](int stage) { return v_tile + kRows * D + stage * Cfg::kStageElems; };
  auto g_tile = [&](int stage) { return q_tile(stage) + kStep * D; };
  float* const stats = reinterpret_cast<float*>(v_tile + kRows * D + 2 * Cfg::kStageElems);
  auto lse_s = [&](int stage) { return stats + stage * 2 * kStep; };
  auto delta_s = [&](int stage) { return stats + stage * 2 * kStep + kStep; };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t b = bh / p.H, h = bh % p.H;
  const int64_t warp_j0 = j0 + warp * Cfg::kWarpRows;
  // Causal: query i sees key j only when i >= j, so the query tiles before j0 contribute nothing.
  const int first = p.causal ? static_cast<int>(j0 / kStep) : 0;
  const int tiles = static_cast<int>((p.Tq + kStep - 1) / kStep);

  auto load_stage = [&](int t) {
    const int64_t i0 = int64_t(t) * kStep;
    load_tile<T, D, kStep>(q, b, h, i0, p.Tq, q_tile(t % 2));
    load_tile<T, D, kStep>(dout, b, h, i0, p.Tq, g_tile(t % 2));
    if (threadIdx.x < kStep) {
      const int64_t i = i0 + threadIdx.x;
      lse_s(t % 2)[threadIdx.x] = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
      if constexpr (kGradK) delta_s(t % 2)[threadIdx.x] = i < p.Tq ? delta[bh * p.Tq + i] : 0.f;
    }
  };
  // cp.async groups: K (and V), then one per query tile (maybe empty): tile t has landed at
  // wait_group<1> once tile t + 1 is queued.
  load_tile<T, D, kRows>(k, b, h, j0, p.Tk, k_tile);
  if constexpr (kGradK) load_tile<T, D, kRows>(v, b, h, j0, p.Tk, v_tile);
  cp_async_commit();
  if (first < tiles) load_stage(first);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t k_frag[kM][kSteps][4], v_frag[kM][kSteps][4];  // this warp's keys as A fragments
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      load_a_fragment<D>(k_frag[mt][ks], k_tile, warp * Cfg::kWarpRows + 16 * mt, 16 * ks);
      if constexpr (kGradK)
        load_a_fragment<D>(v_frag[mt][ks], v_tile, warp * Cfg::kWarpRows + 16 * mt, 16 * ks);
    }
  float acc[kM][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][n][e] = 0.f;

  for (int t = first; t < tiles; ++t) {
    if (t + 1 < tiles) load_stage(t + 1);  // into the stage tile t - 1 used, left at the last barrier
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int64_t i0 = int64_t(t) * kStep;
    // A causal tile wholly before this warp's first key adds nothing to its keys (warp-uniform).
    if (!p.causal || i0 + kStep - 1 >= warp_j0) {
      const uint16_t* const qt = q_tile(t % 2);
      const uint16_t* const gt = g_tile(t % 2);
      // S^T = K Q^T (and dP^T = V dO^T): this warp's keys by the tile's 32 queries.
      float s[kM][kStep / 8][4], dp[kM][kStep / 8][4];
      multiply_transposed<T, D, kM, kStep / 16>(s, k_frag, qt);
      if constexpr (kGradK) multiply_transposed<T, D, kM, kStep / 16>(dp, v_frag, gt);
        // Element e of n-tile n of m-tile mt: key warp_j0 + 16 mt + lane/4 + 8 (e/2), query
        // i0 + 8 n + 2 (lane%4) + e%2. s becomes P~ (dV) or dS = P (dP z - delta) scale (dK). A lane's
        // two neighbouring queries take their LSE (and delta) in one 8-byte shared load.
#pragma unroll
      for (int n = 0; n < kStep / 8; ++n) {
        const int col0 = 8 * n + 2 * (lane % 4);
        const float2 lse2 = *reinterpret_cast<const float2*>(lse_s(t % 2) + col0);
        float2 delta2 = make_float2(0.f, 0.f);
        if constexpr (kGradK) delta2 = *reinterpret_cast<const float2*>(delta_s(t % 2) + col0);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t i = i0 + col0 + e % 2, j = warp_j0 + 16 * mt + lane / 4 + 8 * (e / 2);
            const bool visible = i < p.Tq && j < p.Tk && (!p.causal || j <= i);
            float z;
            const float P = probability(p, bh, i, j, visible, s[mt][n][e], e % 2 ? lse2.y : lse2.x, z);
            if constexpr (kGradK) {
              const float delta_i = e % 2 ? delta2.y : delta2.x;
              s[mt][n][e] = P * (dp[mt][n][e] * z - delta_i) * static_cast<float>(p.scale);
            } else {
              s[mt][n][e] = P * z;
            }
          }
      }
      // grad += s^T-as-A times (dO for dV, Q for dK): the accumulators are the A fragments (k = query).
      accumulate_product<T, D, kM, kStep / 16>(acc, s, kGradK ? qt : gt);
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t j = warp_j0 + 16 * mt + lane / 4 + 8 * half;
      if (j < p.Tk) store_accumulator_row<T>(grad + (bh * p.Tk + j) * D, acc[mt], 2 * half, 1.f);
    }
}

template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_backward_keys_tensor_core(const Params p, const View<T> q, const View<T> k, const View<T> v,
                                    const View<T> dout, const float* lse, const float* delta, T* dk, T* dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int kRows = BackwardConfig<D>::kRows;
  const int64_t n_kt = (p.Tk + kRows - 1) / kRows;
  const int64_t pair = blockIdx.x / 2, bh = pair / n_kt, j0 = (pair % n_kt) * kRows;
  // The two blocks of a key block are neighbours, so they run side by side and share Q and dO in L2.
  if (blockIdx.x % 2 == 0) {
    keys_block<T, D, false>(p, q, k, v, dout, lse, delta, dv, bh, j0, smem_raw);
  } else {
    keys_block<T, D, true>(p, q, k, v, dout, lse, delta, dk, bh, j0, smem_raw);
  }
#endif
}

template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_backward_queries_tensor_core(const Params p, const View<T> q, const View<T> k, const View<T> v,
                                       const View<T> dout, const View<T> o, const float* lse, float* delta,
                                       T* dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using Cfg = BackwardConfig<D>;
  constexpr int kM = Cfg::kM, kSteps = Cfg::kSteps, kRows = Cfg::kRows;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const q_tile = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* const g_tile = q_tile + kRows * D;
  auto k_tile = [&](int stage) { return g_tile + kRows * D + 2 * stage * kStep * D; };
  auto v_tile = [&](int stage) { return k_tile(stage) + kStep * D; };
  uint16_t* const o_tile = k_tile(2);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n_qt = (p.Tq + kRows - 1) / kRows;
  const int64_t bh = blockIdx.x / n_qt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = (n_qt - 1 - blockIdx.x % n_qt) * kRows;  // the longest causal rows first
  const int64_t warp_i0 = i0 + warp * Cfg::kWarpRows;
  const int64_t end = key_end(p, i0, kRows);
  const int tiles = static_cast<int>((end + kStep - 1) / kStep);
  auto load_stage = [&](int t) {
    load_tile<T, D, kStep>(k, b, h, int64_t(t) * kStep, end, k_tile(t % 2));
    load_tile<T, D, kStep>(v, b, h, int64_t(t) * kStep, end, v_tile(t % 2));
  };

  load_tile<T, D, kRows>(q, b, h, i0, p.Tq, q_tile);
  load_tile<T, D, kRows>(dout, b, h, i0, p.Tq, g_tile);
  load_tile<T, D, kRows>(o, b, h, i0, p.Tq, o_tile);
  cp_async_commit();
  if (tiles > 0) load_stage(0);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t q_frag[kM][kSteps][4], g_frag[kM][kSteps][4];  // this warp's rows of Q and dO
  float L[kM][2], dl[kM][2];                              // rows lane/4 and lane/4 + 8 of each m-tile
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    dl[mt][0] = dl[mt][1] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      load_a_fragment<D>(q_frag[mt][ks], q_tile, warp * Cfg::kWarpRows + 16 * mt, 16 * ks);
      load_a_fragment<D>(g_frag[mt][ks], g_tile, warp * Cfg::kWarpRows + 16 * mt, 16 * ks);
      // delta = rowsum(dO O): O's fragment has dO's layout (registers 0 and 2 hold row lane/4,
      // 1 and 3 row lane/4 + 8), so the products pair up register by register.
      uint32_t o_frag[4];
      load_a_fragment<D>(o_frag, o_tile, warp * Cfg::kWarpRows + 16 * mt, 16 * ks);
      dl[mt][0] += pair_dot<T>(g_frag[mt][ks][0], o_frag[0]) + pair_dot<T>(g_frag[mt][ks][2], o_frag[2]);
      dl[mt][1] += pair_dot<T>(g_frag[mt][ks][1], o_frag[1]) + pair_dot<T>(g_frag[mt][ks][3], o_frag[3]);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      dl[mt][half] = quad_sum(dl[mt][half]);  // the 4 lanes of a row hold its 2 D/4 products
      const int64_t i = warp_i0 + 16 * mt + lane / 4 + 8 * half;
      L[mt][half] = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
      if (i < p.Tq && lane % 4 == 0) delta[bh * p.Tq + i] = dl[mt][half];  // for the keys' kernel
    }
  }
  float dq_acc[kM][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq_acc[mt][n][e] = 0.f;

  for (int t = 0; t < tiles; ++t) {
    // Tile t + 1 into the stage tile t - 1 used: every warp left it at the last barrier.
    if (t + 1 < tiles) load_stage(t + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int64_t j0 = int64_t(t) * kStep;
    // A causal tile wholly after this warp's last row adds nothing to its rows (warp-uniform).
    if (!p.causal || j0 <= warp_i0 + Cfg::kWarpRows - 1) {
      const uint16_t* const kt = k_tile(t % 2);
      const uint16_t* const vt = v_tile(t % 2);
      // S = Q K^T and dP = dO V^T: this warp's rows by 32 keys.
      float s[kM][kStep / 8][4], dp[kM][kStep / 8][4];
      multiply_transposed<T, D, kM, kStep / 16>(s, q_frag, kt);
      multiply_transposed<T, D, kM, kStep / 16>(dp, g_frag, vt);
      // Element e of n-tile n of m-tile mt: row warp_i0 + 16 mt + lane/4 + 8 (e/2), key
      // j0 + 8 n + 2 (lane%4) + e%2. dp becomes dS = P (dP z - delta) scale.
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
        for (int n = 0; n < kStep / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int64_t i = warp_i0 + 16 * mt + lane / 4 + 8 * (e / 2),
                          j = j0 + 8 * n + 2 * (lane % 4) + e % 2;
            const bool visible = j < end && (!p.causal || j <= i);
            float z;
            const float P = probability(p, bh, i, j, visible, s[mt][n][e], L[mt][e / 2], z);
            dp[mt][n][e] = P * (dp[mt][n][e] * z - dl[mt][e / 2]) * static_cast<float>(p.scale);
          }
      }
      // dQ += dS K: dS's accumulators are the A fragments (k = key), K's B fragments by ldmatrix.trans.
      accumulate_product<T, D, kM, kStep / 16>(dq_acc, dp, kt);
    }
    __syncthreads();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t i = warp_i0 + 16 * mt + lane / 4 + 8 * half;
      if (i < p.Tq) store_accumulator_row<T>(dq + (bh * p.Tq + i) * D, dq_acc[mt], 2 * half, 1.f);
    }
#endif
}

// The queries' kernel first: it writes delta, which the keys' kernel reads.
template <class T, int D>
void launch(cudaStream_t stream, const Params& p, const View<T>& q, const View<T>& k, const View<T>& v,
            const View<T>& dout, const View<T>& o, const float* lse, float* delta, void* dq, void* dk,
            void* dv) {
  using Cfg = BackwardConfig<D>;
  if (p.B * p.H * p.Tq > 0) {
    constexpr int bytes = Cfg::kQueriesSmem;
    const int64_t blocks = p.B * p.H * ((p.Tq + Cfg::kRows - 1) / Cfg::kRows);
    MG_CHECK(blocks <= 0x7fffffff, "attention_backward (CUDA): ", blocks,
             " blocks exceed the grid's 2^31 - 1");
    allow_dynamic_smem(reinterpret_cast<const void*>(flash_backward_queries_tensor_core<T, D>), bytes);
    launch_kernel<flash_backward_queries_tensor_core<T, D>>(static_cast<unsigned>(blocks), kTcThreads, bytes,
                                                            stream, p, q, k, v, dout, o, lse, delta,
                                                            static_cast<T*>(dq));
  }
  if (p.B * p.H * p.Tk > 0) {
    constexpr int bytes = Cfg::kKeysSmem;
    const int64_t blocks = 2 * p.B * p.H * ((p.Tk + Cfg::kRows - 1) / Cfg::kRows);
    MG_CHECK(blocks <= 0x7fffffff, "attention_backward (CUDA): ", blocks,
             " blocks exceed the grid's 2^31 - 1");
    allow_dynamic_smem(reinterpret_cast<const void*>(flash_backward_keys_tensor_core<T, D>), bytes);
    launch_kernel<flash_backward_keys_tensor_core<T, D>>(static_cast<unsigned>(blocks), kTcThreads, bytes,
                                                         stream, p, q, k, v, dout, lse, delta,
                                                         static_cast<T*>(dk), static_cast<T*>(dv));
  }
}

template <class T>
void launch_dtype(cudaStream_t stream, const Params& p, const void* q, const AttentionStrides& qs,
                  const void* k, const AttentionStrides& ks, const void* v, const AttentionStrides& vs,
                  const void* o, const void* dout, const AttentionStrides& gs, const float* lse, float* delta,
                  void* dq, void* dk, void* dv) {
  const View<T> vq = make_view<T>(q, qs), vk = make_view<T>(k, ks), vv = make_view<T>(v, vs),
                vg = make_view<T>(dout, gs);
  // O is the forward's output: contiguous [B, H, Tq, D].
  const View<T> vo = make_view<T>(o, AttentionStrides{p.H * p.Tq * p.D, p.Tq * p.D, p.D});
  if (p.D == 64) return launch<T, 64>(stream, p, vq, vk, vv, vg, vo, lse, delta, dq, dk, dv);
  launch<T, 128>(stream, p, vq, vk, vv, vg, vo, lse, delta, dq, dk, dv);
}

}  // namespace

namespace attention_internal {

void launch_backward_tensor_core(cudaStream_t stream, DType dtype, const Params& p, const void* q,
                                 const AttentionStrides& qs, const void* k, const AttentionStrides& ks,
                                 const void* v, const AttentionStrides& vs, const void* o, const void* dout,
                                 const AttentionStrides& gs, const float* lse, float* delta, void* dq,
                                 void* dk, void* dv) {
  if (dtype == DType::bf16)
    return launch_dtype<bf16_t>(stream, p, q, qs, k, ks, v, vs, o, dout, gs, lse, delta, dq, dk, dv);
  launch_dtype<f16_t>(stream, p, q, qs, k, ks, v, vs, o, dout, gs, lse, delta, dq, dk, dv);
}

}  // namespace attention_internal
}  // namespace mg::kernels::cuda
