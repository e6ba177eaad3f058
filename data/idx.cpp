// IDX parsing with strict validation; see idx.h for the layout.
#include "data/idx.h"

#include <cstdint>
#include <iomanip>
#include <optional>
#include <sstream>

#include "base/checked_size.h"
#include "base/error.h"
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

std::string dims_text(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  for (size_t d = 0; d < dims.size(); ++d) os << (d ? " x " : "") << dims[d];
  return os.str();
}
}  // namespace

std::string idx_magic_hex(uint32_t magic) {
  std::ostringstream os;
  os << "0x" << std::hex << std::setw(8) << std::setfill('0') << magic;
  return os.str();
}

IdxHeader parse_idx_header(const std::vector<uint8_t>& file, const std::string& name) {
  MG_CHECK(file.size() >= 4, name, ": not an IDX file: ", file.size(),
           " bytes, too short for the 4-byte magic number");
  const uint32_t magic = read_be32(file.data());
  IdxHeader out;
  out.type = file[2];
  const int ndims = file[3];
  const int element_size = idx_element_size(out.type);
  MG_CHECK(
      file[0] == 0 && file[1] == 0 && element_size > 0 && ndims >= 1, name, ": bad IDX magic number ",
      idx_magic_hex(magic),
      " (expected 0x0000TTNN: two zero bytes, a known type code TT such as 08 for u8, and NN >= 1 dims)");

  out.header_bytes = 4 + 4 * size_t(ndims);
  MG_CHECK(file.size() >= out.header_bytes, name, ": truncated IDX header: magic ", idx_magic_hex(magic),
           " announces ", ndims, " dims, which needs ", out.header_bytes, " header bytes, but the file has ",
           file.size());
  for (int d = 0; d < ndims; ++d) out.dims.push_back(int64_t(read_be32(file.data() + 4 + 4 * d)));
  const std::optional<int64_t> numel = try_numel(out.dims);
  const std::optional<int64_t> payload = numel ? try_nbytes(*numel, size_t(element_size)) : std::nullopt;
  MG_CHECK(payload && uint64_t(*payload) <= kMaxIdxPayloadBytes, name, ": IDX dims ", dims_text(out.dims),
           " are implausibly large (their payload ",
           payload ? str_cat(*payload, " bytes is over 1 TiB") : std::string("overflows 64 bits"), ")");
  out.payload_bytes = uint64_t(*payload);
  return out;
}

IdxArray parse_idx(std::vector<uint8_t> file, const std::string& name) {
  const IdxHeader header = parse_idx_header(file, name);
  const uint64_t expected = header.payload_bytes;
  const uint64_t got = file.size() - header.header_bytes;
  MG_CHECK(got >= expected, name, ": truncated IDX payload: dims ", dims_text(header.dims), " need ",
           expected, " bytes after the header, got ", got, " (", expected - got, " missing)");
  MG_CHECK(got == expected, name, ": IDX file has trailing bytes: dims ", dims_text(header.dims), " need ",
           expected, " bytes after the header, got ", got, " (", got - expected, " extra)");

  IdxArray out;
  out.type = header.type;
  out.dims = header.dims;
  file.erase(file.begin(), file.begin() + static_cast<std::ptrdiff_t>(header.header_bytes));
  out.bytes = std::move(file);
  return out;
}

IdxArray read_idx(const std::string& path, size_t max_bytes) {
  const bool gz = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  // The file itself is bounded too: a plain IDX file by max_bytes, a .gz by max_bytes plus what
  // deflate can add to incompressible data (5 bytes per 64 KiB stored block, headers) and then some.
  if (!gz) return parse_idx(read_file(path, max_bytes), path);
  // Inflate the 4-byte magic, then the dims it announces, then at most the payload they imply.
  // Peak memory: the compressed file, plus one buffer of header + payload + kTrailingSlack.
  const size_t max_compressed = max_bytes > SIZE_MAX / 2 ? SIZE_MAX : max_bytes + max_bytes / 64 + 65536;
  const std::vector<uint8_t> compressed = read_file(path, max_compressed);
  GzipReader reader(compressed, path);
  std::vector<uint8_t> file;
  reader.read(4, file);
  if (file.size() == 4) reader.read(4 * size_t(file[3]), file);
  const IdxHeader header = parse_idx_header(file, path);
  MG_CHECK(header.header_bytes + header.payload_bytes <= max_bytes, path, ": IDX dims ",
           dims_text(header.dims), " announce ", header.header_bytes + header.payload_bytes,
           " bytes, over the ", max_bytes, "-byte limit for one file");
  // A little past the implied size, so a few trailing bytes are reported with their exact count by
  // parse_idx; a stream that goes on beyond that is cut off here. Reserved with the payload: the
  // slack read must not reallocate (it doubled the peak: 2.26 GB for a payload near 1 GiB).
  constexpr size_t kTrailingSlack = 4096;
  file.reserve(header.header_bytes + header.payload_bytes + kTrailingSlack);
  reader.read(header.payload_bytes, file);
  reader.read(kTrailingSlack, file);
  std::vector<uint8_t> one_more;
  MG_CHECK(reader.read(1, one_more) == 0, path, ": the gzip data inflates past the ",
           header.header_bytes + header.payload_bytes, " bytes its IDX header implies (dims ",
           dims_text(header.dims), ") by more than ", kTrailingSlack,
           " bytes: trailing bytes, or a decompression bomb");
  return parse_idx(std::move(file), path);
}

}  // namespace mg::data
