// safetensors round trips, a file written by another program, atomic writes,
// and rejection of truncated or tampered files.
#include <unistd.h>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "core/crc32c.h"
#include "core/safetensors.h"
#include "multigrad.h"

#ifndef MG_TEST_FIXTURES_DIR
#define MG_TEST_FIXTURES_DIR "tests/fixtures"
#endif

using namespace mg;

namespace {
std::string temp_path(const std::string& name) {
  return "/tmp/mg_test_" + std::to_string(::getpid()) + "_" + name;
}
std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}
bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// A safetensors file built by hand: the 8-byte little-endian header length, the header, the data.
std::string crafted(const std::string& header, const std::string& data = "") {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xff));
  return bytes + header + data;
}

// decode_safetensors must throw mg::Error; returns the message (which must name `what`).
std::string decode_error(const std::string& bytes, const SafetensorsLoadOptions& options = {}) {
  const std::string what = "crafted.safetensors";
  try {
    decode_safetensors(bytes, what, options);
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::Contains(what));
    return message;
  }
  FAIL("a crafted file decoded without an error");
  return "";
}

std::string checksum_hex(const std::string& bytes) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc32c(bytes.data(), bytes.size()));
  return text;
}
}  // namespace

TEST_CASE("safetensors round-trips every dtype, shape and metadata", "[safetensors]") {
  manual_seed(3);
  StateDict dict;
  dict["a.f32"] = randn({3, 4});
  dict["b.f64"] = randn({2}, TensorOptions{DType::f64});
  dict["c.f16"] = randn({5}).to(DType::f16);
  dict["d.bf16"] = randn({2, 2}).to(DType::bf16);
  dict["e.i32"] = tensor<int32_t>({1, -2, 3}, {3}, TensorOptions{DType::i32});
  dict["f.i64"] = scalar_tensor(7, TensorOptions{DType::i64});
  dict["g.bool"] = tensor<bool>({true, false}, {2}, TensorOptions{DType::boolean});
  dict["h.empty"] = zeros({0, 3});
  dict["i.transposed"] = randn({3, 2}).t();  // non-contiguous input is written row-major
  const std::string path = temp_path("roundtrip.safetensors");
  save_safetensors(path, dict, {{"step", "12"}, {"note", "hello"}});
  SafetensorsFile file = load_safetensors(path);
  REQUIRE(file.metadata.at("step") == "12");
  REQUIRE(file.metadata.at("note") == "hello");
  REQUIRE(file.tensors.size() == dict.size());
  for (const auto& [name, t] : dict) {
    const Tensor& back = file.tensors.at(name);
    INFO(name);
    REQUIRE(back.shape() == t.shape());
    REQUIRE(back.dtype() == t.dtype());
    REQUIRE(back.to_vector<double>() == t.to_vector<double>());
  }
  REQUIRE_FALSE(file_exists(path + ".tmp." + std::to_string(::getpid())));
  std::remove(path.c_str());
}

TEST_CASE("safetensors reads a file written by another program", "[safetensors]") {
  SafetensorsFile file = load_safetensors(MG_TEST_FIXTURES_DIR "/fixture.safetensors");
  REQUIRE(file.metadata.at("epoch") == "3");
  REQUIRE(file.tensors.at("linear.weight").shape() == Shape{2, 3});
  REQUIRE(file.tensors.at("linear.weight").to_vector<float>() ==
          std::vector<float>{0.5f, -1.25f, 2.0f, 3.5f, -0.125f, 1e-3f});
  REQUIRE(file.tensors.at("linear.bias").to_vector<double>() == std::vector<double>{0.1, -0.2});
  REQUIRE(file.tensors.at("step").item<int64_t>() == 42);
  REQUIRE(file.tensors.at("mask").to_vector<bool>() == std::vector<bool>{true, false, false, true});
  REQUIRE(file.tensors.at("half").to_vector<float>() == std::vector<float>{1.0f, -2.5f, 65504.0f});
  REQUIRE(file.tensors.at("counts").to_vector<int32_t>() == std::vector<int32_t>{1, -2, 3, -4});
  REQUIRE(file.tensors.at("bf16").to_vector<float>() == std::vector<float>{1.0f, -3.0f, 0.15625f});
}

