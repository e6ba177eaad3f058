// The tensor-core pieces the attention forward (attention_tensor_core.cu) and backward
// (attention_tensor_core_backward.cu) share: the swizzled [rows][D] tiles of 16-bit values that
// cp.async fills and ldmatrix reads, the three ways a warp loads mma fragments from them, and the
// quad reductions over the 4 lanes that hold one row of an mma accumulator.
//
// mma.sync.m16n8k16's operands (per warp): A is 16 (m) x 16 (k), four 8x8 matrices; B is 16 (k) x 8
// (n), two. ldmatrix.x4 loads four 8x8 matrices of 16-bit values, lane l giving the address of row
// l % 8 of matrix l / 8; .trans transposes each matrix on the way. An accumulator element e of an
// m16n8 tile is row lane/4 + 8 (e / 2), column 2 (lane % 4) + e % 2: the 16 x 16 accumulators of two
// neighbouring n-tiles, packed to 16 bits, are exactly an A fragment (FlashAttention-2's reuse).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/native.cuh"

namespace mg::kernels::cuda::attention_tc {

using attention_internal::View;

constexpr int kTcKeys = 64;  // keys per K/V tile
constexpr int kTcThreads = 128;

// Element offset of (row, col) in a swizzled [rows][D] tile: chunk c of row r at chunk c ^ (r & 7),
// so the eight rows an ldmatrix reads at one logical chunk fall on eight different bank groups.
template <int D>
__host__ __device__ __forceinline__ int swizzled(int row, int col) {
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Queues the copy of rows [t0, t0 + kRows) of x into `tile`: cp.async for whole 16-byte chunks of
// an aligned operand, element loads otherwise, zeros for rows at or past t_end.
template <class T, int D, int kRows>
__device__ __forceinline__ void load_tile(const View<T>& x, int64_t b, int64_t h, int64_t t0, int64_t t_end,
                                          uint16_t* tile) {
  constexpr int kChunksPerRow = D / 8;
  constexpr int kChunksPerThread = kRows * kChunksPerRow / kTcThreads;
  static_assert(kChunksPerThread * kTcThreads == kRows * kChunksPerRow, "whole chunks per thread");
#pragma unroll
  for (int i = 0; i < kChunksPerThread; ++i) {
    const int chunk = threadIdx.x + i * kTcThreads;
    const int r = chunk / kChunksPerRow, c = chunk % kChunksPerRow;
    uint16_t* dst = tile + swizzled<D>(r, 8 * c);
    if (t0 + r >= t_end) {
      *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
      continue;
    }
    const uint16_t* src = reinterpret_cast<const uint16_t*>(x.at(b, h, t0 + r)) + 8 * c;
    if (x.vector_ok) {
      cp_async_16(dst, src);
    } else {
      uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
      for (int e = 0; e < 8; ++e) w[e / 2] |= uint32_t(src[e]) << (16 * (e % 2));
      *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// Queues key tile t of K and V (rows [64 t, 64 t + 64), zeros at or past `end`) into one stage.
template <class T, int D>
__device__ __forceinline__ void load_kv_tile(const View<T>& k, const View<T>& v, int64_t b, int64_t h, int t,
                                             int64_t end, uint16_t* k_dst, uint16_t* v_dst) {
  load_tile<T, D, kTcKeys>(k, b, h, int64_t(t) * kTcKeys, end, k_dst);
  load_tile<T, D, kTcKeys>(v, b, h, int64_t(t) * kTcKeys, end, v_dst);
}

// The A fragment of rows [row0, row0 + 16) x columns [col0, col0 + 16) of a tile whose rows are m
// and columns k: matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
template <int D>
__device__ __forceinline__ void load_a_fragment(uint32_t (&a)[4], const uint16_t* tile, int row0, int col0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  ldmatrix_x4<false>(
      a, shared_address(tile + swizzled<D>(row0 + 8 * (matrix & 1) + lane % 8, col0 + 8 * (matrix >> 1))));
}

// The B fragments of n-tiles n0 and n0 + 8 at k-step [k0, k0 + 16) of a tile whose rows are n and
// columns k (k contiguous): r[0], r[1] for n-tile n0, r[2], r[3] for n0 + 8.
template <int D>
__device__ __forceinline__ void load_b_fragments(uint32_t (&r)[4], const uint16_t* tile, int n0, int k0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  ldmatrix_x4<false>(
      r, shared_address(tile + swizzled<D>(n0 + 8 * (matrix >> 1) + lane % 8, k0 + 8 * (matrix & 1))));
}

// The same from a tile whose rows are k and columns n (n contiguous), transposed by ldmatrix.trans.
template <int D>
__device__ __forceinline__ void load_b_fragments_trans(uint32_t (&r)[4], const uint16_t* tile, int k0,
                                                       int n0) {
  const int lane = threadIdx.x % 32, matrix = lane / 8;
  ldmatrix_x4<true>(
      r, shared_address(tile + swizzled<D>(k0 + 8 * (matrix & 1) + lane % 8, n0 + 8 * (matrix >> 1))));
}

// Two f32 values as one register of two 16-bit values, the lower column in the low half.
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (std::is_same<T, bf16_t>::value) {
    return uint32_t(make_bf16(lo).bits) | (uint32_t(make_bf16(hi).bits) << 16);
  } else {
    return uint32_t(make_f16(lo).bits) | (uint32_t(make_f16(hi).bits) << 16);
  }
}

// The A fragment of keys (or rows) 16 kk .. 16 kk + 15 from the f32 accumulators of n-tiles 2 kk and
// 2 kk + 1, rounded to T.
template <class T>
__device__ __forceinline__ void accumulators_as_a(uint32_t (&a)[4], const float (&lo)[4],
                                                  const float (&hi)[4]) {
  a[0] = pack_pair<T>(lo[0], lo[1]);
  a[1] = pack_pair<T>(lo[2], lo[3]);
  a[2] = pack_pair<T>(hi[0], hi[1]);
  a[3] = pack_pair<T>(hi[2], hi[3]);
}

// s[mt] = A[mt] X^T for the kM m-tiles of a warp, where A[mt] is 16 rows x D held as A fragments
// (a[mt][ks] is d-step ks) and X is rows [0, 16 kNTiles) x D of `tile` (d contiguous), read through
// ldmatrix, each fragment used by every m-tile: S = Q K^T, dP = dO V^T, S^T = K Q^T, dP^T = V dO^T.
template <class T, int D, int kM, int kNTiles>
__device__ __forceinline__ void multiply_transposed(float (&s)[kM][2 * kNTiles][4],
                                                    const uint32_t (&a)[kM][D / 16][4],
                                                    const uint16_t* tile) {
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
#pragma unroll
    for (int n = 0; n < 2 * kNTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][n][e] = 0.f;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
    for (int np = 0; np < kNTiles; ++np) {
      uint32_t r[4];
      load_b_fragments<D>(r, tile, 16 * np, 16 * ks);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        mma_16816<T>(s[mt][2 * np], a[mt][ks], r[0], r[1]);
        mma_16816<T>(s[mt][2 * np + 1], a[mt][ks], r[2], r[3]);
      }
    }
  }
}

// acc[mt] += A[mt] B for the kM m-tiles of a warp, where A[mt] is the 16 x (16 kKTiles) result of an
// earlier product, still in its f32 accumulators s[mt] (n-tiles 2 kk and 2 kk + 1 are k-step kk,
// rounded to T), and B is rows [0, 16 kKTiles) x D of `tile` (rows are k, d contiguous), read through
// ldmatrix.trans, each fragment used by every m-tile: O += P V, dV += P~^T dO, dK += dS^T Q,
// dQ += dS K.
template <class T, int D, int kM, int kKTiles>
__device__ __forceinline__ void accumulate_product(float (&acc)[kM][D / 8][4],
                                                   const float (&s)[kM][2 * kKTiles][4],
                                                   const uint16_t* tile) {
#pragma unroll
  for (int kk = 0; kk < kKTiles; ++kk) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) accumulators_as_a<T>(a[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
    for (int dn = 0; dn < D / 16; ++dn) {
      uint32_t r[4];
      load_b_fragments_trans<D>(r, tile, 16 * kk, 16 * dn);
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        mma_16816<T>(acc[mt][2 * dn], a[mt], r[0], r[1]);
        mma_16816<T>(acc[mt][2 * dn + 1], a[mt], r[2], r[3]);
      }
    }
  }
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Stores a row's accumulators (n-tiles of 8 columns, this lane's 2 neighbouring columns each) times
// `scale` as T: the 2 values as one 4-byte store. `e0`: 0 for row lane/4, 2 for row lane/4 + 8.
template <class T, int kTiles>
__device__ __forceinline__ void store_accumulator_row(T* row, const float (&acc)[kTiles][4], int e0,
                                                      float scale) {
  T* const out = row + 2 * (threadIdx.x % 4);
#pragma unroll
  for (int n = 0; n < kTiles; ++n)
    *reinterpret_cast<uint32_t*>(out + 8 * n) = pack_pair<T>(acc[n][e0] * scale, acc[n][e0 + 1] * scale);
}

}  // namespace mg::kernels::cuda::attention_tc
