// CRC32C: reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF.
//
// The table version handles one byte per step (about 0.5 GB/s); the SSE4.2 version eight
// (about 10 GB/s here), so a checkpoint's checksums cost a small fraction of its write.
#include "core/crc32c.h"

#include <array>
#include <cstring>

#include "base/error.h"

namespace mg {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t crc32c_table(const unsigned char* p, size_t size, uint32_t state) {
  static const std::array<uint32_t, 256> table = make_table();
  for (size_t i = 0; i < size; ++i) state = table[(state ^ p[i]) & 0xff] ^ (state >> 8);
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t size, uint32_t state) {
  uint64_t wide = state;
  for (; size >= 8; p += 8, size -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    wide = __builtin_ia32_crc32di(wide, word);
  }
  state = static_cast<uint32_t>(wide);
  for (; size > 0; ++p, --size) state = __builtin_ia32_crc32qi(state, *p);
  return state;
}
#endif

}  // namespace

bool crc32c_hardware_available() {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  return has_sse42;
#else
  return false;
#endif
}

uint32_t crc32c_software(const void* data, size_t size, uint32_t crc) {
  return ~crc32c_table(static_cast<const unsigned char*>(data), size, ~crc);
}

uint32_t crc32c_hardware(const void* data, size_t size, uint32_t crc) {
  MG_CHECK(crc32c_hardware_available(), "crc32c_hardware: this CPU has no SSE4.2 crc32 instruction");
#if defined(__x86_64__)
  return ~crc32c_sse42(static_cast<const unsigned char*>(data), size, ~crc);
#else
  return crc;  // unreachable: the check above failed
#endif
}

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  return crc32c_hardware_available() ? crc32c_hardware(data, size, crc) : crc32c_software(data, size, crc);
}

}  // namespace mg
