// FullyShardedDataParallel: ZeRO stage 3 (PyTorch's FSDP, DeepSpeed's ZeRO-3). Every rank keeps
// only 1/N of every parameter, of its gradient and (through an optimizer built on the shards) of
// the optimizer state; a unit's full parameters exist only while that unit computes.
//
//   parallel::FullyShardedDataParallel fsdp(model, pg, options);   // before building the optimizer
//   optim::AdamW opt(fsdp.parameters(), ...);                        // the SHARDS, not model.parameters()
//   for (...) { fsdp(x) -> loss; loss.backward(); opt.step(); opt.zero_grad(); }
//
// Units (wrap_policy.h) -- e.g. one per transformer block, plus the root for what is left -- are
// flattened and sharded (flat_param.h). One step of a model of units A, B, C under root R:
//
//   forward   gather R ─ gather A ┬ compute A ─ free A ┬ compute B ─ free B ┬ compute C ─ free C
//                                 └ prefetch gather B  └ prefetch gather C  ┘
//   backward  (R stays gathered)  gather C ─ backward C ┬ reduce-scatter C, free C
//                                  prefetch gather B ───┘ backward B ┬ reduce-scatter B, free B ...
//   end of backward: wait for the last reduce-scatters; shard.grad() = this rank's averaged range
//
// How a unit learns when to act, with no change to the model's code:
//  * forward pre-hook on the unit's module (nn::Module::register_forward_pre_hook): gather the
//    unit (waiting for its prefetch), then post the next unit's all-gather (forward_prefetch:
//    the order is the previous iteration's);
//  * forward hook: reshard the unit (reshard_after_forward; never the root, whose backward
//    starts at once) and put a gradient hook on its output;
//  * that output gradient hook is the pre-backward hook: it runs before any of the unit's
//    backward formulas, gathers the unit again (the leaf views autograd saved become valid
//    again, flat_param.h) and posts the all-gather of the unit whose backward comes next
//    (backward_prefetch);
//  * post-accumulate hooks on the leaf views: when every parameter of the unit has its gradient,
//    the unit's flat gradient is reduce-scattered (asynchronously; at most two in flight, so the
//    full gradients alive are at most two units') and the unit resharded;
//  * a callback at the end of backward (autograd::queue_callback) reduce-scatters units whose
//    gradients did not all arrive (zeros for the rest: every rank issues every collective) and
//    waits for the last reduce-scatters.
// Activation checkpointing (nn::checkpoint, checkpoint_module) runs the unit's forward hooks again
// when it recomputes: the pre-hook gathers the unit if it is not, and inside backward the forward
// hook keeps it gathered, so the recompute's own backward finds the parameters.
//
// Gradient accumulation: inside no_sync() each unit's gradients are summed into its full flat
// gradient (kept, unsharded) and nothing is communicated; the next synchronised backward adds its
// gradients and reduce-scatters the sum. A synchronised backward without zero_grad adds into
// shard.grad().
//
// Devices: on the CPU (MPI backend) a posted all-gather runs on the backend's thread while this
// one computes, and is waited for (a host wait) when the unit needs it. On CUDA (NCCL backend) the
// collectives run on the communicator's stream and Work::wait_on_device() only makes the compute
// stream wait for their event -- no host synchronisation per unit; memory is freed in stream order
// (the caching allocator), so a resharded buffer is reused only after the work queued before it.
//
// Mixed precision (FSDPOptions::mixed_precision): the shards stay in the model's dtype (f32
// masters); the unit is gathered in param_dtype, so forward and backward compute in it; gradients
// are reduce-scattered in reduce_dtype and accumulated into the f32 shard.grad(). forward() casts
// floating inputs to param_dtype; the output is in param_dtype (cast it for the loss). Buffers are
// not cast.
//
// Limits: a parameter shared between two units is refused; the model must call its units through
// operator() (nn::Sequential, checkpoint_module and ordinary member calls do); after the
// FullyShardedDataParallel is destroyed the module's parameters are views of freed memory.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "nn/module.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/no_sync_guard.h"
#include "parallel/fsdp/flat_param.h"
#include "parallel/fsdp/wrap_policy.h"

namespace mg::parallel {

struct FSDPOptions {
  AutoWrapPolicy auto_wrap = AutoWrapPolicy::children();
  bool reshard_after_forward = true;  // free each unit after its forward (gather again for backward)
  bool forward_prefetch = true;       // post the next unit's all-gather before computing this one
  bool backward_prefetch = true;      // the same in backward (reverse forward order)
  std::optional<MixedPrecisionPolicy> mixed_precision;
};

// What FSDP did (for tests, benchmarks and the docs).
struct FSDPStats {
  int64_t all_gathers = 0;             // posted
  int64_t prefetched_all_gathers = 0;  // of those, posted ahead of the unit's use
  int64_t reduce_scatters = 0;
  int64_t backward_passes = 0;      // synchronised ones
  int64_t peak_gathered_bytes = 0;  // the most bytes of gathered units alive at once, ever
};

class FullyShardedDataParallel {
 public:
  // Shards `module`'s parameters in place (a collective: rank 0's values are broadcast; so are
  // its buffers). Build the optimizer afterwards, on parameters().
  FullyShardedDataParallel(nn::Module& module, ProcessGroup group, FSDPOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // module(x); under a mixed-precision policy a floating x is first cast to param_dtype.
  Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // This rank's shards, one per unit: what the optimizer steps.
  std::vector<Tensor> parameters() const;
  nn::Module& module() const { return *module_; }
  const ProcessGroup& group() const;
  const FSDPOptions& options() const;
  // Root first, then the wrapped modules in named_modules() order.
  const std::vector<std::shared_ptr<FlatParamUnit>>& units() const;
  const FSDPStats& stats() const;
  // Bytes of gathered (full) unit buffers alive now: 0 between steps when every unit is resharded.
  int64_t gathered_bytes_alive() const;

  // Gradient accumulation without communication (see the top of this file).
  NoSyncGuard<FullyShardedDataParallel> no_sync() { return NoSyncGuard<FullyShardedDataParallel>(*this); }
  void set_sync(bool sync);
  bool sync() const;
  // Forgets the shards' gradients (the optimizer's zero_grad does the same).
  void zero_grad();

  struct Engine;  // the hooks' shared state (fully_sharded_data_parallel.cpp)

 private:
  nn::Module* module_;
  std::shared_ptr<Engine> engine_;
  std::vector<std::pair<nn::Module*, int64_t>> hook_handles_;
};

}  // namespace mg::parallel
