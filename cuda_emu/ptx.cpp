// The emulated twins of the inline PTX multigrad's kernels use: ldmatrix and mma.sync.
//
// Both are warp collectives: every lane contributes registers (or a shared-memory row address)
// and receives registers that hold pieces of matrices held by other lanes. The pieces follow the
// PTX ISA's fragment tables ("Matrix Fragments for mma.m16n8k16 with floating point type",
// "Warp-level matrix load instruction: ldmatrix"). With lane = 4 * group + t (group = lane / 4,
// t = lane % 4), a 32-bit register holds two 16-bit elements, the lower-indexed one in the low
// half:
//
//   ldmatrix .m8n8.x4 .b16: lanes 8j .. 8j+7 give the row addresses (16 bytes each) of matrix j;
//     register j of a lane holds row `group`, columns 2t and 2t+1 of matrix j; with .trans it
//     holds column `group`, rows 2t and 2t+1 (the matrix transposed on the way).
//   mma.m16n8k16 .row.col, A 16x16: a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1],
//     a[2] = A[g][2t+8..2t+9], a[3] = A[g+8][2t+8..2t+9]
//   B 16x8 (k x n): b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C, D 16x8 f32: d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1]
//
// Numerics: the 16 products of each output are exact in double, summed in order k = 0..15 with
// the accumulator, and rounded to f32 once. Tensor cores round differently (in hardware-defined
// groups, with truncation on some parts); tests compare with a tolerance, never bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstring>

#include "cuda_emu/cuda_emulated.h"
#include "cuda_emu/trace.h"

namespace mg_emu {
namespace {

uint16_t half_of(uint32_t reg, int which) { return static_cast<uint16_t>(which ? reg >> 16 : reg & 0xffffu); }
uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

float to_float(uint16_t bits, bool bf16) {
  if (bf16) return from_bits<float>(uint32_t(bits) << 16);
  return __half2float(__ushort_as_half(bits));
}

// Lane deposits: in[0] = the shared address of its row, in[1] = the shared memory's size check
// was done by the lane itself, so completion only reads rows.
void complete_ldmatrix(WarpLane (&lanes)[32], uint32_t, WarpOpArgs args) {
  const bool trans = args.variant != 0;
  uint16_t m[4][8][8];  // [matrix][row][column]
  for (int j = 0; j < 4; ++j)
    for (int r = 0; r < 8; ++r) {
      const unsigned char* row = dynamic_shared_base() + lanes[8 * j + r].in[0];
      std::memcpy(m[j][r], row, 16);
    }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int j = 0; j < 4; ++j) {
      lanes[l].out[j] =
          trans ? pack(m[j][2 * t][g], m[j][2 * t + 1][g]) : pack(m[j][g][2 * t], m[j][g][2 * t + 1]);
    }
  }
}

// Lane deposits: in[0..3] = a, in[4..5] = b0 b1, in[6..9] = the accumulators' bits.
void complete_mma(WarpLane (&lanes)[32], uint32_t, WarpOpArgs args) {
  const bool bf16 = args.variant != 0;
  float a[16][16], b[16][8], c[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    const uint32_t* in = lanes[l].in;
    for (int h = 0; h < 2; ++h) {
      a[g][2 * t + h] = to_float(half_of(in[0], h), bf16);
      a[g + 8][2 * t + h] = to_float(half_of(in[1], h), bf16);
      a[g][2 * t + 8 + h] = to_float(half_of(in[2], h), bf16);
      a[g + 8][2 * t + 8 + h] = to_float(half_of(in[3], h), bf16);
      b[2 * t + h][g] = to_float(half_of(in[4], h), bf16);
      b[2 * t + 8 + h][g] = to_float(half_of(in[5], h), bf16);
      c[g][2 * t + h] = from_bits<float>(in[6 + h]);
      c[g + 8][2 * t + h] = from_bits<float>(in[8 + h]);
    }
  }
  // D = C + A B, each output's sum in the order k = 0..15; the loops run k outside the columns so
  // the eight columns of a row are summed side by side (vector instructions), in the same order.
  double d[16][8], bd[16][8];
  for (int k = 0; k < 16; ++k)
    for (int col = 0; col < 8; ++col) bd[k][col] = b[k][col];
  for (int row = 0; row < 16; ++row) {
    for (int col = 0; col < 8; ++col) d[row][col] = c[row][col];
    for (int k = 0; k < 16; ++k) {
      const double ak = a[row][k];
      for (int col = 0; col < 8; ++col) d[row][col] += ak * bd[k][col];
    }
  }
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int e = 0; e < 4; ++e) {
      const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
      lanes[l].out[e] = static_cast<uint32_t>(to_bits(static_cast<float>(d[row][col])));
    }
  }
}

}  // namespace

void ldmatrix_x4(uint32_t (&r)[4], uint32_t shared_address, bool trans, const char* file, int line) {
  if (shared_address % 16 != 0) device_fault("ldmatrix: a row address must be 16-byte aligned", file, line);
  const unsigned char* row = shared_pointer_of(shared_address, 16, file, line);  // in bounds, or a fault
  trace_emulated(row, 16, profile::Op::ldmatrix, file, line);
  const uint32_t in[1] = {shared_address};
  warp_collective(trans ? "ldmatrix.x4.trans" : "ldmatrix.x4", 0xffffffffu, WarpOpArgs{trans ? 1 : 0}, in, 1,
                  r, 4, complete_ldmatrix, file, line);
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bool bf16,
                  const char* file, int line) {
  trace_emulated(nullptr, 0, profile::Op::mma, file, line);
  uint32_t in[10] = {a[0], a[1], a[2], a[3], b0, b1};
  for (int e = 0; e < 4; ++e) in[6 + e] = static_cast<uint32_t>(to_bits(d[e]));
  uint32_t out[4];
  warp_collective(bf16 ? "mma.m16n8k16.bf16" : "mma.m16n8k16.f16", 0xffffffffu, WarpOpArgs{bf16 ? 1 : 0}, in,
                  10, out, 4, complete_mma, file, line);
  for (int e = 0; e < 4; ++e) d[e] = from_bits<float>(out[e]);
}

}  // namespace mg_emu
