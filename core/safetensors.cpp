#include "core/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "core/crc32c.h"
#include "core/files.h"
#include "core/grad_mode.h"

namespace mg {
namespace {

using json = nlohmann::json;

// Each tensor's CRC32C goes in __metadata__ as "crc32c:<tensor name>": "<8 hex digits>" (strings,
// as the format requires, so PyTorch's safetensors loads the file and ignores them). Loading
// verifies them and leaves them out of SafetensorsFile::metadata.
const std::string kChecksumPrefix = "crc32c:";

std::string checksum_text(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
}

void verify_checksums(SafetensorsFile& file,
                      const std::map<std::string, std::pair<uint64_t, uint64_t>>& tensor_bytes,
                      const char* buffer, const std::string& path) {
  size_t verified = 0;
  for (auto it = file.metadata.begin(); it != file.metadata.end();) {
    if (it->first.compare(0, kChecksumPrefix.size(), kChecksumPrefix) != 0) {
      ++it;
      continue;
    }
    const std::string name = it->first.substr(kChecksumPrefix.size());
    auto bytes = tensor_bytes.find(name);
    MG_CHECK(bytes != tensor_bytes.end(), path, ": __metadata__ has a checksum for tensor '", name,
          "', which the file does not hold");
    const auto [begin, end] = bytes->second;
    const std::string actual = checksum_text(crc32c(buffer + begin, end - begin));
    MG_CHECK(actual == it->second, path, ": tensor '", name, "' is corrupt: its ", end - begin,
          " bytes have CRC32C ", actual, " but the file recorded ", it->second);
    ++verified;
    it = file.metadata.erase(it);
  }
  // A file with checksums must have one for every tensor (else a tensor could be swapped in).
  MG_CHECK(verified == 0 || verified == tensor_bytes.size(), path, ": ", tensor_bytes.size() - verified, " of ",
        tensor_bytes.size(), " tensors have no checksum in __metadata__");
}

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::boolean: return "BOOL";
  }
  return "?";
}

bool parse_safetensors_dtype(const std::string& name, DType& out) {
  static const std::map<std::string, DType> table = {
      {"F32", DType::f32}, {"F64", DType::f64}, {"F16", DType::f16},     {"BF16", DType::bf16},
      {"I32", DType::i32}, {"I64", DType::i64}, {"BOOL", DType::boolean}};
  auto it = table.find(name);
  if (it == table.end()) return false;
  out = it->second;
  return true;
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

void save_safetensors(const std::string& path, const StateDict& tensors,
                      const SafetensorsMetadata& metadata) {
  write_file_atomically(path, encode_safetensors(tensors, metadata));
}

std::string encode_safetensors(const StateDict& tensors, const SafetensorsMetadata& metadata) {
  json header = json::object();
  SafetensorsMetadata meta = metadata;
  for (const auto& [key, value] : metadata)
    MG_CHECK(key.compare(0, kChecksumPrefix.size(), kChecksumPrefix) != 0, "save_safetensors: metadata key '",
          key, "' uses the prefix '", kChecksumPrefix, "' reserved for the per-tensor checksums");
  std::vector<Tensor> host;
  size_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    MG_CHECK(tensor.defined(), "save_safetensors: tensor '", name, "' is undefined");
    MG_CHECK(name != "__metadata__", "save_safetensors: '__metadata__' is reserved and cannot name a tensor");
    Tensor h;
    {
      NoGradGuard no_grad;
      h = tensor.detach().to(Device::cpu()).contiguous();
    }
    header[name] = {{"dtype", safetensors_dtype(h.dtype())},
                    {"shape", h.shape()},
                    {"data_offsets", {offset, offset + h.nbytes()}}};
    offset += h.nbytes();
    meta[kChecksumPrefix + name] = checksum_text(crc32c(h.data_ptr(), h.nbytes()));
    host.push_back(h);
  }
  if (!meta.empty()) header["__metadata__"] = meta;
  std::string header_text = header.dump();
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');  // align the buffer to 8 bytes
  std::string bytes;
  bytes.reserve(8 + header_text.size() + offset);
  uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header_text;
  for (const Tensor& h : host) bytes.append(static_cast<const char*>(h.data_ptr()), h.nbytes());
  return bytes;
}

