// FashionMNIST and the IDX / gzip readers: the real files (when installed) and hand-made broken
// ones, each of which must fail with a message that names the file and the reason.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/fashion_mnist.h"
#include "data/gzip.h"
#include "data/idx.h"

#if defined(MG_HAS_ZLIB)
#include <zlib.h>
#endif

using namespace mg;
using namespace mg::data;
using Catch::Contains;
namespace fs = std::filesystem;

namespace {

// A fresh directory under /tmp, removed when the test ends.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() /
           ("mg_fmnist_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(v >> shift));
}

// An IDX file: magic, dims, then `payload` bytes (pattern b % 251 unless given).
std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims, size_t payload) {
  std::vector<uint8_t> out;
  put_be32(out, magic);
  for (uint32_t d : dims) put_be32(out, d);
  for (size_t b = 0; b < payload; ++b) out.push_back(uint8_t(b % 251));
  return out;
}

std::vector<uint8_t> images_idx(uint32_t n, size_t payload_delta = 0, bool shorter = false) {
  const size_t payload = size_t(n) * 28 * 28;
  return idx_bytes(0x00000803, {n, 28, 28}, shorter ? payload - payload_delta : payload + payload_delta);
}

std::vector<uint8_t> labels_idx(uint32_t n) {
  std::vector<uint8_t> out = idx_bytes(0x00000801, {n}, 0);
  for (uint32_t i = 0; i < n; ++i) out.push_back(uint8_t((i * 7) % 10));
  return out;
}

void write_raw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  REQUIRE(out.good());
}

#if defined(MG_HAS_ZLIB)
std::vector<uint8_t> gzip_bytes(const std::vector<uint8_t>& raw) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out(deflateBound(&zs, uLong(raw.size())) + 64);
  zs.next_in = const_cast<Bytef*>(raw.data());
  zs.avail_in = uInt(raw.size());
  zs.next_out = out.data();
  zs.avail_out = uInt(out.size());
  REQUIRE(deflate(&zs, Z_FINISH) == Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}
#endif

// Writes `bytes` as <dir>/<name>(.gz when gz) and returns the path.
std::string write_idx(const TempDir& dir, const std::string& name, const std::vector<uint8_t>& bytes,
                      bool gz) {
#if defined(MG_HAS_ZLIB)
  if (gz) {
    const std::string path = dir.file(name + ".gz");
    write_raw(path, gzip_bytes(bytes));
    return path;
  }
#else
  (void)gz;
#endif
  const std::string path = dir.file(name);
  write_raw(path, bytes);
  return path;
}

std::vector<bool> compression_modes() {
#if defined(MG_HAS_ZLIB)
  return {false, true};
#else
  return {false};
#endif
}

// Loading the pair must throw, and the message must contain every fragment (and name a file).
void require_load_error(const std::string& images, const std::string& labels, const std::string& bad_file,
                        const std::vector<std::string>& fragments) {
  try {
    load_fashion_mnist_files(images, labels);
    FAIL("expected an error mentioning " << fragments.front());
  } catch (const Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK_THAT(what, Contains(bad_file));
    for (const std::string& f : fragments) CHECK_THAT(what, Contains(f));
  }
}

}  // namespace

TEST_CASE("IDX parser reads a well-formed file", "[data][idx]") {
  IdxArray a = parse_idx(idx_bytes(0x00000803, {2, 3, 4}, 24), "mem");
  CHECK(a.type == 0x08);
  CHECK(a.dims == std::vector<int64_t>{2, 3, 4});
  CHECK(a.magic() == 0x00000803);
  REQUIRE(a.bytes.size() == 24);
  CHECK(a.bytes[23] == 23);
  CHECK(idx_magic_hex(0x803) == "0x00000803");
}

