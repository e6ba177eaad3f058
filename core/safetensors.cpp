#include "core/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string_view>
#include <tuple>
#include <vector>

#include "base/checked_size.h"
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

// The header's own checksum: "crc32c:__header__" (so "__header__" cannot name a tensor). Its value
// is the CRC32C of the N header bytes as stored (JSON and padding), with its own 8 hex digits read
// as "00000000". Computed over the raw bytes rather than a re-serialisation, so verifying it needs
// no dump() of untrusted JSON and covers every byte a reader interprets. The key is found in the
// raw text as "crc32c:__header__":" -- a sequence that cannot occur inside a JSON string (its
// inner quote would be escaped), and must occur exactly once.
const std::string kHeaderName = "__header__";
const std::string kHeaderChecksumKey = kChecksumPrefix + kHeaderName;
const std::string kHeaderChecksumToken = "\"" + kHeaderChecksumKey + "\":\"";
const std::string kBlankChecksum = "00000000";

std::string checksum_text(uint32_t crc) {
  char text[9];
  std::snprintf(text, sizeof(text), "%08x", crc);
  return text;
}

// Where the 8 hex digits of the header checksum start in `header`, or npos when the token is not
// there exactly once (a header rewritten by another tool, or a crafted one).
size_t find_header_checksum_digits(const std::string_view header) {
  const size_t first = header.find(kHeaderChecksumToken);
  if (first == std::string_view::npos) return std::string_view::npos;
  if (header.find(kHeaderChecksumToken, first + 1) != std::string_view::npos) return std::string_view::npos;
  const size_t digits = first + kHeaderChecksumToken.size();
  if (digits + kBlankChecksum.size() >= header.size() || header[digits + kBlankChecksum.size()] != '"')
    return std::string_view::npos;
  return digits;
}

uint32_t header_checksum(const std::string_view header, size_t digits) {
  uint32_t crc = crc32c(header.data(), digits);
  crc = crc32c(kBlankChecksum.data(), kBlankChecksum.size(), crc);
  const size_t after = digits + kBlankChecksum.size();
  return crc32c(header.data() + after, header.size() - after, crc);
}

// Rejects a header nested deeper than kMaxSafetensorsHeaderDepth before nlohmann parses it: one
// pass over the bytes counting [ and { outside strings, no recursion, no allocation.
void check_nesting_depth(const std::string_view header, const std::string& path) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < header.size(); ++i) {
    const char c = header[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
      MG_CHECK(depth <= kMaxSafetensorsHeaderDepth, path,
               ": the safetensors header nests [ and { deeper than ", kMaxSafetensorsHeaderDepth,
               " levels (at header byte ", i, ")");
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
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

// A short description of a JSON value for an error message: its type, and the value itself when
// it is a scalar (never a dump of a nested value).
std::string describe(const json& value) {
  if (value.is_primitive()) return str_cat(value.type_name(), " ", value.dump());
  return str_cat("an ", value.type_name());
}

// One tensor as the header describes it, validated before any memory is allocated for it.
struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

TensorEntry parse_entry(const std::string& name, const json& entry, size_t buffer_size,
                        const std::string& path) {
  MG_CHECK(entry.is_object() && entry.contains("dtype") && entry.contains("shape") &&
               entry.contains("data_offsets"),
           path, ": entry '", name, "' needs dtype, shape and data_offsets");
  TensorEntry out;
  out.name = name;
  const json& dtype = entry["dtype"];
  MG_CHECK(dtype.is_string() && parse_safetensors_dtype(dtype.get<std::string>(), out.dtype), path,
           ": entry '", name, "' has unsupported dtype ", describe(dtype));
  const json& shape = entry["shape"];
  MG_CHECK(shape.is_array(), path, ": entry '", name, "' has a non-array shape (", describe(shape), ")");
  MG_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), path, ": entry '", name, "' has ", shape.size(),
           " dimensions; tensors have at most ", kMaxDims);
  for (const json& dim : shape) {
    MG_CHECK(dim.is_number_integer(), path, ": entry '", name,
             "' has a dimension that is not an integer: ", describe(dim));
    MG_CHECK(dim.is_number_unsigned() && dim.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX), path,
             ": entry '", name, "' has a negative or too large dimension ", dim.dump());
    out.shape.push_back(dim.get<int64_t>());
  }
  const std::optional<int64_t> numel = try_numel(out.shape);
  MG_CHECK(numel, path, ": entry '", name, "' has shape ", shape_str(out.shape),
           ", whose number of elements overflows 64 bits");
  const std::optional<int64_t> nbytes = try_nbytes(*numel, dtype_size(out.dtype));
  MG_CHECK(nbytes, path, ": entry '", name, "' of shape ", shape_str(out.shape), " ", out.dtype,
           " needs more bytes than 64 bits can count");
  const json& offsets = entry["data_offsets"];
  MG_CHECK(offsets.is_array() && offsets.size() == 2 && offsets[0].is_number_unsigned() &&
               offsets[1].is_number_unsigned(),
           path, ": entry '", name, "' has bad data_offsets (", describe(offsets),
           "); they must be two non-negative integers");
  out.begin = offsets[0].get<uint64_t>();
  out.end = offsets[1].get<uint64_t>();
  MG_CHECK(out.begin <= out.end, path, ": entry '", name, "' has data_offsets [", out.begin, ", ", out.end,
           "] that begin after they end");
  MG_CHECK(out.end <= buffer_size, path, ": entry '", name, "' data [", out.begin, ", ", out.end,
           ") lies outside the ", buffer_size, "-byte data buffer — the file is truncated or corrupt");
  MG_CHECK(out.end - out.begin == static_cast<uint64_t>(*nbytes), path, ": entry '", name, "' of shape ",
           shape_str(out.shape), " ", out.dtype, " needs ", *nbytes, " bytes but data_offsets span ",
           out.end - out.begin);
  return out;
}

