// Fuzzes the gzip reader (data/gzip.h) on arbitrary bytes -- the gzip header and flags, the
// deflate stream, the CRC-32 and ISIZE trailer, concatenated members, trailing garbage -- three
// ways, with a 64 KiB output limit so that a stream inflating past it is refused (mg::Error)
// instead of exhausting memory:
//   1. gunzip(bytes, name, limit), then parse_idx on what came out;
//   2. GzipReader in pieces of 1 to 4081 bytes, which must give exactly what gunzip gave (a differential
//   check:
//      both accept the same streams, with the same bytes);
//   3. read_idx on the bytes as a .gz file: the path a dataset takes (the IDX header first, then
//      at most the payload it implies).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "data/gzip.h"
#include "data/idx.h"
#include "fuzz_common.h"

namespace {

constexpr size_t kLimit =
    size_t(64) << 10;  // small: a fuzzer input inflating to MBs is slow, not interesting

const std::string& scratch_file() {
  static const std::string path = [] {
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(base) + "/mg_fuzz_gzip_" + std::to_string(::getpid()) + ".gz";
  }();
  static const bool cleanup = [] {
    static char command[256];
    std::snprintf(command, sizeof(command), "%s", path.c_str());
    std::atexit([] { std::remove(command); });
    return true;
  }();
  (void)cleanup;
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<uint8_t> compressed(data, data + size);

  std::optional<std::vector<uint8_t>> whole;
  mg::fuzz::expect_only_mg_error([&] {
    whole = mg::data::gunzip(compressed, "fuzz input", kLimit);
    MG_FUZZ_ASSERT(whole->size() <= kLimit, "gunzip keeps to its limit");
  });
  if (whole) mg::fuzz::expect_only_mg_error([&] { mg::data::parse_idx(*whole, "fuzz input (inflated)"); });

  // The same stream in pieces of 1 to 4081 bytes (the sizes from the input, so they vary).
  std::vector<uint8_t> pieces;
  bool pieces_complete = false;
  mg::fuzz::expect_only_mg_error([&] {
    mg::data::GzipReader reader(compressed, "fuzz input");
    size_t step = 0;
    while (!reader.at_end() && pieces.size() <= kLimit) {
      const size_t want = size == 0 ? 1 : 1 + size_t(data[step++ % size]) * 16;
      const size_t before = pieces.size();
      const size_t got = reader.read(want, pieces);
      MG_FUZZ_ASSERT(got <= want && pieces.size() == before + got, "read appends at most what was asked");
      MG_FUZZ_ASSERT(got == want || reader.at_end(), "a short read only at the end");
      MG_FUZZ_ASSERT(reader.produced() == pieces.size(), "produced() counts every byte");
    }
    pieces_complete = reader.at_end();
  });
  if (whole) {
    MG_FUZZ_ASSERT(pieces_complete && pieces == *whole, "GzipReader in pieces gives what gunzip gives");
  } else if (pieces_complete) {
    MG_FUZZ_ASSERT(pieces.size() > kLimit, "a stream GzipReader completes within the limit, gunzip accepts");
  }

  mg::fuzz::expect_only_mg_error([&] {
    {
      std::ofstream out(scratch_file(), std::ios::binary | std::ios::trunc);
      out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    }
    const mg::data::IdxArray array = mg::data::read_idx(scratch_file(), kLimit);
    MG_FUZZ_ASSERT(array.bytes.size() <= kLimit, "read_idx keeps to its limit");
  });
  return 0;
}