TEST_CASE("IDX parser rejects bad headers and lengths", "[data][idx]") {
  CHECK_THROWS_WITH(parse_idx({0, 0, 8}, "f.idx"), Contains("f.idx") && Contains("too short"));
  CHECK_THROWS_WITH(parse_idx(idx_bytes(0x12345678, {}, 0), "f.idx"),
                    Contains("f.idx") && Contains("bad IDX magic number 0x12345678"));
  CHECK_THROWS_WITH(parse_idx(idx_bytes(0x00000800, {}, 0), "f.idx"),
                    Contains("bad IDX magic number 0x00000800"));
  CHECK_THROWS_WITH(parse_idx(idx_bytes(0x00000803, {5, 5}, 0), "f.idx"),
                    Contains("truncated IDX header") && Contains("16 header bytes"));
  CHECK_THROWS_WITH(parse_idx(idx_bytes(0x00000801, {10}, 7), "f.idx"),
                    Contains("truncated IDX payload") && Contains("need 10 bytes") && Contains("got 7") &&
                        Contains("3 missing"));
  CHECK_THROWS_WITH(
      parse_idx(idx_bytes(0x00000801, {10}, 12), "f.idx"),
      Contains("trailing bytes") && Contains("need 10 bytes") && Contains("got 12") && Contains("2 extra"));
  // Multi-byte element types count their size: 3 i32 values are 12 bytes.
  CHECK(parse_idx(idx_bytes(0x00000C01, {3}, 12), "f").bytes.size() == 12);
  CHECK_THROWS_WITH(parse_idx(idx_bytes(0x00000C01, {3}, 3), "f"), Contains("need 12 bytes"));
}

TEST_CASE("IDX parser rejects dims whose payload overflows", "[data][idx][untrusted]") {
  // 2^31 x 256 x 2^25 bytes is 2^64, which wrapped to 0 and matched an empty payload.
  CHECK_THROWS_WITH(
      parse_idx(idx_bytes(0x00000803, {1u << 31, 256, 1u << 25}, 0), "f.idx"),
      Contains("f.idx") && Contains("2147483648 x 256 x 33554432") && Contains("overflows 64 bits"));
  // i32 elements: 2^31 x 2^31 x 4 bytes is 2^64 too.
  CHECK_THROWS_WITH(parse_idx(idx_bytes(0x00000C03, {1u << 31, 1u << 31, 1}, 0), "f.idx"),
                    Contains("overflows 64 bits"));
  // Representable but over the 1 TiB bound.
  CHECK_THROWS_WITH(parse_idx(idx_bytes(0x00000E02, {1u << 31, 1u << 10}, 0), "f.idx"),
                    Contains("implausibly large") && Contains("over 1 TiB"));
}

TEST_CASE("FashionMNIST loads hand-made IDX files, .gz and uncompressed", "[data][fashion_mnist]") {
  for (bool gz : compression_modes()) {
    INFO("gz = " << gz);
    TempDir dir;
    write_idx(dir, "t10k-images-idx3-ubyte", images_idx(5), gz);
    write_idx(dir, "t10k-labels-idx1-ubyte", labels_idx(5), gz);
    FashionMNIST ds(Split::Test, dir.path.string());
    REQUIRE(ds.size() == 5);
    CHECK(ds.images_path() == dir.file(gz ? "t10k-images-idx3-ubyte.gz" : "t10k-images-idx3-ubyte"));

    Example e = ds.get(3);
    CHECK(e.data.shape() == Shape{1, 28, 28});
    CHECK(e.data.dtype() == DType::f32);
    CHECK(e.target.dim() == 0);
    CHECK(e.target.dtype() == DType::i64);
    CHECK(e.target.item<int64_t>() == (3 * 7) % 10);
    std::vector<float> px = e.data.to_vector<float>();
    for (size_t p = 0; p < px.size(); p += 97) {
      CHECK(px[p] == Approx(double((3 * 784 + p) % 251) / 255.0));
    }

    Batch b = ds.get_batch({4, 0, 3});
    CHECK(b.data.shape() == Shape{3, 1, 28, 28});
    CHECK(b.target.to_vector<int64_t>() == std::vector<int64_t>{8, 0, 1});
    const std::vector<float> all = b.data.to_vector<float>();
    const std::vector<float> row2(all.begin() + 2 * 784, all.begin() + 3 * 784);
    CHECK(row2 == px);

    CHECK_THROWS_WITH(ds.get(5), Contains("index 5 is out of range [0, 5)"));
    CHECK_THROWS_WITH(ds.get_batch({0, -1}), Contains("index -1 is out of range"));
  }
}

