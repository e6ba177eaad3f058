// The attention forward on tensor cores (FlashAttention-2's arrangement), bf16/f16 with D = 64 or
// 128, sm_80+. Semantics: kernels/cpu/attention.h; the CUDA-core kernels, the backward and the
// entry points: attention.cu; docs/attention.md has the tile diagram.
//
// Decomposition. A block of 4 warps owns the query rows of one (b, h): 32 rows a warp (two m16
// tiles) at D = 64, 16 at D = 128, so 128 or 64 rows a block; K and V stream through shared memory
// in tiles of 64 keys. Per key tile, a warp
//   S = Q K^T   its rows x 64 scores: D/16 k-steps x 8 n-tiles of mma.sync.m16n8k16 per m-tile (f32
//               accumulators; each lane holds 2 rows x 16 columns of each m-tile's S);
//   online softmax on those registers: row max and the rescale factor through 2 shuffles inside
//               each quad of lanes (the 4 lanes of a row), exp, dropout from Philox, the running
//               sum kept per lane (the quad's sum is taken once, at the end);
//   O += P V    P's accumulators become mma A fragments in place (a 16 x 16 accumulator block is
//               exactly an A fragment: the register reuse FlashAttention-2 relies on), rounded to
//               bf16/f16; 4 k-steps x D/8 n-tiles of mma per m-tile, O stays in registers.
// Memory. Q is copied to shared memory once and held as A fragments in registers (ldmatrix). K and
// V tiles move with cp.async (16 bytes, no registers) through two stages, so tile t + 1 is in
// flight while tile t is computed. A tile row is D x 2 bytes (8 or 16 chunks of 16 bytes), chunk c
// of row r stored at chunk c ^ (r & 7): ldmatrix reads eight consecutive rows at one logical chunk,
// which land in eight different bank groups (unswizzled they would share one: an 8-way conflict).
// K feeds S's B operand with plain ldmatrix (its rows are keys, k = d contiguous); V feeds PV's B
// operand with ldmatrix.trans (its rows are keys, the mma's k, with n = d contiguous). Shared
// memory: Q + 2 stages x (K + V): 48 KiB at D = 64, 80 KiB at D = 128.
// FLOPs and bytes per key tile: a block reads 2 x 64 x D x 2 bytes of K and V (from L2) for
// 4 x rows x 64 x D FLOPs: 128 (D = 64) or 64 FLOP/byte. Shared memory, per warp and 16 keys:
// D/16 + D/16 ldmatrix.x4 (64 D bytes) feed (D/8 + D/8) x m-tiles mma (1024 D FLOPs per m-tile):
// 1/32 byte per FLOP at D = 64, the GEMM ladder's ratio, and 1/16 at D = 128. That ratio is what
// binds on an H200 (docs/attention.md, "The ladder"): with one m-tile a warp at D = 64 the model
// predicted 29 % of the bf16 tensor peak at T = 1024, bound by shared memory; the second m-tile,
// which reuses every K and V fragment twice, is why D = 64 takes 32 rows a warp. A third would not
// fit: O and S of three m-tiles are 192 f32 registers a thread before Q's fragments.
// The exps: rows x 64 per block and tile, on the SFU (16 per SM and clock against 1024 bf16 FMAs).
// Causal blocks stop at the diagonal tile (masked element by element) and run in reverse order of
// their query tile, the longest first, so the short ones fill the last wave.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <type_traits>

#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/attention_tensor_core.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace attention_internal;
using namespace attention_tc;

template <int D>
struct TcForward {
  static_assert(D == 64 || D == 128, "specialised head dims");
  // m16 tiles of query rows per warp: 2 at D = 64 (each K and V fragment feeds two mma, halving the
  // shared-memory bytes per FLOP), 1 at D = 128 (two would need more than 255 registers a thread).
  static constexpr int kM = D == 64 ? 2 : 1;
  static constexpr int kWarpRows = 16 * kM;
  static constexpr int kRows = 4 * kWarpRows;                        // 128 / 64 query rows a block
  static constexpr int kKvElems = kTcKeys * D;                       // one K or V tile
  static constexpr int kSmemBytes = (kRows * D + 4 * kKvElems) * 2;  // Q + 2 x (K + V): 48 / 80 KiB
};

