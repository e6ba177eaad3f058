// Fuzzes the IDX parser (data/idx.h): parse_idx on arbitrary bytes -- the magic number, the dims,
// the payload -- as read_idx hands it a decompressed file. An accepted array must be exactly what
// its header says: prod(dims) * element size payload bytes, each of them readable.
#include <cstdint>
#include <vector>

#include "data/idx.h"
#include "fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> file(data, data + size);
  return mg::fuzz::expect_only_mg_error([&] {
    const mg::data::IdxArray array = mg::data::parse_idx(std::move(file), "fuzz input");
    uint64_t expected = static_cast<uint64_t>(mg::data::idx_element_size(array.type));
    MG_FUZZ_ASSERT(expected > 0, "an accepted type code has a size");
    MG_FUZZ_ASSERT(!array.dims.empty(), "an accepted array has dims");
    bool has_zero_dim = false;
    for (int64_t dim : array.dims) {
      MG_FUZZ_ASSERT(dim >= 0, "dims are non-negative");
      has_zero_dim = has_zero_dim || dim == 0;
    }
    if (has_zero_dim) {
      expected = 0;
    } else {
      for (int64_t dim : array.dims)
        MG_FUZZ_ASSERT(
            !__builtin_mul_overflow(expected, static_cast<uint64_t>(dim), &expected) && expected <= size,
            "an accepted payload's size fits in the input");
    }
    MG_FUZZ_ASSERT(array.bytes.size() == expected, "payload is exactly prod(dims) * element size");
    unsigned checksum = 0;
    for (uint8_t byte : array.bytes) checksum += byte;
    (void)checksum;
  });
}