TEST_CASE("FashionMNIST root: missing files, MG_FASHION_MNIST_DIR", "[data][fashion_mnist]") {
  TempDir dir;
  CHECK_THROWS_WITH(FashionMNIST(Split::Train, dir.path.string()),
                    Contains("cannot find") && Contains(dir.file("train-images-idx3-ubyte.gz")) &&
                        Contains("MG_FASHION_MNIST_DIR"));

  const char* old = std::getenv("MG_FASHION_MNIST_DIR");
  const std::string saved = old ? old : "";
  ::setenv("MG_FASHION_MNIST_DIR", dir.path.c_str(), 1);
  CHECK(FashionMNIST::default_root() == dir.path.string());
  ::unsetenv("MG_FASHION_MNIST_DIR");
  CHECK(FashionMNIST::default_root() == "/usr/share/datasets/fashion-mnist");
  if (old) ::setenv("MG_FASHION_MNIST_DIR", saved.c_str(), 1);
  CHECK(FashionMNIST::class_names()[9] == std::string("Ankle boot"));
}

TEST_CASE("FashionMNIST rejects corrupt IDX files with the reason", "[data][fashion_mnist]") {
  const bool gz = GENERATE(0, 1) == 1;
  if (gz && !has_gzip_support()) return;
  INFO("gz = " << gz);
  {
    TempDir dir;
    const std::string good_images = write_idx(dir, "good-images", images_idx(10), gz);
    const std::string good_labels = write_idx(dir, "good-labels", labels_idx(10), gz);
    REQUIRE(load_fashion_mnist_files(good_images, good_labels).count == 10);

    SECTION("bad magic") {
      auto bytes = images_idx(10);
      bytes[0] = 0x12;
      const std::string bad = write_idx(dir, "bad-magic", bytes, gz);
      require_load_error(bad, good_labels, bad, {"bad IDX magic number 0x12000803"});
      // A valid IDX file of the wrong kind: labels where images belong, and the other way round.
      require_load_error(good_labels, good_labels, good_labels,
                         {"expected an IDX image file (magic 0x00000803", "got 0x00000801"});
      require_load_error(good_images, good_images, good_images,
                         {"expected an IDX label file (magic 0x00000801", "got 0x00000803"});
    }
    SECTION("wrong dims") {
      const std::string bad =
          write_idx(dir, "bad-dims", idx_bytes(0x00000803, {10, 28, 27}, 10 * 28 * 27), gz);
      require_load_error(bad, good_labels, bad, {"expected 28 x 28 images", "10 x 28 x 27"});
    }
    SECTION("truncated payload") {
      const std::string bad = write_idx(dir, "truncated", images_idx(10, 100, /*shorter=*/true), gz);
      require_load_error(bad, good_labels, bad,
                         {"truncated IDX payload", "need 7840 bytes", "got 7740", "100 missing"});
    }
    SECTION("trailing garbage") {
      const std::string bad = write_idx(dir, "trailing", images_idx(10, 5), gz);
      require_load_error(bad, good_labels, bad, {"trailing bytes", "need 7840 bytes", "got 7845", "5 extra"});
    }
    SECTION("image and label counts disagree") {
      const std::string labels9 = write_idx(dir, "labels9", labels_idx(9), gz);
      require_load_error(good_images, labels9, labels9, {"has 10 images but", "has 9 labels"});
      CHECK_THROWS_WITH(load_fashion_mnist_files(good_images, labels9), Contains(good_images));
    }
    SECTION("label out of range") {
      auto bytes = labels_idx(10);
      bytes[8 + 4] = 12;  // header is 8 bytes; label 4
      const std::string bad = write_idx(dir, "label12", bytes, gz);
      require_load_error(good_images, bad, bad, {"label 12 at index 4 is outside [0, 9]"});
    }
    SECTION("empty file and missing file") {
      const std::string empty_file = dir.file("empty");
      write_raw(empty_file, {});
      require_load_error(empty_file, good_labels, empty_file, {"too short"});
      require_load_error(dir.file("nope"), good_labels, dir.file("nope"), {"cannot open"});
    }
  }
}