template <class T, int D>
__global__ void __launch_bounds__(kTcThreads)
    flash_forward_tensor_core(const Params p, const View<T> q, const View<T> k, const View<T> v, T* o,
                              float* lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // mma.sync bf16, ldmatrix and cp.async need sm_80 (the host refuses older GPUs)
#else
  using Cfg = TcForward<D>;
  constexpr int kM = Cfg::kM;
  constexpr int kSteps = D / 16;  // k-steps of S = Q K^T; also PV's pairs of n-tiles
  extern __shared__ __align__(16) unsigned char smem_raw[];
  uint16_t* const q_tile = reinterpret_cast<uint16_t*>(smem_raw);
  auto k_tile = [&](int stage) { return q_tile + Cfg::kRows * D + 2 * stage * Cfg::kKvElems; };
  auto v_tile = [&](int stage) { return q_tile + Cfg::kRows * D + (2 * stage + 1) * Cfg::kKvElems; };
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t n_qt = (p.Tq + Cfg::kRows - 1) / Cfg::kRows;
  const int64_t bh = blockIdx.x / n_qt, b = bh / p.H, h = bh % p.H;
  const int64_t i0 = (n_qt - 1 - blockIdx.x % n_qt) * Cfg::kRows;  // the longest causal rows first
  const int64_t end = key_end(p, i0, Cfg::kRows);
  const int tiles = static_cast<int>((end + kTcKeys - 1) / kTcKeys);

  // cp.async groups: Q, then one per key tile (possibly empty), so "tile t has landed" is always
  // wait_group<1> after tile t + 1 was queued.
  load_tile<T, D, Cfg::kRows>(q, b, h, i0, p.Tq, q_tile);
  cp_async_commit();
  if (tiles > 0) load_kv_tile<T, D>(k, v, b, h, 0, end, k_tile(0), v_tile(0));
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();

  // This warp's rows of Q as A fragments, m-tile mt = rows warp * kWarpRows + 16 mt ...: matrices
  // (rows 0-7, d 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) of each 16-deep step.
  uint32_t q_frag[kM][kSteps][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks)
      load_a_fragment<D>(q_frag[mt][ks], q_tile, warp * Cfg::kWarpRows + 16 * mt, 16 * ks);

  // Accumulator element e of an m16n8 tile is row lane/4 + 8 (e / 2), column 2 (lane % 4) + e % 2.
  float o_acc[kM][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[mt][n][e] = 0.f;
  float m[kM][2], l[kM][2];  // rows lane/4 and lane/4 + 8 of each m-tile
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  const float scale = static_cast<float>(p.scale), keep_scale = static_cast<float>(p.keep_scale);

  for (int t = 0; t < tiles; ++t) {
    // Tile t + 1 into the stage tile t - 1 used: every warp left it at the last barrier.
    if (t + 1 < tiles) load_kv_tile<T, D>(k, v, b, h, t + 1, end, k_tile((t + 1) % 2), v_tile((t + 1) % 2));
    cp_async_commit();
    cp_async_wait<1>();  // this thread's copies of tile t are in shared memory...
    __syncthreads();     // ...and everyone's
    const uint16_t* const kt = k_tile(t % 2);
    const uint16_t* const vt = v_tile(t % 2);

    // S = Q K^T: B fragments of key n-tiles 2 jp and 2 jp + 1 from one ldmatrix.x4, matrices
    // (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15), used by every
    // m-tile of the warp.
    float s[kM][8][4];
    multiply_transposed<T, D, kM, kTcKeys / 16>(s, q_frag, kt);

    // Online softmax on the registers, row by row (half 0: row lane/4, half 1: row lane/4 + 8).
    const int64_t j0 = int64_t(t) * kTcKeys;
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int64_t i = i0 + warp * Cfg::kWarpRows + 16 * mt + lane / 4 + 8 * half;
        float tile_max = -INFINITY;
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int64_t j = j0 + 8 * n + 2 * (lane % 4) + c;
            const bool visible = j < end && (!p.causal || j <= i);
            float& x = s[mt][n][2 * half + c];
            x = visible ? x * scale : -INFINITY;
            tile_max = fmaxf(tile_max, x);
          }
        const float m_new = fmaxf(m[mt][half], quad_max(tile_max));
        const bool any = m_new != -INFINITY;  // nothing visible yet: exp(-inf - -inf) would be NaN
        const float alpha = any ? expf(m[mt][half] - m_new) : 1.f;
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 8; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            float& x = s[mt][n][2 * half + c];
            const float e = any ? expf(x - m_new) : 0.f;
            sum += e;
            x = e;
            if (p.dropout) {
              const int64_t j = j0 + 8 * n + 2 * (lane % 4) + c;
              x = e != 0.f && dropout_keeps(p, bh, i, j) ? e * keep_scale : 0.f;
            }
          }
        l[mt][half] = l[mt][half] * alpha + sum;  // this lane's share; the quad's sum is taken at the end
        m[mt][half] = m_new;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
          o_acc[mt][n][2 * half] *= alpha;
          o_acc[mt][n][2 * half + 1] *= alpha;
        }
      }
    }

    // O += P V: the S accumulators of key n-tiles 2 kk and 2 kk + 1 are the A fragment of keys
    // 16 kk .. 16 kk + 15; V's B fragments through ldmatrix.trans, matrices (keys 0-7, d 0-7),
    // (keys 8-15, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 8-15), used by every m-tile.
    accumulate_product<T, D, kM, kTcKeys / 16>(o_acc, s, vt);
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }
  cp_async_wait<0>();  // only empty groups can be left; nothing may land after the block exits

  // O = acc / l and LSE = m + log l; each lane stores 2 neighbouring columns of its rows.
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float row_sum = quad_sum(l[mt][half]);
      const int64_t i = i0 + warp * Cfg::kWarpRows + 16 * mt + lane / 4 + 8 * half;
      if (i >= p.Tq) continue;
      const bool seen = row_sum > 0.f;  // a row that saw no key: O = 0 and LSE = -inf
      const float inv = seen ? 1.f / row_sum : 0.f;
      store_accumulator_row<T>(o + (bh * p.Tq + i) * D, o_acc[mt], 2 * half, inv);
      if (lane % 4 == 0) lse[bh * p.Tq + i] = seen ? m[mt][half] + logf(row_sum) : -INFINITY;
    }
  }
