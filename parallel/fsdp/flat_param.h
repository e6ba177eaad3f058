// FlatParamUnit: one FullyShardedDataParallel unit's parameters, flattened and sharded.
//
// The unit's parameters (in registration order) are laid end to end in one flat buffer of
// `numel` elements, padded with zeros to N * s (s = ceil(numel / N)) so uneven sizes are never
// lost. Rank r keeps only elements [r*s, (r+1)*s) of it: the *shard*, a leaf tensor in the
// parameters' own dtype (the f32 master copy under a mixed-precision policy) that the optimizer
// steps. The full buffer exists only while the unit computes:
//
//   gathered  [p0 p0 p0 p1 p1 | p1 p2 p2 p2 pad]   N * s elements, in param_dtype
//              ^ rank 0's shard ^ rank 1's shard
//   module    weight = leaf view of gathered[0:3], bias = leaf view of gathered[3:6], ...
//
// The module's parameter slots hold *leaf views* into the gathered buffer's storage, created once.
// Resharding releases that storage's memory without destroying it (Storage::release_memory), so
// the views -- also the ones autograd saved for backward -- stay valid handles; gathering again
// reallocates it and all-gathers into it, and they see the values again. The all-gather writes
// the memory directly (not through an in-place op), so the saved tensors' version checks pass.
//
// Gradients: autograd accumulates each leaf view's .grad as usual; the unit copies it into a flat
// gradient (reduce_dtype, padded), frees the .grad, and once the step is synchronised
// reduce-scatters the flat gradient (Avg) into this rank's range, which is added to shard.grad().
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "nn/module.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// FSDP's mixed precision (PyTorch's MixedPrecisionPolicy): the shards stay in their own dtype
// (f32 masters); the gathered parameters, so the forward and backward, are in param_dtype; the
// gradients are reduce-scattered in reduce_dtype and accumulated into the shard's .grad.
struct MixedPrecisionPolicy {
  DType param_dtype = DType::bf16;
  DType reduce_dtype = DType::f32;
};

class FlatParamUnit {
 public:
  struct Member {
    std::string name;  // under the root module ("fc1.weight")
    Shape shape;
    int64_t offset = 0;  // in the flat buffer
    int64_t numel = 0;
  };
  enum class State { Sharded, Gathering, Gathered };

  // Takes over `slots` (the parameters of `module` that belong to this unit): their values,
  // broadcast from rank 0, become the flat buffer; each slot then holds a leaf view of it.
  // A collective (the broadcast).
  FlatParamUnit(std::string name, nn::Module& module,
                const std::vector<std::pair<std::string, Tensor*>>& slots, ProcessGroup group,
                DType param_dtype, DType reduce_dtype);
  ~FlatParamUnit();
  FlatParamUnit(const FlatParamUnit&) = delete;
  FlatParamUnit& operator=(const FlatParamUnit&) = delete;

  const std::string& name() const { return name_; }  // "" for the root unit
  nn::Module& module() const { return *module_; }
  const std::vector<Member>& members() const { return members_; }
  const Tensor& leaf(size_t member) const { return leaves_[member]; }
  int64_t numel() const { return numel_; }              // without the padding
  int64_t shard_numel() const { return shard_numel_; }  // s
  int64_t padded_numel() const { return shard_numel_ * group_.size(); }
  Tensor& shard() { return shard_; }
  const Tensor& shard() const { return shard_; }
  const ProcessGroup& group() const { return group_; }
  DType param_dtype() const { return gathered_.dtype(); }
  DType reduce_dtype() const { return reduce_dtype_; }
  int64_t gathered_bytes() const { return static_cast<int64_t>(gathered_.nbytes()); }

  // ---- parameters ----
  State state() const { return state_; }
  // Gathered with the shard's current values (the optimizer has not stepped it since).
  bool fresh() const;
  // Posts the all-gather (asynchronous); nothing when already gathering or gathered and fresh.
  // Returns whether it posted one.
  bool start_gather();
  // start_gather(), then waits for it: afterwards the leaf views hold the parameters.
  void wait_gather();
  // Frees the gathered memory (kept at world size 1, where the shard is the whole buffer).
  void reshard();

  // ---- gradients ----
  int64_t grads_expected() const { return grads_expected_; }
  // The leaf view `member` received its gradient: it is added to the flat gradient and freed.
  // Returns true when every member that requires grad has now arrived in this pass.
  bool accumulate_grad(size_t member);
  bool arrived(size_t member) const { return arrived_[member]; }
  bool has_flat_grad() const { return flat_grad_.defined(); }
  bool reduce_scatter_posted() const { return reduce_scatter_posted_; }
  // Posts the reduce-scatter of the flat gradient (zeros when no gradient arrived).
  void start_reduce_scatter();
  // Waits for it, adds this rank's range into shard.grad(), frees the flat gradient.
  void finish_reduce_scatter();
  // End of a backward pass: forget which members arrived (the flat gradient is kept when it was
  // not reduce-scattered: no_sync accumulation).
  void end_pass();

 private:
  std::string name_;
  nn::Module* module_;
  ProcessGroup group_;
  std::vector<Member> members_;
  std::vector<Tensor*> slots_;
  std::vector<Tensor> leaves_;
  int64_t numel_ = 0, shard_numel_ = 0;
  Tensor shard_;
  Tensor gathered_;  // padded_numel() elements in param_dtype; memory only while gathered
  Tensor send_;      // the shard cast to param_dtype, alive while the all-gather runs
  WorkPtr gather_work_;
  State state_ = State::Sharded;
  uint64_t gathered_version_ = 0;
  DType reduce_dtype_;
  int64_t grads_expected_ = 0, grads_arrived_ = 0;
  std::vector<bool> arrived_;
  Tensor flat_grad_;  // padded, reduce_dtype; alive from the first gradient to the reduce-scatter's end
  Tensor received_;   // this rank's range of the reduction
  WorkPtr reduce_work_;
  bool reduce_scatter_posted_ = false;
};

}  // namespace mg::parallel