#if defined(MG_HAS_ZLIB)
TEST_CASE("gunzip rejects corrupt gzip data with zlib's reason", "[data][gzip]") {
  TempDir dir;
  const std::vector<uint8_t> raw = images_idx(10);
  const std::vector<uint8_t> gz = gzip_bytes(raw);
  CHECK(gunzip(gz, "x.gz") == raw);
  const std::string good_labels = write_idx(dir, "good-labels", labels_idx(10), true);

  SECTION("not gzip at all") {
    const std::string bad = dir.file("plain.gz");
    write_raw(bad, raw);  // uncompressed bytes under a .gz name
    require_load_error(bad, good_labels, bad, {"not a gzip file"});
  }
  SECTION("garbage after the gzip header") {
    std::vector<uint8_t> bytes(gz.begin(), gz.begin() + 10);  // a valid 10-byte gzip header
    for (int i = 0; i < 200; ++i) bytes.push_back(uint8_t(0xFF - i));
    const std::string bad = dir.file("garbage.gz");
    write_raw(bad, bytes);
    require_load_error(bad, good_labels, bad, {"corrupt gzip data (zlib: invalid"});
  }
  SECTION("CRC mismatch") {
    std::vector<uint8_t> bytes = gz;
    bytes[bytes.size() - 8] ^= 0x55;  // first byte of the CRC-32 trailer
    const std::string bad = dir.file("crc.gz");
    write_raw(bad, bytes);
    require_load_error(bad, good_labels, bad, {"corrupt gzip data (zlib: incorrect data check)"});
  }
  SECTION("truncated .gz") {
    const std::string bad = dir.file("cut.gz");
    write_raw(bad, std::vector<uint8_t>(gz.begin(), gz.begin() + gz.size() / 2));
    require_load_error(bad, good_labels, bad, {"gzip stream is truncated"});
  }
  SECTION("trailing bytes after the gzip member") {
    std::vector<uint8_t> bytes = gz;
    bytes.insert(bytes.end(), {1, 2, 3});
    const std::string bad = dir.file("tail.gz");
    write_raw(bad, bytes);
    require_load_error(bad, good_labels, bad, {"3 unexpected trailing bytes after gzip member 1"});
  }
  SECTION("concatenated members are one stream, as with gzip(1)") {
    const std::vector<uint8_t> first(raw.begin(), raw.begin() + 1000), second(raw.begin() + 1000, raw.end());
    std::vector<uint8_t> bytes = gzip_bytes(first);
    const std::vector<uint8_t> tail = gzip_bytes(second);
    bytes.insert(bytes.end(), tail.begin(), tail.end());
    CHECK(gunzip(bytes, "two.gz") == raw);
  }
}
#endif

