// Philox4x32-10: a counter-based random number generator (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11).
//
// Why counter-based: the numbers are a pure function of (key, counter), so any
// element can be computed on its own, on any thread, on CPU or GPU, and the same
// seed gives the same tensor everywhere. There is no sequential state to share.
//
// multigrad's convention (same on CPU and CUDA):
//   key     = the 64-bit seed (two 32-bit words)
//   counter = { element index (64 bits), call offset (64 bits) }
// The generator's offset increases by one per random op, so two calls differ;
// element i of a call reads word 0 (rand) or words 0 and 1 (randn) of its block.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MG_HOST_DEVICE inline
#endif

namespace mg {

struct PhiloxBlock {
  uint32_t word[4];
};

MG_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

// Ten rounds of Philox4x32 on counter (c0..c3) with key (k0, k1).
MG_HOST_DEVICE PhiloxBlock philox4x32_10(uint64_t seed, uint64_t element, uint64_t call_offset) {
  uint32_t c0 = static_cast<uint32_t>(element), c1 = static_cast<uint32_t>(element >> 32);
  uint32_t c2 = static_cast<uint32_t>(call_offset), c3 = static_cast<uint32_t>(call_offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;  // the golden-ratio Weyl sequence bumps the key each round
    k1 += 0xBB67AE85u;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (exactly representable as float).
MG_HOST_DEVICE float philox_uniform(uint64_t seed, uint64_t element, uint64_t call_offset) {
  return static_cast<float>(philox4x32_10(seed, element, call_offset).word[0] >> 8) * (1.0f / 16777216.0f);
}

// 24 random bits of one 32-bit Philox word as a uniform float in [0, 1).
MG_HOST_DEVICE float philox_word_uniform(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// Dropout's draw for element i: word i % 4 of block i / 4, so one Philox call serves four
// elements (the CPU and CUDA kernels both take a block per four elements; this is the same
// number for any one of them).
MG_HOST_DEVICE float philox_dropout_uniform(uint64_t seed, uint64_t element, uint64_t call_offset) {
  return philox_word_uniform(philox4x32_10(seed, element / 4, call_offset).word[element % 4]);
}

// Standard normal by Box-Muller from words 0 and 1 of the element's block.
MG_HOST_DEVICE float philox_normal(uint64_t seed, uint64_t element, uint64_t call_offset) {
  PhiloxBlock b = philox4x32_10(seed, element, call_offset);
  float u1 = (static_cast<float>(b.word[0] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
  float u2 = static_cast<float>(b.word[1] >> 8) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

}  // namespace mg
