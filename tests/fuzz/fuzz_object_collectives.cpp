// Fuzzes the receiving side of the object collectives (parallel/comm/object_collectives.h): what a
// rank does with the lengths and bytes its peers sent. The decoding is a free function
// (unpack_object / unpack_objects), so no MPI job is needed: the input plays the received
// messages. Layout of an input:
//   byte 0          low 2 bits: which receive path (0 broadcast, 1 gather, 2 all-gather, 3 all
//                   three); bits 2..4: the number of ranks - 1 (1 to 8)
//   8 bytes/rank    each rank's announced length, little-endian int64 (the received length tensor)
//   the rest        the received payload words
// Each decoded object is then decoded as a StateDict (decode_safetensors), as
// ZeroRedundancyOptimizer does with the optimizer shards gather_object brings it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "fuzz_common.h"
#include "parallel/comm/object_collectives.h"

namespace {

void decode_as_state_dict(const std::string& object) {
  try {
    const mg::SafetensorsFile file = mg::decode_safetensors(object, "received object");
    for (const auto& [name, tensor] : file.tensors) (void)tensor.to(mg::DType::f64);
  } catch (const mg::Error&) {
    // not a StateDict: fine, the object collectives carry any bytes
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int path = data[0] & 3;
  const int ranks = ((data[0] >> 2) & 7) + 1;
  size_t pos = 1;
  std::vector<int64_t> lengths;
  for (int r = 0; r < ranks && pos + 8 <= size; ++r, pos += 8) {
    int64_t length;
    std::memcpy(&length, data + pos, 8);
    lengths.push_back(length);
  }
  if (lengths.empty()) return 0;
  // The payload as it lands in the receiving i64 tensor: a buffer of its own, of exactly its size.
  const std::vector<uint8_t> payload(data + pos, data + size);
  const void* bytes = payload.data();
  const int64_t capacity = static_cast<int64_t>(payload.size());

  if (path == 0 || path == 3) {  // broadcast_object: one length, then a buffer of object_words(n)
    mg::fuzz::expect_only_mg_error([&] {
      const int64_t words = mg::parallel::object_words(lengths[0], "broadcast_object");
      MG_FUZZ_ASSERT(words >= 1 && words * 8 >= lengths[0], "the buffer holds the announced length");
      const std::string object = mg::parallel::unpack_object(bytes, capacity, lengths[0], "broadcast_object");
      MG_FUZZ_ASSERT(static_cast<int64_t>(object.size()) == lengths[0], "the object has its length");
      decode_as_state_dict(object);
    });
  }
  if (path == 1 || path == 3) {  // gather_object: each rank's length, then its own buffer
    mg::fuzz::expect_only_mg_error([&] {
      int64_t offset = 0;
      for (int64_t length : lengths) {
        mg::parallel::object_words(length, "gather_object");
        const int64_t rest = capacity - offset;
        const std::string object = mg::parallel::unpack_object(static_cast<const char*>(bytes) + offset, rest,
                                                               length, "gather_object");
        offset += length;
        decode_as_state_dict(object);
      }
    });
  }
  if (path == 2 || path == 3) {  // all_gather_object: every length, then one buffer of equal slots
    mg::fuzz::expect_only_mg_error([&] {
      int64_t words = 1;  // as all_gather_object sizes the slots: the longest announced length
      for (int64_t length : lengths)
        words = std::max(words, mg::parallel::object_words(length, "all_gather_object"));
      const int64_t stride = words * 8;
      const std::vector<std::string> objects =
          mg::parallel::unpack_objects(bytes, capacity, lengths, stride, "all_gather_object");
      MG_FUZZ_ASSERT(objects.size() == lengths.size(), "one object per rank");
      for (const std::string& object : objects) decode_as_state_dict(object);
    });
  }
  return 0;
}
