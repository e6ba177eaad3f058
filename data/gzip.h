// Reading a whole file into memory, and gunzipping it when it is a .gz.
//
// Datasets ship compressed (Debian's dataset-fashion-mnist installs *.gz), and they are small
// enough (tens of MB) to decompress into memory once at load time. zlib's inflate() does the
// decoding; this file adds the checks a loader needs so a damaged download fails with a reason:
// not a gzip stream, corrupt deflate data or CRC (zlib's own message), a stream cut short, or
// bytes after the last gzip member. Every message names the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mg::data {

// The raw bytes of `path`; throws mg::Error (with the OS's reason) if it can't be read.
std::vector<uint8_t> read_file(const std::string& path);

// Decompresses gzip data (one or more concatenated members, as gzip(1) allows). `name` is used in
// error messages. Throws mg::Error when the build has no zlib.
std::vector<uint8_t> gunzip(const std::vector<uint8_t>& compressed, const std::string& name);

// read_file, then gunzip when the name ends in ".gz".
std::vector<uint8_t> read_maybe_gzipped(const std::string& path);

// Whether this build can read .gz files (zlib was found at configure time).
bool has_gzip_support();

}  // namespace mg::data