#if defined(MG_HAS_ZLIB)
namespace {
// `zeros` zero bytes after `prefix`, gzipped at level 9 in 1 MiB pieces: 64 MiB become ~64 KB.
std::vector<uint8_t> gzip_bomb(const std::vector<uint8_t>& prefix, size_t zeros) {
  z_stream zs{};
  REQUIRE(deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<uint8_t> out, chunk(1 << 20), zero_block(1 << 20, 0);
  auto pump = [&](const uint8_t* data, size_t size, int flush) {
    zs.next_in = const_cast<Bytef*>(data);
    zs.avail_in = uInt(size);
    int rc;
    do {
      zs.next_out = chunk.data();
      zs.avail_out = uInt(chunk.size());
      rc = deflate(&zs, flush);
      REQUIRE(rc != Z_STREAM_ERROR);
      out.insert(out.end(), chunk.data(), chunk.data() + (chunk.size() - zs.avail_out));
    } while (zs.avail_out == 0 || (flush == Z_FINISH && rc != Z_STREAM_END));
  };
  pump(prefix.data(), prefix.size(), Z_NO_FLUSH);
  for (size_t left = zeros; left > 0;) {
    const size_t n = std::min(left, zero_block.size());
    pump(zero_block.data(), n, Z_NO_FLUSH);
    left -= n;
  }
  pump(nullptr, 0, Z_FINISH);
  deflateEnd(&zs);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

TEST_CASE("gunzip stops a decompression bomb at its size limit", "[data][gzip][untrusted]") {
  const size_t inflated = size_t(64) << 20;
  const std::vector<uint8_t> bomb = gzip_bomb({}, inflated);
  INFO(bomb.size() << " compressed bytes inflate to " << inflated);
  CHECK(bomb.size() < inflated / 500);
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(gunzip(bomb, "bomb.gz", size_t(1) << 20),
                    Contains("bomb.gz") && Contains("inflates to more than 1048576 bytes"));
  CHECK(seconds_since(start) < 1.0);
  // The limit is exact: a stream of exactly `limit` bytes inflates, one byte less refuses it.
  const std::vector<uint8_t> small = gzip_bytes(images_idx(3));
  CHECK(gunzip(small, "small.gz", images_idx(3).size()) == images_idx(3));
  CHECK_THROWS_WITH(gunzip(small, "small.gz", images_idx(3).size() - 1), Contains("inflates to more than"));
  CHECK(kDefaultMaxInflatedBytes == size_t(1) << 30);
}

TEST_CASE("read_idx inflates no more than its IDX header implies", "[data][idx][gzip][untrusted]") {
  TempDir dir;
  // An IDX header for 16 bytes, then 64 MiB: the reader stops 4 KiB past the 24 bytes implied.
  const std::string bomb = dir.file("bomb-idx1-ubyte.gz");
  write_raw(bomb, gzip_bomb(idx_bytes(0x00000801, {16}, 0), size_t(64) << 20));
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(read_idx(bomb),
                    Contains(bomb) && Contains("inflates past the 24 bytes its IDX header implies"));
  CHECK(seconds_since(start) < 1.0);
  // A header announcing more than the per-file limit is refused before its payload is inflated.
  const std::string big = dir.file("big-idx2-ubyte.gz");
  write_raw(big, gzip_bytes(idx_bytes(0x00000802, {1u << 20, 1u << 11}, 0)));
  CHECK_THROWS_WITH(read_idx(big), Contains(big) && Contains("over the 1073741824-byte limit"));
  CHECK_THROWS_WITH(read_idx(big, size_t(1) << 20), Contains("over the 1048576-byte limit"));
  // A well-formed .gz reads as before.
  const std::string good = dir.file("good-idx1-ubyte.gz");
  write_raw(good, gzip_bytes(labels_idx(7)));
  CHECK(read_idx(good).bytes.size() == 7);
}

namespace {
// A line "<key>: <n> kB" of /proc/self/status, in bytes (-1 when not there: not Linux).
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + ":") == 0)
      return std::atoll(line.c_str() + key.size() + 1) * 1024;
  return -1;
}
}  // namespace

TEST_CASE("read_idx of a .gz holds the payload once: its slack read does not reallocate",
          "[data][idx][gzip][untrusted]") {
  // 128 MiB announced and 100 bytes more inflated (trailing bytes): the buffer was reserved for the
  // payload exactly, so the slack read grew it to twice that (2.26 GB peak near the 1 GiB cap).
  TempDir dir;
  const uint32_t n = uint32_t(128) << 20;
  const std::vector<uint8_t> header = {
      0, 0, 0x08, 1, uint8_t(n >> 24), uint8_t(n >> 16), uint8_t(n >> 8), uint8_t(n)};
  const std::string path = dir.file("trailing-idx1-ubyte.gz");
  write_raw(path, gzip_bomb(header, size_t(n) + 100));
  // The peak resident memory (VmHWM) is reset by writing 5 to clear_refs (Linux >= 4.0).
  if (!(std::ofstream("/proc/self/clear_refs") << "5") || status_bytes("VmHWM") < 0) {
    WARN("cannot reset this process's peak resident memory: the peak is not measured");
    return;
  }
  const int64_t before = status_bytes("VmRSS");
  CHECK_THROWS_WITH(read_idx(path), Contains(path) && Contains("trailing bytes") && Contains("100 extra"));
  const int64_t grew = status_bytes("VmHWM") - before;
  INFO("peak resident memory grew by " << grew << " bytes for a " << n << "-byte payload");
  CHECK(grew < int64_t(n) * 3 / 2);
}
#endif

