// The attention backward on tensor cores, bf16/f16 with D = 64 or 128, sm_80+. Semantics and the
// formulas: kernels/cpu/attention.h and .cpp; delta = rowsum(dO O) comes first (attention.cu's
// attention_delta, as for the CUDA-core backward); the shared tensor-core pieces:
// attention_tensor_core.cuh.
//
// Two kernels, each writing its outputs alone (deterministic, no atomics), like the CPU's two
// passes; both rebuild P = exp(S scale - LSE) from Q, K and the forward's LSE, and dP = dO V^T:
//   flash_backward_kv_tensor_core: a block owns 64 keys (16 a warp) and streams query tiles (Q, dO,
//     LSE, delta) through two cp.async stages. It computes the TRANSPOSED scores S^T = K Q^T and
//     dP^T = V dO^T (the warp's K and V rows are its A fragments, held in registers), so that the
//     accumulators of P~^T and dS^T, keys by queries, are already the A fragments of
//       dV += P~^T dO  and  dK += dS^T Q   (dO and Q read as B by ldmatrix.trans):
//     no transpose through shared memory, four products a tile.
//   flash_backward_q_tensor_core: a block owns 64 query rows (16 a warp, Q and dO as A fragments)
//     and streams K and V tiles, like the forward: S = Q K^T, dP = dO V^T, and dS as the A
//     fragment of dQ += dS K (K by ldmatrix.trans). Three products a tile.
// Seven products in all (FlashAttention-2 computes five, adding dQ from the first kernel with f32
// atomics, which makes the result depend on the order the blocks run in). dS and P~ are rounded to
// bf16/f16 for their products, as in FlashAttention; every accumulator is f32.
// Tile sizes: the first kernel's query tile is 64 rows at D = 64 and 32 at D = 128, so that the f32
// accumulators (dK and dV: D/2 each, S^T and dP^T: query tile/2 each, per lane) and the K and V
// fragments (D/4 each) stay under 255 registers a thread. Shared memory: 49 / 65 KiB and 48 /
// 96 KiB. FLOPs: 4 x 2 Tq Tk D (first kernel) + 3 x 2 Tq Tk D (second), causal about half; bytes
// from L2: Q, dO once per 64 keys, K, V once per 64 query rows.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_tensor_core.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace attention_internal;
using namespace attention_tc;

constexpr int kBlockKeys = 64;  // first kernel: keys a block, 16 a warp
constexpr int kBlockRows = 64;  // second kernel: query rows a block, 16 a warp

template <int D>
struct KvConfig {
  static constexpr int kQueryTile = D == 64 ? 64 : 32;
  static constexpr int kStageElems = 2 * kQueryTile * D;  // Q and dO
  static constexpr int kSmemBytes = (2 * kBlockKeys * D + 2 * kStageElems) * 2 + 2 * 2 * kQueryTile * 4;
};
template <int D>
struct QConfig {
  static constexpr int kSmemBytes = (2 * kBlockRows * D + 2 * 2 * kTcKeys * D) * 2;
};

// p~ (dropped and rescaled) into s and scale dS into dp, for the score of query i and key j.
__device__ __forceinline__ void score_grads(const Params& p, int64_t bh, int64_t i, int64_t j, bool visible,
                                            float lse_i, float delta_i, float& s, float& dp) {
  const float scale = static_cast<float>(p.scale);
  const float P = visible && lse_i != -INFINITY ? expf(s * scale - lse_i) : 0.f;
  float z = 1.f;
  if (p.dropout) z = visible && dropout_keeps(p, bh, i, j) ? static_cast<float>(p.keep_scale) : 0.f;
  s = P * z;
  dp = P * (dp * z - delta_i) * scale;
}

