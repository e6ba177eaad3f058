// The IDX file format (LeCun's MNIST format, also used by Fashion-MNIST).
//
//   offset  size  content
//   0       2     0x00 0x00
//   2       1     element type: 0x08 u8, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32, 0x0E f64
//   3       1     number of dims, n
//   4       4*n   each dim's size, big-endian u32
//   4+4n    ...   the elements, row-major, big-endian for multi-byte types
//
// So the magic number 0x00000803 means "u8, 3 dims" (images N x 28 x 28) and 0x00000801
// "u8, 1 dim" (labels N). parse_idx checks the header and that the payload is exactly
// prod(dims) * element size bytes: a truncated file and one with trailing bytes are both errors,
// each message naming the file and the expected vs actual byte counts. The dims are multiplied
// with overflow checks (base/checked_size.h) and the payload may be at most kMaxIdxPayloadBytes,
// so no header can make the size wrap (2^31 x 256 x 2^25 is 2^64, which wraps to 0).
//
// read_idx of a .gz inflates the header first, then at most the payload that header implies plus
// 4 KiB (so a few trailing bytes get their exact count), and refuses a header announcing more than
// `max_bytes`: a small .gz that would inflate to gigabytes stops with an error there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mg::data {

struct IdxArray {
  uint8_t type = 0;            // element type code (0x08 = u8)
  std::vector<int64_t> dims;   // e.g. {60000, 28, 28}
  std::vector<uint8_t> bytes;  // the payload, exactly prod(dims) * element size bytes

  uint32_t magic() const { return (uint32_t(type) << 8) | uint32_t(dims.size()); }
};

// "0x00000803"
std::string idx_magic_hex(uint32_t magic);

// Size in bytes of one element of IDX type `type`; 0 for an unknown code.
int idx_element_size(uint8_t type);

// The largest payload an IDX header may announce: 1 TiB.
constexpr uint64_t kMaxIdxPayloadBytes = uint64_t(1) << 40;

// What the header at the start of `file` announces; throws naming `name` on a bad magic number, a
// truncated header, or dims whose payload overflows or exceeds kMaxIdxPayloadBytes.
struct IdxHeader {
  uint8_t type = 0;
  std::vector<int64_t> dims;
  size_t header_bytes = 0;     // 4 + 4 * ndims
  uint64_t payload_bytes = 0;  // prod(dims) * element size
};
IdxHeader parse_idx_header(const std::vector<uint8_t>& file, const std::string& name);

// Parses a whole (decompressed) IDX file. `name` (the path) appears in every error message.
IdxArray parse_idx(std::vector<uint8_t> file, const std::string& name);

// Reads `path` (gunzipping a .gz, bounded as above) and parses it.
IdxArray read_idx(const std::string& path, size_t max_bytes = size_t(1) << 30);

}  // namespace mg::data
