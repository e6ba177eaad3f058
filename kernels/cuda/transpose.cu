// Same-dtype strided copies on the GPU: transposes and permutations (x.t().contiguous(),
// x.permute(...).contiguous(), a copy into a transposed view), slices, steps, broadcasts. The entry
// point is copy() (elementwise.cu), which does the contiguous case with cudaMemcpyAsync and the
// casts itself and hands every other same-dtype copy to copy_same_dtype() here. The kernels move
// raw words of the element's width (1, 2, 4 or 8 bytes): one instantiation per width, not per dtype.
//
// Three paths, chosen on the host from the merged dims (make_offset_calc: size-1 dims dropped,
// dims contiguous in both operands merged, so a 3-d permutation that keeps two dims together is a
// 2-d transpose):
//   - Pack path (vectorized.cuh): the input walks the innermost dim with stride 1 (or 0, a
//     broadcast) like the output, with aligned rows: 16-byte loads and stores, no transposition.
//   - Tiled transpose: the output's unit-stride dim A is not the input's unit-stride dim B (the
//     classic out[j][i] = in[i][j], generalised: every other dim is a batch dim), and both are at
//     least 32 bytes long. One block of 256 threads per 32 x 32 tile of (A, B), through shared
//     memory: the 32 lanes of a warp read 32 consecutive elements of one input row (along B) and
//     write 32 consecutive elements of one output row (along A), so both sides are whole 32-byte
//     sectors (4-byte elements: 128 bytes, 4 sectors per request, all used). Each thread moves 4
//     elements, its 4 loads independent (in flight together). The tile's rows are padded so that
//     a warp reading one column hits 32 banks: 33 words for 4- and 8-byte elements, 34 halves,
//     36 bytes. 16-bit elements go two at a time when every pair is 4-byte aligned on both sides
//     (even sizes and strides): a 64 x 64 tile, each lane loading a 4-byte word from each of two
//     adjacent rows and swapping halves in registers (transpose_pairs_kernel), so their requests
//     are 128 bytes too instead of 64. Index arithmetic: a few int64 divisions per TILE (tile ->
//     position along A and B, batch index -> offsets), then a multiply-add per element.
//   - General strided move: everything else (no unit stride on one side, dims too short for
//     tiles). One thread per element turns its linear index into two offsets; when the element
//     count fits 31 bits, with 32-bit "magic number" divisions (a multiply-high, an add and a
//     shift per dim, divisors prepared on the host) instead of an int64 div/mod per dim (a
//     ~70-instruction subroutine on the GPU).
//
// Cost. A copy moves 2 n s bytes (s = element size) and does no arithmetic: bandwidth bound. A
// strided-path transpose reads one element per 32-byte sector per lane (4 of 32 bytes used for
// f32: 32 sectors per request, 12% efficiency) and relies on L2 for the rest: its L2 traffic is
// 8x the bytes and binds before DRAM does (the tracer: 4096 x 16384 f32 is L2 bound). The tiled
// path asks for the ideal 2 n s bytes in whole sectors (DRAM bound near the roofline; the
// predicted times are in docs/kernels.md); its shared memory side is one write and one read wavefront per
// 128 bytes, conflict free, far below the SM's 128 bytes per clock. Rows whose starts are not
// 32-byte aligned (an odd row length) straddle an extra sector per 128 bytes: ~82% efficiency,
// which no tiling of rows avoids.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cstdint>
#include <limits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/vectorized.cuh"