// Tensors must tile the buffer in order, without overlaps or holes (the format's rule).
void check_tiling(std::vector<const TensorEntry*> entries, size_t buffer_size, const std::string& path) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry* a, const TensorEntry* b) {
    return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
  });
  uint64_t cursor = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry* entry : entries) {
    MG_CHECK(entry->begin >= cursor, path, ": tensor '", entry->name, "' bytes [", entry->begin, ", ",
             entry->end, ") overlap tensor '", previous ? previous->name : "", "' (which ends at byte ",
             cursor, ")");
    MG_CHECK(entry->begin == cursor, path, ": tensor data is not contiguous (a gap of ",
             entry->begin - cursor, " bytes before tensor '", entry->name, "' at byte ", entry->begin, ")");
    cursor = entry->end;
    previous = entry;
  }
  MG_CHECK(cursor == buffer_size, path, ": ", buffer_size - cursor,
           " unexpected bytes after the last tensor");
}

// Verifies every checksum in `metadata` (and removes them from it): the header's over the raw
// header bytes, each tensor's over its bytes. With require_checksums, missing ones are errors.
void verify_checksums(SafetensorsMetadata& metadata, const std::map<std::string, TensorEntry>& entries,
                      const std::string_view header, const char* buffer, const std::string& path,
                      const SafetensorsLoadOptions& options) {
  auto header_key = metadata.find(kHeaderChecksumKey);
  if (header_key != metadata.end()) {
    const size_t digits = find_header_checksum_digits(header);
    MG_CHECK(digits != std::string_view::npos &&
                 header.substr(digits, kBlankChecksum.size()) == header_key->second,
             path, ": the header checksum \"", kHeaderChecksumKey,
             "\" is not stored as written (the header was rewritten or crafted)");
    const std::string actual = checksum_text(header_checksum(header, digits));
    MG_CHECK(actual == header_key->second, path, ": the header is corrupt: its ", header.size(),
             " bytes have CRC32C ", actual, " but the file recorded ", header_key->second);
    metadata.erase(header_key);
  } else {
    MG_CHECK(!options.require_checksums, path, ": the header has no checksum (\"", kHeaderChecksumKey,
             "\" is missing from __metadata__) and checksums are required");
  }
  size_t verified = 0;
  for (auto it = metadata.lower_bound(kChecksumPrefix);
       it != metadata.end() && it->first.compare(0, kChecksumPrefix.size(), kChecksumPrefix) == 0;) {
    const std::string name = it->first.substr(kChecksumPrefix.size());
    auto entry = entries.find(name);
    MG_CHECK(entry != entries.end(), path, ": __metadata__ has a checksum for tensor '", name,
             "', which the file does not hold");
    const TensorEntry& t = entry->second;
    const std::string actual = checksum_text(crc32c(buffer + t.begin, t.end - t.begin));
    MG_CHECK(actual == it->second, path, ": tensor '", name, "' is corrupt: its ", t.end - t.begin,
             " bytes have CRC32C ", actual, " but the file recorded ", it->second);
    ++verified;
    it = metadata.erase(it);
  }
  // A file with checksums must have one for every tensor (else a tensor could be swapped in).
  MG_CHECK(verified == entries.size() || (verified == 0 && !options.require_checksums), path, ": ",
           entries.size() - verified, " of ", entries.size(), " tensors have no checksum in __metadata__",
           options.require_checksums ? " and checksums are required" : "");
}

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
    MG_CHECK(name != kHeaderName, "save_safetensors: '", kHeaderName,
             "' is reserved (its checksum key names the header's) and cannot name a tensor");
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
  meta[kHeaderChecksumKey] = kBlankChecksum;
  header["__metadata__"] = meta;
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // a name or metadata string that is not UTF-8
    throw Error(str_cat("save_safetensors: a tensor name or metadata key or value is not valid UTF-8 (",
                        e.what(), ")"));
  }
  while ((8 + header_text.size()) % 8 != 0) header_text.push_back(' ');  // align the buffer to 8 bytes
  const size_t digits = find_header_checksum_digits(header_text);
  MG_CHECK(digits != std::string::npos,
           "save_safetensors: internal error: the header checksum key is not unique");
  header_text.replace(digits, kBlankChecksum.size(), checksum_text(header_checksum(header_text, digits)));
  std::string bytes;
  bytes.reserve(8 + header_text.size() + offset);
  uint64_t n = header_text.size();
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  bytes += header_text;
  for (const Tensor& h : host) bytes.append(static_cast<const char*>(h.data_ptr()), h.nbytes());
  return bytes;
}

