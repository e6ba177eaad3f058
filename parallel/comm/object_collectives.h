// Collectives on bytes instead of tensors, for what is not a tensor: configs, metrics, a
// StateDict serialised with encode_safetensors (core/safetensors.h). PyTorch's
// broadcast_object_list / gather_object / all_gather_object, without pickle: the caller chooses
// the encoding, these move the bytes.
//
// How: the bytes travel in a CPU i64 tensor (8 bytes per element, the last one zero-padded)
// over the group's CPU backend (MPI), after their lengths, so ranks need not know each other's
// sizes in advance. Every rank of the group must make the same call (they are collectives), and
// they block until done: they are for set-up, checkpoints and logging, not for the training step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel/comm/process_group.h"

namespace mg::parallel {

// `bytes` on `root`; every rank returns root's bytes (the others' argument is ignored).
std::string broadcast_object(ProcessGroup& group, const std::string& bytes, int root = 0);

// Every rank's bytes, by rank, on `root`; the other ranks return an empty vector.
std::vector<std::string> gather_object(ProcessGroup& group, const std::string& bytes, int root = 0);

// Every rank's bytes, by rank, on every rank.
std::vector<std::string> all_gather_object(ProcessGroup& group, const std::string& bytes);

// The receiving side's decoding, apart from any group so that it is tested and fuzzed without MPI
// (tests/fuzz/fuzz_object_collectives.cpp). A length is what a peer announced, so it is input
// like any other: a negative one, one over 1 TiB (whose buffer size could wrap, and which no
// set-up object comes near), or one beyond the bytes that came is an mg::Error naming `op`,
// never a read past the buffer or a wrapped size.
//
// The i64 words a buffer for `length` received bytes needs (at least one); checks the length.
int64_t object_words(int64_t length, const char* op);
// The first `length` bytes of the `capacity` bytes at `packed`.
std::string unpack_object(const void* packed, int64_t capacity, int64_t length, const char* op);
// all_gather_object's layout: object r is lengths[r] bytes at byte r * stride of `packed`, and
// no object runs into the next one's slot.
std::vector<std::string> unpack_objects(const void* packed, int64_t capacity,
                                        const std::vector<int64_t>& lengths, int64_t stride, const char* op);

// One flag per rank, one answer on every rank: true iff `flag` is true on at least one rank (an
// all-reduce max). How ranks decide together -- skip a step, stop, fail -- so that no rank acts
// alone and leaves the others waiting in a collective it never joins.
bool any_rank(ProcessGroup& group, bool flag);

// True on every rank iff `ok` is true on every rank.
inline bool all_ranks(ProcessGroup& group, bool ok) { return !any_rank(group, !ok); }

}  // namespace mg::parallel
