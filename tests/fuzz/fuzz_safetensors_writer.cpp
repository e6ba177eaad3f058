// Fuzzes the safetensors writer (core/safetensors.h) with names and metadata from outside: a
// checkpoint's user metadata (CheckpointInfo::extra), a module's parameter names. encode_safetensors
// must either refuse them with mg::Error (a reserved name or key, a string that is not UTF-8 and so
// cannot be in a JSON header) or write a file that decode_safetensors reads back exactly: the same
// metadata, names, dtypes, shapes and bytes.
// Input: a sequence of entries, each one byte (bit 0: a tensor or a metadata pair) and then
//   tensor     name (a length byte % 48, then raw bytes), dtype byte, ndims byte (% 3), dims (% 4
//              each), the data bytes
//   metadata   key, value (each a length byte % 48, then raw bytes)
#include <cstdint>
#include <cstring>
#include <string>

#include "core/safetensors.h"
#include "fuzz_common.h"
#include "fuzz_input.h"
#include "multigrad.h"

namespace {

struct Reader : mg::fuzz::Input {
  std::string text() { return mg::fuzz::Input::text(48, false); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const mg::DType kDTypes[] = {mg::DType::f32, mg::DType::f64, mg::DType::f16,    mg::DType::bf16,
                                      mg::DType::i32, mg::DType::i64, mg::DType::boolean};
  Reader in{{data, size}};
  mg::StateDict tensors;
  mg::SafetensorsMetadata metadata;
  for (int entry = 0; entry < 16 && !in.done(); ++entry) {
    if (in.byte() & 1) {
      const std::string name = in.text();
      const mg::DType dtype = kDTypes[in.byte() % 7];
      mg::Shape shape(in.byte() % 3);
      for (int64_t& dim : shape) dim = in.byte() % 4;
      mg::Tensor t = mg::zeros(shape, mg::TensorOptions{dtype});
      auto* bytes = static_cast<uint8_t*>(t.data_ptr());
      for (size_t i = 0; i < t.nbytes(); ++i)
        bytes[i] = dtype == mg::DType::boolean ? in.byte() & 1 : in.byte();
      tensors[name] = t;
    } else {
      const std::string key = in.text();
      metadata[key] = in.text();
    }
  }

  std::string file;
  bool written = false;
  mg::fuzz::expect_only_mg_error([&] {
    file = mg::encode_safetensors(tensors, metadata);
    written = true;
  });
  if (!written) return 0;

  mg::SafetensorsFile back;
  try {
    back = mg::decode_safetensors(file, "written", [] {
      mg::SafetensorsLoadOptions strict;
      strict.require_checksums = true;  // a file multigrad writes carries every checksum
      return strict;
    }());
  } catch (const mg::Error& e) {
    std::fprintf(stderr, "a file the writer wrote does not read back: %s\n", e.what());
    MG_FUZZ_ASSERT(false, "decode(encode(x)) succeeds");
  }
  MG_FUZZ_ASSERT(back.metadata == metadata, "metadata reads back");
  MG_FUZZ_ASSERT(back.tensors.size() == tensors.size(), "every tensor reads back");
  for (const auto& [name, tensor] : tensors) {
    auto it = back.tensors.find(name);
    MG_FUZZ_ASSERT(it != back.tensors.end(), "a tensor reads back under its name");
    MG_FUZZ_ASSERT(it->second.dtype() == tensor.dtype() && it->second.shape() == tensor.shape(),
                   "dtype and shape read back");
    MG_FUZZ_ASSERT(
        tensor.nbytes() == 0 || std::memcmp(it->second.data_ptr(), tensor.data_ptr(), tensor.nbytes()) == 0,
        "bytes read back");
  }
  return 0;
}