#endif
}

template <class T, int D>
void launch(cudaStream_t stream, const Params& p, const void* q, const AttentionStrides& qs, const void* k,
            const AttentionStrides& ks, const void* v, const AttentionStrides& vs, void* o, float* lse) {
  using Cfg = TcForward<D>;
  const int64_t blocks = p.B * p.H * ((p.Tq + Cfg::kRows - 1) / Cfg::kRows);
  MG_CHECK(blocks <= 0x7fffffff, "attention_forward (CUDA): ", blocks, " blocks exceed the grid's 2^31 - 1");
  if (Cfg::kSmemBytes > 48 * 1024)
    allow_dynamic_smem(reinterpret_cast<const void*>(flash_forward_tensor_core<T, D>), Cfg::kSmemBytes);
  launch_kernel<flash_forward_tensor_core<T, D>>(static_cast<unsigned>(blocks), kTcThreads, Cfg::kSmemBytes,
                                                 stream, p, make_view<T>(q, qs), make_view<T>(k, ks),
                                                 make_view<T>(v, vs), static_cast<T*>(o), lse);
}

}  // namespace

namespace attention_internal {

bool tensor_cores_apply(DType dtype, int64_t D) {
  if ((dtype != DType::bf16 && dtype != DType::f16) || (D != 64 && D != 128)) return false;
  int device = 0, major = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 8;
}

void launch_forward_tensor_core(cudaStream_t stream, DType dtype, const Params& p, const void* q,
                                const AttentionStrides& qs, const void* k, const AttentionStrides& ks,
                                const void* v, const AttentionStrides& vs, void* o, float* lse) {
  if (dtype == DType::bf16) {
    if (p.D == 64) return launch<bf16_t, 64>(stream, p, q, qs, k, ks, v, vs, o, lse);
    return launch<bf16_t, 128>(stream, p, q, qs, k, ks, v, vs, o, lse);
  }
  if (p.D == 64) return launch<f16_t, 64>(stream, p, q, qs, k, ks, v, vs, o, lse);
  launch<f16_t, 128>(stream, p, q, qs, k, ks, v, vs, o, lse);
}

}  // namespace attention_internal
}  // namespace mg::kernels::cuda
