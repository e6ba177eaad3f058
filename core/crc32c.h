// CRC32C (Castagnoli), the checksum each safetensors file records per tensor, so a flipped or
// overwritten byte in a checkpoint is an error naming the tensor instead of a model that trains
// on garbage. Hardware instruction (SSE4.2 crc32) when the CPU has it, else a table; both give
// the standard CRC-32C (crc32c("123456789") == 0xE3069283).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mg {

// Continues `crc` (0 to start) over `size` bytes, with the fastest implementation this CPU has.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// Each implementation on its own, so a test can check they agree on any machine: the table
// (one byte per step, every CPU) and the SSE4.2 instruction (eight bytes per step).
uint32_t crc32c_software(const void* data, size_t size, uint32_t crc = 0);
// True when this CPU has SSE4.2 (crc32c_hardware then runs); crc32c_hardware throws mg::Error otherwise.
bool crc32c_hardware_available();
uint32_t crc32c_hardware(const void* data, size_t size, uint32_t crc = 0);

}  // namespace mg
