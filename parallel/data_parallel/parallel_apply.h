// parallel_apply: run replica i on inputs[i], one thread per replica, and wait for all.
//
//   caller thread ──┬─ thread 0: replicas[0]->forward(inputs[0])  on devices[0] ─┐
//                   ├─ thread 1: replicas[1]->forward(inputs[1])  on devices[1] ─┤ join
//                   └─ thread 2: ...                                           ─┘──▶ outputs
//
// Why threads: each device needs a host thread to issue its work. On GPUs the kernels
// of one replica run asynchronously while its thread is already launching the next
// ones; on logical CPU devices the threads are what runs the replicas at the same time.
//
// Grad mode and autocast are thread-local (core/grad_mode.h, core/autocast.h), so a new
// thread would start with grad mode on and autocast off whatever the caller had set:
// each thread copies the caller's state first. An exception in any replica is caught
// in its thread, every thread is joined, and the caller gets an mg::Error naming the
// replica's device ("replica 1 on cpu:1 failed: ..."); the lowest-numbered failing
// replica is reported. With one replica no thread is started.
#pragma once

#include <memory>
#include <vector>

#include "base/device.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace mg::parallel {

// outputs[i] = replicas[i]->forward(inputs[i]). devices[i] is where replica i lives;
// when `devices` is empty it is taken from inputs[i]. Before starting any thread it
// checks that input i and replica i's parameters are on devices[i].
std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                   const std::vector<Tensor>& inputs,
                                   const std::vector<Device>& devices = {});

// The same for modules of any signature: outputs[i] = replicas[i]->forward_values(inputs[i]).
// Every tensor leaf of inputs[i] must be on devices[i]; with `devices` empty, devices[i] is
// the device of inputs[i]'s first tensor leaf (an error when it has none).
std::vector<nn::Values> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                       const std::vector<nn::Values>& inputs,
                                       const std::vector<Device>& devices = {});

}  // namespace mg::parallel
