// Reading and writing StateDicts in the safetensors format, so PyTorch can load
// our weights (safetensors.torch.load_file) and we can load theirs.
//
// The file layout (https://github.com/huggingface/safetensors):
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  JSON: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//                     "__metadata__": {"<key>": "<string value>", ...}}
//   [rest]     the tensors' bytes, little-endian, row-major, at [begin, end) of this buffer
//
// Checksums: __metadata__ gets "crc32c:<name>": "<8 hex digits>" per tensor (core/crc32c.h), the
// CRC32C of its bytes, and "crc32c:__header__": the CRC32C of the whole header (every dtype, shape,
// offset and metadata entry) -- the N header bytes exactly as stored, with the 8 hex digits of that
// one value read as "00000000". Plain string metadata, so PyTorch still loads the file. Reading
// verifies every checksum present and fails naming the tensor (or the header) and the file on a
// mismatch. A file without checksums (written by PyTorch) loads unverified by default; with
// SafetensorsLoadOptions::require_checksums it is an error. The checksum keys are not in
// SafetensorsFile::metadata, "crc32c:" is reserved in the metadata a caller passes, and
// "__header__" cannot name a tensor. Checksums detect corruption (a flipped bit, a torn or
// overwritten block), not tampering: anyone can recompute a CRC.
//
// Untrusted input: decoding rejects, naming the file and the tensor, a header length beyond the
// file, JSON nested deeper than kMaxSafetensorsHeaderDepth (checked before the JSON parser runs),
// dims that are negative or not integers, shapes whose numel * dtype size overflows, data_offsets
// out of range, reversed, of the wrong size, overlapping or leaving holes. See docs/security.md.
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

// The deepest [ / { nesting a header may have (ours is 3: header, entry, shape). Deeper headers are
// rejected before the JSON parser sees them, so a header nested a million levels is an error, not a
// stack overflow.
constexpr int kMaxSafetensorsHeaderDepth = 64;

struct SafetensorsLoadOptions {
  // Refuse a file unless every tensor and the header carry a checksum (files multigrad writes do;
  // the checkpoint manager requires them, so a file whose checksum keys were stripped is refused).
  bool require_checksums = false;
};

// Reads and validates `path`; throws mg::Error naming the file and the reason on any problem.
SafetensorsFile load_safetensors(const std::string& path, const SafetensorsLoadOptions& options = {});

// The same format in memory (for sending a StateDict between ranks, parallel/comm/object_collectives.h).
// `what` names the bytes in errors, as the path does for a file.
std::string encode_safetensors(const StateDict& tensors, const SafetensorsMetadata& metadata = {});
SafetensorsFile decode_safetensors(const std::string& bytes, const std::string& what = "safetensors bytes",
                                   const SafetensorsLoadOptions& options = {});

}  // namespace mg
