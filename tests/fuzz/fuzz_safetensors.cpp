// Fuzzes the safetensors reader (core/safetensors.h): decode_safetensors on arbitrary bytes, the
// 8-byte header length, the JSON header and the data buffer, exactly as load_safetensors reads a
// file. An accepted file must then be what it claims: every tensor's bytes are read (converted to
// f64 and summed, so a tensor whose storage is shorter than its shape says shows as an
// out-of-bounds read under ASan), and encoding it again and decoding that must succeed and give
// the same bytes -- a file the reader accepts is one the writer can reproduce. An accepted file is
// also decoded with SafetensorsLoadOptions::require_checksums (the checkpoint manager's setting).
#include <cstdint>
#include <cstring>
#include <string>

#include "core/safetensors.h"
#include "fuzz_common.h"

namespace {

void read_every_element(const mg::Tensor& t) {
  MG_FUZZ_ASSERT(t.nbytes() == static_cast<size_t>(t.numel()) * t.itemsize(), "nbytes matches the shape");
  const mg::Tensor wide = t.to(mg::DType::f64);
  double sum = 0;
  const double* values = wide.data<double>();
  for (int64_t i = 0; i < wide.numel(); ++i) sum += values[i];
  (void)sum;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  return mg::fuzz::expect_only_mg_error([&] {
    const mg::SafetensorsFile file = mg::decode_safetensors(bytes, "fuzz input");
    for (const auto& [name, tensor] : file.tensors) read_every_element(tensor);
    // What the checkpoint manager asks of its own files: every checksum present.
    mg::fuzz::expect_only_mg_error([&] {
      mg::SafetensorsLoadOptions strict;
      strict.require_checksums = true;
      mg::decode_safetensors(bytes, "fuzz input (checksums required)", strict);
    });

    // The round trip, outside the expected-error scope: an accepted file must re-encode.
    mg::SafetensorsFile again;
    try {
      again = mg::decode_safetensors(mg::encode_safetensors(file.tensors, file.metadata), "re-encoded");
    } catch (const mg::Error& e) {
      std::fprintf(stderr, "accepted input does not survive a round trip: %s\n", e.what());
      MG_FUZZ_ASSERT(false, "decode(encode(decode(x))) succeeds");
    }
    MG_FUZZ_ASSERT(again.metadata == file.metadata, "metadata survives the round trip");
    MG_FUZZ_ASSERT(again.tensors.size() == file.tensors.size(), "tensor count survives the round trip");
    for (const auto& [name, tensor] : file.tensors) {
      const mg::Tensor& other = again.tensors.at(name);
      MG_FUZZ_ASSERT(other.dtype() == tensor.dtype() && other.shape() == tensor.shape(),
                     "dtype and shape survive");
      MG_FUZZ_ASSERT(
          tensor.nbytes() == 0 || std::memcmp(other.data_ptr(), tensor.data_ptr(), tensor.nbytes()) == 0,
          "bytes survive the round trip");
    }
  });
}