template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_backward_kv_tensor_core(const Params p, const View<T> q, const View<T> k, const View<T> v,
                                  const View<T> dout, const float* lse, const float* delta, T* dk, T* dv) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  using Cfg = KvConfig<D>;
  constexpr int kQ = Cfg::kQueryTile, kSteps = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const k_tile = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* const v_tile = k_tile + kBlockKeys * D;
  auto q_tile = [&](int stage) { return v_tile + kBlockKeys * D + stage * Cfg::kStageElems; };
  auto g_tile = [&](int stage) { return q_tile(stage) + kQ * D; };
  float* const stats = reinterpret_cast<float*>(v_tile + kBlockKeys * D + 2 * Cfg::kStageElems);
  auto lse_s = [&](int stage) { return stats + stage * 2 * kQ; };
  auto delta_s = [&](int stage) { return stats + stage * 2 * kQ + kQ; };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n_kt = (p.Tk + kBlockKeys - 1) / kBlockKeys;
  const int64_t bh = blockIdx.x / n_kt, b = bh / p.H, h = bh % p.H;
  const int64_t j0 = (blockIdx.x % n_kt) * kBlockKeys;
  // Causal: query i sees key j only when i >= j, so the query tiles before j0 contribute nothing.
  const int first = p.causal ? static_cast<int>(j0 / kQ) : 0;
  const int tiles = static_cast<int>((p.Tq + kQ - 1) / kQ);

  auto load_stage = [&](int t) {
    const int64_t i0 = int64_t(t) * kQ;
    load_tile<T, D, kQ>(q, b, h, i0, p.Tq, q_tile(t % 2));
    load_tile<T, D, kQ>(dout, b, h, i0, p.Tq, g_tile(t % 2));
    if (threadIdx.x < kQ) {
      const int64_t i = i0 + threadIdx.x;
      lse_s(t % 2)[threadIdx.x] = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
      delta_s(t % 2)[threadIdx.x] = i < p.Tq ? delta[bh * p.Tq + i] : 0.f;
    }
  };
  // cp.async groups: K and V, then one per query tile (maybe empty): tile t has landed at
  // wait_group<1> once tile t + 1 is queued.
  load_tile<T, D, kBlockKeys>(k, b, h, j0, p.Tk, k_tile);
  load_tile<T, D, kBlockKeys>(v, b, h, j0, p.Tk, v_tile);
  cp_async_commit();
  if (first < tiles) load_stage(first);
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t k_frag[kSteps][4], v_frag[kSteps][4];  // this warp's 16 keys as A fragments
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    load_a_fragment<D>(k_frag[ks], k_tile, warp * 16, 16 * ks);
    load_a_fragment<D>(v_frag[ks], v_tile, warp * 16, 16 * ks);
  }
  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.f;

  for (int t = first; t < tiles; ++t) {
    if (t + 1 < tiles) load_stage(t + 1);  // into the stage tile t - 1 used, left at the last barrier
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* const qt = q_tile(t % 2);
    const uint16_t* const gt = g_tile(t % 2);
    // S^T = K Q^T and dP^T = V dO^T: this warp's 16 keys by the tile's kQ queries.
    float s[kQ / 8][4], dp[kQ / 8][4];
#pragma unroll
    for (int n = 0; n < kQ / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
      for (int qp = 0; qp < kQ / 16; ++qp) {
        uint32_t r[4];
        load_b_fragments<D>(r, qt, 16 * qp, 16 * ks);
        mma_16816<T>(s[2 * qp], k_frag[ks], r[0], r[1]);
        mma_16816<T>(s[2 * qp + 1], k_frag[ks], r[2], r[3]);
        load_b_fragments<D>(r, gt, 16 * qp, 16 * ks);
        mma_16816<T>(dp[2 * qp], v_frag[ks], r[0], r[1]);
        mma_16816<T>(dp[2 * qp + 1], v_frag[ks], r[2], r[3]);
      }
    }
    // Element e of n-tile n: key j0 + 16 warp + lane/4 + 8 (e/2), query i0 + 8 n + 2 (lane%4) + e%2.
    const int64_t i0 = int64_t(t) * kQ;
#pragma unroll
    for (int n = 0; n < kQ / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * n + 2 * (lane % 4) + e % 2;
        const int64_t i = i0 + col, j = j0 + warp * 16 + lane / 4 + 8 * (e / 2);
        const bool visible = i < p.Tq && j < p.Tk && (!p.causal || j <= i);
        score_grads(p, bh, i, j, visible, lse_s(t % 2)[col], delta_s(t % 2)[col], s[n][e], dp[n][e]);
      }
      // dV += P~^T dO and dK += dS^T Q: the accumulators are the A fragments (k = query).
#pragma unroll
    for (int kk = 0; kk < kQ / 16; ++kk) {
      uint32_t a_p[4], a_ds[4];
      accumulators_as_a<T>(a_p, s[2 * kk], s[2 * kk + 1]);
      accumulators_as_a<T>(a_ds, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < kSteps; ++dn) {
        uint32_t r[4];
        load_b_fragments_trans<D>(r, gt, 16 * kk, 16 * dn);
        mma_16816<T>(dv_acc[2 * dn], a_p, r[0], r[1]);
        mma_16816<T>(dv_acc[2 * dn + 1], a_p, r[2], r[3]);
        load_b_fragments_trans<D>(r, qt, 16 * kk, 16 * dn);
        mma_16816<T>(dk_acc[2 * dn], a_ds, r[0], r[1]);
        mma_16816<T>(dk_acc[2 * dn + 1], a_ds, r[2], r[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }
  cp_async_wait<0>();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t j = j0 + warp * 16 + lane / 4 + 8 * half;
    if (j >= p.Tk) continue;
    store_accumulator_row<T>(dk + (bh * p.Tk + j) * D, dk_acc, 2 * half, 1.f);
    store_accumulator_row<T>(dv + (bh * p.Tk + j) * D, dv_acc, 2 * half, 1.f);
  }
#endif
}

template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_backward_q_tensor_core(const Params p, const View<T> q, const View<T> k, const View<T> v,
                                 const View<T> dout, const float* lse, const float* delta, T* dq) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  constexpr int kSteps = D / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const q_tile = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* const g_tile = q_tile + kBlockRows * D;
  auto k_tile = [&](int stage) { return g_tile + kBlockRows * D + 2 * stage * kTcKeys * D; };
  auto v_tile = [&](int stage) { return k_tile(stage) + kTcKeys * D; };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n_qt = (p.Tq + kBlockRows - 1) / kBlockRows;
  const int64_t bh = blockIdx.x / n_qt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = (n_qt - 1 - blockIdx.x % n_qt) * kBlockRows;  // the longest causal rows first
  const int64_t end = key_end(p, i0, kBlockRows);
  const int tiles = static_cast<int>((end + kTcKeys - 1) / kTcKeys);

  load_tile<T, D, kBlockRows>(q, b, h, i0, p.Tq, q_tile);
  load_tile<T, D, kBlockRows>(dout, b, h, i0, p.Tq, g_tile);
  cp_async_commit();
  if (tiles > 0) load_kv_tile<T, D>(k, v, b, h, 0, end, k_tile(0), v_tile(0));
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t q_frag[kSteps][4], g_frag[kSteps][4];  // this warp's 16 rows of Q and dO
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    load_a_fragment<D>(q_frag[ks], q_tile, warp * 16, 16 * ks);
    load_a_fragment<D>(g_frag[ks], g_tile, warp * 16, 16 * ks);
  }
  float L[2], dl[2];  // rows lane/4 and lane/4 + 8
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = i0 + warp * 16 + lane / 4 + 8 * half;
    L[half] = i < p.Tq ? lse[bh * p.Tq + i] : -INFINITY;
    dl[half] = i < p.Tq ? delta[bh * p.Tq + i] : 0.f;
  }
  float dq_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq_acc[n][e] = 0.f;

  for (int t = 0; t < tiles; ++t) {
    // Tile t + 1 into the stage tile t - 1 used: every warp left it at the last barrier.
    if (t + 1 < tiles) load_kv_tile<T, D>(k, v, b, h, t + 1, end, k_tile((t + 1) % 2), v_tile((t + 1) % 2));
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* const kt = k_tile(t % 2);
    const uint16_t* const vt = v_tile(t % 2);
    // S = Q K^T and dP = dO V^T: 16 rows by 64 keys.
    float s[8][4], dp[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dp[n][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
#pragma unroll
      for (int jp = 0; jp < 4; ++jp) {
        uint32_t r[4];
        load_b_fragments<D>(r, kt, 16 * jp, 16 * ks);
        mma_16816<T>(s[2 * jp], q_frag[ks], r[0], r[1]);
        mma_16816<T>(s[2 * jp + 1], q_frag[ks], r[2], r[3]);
        load_b_fragments<D>(r, vt, 16 * jp, 16 * ks);
        mma_16816<T>(dp[2 * jp], g_frag[ks], r[0], r[1]);
        mma_16816<T>(dp[2 * jp + 1], g_frag[ks], r[2], r[3]);
      }
    }
    const int64_t j0 = int64_t(t) * kTcKeys;
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t i = i0 + warp * 16 + lane / 4 + 8 * (e / 2), j = j0 + 8 * n + 2 * (lane % 4) + e % 2;
        const bool visible = j < end && (!p.causal || j <= i);
        score_grads(p, bh, i, j, visible, L[e / 2], dl[e / 2], s[n][e], dp[n][e]);
      }
      // dQ += dS K: dS's accumulators are the A fragments (k = key), K's B fragments by ldmatrix.trans.
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      accumulators_as_a<T>(a, dp[2 * kk], dp[2 * kk + 1]);
#pragma unroll
      for (int dn = 0; dn < kSteps; ++dn) {
        uint32_t r[4];
        load_b_fragments_trans<D>(r, kt, 16 * kk, 16 * dn);
        mma_16816<T>(dq_acc[2 * dn], a, r[0], r[1]);
        mma_16816<T>(dq_acc[2 * dn + 1], a, r[2], r[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t i = i0 + warp * 16 + lane / 4 + 8 * half;
    if (i < p.Tq) store_accumulator_row<T>(dq + (bh * p.Tq + i) * D, dq_acc, 2 * half, 1.f);
  }
#endif
}

template <class T, int D>
void launch(cudaStream_t stream, const Params& p, const View<T>& q, const View<T>& k, const View<T>& v,
            const View<T>& dout, const float* lse, const float* delta, void* dq, void* dk, void* dv) {
  if (p.B * p.H * p.Tk > 0) {
    constexpr int bytes = KvConfig<D>::kSmemBytes;
    const int64_t blocks = p.B * p.H * ((p.Tk + kBlockKeys - 1) / kBlockKeys);
    MG_CHECK(blocks <= 0x7fffffff, "attention_backward (CUDA): ", blocks,
             " blocks exceed the grid's 2^31 - 1");
    allow_dynamic_smem(reinterpret_cast<const void*>(flash_backward_kv_tensor_core<T, D>), bytes);
    launch_kernel<flash_backward_kv_tensor_core<T, D>>(static_cast<unsigned>(blocks), kTcThreads, bytes,
                                                       stream, p, q, k, v, dout, lse, delta,
                                                       static_cast<T*>(dk), static_cast<T*>(dv));
  }
  if (p.B * p.H * p.Tq > 0) {
    constexpr int bytes = QConfig<D>::kSmemBytes;
    const int64_t blocks = p.B * p.H * ((p.Tq + kBlockRows - 1) / kBlockRows);
    MG_CHECK(blocks <= 0x7fffffff, "attention_backward (CUDA): ", blocks,
             " blocks exceed the grid's 2^31 - 1");
    if (bytes > 48 * 1024)
      allow_dynamic_smem(reinterpret_cast<const void*>(flash_backward_q_tensor_core<T, D>), bytes);
    launch_kernel<flash_backward_q_tensor_core<T, D>>(static_cast<unsigned>(blocks), kTcThreads, bytes,
                                                      stream, p, q, k, v, dout, lse, delta,
                                                      static_cast<T*>(dq));
  }
}

template <class T>
void launch_dtype(cudaStream_t stream, const Params& p, const void* q, const AttentionStrides& qs,
                  const void* k, const AttentionStrides& ks, const void* v, const AttentionStrides& vs,
                  const void* dout, const AttentionStrides& gs, const float* lse, const float* delta,
                  void* dq, void* dk, void* dv) {
  const View<T> vq = make_view<T>(q, qs), vk = make_view<T>(k, ks), vv = make_view<T>(v, vs),
                vg = make_view<T>(dout, gs);
  if (p.D == 64) return launch<T, 64>(stream, p, vq, vk, vv, vg, lse, delta, dq, dk, dv);
  launch<T, 128>(stream, p, vq, vk, vv, vg, lse, delta, dq, dk, dv);
}

}  // namespace

namespace attention_internal {

void launch_backward_tensor_core(cudaStream_t stream, DType dtype, const Params& p, const void* q,
                                 const AttentionStrides& qs, const void* k, const AttentionStrides& ks,
                                 const void* v, const AttentionStrides& vs, const void* dout,
                                 const AttentionStrides& gs, const float* lse, const float* delta, void* dq,
                                 void* dk, void* dv) {
  if (dtype == DType::bf16)
    return launch_dtype<bf16_t>(stream, p, q, qs, k, ks, v, vs, dout, gs, lse, delta, dq, dk, dv);
  launch_dtype<f16_t>(stream, p, q, qs, k, ks, v, vs, dout, gs, lse, delta, dq, dk, dv);
}

}  // namespace attention_internal
}  // namespace mg::kernels::cuda
