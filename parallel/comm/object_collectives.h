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

// One flag per rank, one answer on every rank: true iff `flag` is true on at least one rank (an
// all-reduce max). How ranks decide together -- skip a step, stop, fail -- so that no rank acts
// alone and leaves the others waiting in a collective it never joins.
bool any_rank(ProcessGroup& group, bool flag);

// True on every rank iff `ok` is true on every rank.
inline bool all_ranks(ProcessGroup& group, bool ok) { return !any_rank(group, !ok); }

}  // namespace mg::parallel
