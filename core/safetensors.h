// Reading and writing StateDicts in the safetensors format, so PyTorch can load
// our weights (safetensors.torch.load_file) and we can load theirs.
//
// The file layout (https://github.com/huggingface/safetensors):
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  JSON: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//                     "__metadata__": {"<key>": "<string value>", ...}}
//   [rest]     the tensors' bytes, little-endian, row-major, at [begin, end) of this buffer
//
// Every tensor's bytes are checksummed: __metadata__ gets "crc32c:<name>": "<8 hex digits>" per
// tensor (core/crc32c.h) -- plain string metadata, so PyTorch still loads the file. Reading
// verifies each one and fails naming the tensor and the file on a mismatch; a file without
// checksums (written by PyTorch) loads unverified. The checksum keys are not in
// SafetensorsFile::metadata, and "crc32c:" is reserved in the metadata a caller passes.
//
// Writes are atomic: the file is written under a temporary name, fsync'ed, then
// renamed over the destination, so a crash leaves either the old file or the new
// one, never half of one. Reads validate everything (sizes, offsets, dtypes,
// overlaps, JSON) before returning and name the problem and the file.
#pragma once

#include <map>
#include <string>

#include "core/state_dict.h"

namespace mg {

using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes `tensors` (any device; copied to the host) and string metadata to `path` atomically.
void save_safetensors(const std::string& path, const StateDict& tensors,
                      const SafetensorsMetadata& metadata = {});

struct SafetensorsFile {
  StateDict tensors;  // CPU tensors
  SafetensorsMetadata metadata;
};
// Reads and validates `path`; throws mg::Error naming the file and the reason on any problem.
SafetensorsFile load_safetensors(const std::string& path);

// The same format in memory (for sending a StateDict between ranks, parallel/comm/object_collectives.h).
// `what` names the bytes in errors, as the path does for a file.
std::string encode_safetensors(const StateDict& tensors, const SafetensorsMetadata& metadata = {});
SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& what = "safetensors bytes");

}  // namespace mg
