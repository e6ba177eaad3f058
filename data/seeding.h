// How data/ turns a seed into random decisions that don't depend on threads.
//
// Every random choice the input pipeline makes (the shuffle of an epoch, where sample i is
// cropped, whether it is flipped) is a pure function of a few integers — (seed, epoch, index) —
// computed with Philox (base/philox.h), a counter-based generator: no generator state is shared
// or advanced, so it does not matter which worker thread assembles which batch, or in what order.
// Each use mixes its own `stream` constant into the seed, so the shuffle and a crop drawn from
// the same user seed are independent.
#pragma once

#include <cstdint>

#include "base/philox.h"

namespace mg::data {

// SplitMix64's finaliser: a bijective 64-bit mix, used to combine a seed with a stream id.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The Philox key for one use (`stream`) of a user seed.
inline uint64_t derive_key(uint64_t seed, uint64_t stream) { return mix64(seed ^ mix64(stream)); }

// 128 random bits for (key, element, call), as two 64-bit halves.
struct Random128 {
  uint64_t lo, hi;
};
inline Random128 philox128(uint64_t key, uint64_t element, uint64_t call) {
  PhiloxBlock b = philox4x32_10(key, element, call);
  return Random128{uint64_t(b.word[0]) | uint64_t(b.word[1]) << 32, uint64_t(b.word[2]) | uint64_t(b.word[3])
                                                                                              << 32};
}

// The high 64 bits of the 128-bit product a * b, from four 32 x 32 -> 64 products (standard
// C++ has no 128-bit integer; this is what the compiler's __int128 multiply computes).
inline uint64_t mul_high64(uint64_t a, uint64_t b) {
  const uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32, b_lo = b & 0xffffffffu, b_hi = b >> 32;
  const uint64_t lo_lo = a_lo * b_lo, hi_lo = a_hi * b_lo, lo_hi = a_lo * b_hi, hi_hi = a_hi * b_hi;
  const uint64_t middle = (lo_lo >> 32) + (hi_lo & 0xffffffffu) + lo_hi;  // cannot overflow
  return hi_hi + (hi_lo >> 32) + (middle >> 32);
}

// An integer in [0, n) from 64 random bits (Lemire's multiply-shift; bias below n / 2^64).
inline uint64_t below(uint64_t random64, uint64_t n) { return mul_high64(random64, n); }

// A double in [0, 1) from the top 53 of 64 random bits.
inline double unit_double(uint64_t random64) { return static_cast<double>(random64 >> 11) * 0x1.0p-53; }

// Stream ids: one per kind of random decision.
enum class Stream : uint64_t { Shuffle = 1, Crop = 2, Flip = 3, Synthetic = 4 };
inline uint64_t stream_key(uint64_t seed, Stream stream) {
  return derive_key(seed, static_cast<uint64_t>(stream));
}

}  // namespace mg::data
