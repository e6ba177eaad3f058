// gunzip with zlib's streaming inflate(); see gzip.h for what is checked.
#include "data/gzip.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/base/error.h"

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

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  MG_CHECK(in.good(), "cannot open ", path, ": ", std::strerror(errno));
  const std::streamsize size = in.tellg();
  MG_CHECK(size >= 0, "cannot determine the size of ", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
  MG_CHECK(in.good() || in.eof(), "error reading ", path, ": ", std::strerror(errno));
  MG_CHECK(in.gcount() == size, "error reading ", path, ": got ", in.gcount(), " of ", size, " bytes");
  return bytes;
}

#if defined(MG_HAS_ZLIB)
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& name) {
  MG_CHECK(compressed.size() >= 2 && compressed[0] == 0x1f && compressed[1] == 0x8b, name,
        ": not a gzip file (it does not start with the gzip magic bytes 1f 8b)");
  std::vector<uint8_t> out;
  // A gzip member ends with ISIZE, the uncompressed size mod 2^32: a good first guess for one member.
  if (compressed.size() >= 4) {
    const size_t n = compressed.size();
    const uint32_t isize = uint32_t(compressed[n - 4]) | uint32_t(compressed[n - 3]) << 8 |
                           uint32_t(compressed[n - 2]) << 16 | uint32_t(compressed[n - 1]) << 24;
    // Only a hint (a damaged trailer can claim anything): deflate expands at most ~1032:1.
    out.reserve(std::min<size_t>({size_t(isize), n * 1032, size_t(1) << 30}));
  }

  MG_CHECK(compressed.size() <= 0xFFFFFFFFu, name, ": a compressed file over 4 GiB is not supported");
  z_stream zs;
  std::memset(&zs, 0, sizeof(zs));
  // windowBits 15 + 16: expect a gzip wrapper (header + CRC-32 + ISIZE), not raw zlib data.
  MG_CHECK(inflateInit2(&zs, 15 + 16) == Z_OK, name, ": zlib inflateInit2 failed");
  zs.next_in = const_cast<Bytef*>(compressed.data());
  zs.avail_in = static_cast<uInt>(compressed.size());

  size_t members = 0;
  uint8_t chunk[1 << 16];
  for (;;) {
    zs.next_out = chunk;
    zs.avail_out = sizeof(chunk);
    const int rc = inflate(&zs, Z_NO_FLUSH);
    out.insert(out.end(), chunk, chunk + (sizeof(chunk) - zs.avail_out));
    if (rc == Z_STREAM_END) {
      ++members;
      if (zs.avail_in == 0) break;
      // Another member may follow (concatenated .gz files); anything else is garbage.
      const bool next_is_gzip = zs.avail_in >= 2 && zs.next_in[0] == 0x1f && zs.next_in[1] == 0x8b;
      if (!next_is_gzip) {
        const size_t extra = zs.avail_in;
        inflateEnd(&zs);
        throw Error(str_cat(name, ": ", extra, " unexpected trailing bytes after gzip member ", members));
      }
      inflateReset(&zs);
      continue;
    }
    if (rc == Z_OK) continue;
    if (rc == Z_BUF_ERROR && zs.avail_in == 0) {
      inflateEnd(&zs);
      throw Error(str_cat(name,
                          ": gzip stream is truncated (the compressed data ends before the end of member ",
                          members + 1, "; ", out.size(), " bytes decompressed so far)"));
    }
    const std::string reason = zs.msg ? zs.msg : zError(rc);
    inflateEnd(&zs);
    throw Error(
        str_cat(name, ": corrupt gzip data (zlib: ", reason, ") after ", out.size(), " decompressed bytes"));
  }
  inflateEnd(&zs);
  return out;
}
#else
std::vector<uint8_t> gunzip(const std::vector<uint8_t>&, const std::string& name) {
  throw Error(str_cat(name,
                      ": this build of multigrad has no zlib, so .gz files can't be read; "
                      "decompress it (gunzip -k) or rebuild with zlib (Debian: zlib1g-dev)"));
}
#endif

std::vector<uint8_t> read_maybe_gzipped(const std::string& path) {
  const bool gz = path.size() >= 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  std::vector<uint8_t> bytes = read_file(path);
  return gz ? gunzip(bytes, path) : bytes;
}

}  // namespace mg::data