SafetensorsFile load_safetensors(const std::string& path, const SafetensorsLoadOptions& options) {
  std::ifstream in(path, std::ios::binary);
  MG_CHECK(in.good(), "cannot open ", path, ": ", errno_text());
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return decode_safetensors(bytes, path, options);
}

SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& path,
                                   const SafetensorsLoadOptions& options) {
  MG_CHECK(bytes.size() >= 8, path, ": not a safetensors file (", bytes.size(),
           " bytes, shorter than the 8-byte header length)");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  MG_CHECK(header_size <= bytes.size() - 8, path, ": header length ", header_size,
           " runs past the end of the file (", bytes.size(),
           " bytes) — the file is truncated or not safetensors");
  const std::string_view header_text(bytes.data() + 8, header_size);
  check_nesting_depth(header_text, path);
  json header;
  try {
    header = json::parse(header_text.begin(), header_text.end());
  } catch (const json::exception& e) {
    throw Error(str_cat(path, ": the safetensors header is not valid JSON: ", e.what()));
  }
  MG_CHECK(header.is_object(), path, ": the safetensors header is not a JSON object");
  const size_t buffer_size = bytes.size() - 8 - header_size;
  const char* buffer = bytes.data() + 8 + header_size;

  SafetensorsFile file;
  std::map<std::string, TensorEntry> entries;
  std::vector<const TensorEntry*> in_order;
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
    // The writer refuses this name (its checksum key is the header's); a file that spells it with
    // an escape ("\u005f\u005fheader__") must not load either: names are compared decoded.
    MG_CHECK(name != kHeaderName, path, ": a tensor is named '", kHeaderName,
             "', which is reserved (its checksum key names the header's) and cannot name a tensor");
    // (JSON object keys are unique once parsed: a repeated name is the parser's last one.)
    in_order.push_back(&entries.emplace(name, parse_entry(name, entry, buffer_size, path)).first->second);
  }
  // Every check on the header before any tensor memory is allocated: a crafted header can make no
  // allocation larger than the file itself.
  check_tiling(in_order, buffer_size, path);
  verify_checksums(file.metadata, entries, header_text, buffer, path, options);
  for (const auto& [name, entry] : entries) {
    if (entry.dtype == DType::boolean) {  // a C++ bool holding any byte but 0 or 1 is undefined behaviour
      for (size_t i = entry.begin; i < entry.end; ++i) {
        const auto byte = static_cast<unsigned char>(buffer[i]);
        MG_CHECK(byte <= 1, path, ": tensor '", name, "' is BOOL but its byte ", i - entry.begin, " is ",
                 static_cast<int>(byte), " (a BOOL byte must be 0 or 1)");
      }
    }
    Tensor t = empty(entry.shape, TensorOptions{entry.dtype});
    if (entry.end > entry.begin) std::memcpy(t.data_ptr(), buffer + entry.begin, entry.end - entry.begin);
    file.tensors[name] = t;
  }
  return file;
}

}  // namespace mg
