// safetensors round trips, a file written by another program, atomic writes,
// and rejection of truncated or tampered files.
#include <unistd.h>
#include <catch2/catch.hpp>
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
  REQUIRE(crc32c(nullptr, 0) == 0u);
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