namespace mg::kernels::cuda {
namespace {

// ---- the general path: 32-bit index arithmetic ---------------------------------------------------
// Unsigned division by a divisor fixed at launch with a multiply-high, an add and a shift
// (Granlund & Montgomery, "Division by invariant integers using multiplication", 1994; the form of
// PyTorch's IntDivider): q = (umulhi(n, m) + n) >> s with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1. Exact for every n, d < 2^31 (then umulhi(n, m) + n < 2^32).
struct FastDivmod {
  uint32_t divisor = 1, multiplier = 0, shift = 0;

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while (shift < 31 && (uint32_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * multiplier) >> 32);  // mul.hi
    return (hi + n) >> shift;
  }
};

// Element linear -> (output offset, input offset), row-major over the merged shape.
struct MoveIndex {
  OffsetCalc<2> oc;
  FastDivmod dims[kMaxDims];
  bool narrow = false;  // every index < 2^31: the 32-bit divisions

  __device__ __forceinline__ void get(int64_t linear, int64_t (&off)[2]) const {
    if (!narrow) {
      oc.get(linear, off);
      return;
    }
    uint32_t rest = static_cast<uint32_t>(linear);
    off[0] = off[1] = 0;
    for (int d = oc.ndim - 1; d >= 0; --d) {
      const uint32_t q = dims[d].div(rest), i = rest - q * dims[d].divisor;
      rest = q;
      off[0] += int64_t(i) * oc.strides[0][d];
      off[1] += int64_t(i) * oc.strides[1][d];
    }
  }
};

template <class W>
__global__ void move_kernel(MoveIndex index, PackPlan plan, int64_t n, const W* in, W* out) {
  auto element = [&](int64_t i) {
    int64_t off[2];
    index.get(i, off);
    out[off[0]] = in[off[1]];
  };
  constexpr int V = pack_width<W>();
  run_elements<V>(n, plan, element, [&](int64_t i) {
    int64_t off[2];
    index.get(i, off);
    store_pack(out + off[0], load_pack_or_splat<V>(in + off[1], plan.unit & 2u));
  });
}

// ---- the tiled transpose -------------------------------------------------------------------------
constexpr int kTile = 32;      // a tile is kTile x kTile elements (kPairTile for 16-bit pairs)
constexpr int kPairTile = 64;  // 16-bit elements moved as 4-byte pairs
constexpr int kTileRows = 8;   // 256 threads: 8 warps

struct TilePlan {
  int64_t size_a = 0, size_b = 0;  // A: the output's unit-stride dim; B: the input's
  int64_t in_a = 0, out_b = 0;     // the input's stride along A, the output's along B
  int64_t tiles_a = 0, tiles_b = 0, tiles = 0;
  int batch_dims = 0;  // the other dims, outermost first
  int64_t batch_shape[kMaxDims] = {}, batch_in[kMaxDims] = {}, batch_out[kMaxDims] = {};
};

// Where tile t starts: its first element along A and B, and the offsets of its batch index.
struct TileOrigin {
  int64_t a0, b0, in_base, out_base;
};
template <int kT>
__device__ __forceinline__ TileOrigin tile_origin(const TilePlan& p, int64_t t) {
  TileOrigin o{(t % p.tiles_a) * kT, 0, 0, 0};
  t /= p.tiles_a;
  o.b0 = (t % p.tiles_b) * kT;
  t /= p.tiles_b;
  for (int d = p.batch_dims - 1; d >= 0; --d) {
    const int64_t i = t % p.batch_shape[d];
    t /= p.batch_shape[d];
    o.in_base += i * p.batch_in[d];
    o.out_base += i * p.batch_out[d];
  }
  return o;
}

// Row length of the shared tile, in elements: a column (32 elements one row apart) then falls in
// 32 different banks (an odd number of 4-byte words per row; 8-byte elements take 2 wavefronts
// for 256 bytes whatever the padding).
template <class W>
constexpr int tile_pitch() {
  return sizeof(W) >= 4 ? kTile + 1 : kTile + static_cast<int>(4 / sizeof(W));
}

template <class W>
__global__ void transpose_kernel(TilePlan p, const W* in, W* out) {
  __shared__ W tile[kTile][tile_pitch<W>()];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const TileOrigin o = tile_origin<kTile>(p, blockIdx.x);
  // Read: lanes along B (the input's unit stride), a warp per row of A; tile[a][b].
  const int64_t b_in = o.b0 + lane;
#pragma unroll
  for (int r = warp; r < kTile; r += kTileRows) {
    const int64_t a = o.a0 + r;
    if (a < p.size_a && b_in < p.size_b) tile[r][lane] = in[o.in_base + a * p.in_a + b_in];
  }
  __syncthreads();
  // Write: lanes along A (the output's unit stride), a warp per row of B.
  const int64_t a_out = o.a0 + lane;
#pragma unroll
  for (int r = warp; r < kTile; r += kTileRows) {
    const int64_t b = o.b0 + r;
    if (a_out < p.size_a && b < p.size_b) out[o.out_base + b * p.out_b + a_out] = tile[lane][r];
  }
}

// 16-bit elements, two at a time: 2-byte lanes would fill only 64 bytes per warp request. A
// 64 x 64 tile; lane l reads the 4-byte word holding elements (a, b), (a, b+1) (b = b0 + 2l) of
// two adjacent rows a, a+1, swaps halves between the two words in registers so that each holds
// two adjacent elements of an OUTPUT row, (a, b), (a+1, b) and (a, b+1), (a+1, b+1), and parks
// them in a 32 x 64 tile of words (row: the pair of A rows; column: b, the even ones in the
// first 32 columns and the odd ones in the last 32, so a warp's writes hit 32 banks). Then a
// warp writes an output row: lane l stores the word of A rows 2l, 2l+1, read down a column (rows
// of 65 words: 32 banks). Needs every pair 4-byte aligned on both sides (plan_pairs).
__global__ void transpose_pairs_kernel(TilePlan p, const uint16_t* in, uint16_t* out) {
  __shared__ uint32_t tile[kPairTile / 2][kPairTile + 1];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const TileOrigin o = tile_origin<kPairTile>(p, blockIdx.x);
  const int64_t b_in = o.b0 + 2 * lane;
#pragma unroll
  for (int r = warp; r < kPairTile / 2; r += kTileRows) {  // the pair of A rows a0 + 2r, a0 + 2r + 1
    const int64_t a = o.a0 + 2 * r;
    if (a < p.size_a && b_in < p.size_b) {
      const uint16_t* row = in + o.in_base + a * p.in_a + b_in;
      const uint32_t w0 = *reinterpret_cast<const uint32_t*>(row);
      const uint32_t w1 = *reinterpret_cast<const uint32_t*>(row + p.in_a);
      tile[r][lane] = (w0 & 0xffffu) | (w1 << 16);           // (a, b), (a+1, b)
      tile[r][32 + lane] = (w0 >> 16) | (w1 & 0xffff0000u);  // (a, b+1), (a+1, b+1)
    }
  }
  __syncthreads();
  const int64_t a_out = o.a0 + 2 * lane;
#pragma unroll
  for (int r = warp; r < kPairTile; r += kTileRows) {  // output row b0 + r
    const int64_t b = o.b0 + r;
    if (a_out < p.size_a && b < p.size_b)
      *reinterpret_cast<uint32_t*>(out + o.out_base + b * p.out_b + a_out) = tile[lane][(r % 2) * 32 + r / 2];
  }
}

// The tiled path applies when the output has a unit-stride dim A and the input another one, B,
// and each is long enough for a warp's 32 lanes to fill whole sectors (32 bytes) on its side.
bool plan_tiles(const OffsetCalc<2>& oc, size_t width, TilePlan* p) {
  int a = -1, b = -1;
  for (int d = oc.ndim - 1; d >= 0; --d) {
    if (a < 0 && oc.strides[0][d] == 1) a = d;
    if (b < 0 && oc.strides[1][d] == 1) b = d;
  }
  if (a < 0 || b < 0 || a == b) return false;
  const int64_t min_size = static_cast<int64_t>(32 / width);
  if (oc.shape[a] < min_size || oc.shape[b] < min_size) return false;
  p->size_a = oc.shape[a];
  p->size_b = oc.shape[b];
  p->in_a = oc.strides[1][a];
  p->out_b = oc.strides[0][b];
  p->tiles = 1;
  for (int d = 0; d < oc.ndim; ++d) {
    if (d == a || d == b) continue;
    p->batch_shape[p->batch_dims] = oc.shape[d];
    p->batch_out[p->batch_dims] = oc.strides[0][d];
    p->batch_in[p->batch_dims] = oc.strides[1][d];
    p->tiles *= oc.shape[d];
    ++p->batch_dims;
  }
  return true;
}

// Sets the tile counts for tiles of kT x kT.
void size_tiles(TilePlan* p, int kT) {
  p->tiles_a = (p->size_a + kT - 1) / kT;
  p->tiles_b = (p->size_b + kT - 1) / kT;
  p->tiles *= p->tiles_a * p->tiles_b;
}

// 16-bit pairs: every pair (a, a+1) and (b, b+1) must be whole (even sizes) and start on a 4-byte
// boundary on both sides (4-byte aligned data, even strides).
bool plan_pairs(const TilePlan& p, const void* in, const void* out) {
  bool ok = p.size_a % 2 == 0 && p.size_b % 2 == 0 && p.in_a % 2 == 0 && p.out_b % 2 == 0 &&
            reinterpret_cast<uintptr_t>(in) % 4 == 0 && reinterpret_cast<uintptr_t>(out) % 4 == 0;
  for (int d = 0; d < p.batch_dims && ok; ++d) ok = p.batch_in[d] % 2 == 0 && p.batch_out[d] % 2 == 0;
  return ok;
}

MoveIndex move_index(const OffsetCalc<2>& oc, int64_t n) {
  MoveIndex index;
  index.oc = oc;
  index.narrow = n <= std::numeric_limits<int32_t>::max();
  if (index.narrow) {
    for (int d = 0; d < oc.ndim; ++d) index.dims[d] = FastDivmod(static_cast<uint32_t>(oc.shape[d]));
  }
  return index;
}

}  // namespace

