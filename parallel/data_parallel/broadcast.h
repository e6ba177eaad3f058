// Broadcast and ReduceAdd: the two collectives of single-process DataParallel.
//
//   broadcast(params, {d0, d1, d2})          params live on d0
//
//     d0: p ─┬──────────────▶ p (an alias: same memory, no copy)
//            ├── copy ──────▶ p on d1
//            └── copy ──────▶ p on d2
//
//   backward: grad(p) = g_d0 + g_d1.to(d0) + g_d2.to(d0)        (reduce_add onto d0)
//
// Every replica of a DataParallel module uses its own copy of each parameter, and a
// parameter's gradient is the sum of the gradients the replicas computed for their
// copies. So the forward is a broadcast and its backward is a reduce-add onto the
// source device, where the optimizer runs. Recording the broadcast as one autograd
// node (PyTorch's `Broadcast` function, whose backward is `ReduceAddCoalesced`) makes
// that happen inside the ordinary backward pass: the engine sums nothing by itself
// across devices, the node does.
//
// Unlike PyTorch we copy tensor by tensor instead of packing them into 10 MB flat
// buffers first ("coalescing"). Coalescing saves per-copy latency between GPUs; on
// logical CPU devices, where a copy is a memcpy, packing would only double the traffic.
#pragma once

#include <vector>

#include "base/device.h"
#include "core/tensor.h"

namespace mg::parallel {

// Copies of `tensors` on every device: result[d][i] is tensors[i] on devices[d].
// All tensors must be on one device (the source). On the source device the result
// shares memory with the input (an alias, as in PyTorch); elsewhere it is a copy.
// When grad mode is on, the outputs of inputs that require grad are non-leaves whose
// backward adds the gradients of all copies onto the source device; the other inputs
// are copied without history.
std::vector<std::vector<Tensor>> broadcast(const std::vector<Tensor>& tensors,
                                           const std::vector<Device>& devices);

// The sum of `tensors` (same shape and dtype, any devices) on `destination`, added in
// the order given so the result is deterministic. Not recorded by autograd.
Tensor reduce_add(const std::vector<Tensor>& tensors, Device destination);

// Throws mg::Error unless `devices` is non-empty and has no device twice; `who` names
// the caller in the message.
void check_devices(const std::vector<Device>& devices, const char* who);

}  // namespace mg::parallel
