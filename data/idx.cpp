// IDX parsing with strict validation; see idx.h for the layout.
#include "data/idx.h"

#include <iomanip>
#include <sstream>

#include "core/base/error.h"
#include "data/gzip.h"

namespace mg::data {

int idx_element_size(uint8_t type) {
  switch (type) {
    case 0x08:
    case 0x09: return 1;  // u8, i8
    case 0x0B: return 2;  // i16
    case 0x0C:
    case 0x0D: return 4;  // i32, f32
    case 0x0E: return 8;  // f64
    default: return 0;
  }
}

namespace {
uint32_t read_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
}  // namespace

std::string idx_magic_hex(uint32_t magic) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << magic;
  return os.str();
}

IdxArray parse_idx(std::vector<uint8_t> file, const std::string& name) {
  MG_CHECK(file.size() >= 4, name, ": not an IDX file: ", file.size(),
        " bytes, too short for the 4-byte magic number");
  const uint32_t magic = read_be32(file.data());
  IdxArray out;
  out.type = file[2];
  const int ndims = file[3];
  const int element_size = idx_element_size(out.type);
  MG_CHECK(file[0] == 0 && file[1] == 0 && element_size > 0 && ndims >= 1, name, ": bad IDX magic number ",
        idx_magic_hex(magic),
        " (expected 0x0000TTNN: two zero bytes, a known type code TT such as 08 for u8, and NN >= 1 dims)");

  const size_t header = 4 + 4 * size_t(ndims);
  MG_CHECK(file.size() >= header, name, ": truncated IDX header: magic ", idx_magic_hex(magic), " announces ",
        ndims, " dims, which needs ", header, " header bytes, but the file has ", file.size());
  uint64_t expected = uint64_t(element_size);
  for (int d = 0; d < ndims; ++d) {
    const uint32_t size = read_be32(file.data() + 4 + 4 * d);
    out.dims.push_back(int64_t(size));
    expected *= size;  // at most 255 dims of u32 sizes: the caller's dim checks bound this
    MG_CHECK(expected < (uint64_t(1) << 40), name, ": IDX dims are implausibly large (over 1 TiB of payload)");
  }

  const uint64_t got = file.size() - header;
  std::ostringstream dims;
  for (size_t d = 0; d < out.dims.size(); ++d) dims << (d ? " x " : "") << out.dims[d];
  MG_CHECK(got >= expected, name, ": truncated IDX payload: dims ", dims.str(), " need ", expected,
        " bytes after the header, got ", got, " (", expected - got, " missing)");
  MG_CHECK(got == expected, name, ": IDX file has trailing bytes: dims ", dims.str(), " need ", expected,
        " bytes after the header, got ", got, " (", got - expected, " extra)");

  file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(header));
  out.bytes = std::move(file);
  return out;
}

IdxArray read_idx(const std::string& path) { return parse_idx(read_maybe_gzipped(path), path); }

}  // namespace mg::data