TEST_CASE("safetensors rejects truncated and tampered files with the reason", "[safetensors]") {
  StateDict dict{{"w", ones({4, 4})}, {"b", zeros({4})}};
  const std::string path = temp_path("good.safetensors"), bad = temp_path("bad.safetensors");
  save_safetensors(path, dict);
  const std::string good = read_bytes(path);

  SECTION("truncated data") {
    write_bytes(bad, good.substr(0, good.size() - 5));
    REQUIRE_THROWS_WITH(load_safetensors(bad), Catch::Contains("truncated") && Catch::Contains(bad));
  }
  SECTION("truncated header") {
    write_bytes(bad, good.substr(0, 20));
    REQUIRE_THROWS_WITH(load_safetensors(bad), Catch::Contains("header length"));
  }
  SECTION("shorter than 8 bytes") {
    write_bytes(bad, "abc");
    REQUIRE_THROWS_WITH(load_safetensors(bad), Catch::Contains("not a safetensors file"));
  }
  SECTION("trailing bytes") {
    write_bytes(bad, good + "XXXX");
    REQUIRE_THROWS_WITH(load_safetensors(bad), Catch::Contains("unexpected bytes"));
  }
  SECTION("a tampered dtype no longer matches the byte count") {
    std::string t = good;
    const size_t at = t.find("\"F32\"");
    REQUIRE(at != std::string::npos);
    t.replace(at, 5, "\"F64\"");
    write_bytes(bad, t);
    REQUIRE_THROWS_WITH(load_safetensors(bad), Catch::Contains("needs") && Catch::Contains("bytes"));
  }
  SECTION("a broken JSON header") {
    std::string t = good;
    t[8] = '[';
    write_bytes(bad, t);
    REQUIRE_THROWS_WITH(load_safetensors(bad), Catch::Contains("JSON"));
  }
  SECTION("an unknown dtype") {
    std::string t = good;
    const size_t at = t.find("\"F32\"");
    t.replace(at, 5, "\"U99\"");
    write_bytes(bad, t);
    REQUIRE_THROWS_WITH(load_safetensors(bad), Catch::Contains("unsupported dtype"));
  }
  SECTION("a missing file") {
    REQUIRE_THROWS_WITH(load_safetensors(temp_path("nope.safetensors")), Catch::Contains("cannot open"));
  }
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("an atomic write that fails leaves the previous file intact", "[safetensors]") {
  const std::string path = temp_path("keep.safetensors");
  save_safetensors(path, {{"w", ones({2})}});
  const std::string before = read_bytes(path);
  // An undefined tensor fails during serialisation, before anything is renamed.
  REQUIRE_THROWS(save_safetensors(path, {{"w", Tensor()}}));
  REQUIRE(read_bytes(path) == before);
  // A destination in a missing directory fails to create the temp file.
  REQUIRE_THROWS_WITH(save_safetensors("/nonexistent_dir_mg/x.safetensors", {{"w", ones({2})}}),
                      Catch::Contains("cannot create"));
  std::remove(path.c_str());
}

TEST_CASE("crc32c is the standard CRC-32C, hardware and table paths alike", "[safetensors]") {
  const std::string check_string = "123456789";
  REQUIRE(crc32c(check_string.data(), check_string.size()) == 0xE3069283u);
  REQUIRE(crc32c_software(check_string.data(), check_string.size()) == 0xE3069283u);
  REQUIRE(crc32c(nullptr, 0) == 0u);
  REQUIRE(crc32c_software(nullptr, 0) == 0u);
  // Both implementations, called directly, on every length 0..300 at every alignment 0..15, and
  // continued from a nonzero state: the table path runs here even on a CPU with SSE4.2.
  std::vector<unsigned char> data(300 + 16);
  uint32_t x = 12345;
  for (auto& b : data) b = static_cast<unsigned char>((x = x * 1103515245u + 12345u) >> 24);
  const bool hardware = crc32c_hardware_available();
  INFO("SSE4.2 crc32 available: " << hardware);
  for (size_t align = 0; align < 16; ++align) {
    for (size_t length = 0; length <= 300; ++length) {
      const unsigned char* p = data.data() + align;
      const uint32_t software = crc32c_software(p, length),
                     continued = crc32c_software(p, length, 0xdeadbeefu);
      REQUIRE(crc32c(p, length) == software);
      REQUIRE(crc32c(p, length, 0xdeadbeefu) == continued);
      if (hardware) {
        REQUIRE(crc32c_hardware(p, length) == software);
        REQUIRE(crc32c_hardware(p, length, 0xdeadbeefu) == continued);
      }
    }
  }
  if (!hardware) REQUIRE_THROWS_WITH(crc32c_hardware(data.data(), 1), Catch::Contains("SSE4.2"));
  // Any split continues the same checksum (the 8-byte and 1-byte steps agree).
  std::string long_text;
  for (int i = 0; i < 1000; ++i) long_text.push_back(static_cast<char>(i * 37 + 11));
  const uint32_t whole = crc32c(long_text.data(), long_text.size());
  for (size_t cut : {size_t(1), size_t(7), size_t(8), size_t(501), size_t(999)})
    REQUIRE(crc32c(long_text.data() + cut, long_text.size() - cut, crc32c(long_text.data(), cut)) == whole);
}

TEST_CASE("every tensor's bytes are checksummed: a 64-byte overwrite is an error naming the tensor",
          "[safetensors]") {
  const std::string path = temp_path("checksummed.safetensors");
  StateDict dict;
  dict["weight"] = arange(0, 256).reshape({16, 16});
  dict["bias"] = ones({16});
  save_safetensors(path, dict, {{"step", "7"}});
  const std::string good = read_bytes(path);
  // The checksums are ordinary string metadata (PyTorch loads the file), hidden from the reader.
  REQUIRE(good.find("\"crc32c:weight\"") != std::string::npos);
  SafetensorsFile loaded = load_safetensors(path);
  REQUIRE(loaded.metadata == SafetensorsMetadata{{"step", "7"}});

  // Overwrite 64 bytes inside "weight" (after "bias": tensors are laid out in name order).
  std::string bad = good;
  const size_t data_start = bad.size() - 256 * 4;
  for (size_t i = 0; i < 64; ++i) bad[data_start + 100 + i] = static_cast<char>(0x7f);
  write_bytes(path, bad);
  try {
    load_safetensors(path);
    FAIL("a corrupt tensor loaded");
  } catch (const Error& e) {
    const std::string message = e.what();
    REQUIRE(message.find(path) != std::string::npos);
    REQUIRE(message.find("tensor 'weight' is corrupt") != std::string::npos);
  }
  // A checksum key for a tensor that is not there, and a reserved key from the caller.
  REQUIRE_THROWS_WITH(save_safetensors(path, dict, {{"crc32c:weight", "0"}}),
                      Catch::Contains("reserved for the per-tensor checksums"));
  std::remove(path.c_str());
}

TEST_CASE("safetensors rejects shapes whose byte count overflows, naming the file and the tensor",
          "[safetensors][untrusted]") {
  // [2^62] F32 is 2^64 bytes, which wraps to 0 and matched data_offsets [0, 0] before the fix.
  std::string m =
      decode_error(crafted(R"({"huge":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})"));
  CHECK_THAT(m, Catch::Contains("'huge'") && Catch::Contains("[4611686018427387904]"));
  // [2^32, 2^32]: the element count itself overflows (signed: it was undefined behaviour).
  m = decode_error(crafted(R"({"t":{"dtype":"BF16","shape":[4294967296,4294967296],"data_offsets":[0,0]}})"));
  CHECK_THAT(m, Catch::Contains("'t'") && Catch::Contains("overflows"));
  // numel fits, numel * 8 does not.
  m = decode_error(crafted(R"({"t":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,0]}})"));
  CHECK_THAT(m, Catch::Contains("'t'") && Catch::Contains("64 bits"));
  // A dimension beyond int64 (nlohmann reads it as a u64).
  m = decode_error(crafted(R"({"t":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})"));
  CHECK_THAT(m, Catch::Contains("'t'") && Catch::Contains("too large"));
}

TEST_CASE("safetensors rejects dims that are negative or not integers", "[safetensors][untrusted]") {
  for (const std::string dim : {"-1", "2.0", "2.5", "\"2\"", "true", "null", "[2]", "{}"}) {
    INFO("dim " << dim);
    const std::string m2 = decode_error(
        crafted(R"({"t":{"dtype":"BOOL","shape":[)" + dim + R"(],"data_offsets":[0,2]}})", "ab"));
    CHECK_THAT(m2,
               Catch::Contains("'t'") && (Catch::Contains("negative") || Catch::Contains("not an integer")));
  }
}

TEST_CASE("safetensors rejects bad data_offsets: reversed, out of range, wrong size, overlapping",
          "[safetensors][untrusted]") {
  const std::string eight(8, '\0');
  std::string m = decode_error(crafted(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", eight));
  CHECK_THAT(m, Catch::Contains("'t'") && Catch::Contains("begin after they end"));
  m = decode_error(crafted(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", eight));
  CHECK_THAT(m, Catch::Contains("'t'") && Catch::Contains("outside the 8-byte data buffer"));
  m = decode_error(crafted(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", eight));
  CHECK_THAT(m, Catch::Contains("'t'") && Catch::Contains("needs 4 bytes but data_offsets span 8"));
  for (const std::string offsets : {"[-4,0]", "[0]", "[0,4,8]", "[0.0,4]", "\"0,4\"", "[0,\"4\"]"}) {
    INFO("offsets " << offsets);
    m = decode_error(crafted(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":)" + offsets + "}}", eight));
    CHECK_THAT(m, Catch::Contains("'t'") && Catch::Contains("bad data_offsets"));
  }
  // Two tensors over the same bytes: one allocation each, from 8 bytes of file -- refused.
  m = decode_error(crafted(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
                           eight));
  CHECK_THAT(m, Catch::Contains("overlap") && Catch::Contains("'a'") && Catch::Contains("'b'"));
  m = decode_error(crafted(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           eight));
  CHECK_THAT(m, Catch::Contains("overlap"));
  m = decode_error(crafted(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", eight));
  CHECK_THAT(m, Catch::Contains("gap of 4 bytes before tensor 'a'"));
  // A header length beyond the file.
  std::string cut = crafted(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "abcd");
  m = decode_error(cut.substr(0, 20));
  CHECK_THAT(m, Catch::Contains("header length") && Catch::Contains("runs past the end"));
  // The well-formed version of the same file loads.
  CHECK(decode_safetensors(cut).tensors.at("a").numel() == 1);
}

TEST_CASE("a header nested a million levels deep is an error, not a stack overflow",
          "[safetensors][untrusted]") {
  const size_t depth = 1000000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  const std::string header = R"({"t":{"dtype":)" + nested + R"(,"shape":[],"data_offsets":[0,0]}})";
  const auto start = std::chrono::steady_clock::now();
  const std::string m = decode_error(crafted(header));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK_THAT(m, Catch::Contains("nests [ and { deeper than 64 levels"));
  CHECK(seconds < 2.0);
  // Objects count too; brackets inside strings do not.
  CHECK_THAT(decode_error(crafted(std::string(100, '{') + std::string(100, '}'))),
             Catch::Contains("deeper than 64"));
  const std::string in_string = R"({"__metadata__":{"note":")" + std::string(1000, '[') + R"("}})";
  CHECK(decode_safetensors(crafted(in_string)).metadata.at("note") == std::string(1000, '['));
  // The bound is 64: an unknown key nested to exactly 64 levels is accepted, 65 is not.
  auto with_extra = [](int levels) {  // the header and the entry are 2 levels
    return crafted(R"({"t":{"dtype":"F32","shape":[],"data_offsets":[0,4],"x":)" + std::string(levels, '[') +
                       std::string(levels, ']') + "}}",
                   "abcd");
  };
  CHECK(decode_safetensors(with_extra(kMaxSafetensorsHeaderDepth - 2)).tensors.size() == 1);
  CHECK_THAT(decode_error(with_extra(kMaxSafetensorsHeaderDepth - 1)), Catch::Contains("deeper than 64"));
}

TEST_CASE("the header is checksummed: a changed shape, dtype or metadata value is an error",
          "[safetensors]") {
  const std::string path = temp_path("header.safetensors");
  save_safetensors(path, {{"weight", arange(0, 256).reshape({16, 16})}}, {{"step", "7"}});
  const std::string good = read_bytes(path);
  REQUIRE(good.find("\"crc32c:__header__\":\"") != std::string::npos);
  CHECK(load_safetensors(path).metadata == SafetensorsMetadata{{"step", "7"}});

  SECTION("a reshaped tensor: same bytes, so its own checksum still matches") {
    std::string bad = good;
    const size_t at = bad.find("[16,16]");
    REQUIRE(at != std::string::npos);
    bad.replace(at, 7, "[4,64] ");  // same length, still valid JSON, still 256 elements
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(load_safetensors(path),
                        Catch::Contains(path) && Catch::Contains("the header is corrupt"));
  }
  SECTION("a changed metadata value") {
    std::string bad = good;
    const size_t at = bad.find("\"step\":\"7\"");
    REQUIRE(at != std::string::npos);
    bad[at + 8] = '8';
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(load_safetensors(path), Catch::Contains("the header is corrupt"));
  }
  SECTION("a changed header checksum") {
    std::string bad = good;
    const size_t at = bad.find("\"crc32c:__header__\":\"") + std::string("\"crc32c:__header__\":\"").size();
    bad[at] = bad[at] == '0' ? '1' : '0';
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(load_safetensors(path), Catch::Contains("the header is corrupt"));
  }
  SECTION("the key spelled differently (a \\u escape) cannot stand in for it") {
    std::string bad = good;
    const size_t at = bad.find("crc32c:__header__");
    bad.replace(at, 17, "crc32c:\\u005f_header__");  // 5 bytes longer: fix the header length
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bad[i])) << (8 * i);
    n += 5;
    for (int i = 0; i < 8; ++i) bad[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    write_bytes(path, bad);
    REQUIRE_THROWS_WITH(load_safetensors(path), Catch::Contains("not stored as written"));
  }
  REQUIRE_THROWS_WITH(save_safetensors(path, {{"__header__", ones({1})}}), Catch::Contains("reserved"));
  // Nor may a file name a tensor so by spelling it with escapes (no checksums: they are optional).
  {
    std::string header = R"({"\u005f\u005fheader__":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    header += std::string((8 - header.size() % 8) % 8, ' ');
    std::string bytes;
    for (int i = 0; i < 8; ++i) bytes += static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xff);
    bytes += header + std::string(4, '\0');
    write_bytes(path, bytes);
    REQUIRE_THROWS_WITH(load_safetensors(path),
                        Catch::Contains("named '__header__'") && Catch::Contains("reserved"));
  }
  std::remove(path.c_str());
}

TEST_CASE("require_checksums refuses files without them; by default they load unverified", "[safetensors]") {
  const SafetensorsLoadOptions strict{/*require_checksums=*/true};
  // PyTorch's files carry no checksums.
  const std::string fixture = MG_TEST_FIXTURES_DIR "/fixture.safetensors";
  CHECK(load_safetensors(fixture).tensors.size() == 7);
  REQUIRE_THROWS_WITH(load_safetensors(fixture, strict),
                      Catch::Contains(fixture) && Catch::Contains("checksums are required"));
  // Ours carry both kinds and pass.
  const std::string path = temp_path("strict.safetensors");
  save_safetensors(path, {{"w", ones({3})}, {"b", zeros({2})}});
  CHECK(load_safetensors(path, strict).tensors.size() == 2);
  CHECK(decode_safetensors(encode_safetensors({{"w", ones({3})}}), "bytes", strict).tensors.size() == 1);
  std::remove(path.c_str());

  const std::string data(4, '\0');
  const std::string tensor_checksum = checksum_hex(data);
  // Per-tensor checksums, no header checksum (a file whose header key was stripped).
  const std::string no_header_sum = crafted(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                            R"("__metadata__":{"crc32c:a":")" +
                                                tensor_checksum + R"("}})",
                                            data);
  CHECK(decode_safetensors(no_header_sum).tensors.size() == 1);
  CHECK_THAT(decode_error(no_header_sum, strict), Catch::Contains("header has no checksum"));
  // No checksums at all.
  const std::string none = crafted(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data);
  CHECK(decode_safetensors(none).tensors.size() == 1);
  CHECK_THAT(decode_error(none, strict), Catch::Contains("checksum"));
  // A tensor's checksum stripped: the header checksum catches the edit...
  save_safetensors(path, {{"w", ones({3})}, {"b", zeros({2})}});
  std::string stripped = read_bytes(path);
  const size_t key = stripped.find("\"crc32c:b\":\"");
  REQUIRE(key != std::string::npos);
  stripped.replace(key + 1, 8, "nocheck:");  // same length: "nocheck:b" is plain metadata now
  CHECK_THAT(decode_error(stripped), Catch::Contains("the header is corrupt"));
  // ...and with the header checksum recomputed, the missing tensor checksum is still refused.
  const std::string token = "\"crc32c:__header__\":\"";
  const size_t digits = stripped.find(token) + token.size();
  std::string header = stripped.substr(8, stripped.size() - 8 - 5 * 4);  // two tensors: 3 + 2 floats
  header.replace(digits - 8, 8, "00000000");
  stripped.replace(digits, 8, checksum_hex(header));
  CHECK_THAT(decode_error(stripped), Catch::Contains("1 of 2 tensors have no checksum"));
  CHECK_THAT(decode_error(stripped, strict), Catch::Contains("checksums are required"));
  std::remove(path.c_str());
}
