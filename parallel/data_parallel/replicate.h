// replicate: one copy of a module per device, for DataParallel.
//
//   module (params on d0) ──clone_empty()──▶ replica shells (same classes, same structure)
//          │
//          └── broadcast(parameters) ──▶ replica d's parameter slots    (autograd: reduce-add back)
//              broadcast(buffers)    ──▶ replica d's buffer slots       (no history)
//
// A replica's parameters are NOT leaves: they are outputs of the broadcast node, so a
// backward through any replica ends in BroadcastBackward, which sums the replicas'
// gradients into the original parameters' .grad on the source device. That is why the
// optimizer is built on the original module's parameters and never sees a replica.
//
// Buffers (BatchNorm's running statistics) are broadcast without history. As in PyTorch,
// the replica on the source device holds *aliases* of the module's own parameters and
// buffers (same memory), so its in-place buffer updates land in the module: with
// BatchNorm in training mode the module's running statistics are updated from the
// first chunk of every batch. The other replicas update copies that are thrown away
// after the forward.
//
// Building a replica costs a clone_empty() (a constructor run, including its
// initialisers) per device. replicate() does that every call, like PyTorch;
// DataParallel builds the shells once and only re-fills their slots each forward
// (make_replica_shell + fill_replicas).
#pragma once

#include <memory>
#include <vector>

#include "base/device.h"
#include "nn/module.h"

namespace mg::parallel {

// replicas[i] is a copy of `module` on devices[i] that shares its parameters through
// an autograd broadcast (see above). Every parameter and buffer of `module` must be on
// devices[0]; train/eval mode is copied module by module.
std::vector<std::shared_ptr<nn::Module>> replicate(const nn::Module& module,
                                                   const std::vector<Device>& devices);

// The two halves of replicate(), for callers that replicate on every step:
// A new, empty module of the same structure (clone_empty(), with the global RNG left
// as it was; its own tensors are placeholders until fill_replicas()).
std::shared_ptr<nn::Module> make_replica_shell(const nn::Module& module);
// Broadcasts `module`'s parameters and buffers to devices[i] and writes them into the
// slots of replicas[i] (replicas.size() == devices.size()), then copies every
// submodule's train/eval mode. Checks that each shell has the module's structure.
void fill_replicas(const nn::Module& module, const std::vector<std::shared_ptr<nn::Module>>& replicas,
                   const std::vector<Device>& devices);
// Empties every parameter and buffer slot of `replica` (undefined tensors), so a cached
// shell does not keep the last step's copies alive between forwards.
void clear_replica(nn::Module& replica);

}  // namespace mg::parallel
