// Reading a whole file into memory, and gunzipping it when it is a .gz.
//
// Datasets ship compressed (Debian's dataset-fashion-mnist installs *.gz), and they are small
// enough (tens of MB) to decompress into memory once at load time. zlib's inflate() does the
// decoding; this file adds the checks a loader needs so a damaged download fails with a reason:
// not a gzip stream, corrupt deflate data or CRC (zlib's own message), a stream cut short, or
// bytes after the last gzip member. Every message names the file.
//
// Inflation is bounded: deflate expands up to ~1032:1, so a 2 MB file of zeros inflates to 2 GB.
// Every inflation stops with an error once its output would pass a limit -- the caller's (the IDX
// reader passes the size its header implies, data/idx.h) or kDefaultMaxInflatedBytes -- never
// inflating more than the limit plus the one byte that shows the limit was passed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mg::data {

// The raw bytes of `path`; throws mg::Error (with the OS's reason) if it can't be read.
// A file larger than `max_bytes` is an error naming it (its size is read first: nothing is allocated).
std::vector<uint8_t> read_file(const std::string& path, size_t max_bytes = SIZE_MAX);

// The most any inflation produces unless its caller passes a limit: 1 GiB (Fashion-MNIST's
// largest file is 47 MB).
constexpr size_t kDefaultMaxInflatedBytes = size_t(1) << 30;

// Decompresses gzip data (one or more concatenated members, as gzip(1) allows). `name` is used in
// error messages. Throws mg::Error when the output would exceed `max_output` bytes, and when the
// build has no zlib.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& name,
                            size_t max_output = kDefaultMaxInflatedBytes);

// Inflates a gzip stream piece by piece, so a reader can decide from the first bytes (a header)
// how many more it will accept. Holds a pointer to `compressed`, which must outlive it.
class GzipReader {
 public:
  GzipReader(const std::vector<uint8_t>& compressed, const std::string& name);
  ~GzipReader();
  GzipReader(const GzipReader&) = delete;
  GzipReader& operator=(const GzipReader&) = delete;

  // Appends up to `count` more decompressed bytes to `out` and returns how many; fewer than
  // `count` only at the end of the data (after its CRC and trailer were verified).
  size_t read(size_t count, std::vector<uint8_t>& out);
  // Whether the whole stream has been inflated and verified.
  bool at_end() const;
  // Decompressed bytes so far.
  size_t produced() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// read_file, then gunzip (with `max_output`) when the name ends in ".gz".
std::vector<uint8_t> read_maybe_gzipped(const std::string& path,
                                        size_t max_output = kDefaultMaxInflatedBytes);

// Whether this build can read .gz files (zlib was found at configure time).
bool has_gzip_support();

}  // namespace mg::data