SafetensorsFile load_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MG_CHECK(in.good(), "cannot open ", path, ": ", errno_text());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return decode_safetensors(bytes, path);
}

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& path) {
  MG_CHECK(bytes.size() >= 8, path, ": not a safetensors file (", bytes.size(),
        " bytes, shorter than the 8-byte header "
        "length)");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  MG_CHECK(header_size <= bytes.size() - 8, path, ": header length ", header_size,
        " runs past the end of the file (", bytes.size(),
        " bytes) — the file is truncated or not safetensors");
  json header;
  try {
    header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(header_size));
  } catch (const json::exception& e) {
    throw Error(str_cat(path, ": the safetensors header is not valid JSON: ", e.what()));
  }
  MG_CHECK(header.is_object(), path, ": the safetensors header is not a JSON object");
  const size_t buffer_size = bytes.size() - 8 - header_size;
  const char* buffer = bytes.data() + 8 + header_size;

  SafetensorsFile file;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  std::map<std::string, std::pair<uint64_t, uint64_t>> tensor_bytes;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      MG_CHECK(entry.is_object(), path, ": __metadata__ must be an object of strings");
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        MG_CHECK(m.value().is_string(), path, ": __metadata__ value for '", m.key(), "' is not a string");
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    MG_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
              entry.contains("data_offsets"),
          path, ": entry '", name, "' needs dtype, shape and data_offsets");
    DType dtype;
    MG_CHECK(entry["dtype"].is_string() && parse_safetensors_dtype(entry["dtype"].get<std::string>(), dtype),
          path, ": entry '", name, "' has unsupported dtype ", entry["dtype"].dump());
    MG_CHECK(entry["shape"].is_array(), path, ": entry '", name, "' has a non-array shape");
    Shape shape;
    for (const json& s : entry["shape"]) {
      MG_CHECK(s.is_number_integer() && s.get<int64_t>() >= 0, path, ": entry '", name, "' has a bad dimension ",
            s.dump());
      shape.push_back(s.get<int64_t>());
    }
    const json& offsets = entry["data_offsets"];
    MG_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
              offsets[1].is_number_unsigned(),
          path, ": entry '", name, "' has bad data_offsets ", offsets.dump());
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    const uint64_t expected = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
    MG_CHECK(begin <= end && end <= buffer_size, path, ": entry '", name, "' data [", begin, ", ", end,
          ") lies outside the ", buffer_size, "-byte data buffer — the file is truncated or corrupt");
    MG_CHECK(end - begin == expected, path, ": entry '", name, "' of shape ", shape_str(shape), " ", dtype,
          " needs ", expected, " bytes but data_offsets span ", end - begin);
    ranges.emplace_back(begin, end);
    tensor_bytes[name] = {begin, end};
    Tensor t = empty(shape, TensorOptions{dtype});
    if (expected > 0) std::memcpy(t.data_ptr(), buffer + begin, expected);
    file.tensors[name] = t;
  }
  verify_checksums(file, tensor_bytes, buffer, path);
  // Tensors must tile the buffer without overlaps or holes (the format's rule).
  std::sort(ranges.begin(), ranges.end());
  uint64_t cursor = 0;
  for (const auto& [begin, end] : ranges) {
    MG_CHECK(begin == cursor, path, ": tensor data is not contiguous (a gap or overlap at byte ", begin, ")");
    cursor = end;
  }
  MG_CHECK(cursor == buffer_size, path, ": ", buffer_size - cursor, " unexpected bytes after the last tensor");
  return file;
}

}  // namespace mg