// ---- the real dataset (Debian's dataset-fashion-mnist), when installed ------------------------

namespace {
bool real_files_present() {
  const std::string root = FashionMNIST::default_root();
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"}) {
    const bool gz = fs::exists(root + "/" + f + ".gz") && has_gzip_support();
    if (!gz && !fs::exists(root + "/" + f)) return false;
  }
  return true;
}

// The first `count` labels, read straight from the file with zlib's gzread (not our reader).
std::vector<int64_t> first_labels_independently(const std::string& path, int count) {
  std::vector<unsigned char> buf(size_t(8 + count));
#if defined(MG_HAS_ZLIB)
  gzFile f = gzopen(path.c_str(), "rb");  // also reads uncompressed files transparently
  REQUIRE(f != nullptr);
  REQUIRE(gzread(f, buf.data(), unsigned(buf.size())) == int(buf.size()));
  gzclose(f);
#else
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(buf.data()), std::streamsize(buf.size()));
  REQUIRE(in.gcount() == std::streamsize(buf.size()));
#endif
  REQUIRE(buf[2] == 0x08);
  REQUIRE(buf[3] == 0x01);
  return std::vector<int64_t>(buf.begin() + 8, buf.end());
}
}  // namespace

TEST_CASE("FashionMNIST reads the installed dataset", "[data][fashion_mnist][real]") {
  // The data is found as FashionMNIST finds it: $MG_FASHION_MNIST_DIR, else Debian's install path
  // (dataset-fashion-mnist, which ./scripts/test installs). Missing data fails the test; a machine
  // that cannot have it says so explicitly with MG_ALLOW_MISSING_DATASET=1.
  if (!real_files_present()) {
    const char* allow = std::getenv("MG_ALLOW_MISSING_DATASET");
    if (allow && std::string(allow) == "1") {
      WARN("Fashion-MNIST not installed under " << FashionMNIST::default_root()
                                                << "; skipped (MG_ALLOW_MISSING_DATASET=1)");
      return;
    }
    FAIL("Fashion-MNIST is not installed under "
         << FashionMNIST::default_root()
         << (has_gzip_support() ? "" : " (or only as .gz, and this build has no zlib)")
         << ": install Debian's dataset-fashion-mnist or set MG_FASHION_MNIST_DIR; on a machine that cannot "
            "have it, set MG_ALLOW_MISSING_DATASET=1 to skip this test");
  }
  for (Split split : {Split::Train, Split::Test}) {
    FashionMNIST ds(split);
    const int64_t expected = split == Split::Train ? 60000 : 10000;
    REQUIRE(ds.size() == expected);
    CHECK(ds.pixels().size() == size_t(expected) * 784);

    const std::vector<int64_t> labels = first_labels_independently(ds.labels_path(), 100);
    std::vector<int64_t> ours;
    for (int64_t i = 0; i < 100; ++i) ours.push_back(ds.get(i).target.item<int64_t>());
    CHECK(ours == labels);

    // The batch fast path agrees with get(), pixel for pixel.
    Batch b = ds.get_batch({0, expected - 1});
    CHECK(b.target.to_vector<int64_t>() == std::vector<int64_t>{ds.get(0).target.item<int64_t>(),
                                                                ds.get(expected - 1).target.item<int64_t>()});
    std::vector<float> batch_px = b.data.to_vector<float>(),
                       last = ds.get(expected - 1).data.to_vector<float>();
    CHECK(std::vector<float>(batch_px.begin() + 784, batch_px.end()) == last);

    // Pixels are in [0, 1], and the training mean is the documented kMean.
    if (split == Split::Train) {
      double sum = 0;
      for (uint8_t p : ds.pixels()) sum += p;
      CHECK(sum / double(ds.pixels().size()) / 255.0 == Approx(FashionMNIST::kMean).margin(5e-4));
    }
  }
}
