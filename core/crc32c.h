// CRC32C (Castagnoli), the checksum each safetensors file records per tensor, so a flipped or
// overwritten byte in a checkpoint is an error naming the tensor instead of a model that trains
// on garbage. Hardware instruction (SSE4.2 crc32) when the CPU has it, else a table; both give
// the standard CRC-32C (crc32c("123456789") == 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mg {

// Continues `crc` (0 to start) over `size` bytes.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace mg
