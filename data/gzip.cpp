// gunzip with zlib's streaming inflate(); see gzip.h for what is checked.
#include "data/gzip.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "base/error.h"

#if defined(MG_HAS_ZLIB)
#include <zlib.h>
#endif

namespace mg::data {

bool has_gzip_support() {
#if defined(MG_HAS_ZLIB)
  return true;
#else
  return false;
#endif
}

std::vector<uint8_t> read_file(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  MG_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno));
  const std::streamsize size = in.tellg();
  MG_CHECK(size >= 0, "cannot determine the size of ", path);
  MG_CHECK(static_cast<uint64_t>(size) <= max_bytes, path, ": ", size, " bytes, over the ", max_bytes,
           "-byte limit for this file");
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
  MG_CHECK(in.good() || in.eof(), "error reading ", path, ": ", std::strerror(errno));
  MG_CHECK(in.gcount() == size, "error reading ", path, ": got ", in.gcount(), " of ", size, " bytes");
  return bytes;
}

#if defined(MG_HAS_ZLIB)
struct GzipReader::State {
  z_stream zs;
  std::string name;
  size_t members = 0;
  size_t produced = 0;  // over all members (zlib's total_out restarts with each)
  bool finished = false;
};

GzipReader::GzipReader(const std::vector<uint8_t>& compressed, const std::string& name)
    : state_(std::make_unique<State>()) {
  MG_CHECK(compressed.size() >= 2 && compressed[0] == 0x1f && compressed[1] == 0x8b, name,
           ": not a gzip file (it does not start with the gzip magic bytes 1f 8b)");
  MG_CHECK(compressed.size() <= 0xFFFFFFFFu, name, ": a compressed file over 4 GiB is not supported");
  State& s = *state_;
  s.name = name;
  std::memset(&s.zs, 0, sizeof(s.zs));
  // windowBits 15 + 16: expect a gzip wrapper (header + CRC-32 + ISIZE), not raw zlib data.
  MG_CHECK(inflateInit2(&s.zs, 15 + 16) == Z_OK, name, ": zlib inflateInit2 failed");
  s.zs.next_in = const_cast<Bytef*>(compressed.data());
  s.zs.avail_in = static_cast<uInt>(compressed.size());
}

GzipReader::~GzipReader() { inflateEnd(&state_->zs); }

bool GzipReader::at_end() const { return state_->finished; }

size_t GzipReader::produced() const { return state_->produced; }

size_t GzipReader::read(size_t count, std::vector<uint8_t>& out) {
  State& s = *state_;
  z_stream& zs = s.zs;
  size_t appended = 0;
  uint8_t chunk[1 << 16];
  // Never asks zlib for more than `count` bytes: a bomb costs the caller at most what it allowed.
  while (!s.finished && appended < count) {
    zs.next_out = chunk;
    zs.avail_out = static_cast<uInt>(std::min(sizeof(chunk), count - appended));
    const int rc = inflate(&zs, Z_NO_FLUSH);
    const size_t got = static_cast<size_t>(zs.next_out - chunk);
    out.insert(out.end(), chunk, chunk + got);
    appended += got;
    s.produced += got;
    if (rc == Z_STREAM_END) {
      ++s.members;
      if (zs.avail_in == 0) {
        s.finished = true;
        break;
      }
      // Another member may follow (concatenated .gz files); anything else is garbage.
      const bool next_is_gzip = zs.avail_in >= 2 && zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b;
      MG_CHECK(next_is_gzip, s.name, ": ", zs.avail_in, " unexpected trailing bytes after gzip member ",
               s.members);
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    MG_CHECK(!(rc == Z_BUF_ERROR && zs.avail_in == 0), s.name,
             ": gzip stream is truncated (the compressed data ends before the end of member ", s.members + 1,
             "; ", s.produced, " bytes decompressed so far)");
    throw Error(str_cat(s.name, ": corrupt gzip data (zlib: ", zs.msg ? zs.msg : zError(rc), ") after ",
                        s.produced, " decompressed bytes"));
  }
  return appended;
}

std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& name,
                            size_t max_output) {
  GzipReader reader(compressed, name);
  std::vector<uint8_t> out;
  // A gzip member ends with ISIZE, the uncompressed size mod 2^32: a good first guess for one member.
  if (compressed.size() >= 4) {
    const size_t n = compressed.size();
    const uint32_t isize = uint32_t(compressed[n - 4]) | uint32_t(compressed[n - 3]) << 8 |
                           uint32_t(compressed[n - 2]) << 16 | uint32_t(compressed[n - 1]) << 24;
    // Only a hint (a damaged trailer can claim anything): deflate expands at most ~1032:1.
    out.reserve(std::min<size_t>({size_t(isize), n * 1032, max_output, size_t(1) << 30}));
  }
  reader.read(max_output, out);
  if (!reader.at_end()) {  // the limit was reached: one byte more tells a stream that ends there from a bomb
    std::vector<uint8_t> one_more;
    MG_CHECK(reader.read(1, one_more) == 0, name, ": gzip data inflates to more than ", max_output,
             " bytes, the limit for this file (a damaged file or a decompression bomb)");
  }
  return out;
}
#else
struct GzipReader::State {};

GzipReader::GzipReader(const std::vector<uint8_t>&, const std::string& name) {
  throw Error(str_cat(name,
                      ": this build of multigrad has no zlib, so .gz files can't be read; "
                      "decompress it (gunzip -k) or rebuild with zlib (Debian: zlib1g-dev)"));
}
GzipReader::~GzipReader() = default;
bool GzipReader::at_end() const { return true; }
size_t GzipReader::produced() const { return 0; }
size_t GzipReader::read(size_t, std::vector<uint8_t>&) { return 0; }

std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& name, size_t) {
  GzipReader reader(compressed, name);  // throws: no zlib
  return {};
}
#endif

std::vector<uint8_t> read_maybe_gzipped(const std::string& path, size_t max_output) {
  const bool gz = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  std::vector<uint8_t> bytes = read_file(path);
  return gz ? gunzip(bytes, path, max_output) : bytes;
}

}  // namespace mg::data