void copy_same_dtype(cudaStream_t stream, const StridedView& in, const StridedView& out,
                     const OffsetCalc<2>& oc) {
  const int64_t n = out.numel();
  const StridedView* views[2] = {&out, &in};
  visit_width(dtype_size(in.dtype), [&](auto t) {
    using W = typename decltype(t)::type;
    constexpr int V = pack_width<W>();
    const PackPlan plan = plan_packs<2>(oc, views, n, V);
    TilePlan tiles;
    if (plan.head < 0 && plan_tiles(oc, sizeof(W), &tiles)) {
      const bool pairs = sizeof(W) == 2 && plan_pairs(tiles, in.data, out.data);
      size_tiles(&tiles, pairs ? kPairTile : kTile);
      // One block per tile. A tile holds at least 128 bytes (its two dims are at least 32 bytes
      // long, 4 x 4 for f64), so the grid's limit of 2^31 - 1 blocks is 256 GB away; past it the
      // general path would take over.
      if (tiles.tiles <= std::numeric_limits<int32_t>::max()) {
        const unsigned blocks = static_cast<unsigned>(tiles.tiles);
        if (pairs) {
          launch_kernel<transpose_pairs_kernel>(blocks, 32 * kTileRows, 0, stream, tiles,
                                                in.ptr<const uint16_t>(), out.ptr<uint16_t>());
        } else {
          launch_kernel<transpose_kernel<W>>(blocks, 32 * kTileRows, 0, stream, tiles, in.ptr<const W>(),
                                             out.ptr<W>());
        }
        return;
      }
    }
    launch_kernel<move_kernel<W>>(grid_of(n, plan, V), kThreads, 0, stream, move_index(oc, n), plan, n,
                                  in.ptr<const W>(), out.ptr<W>());
  });
}

}  // namespace mg::kernels::cuda
