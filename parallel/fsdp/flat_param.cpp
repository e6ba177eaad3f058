// FlatParamUnit: flattening, sharding, gathering and reduce-scattering one FSDP unit (flat_param.h).
#include "parallel/fsdp/flat_param.h"

#include <algorithm>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/storage.h"

namespace mg::parallel {

FlatParamUnit::FlatParamUnit(std::string name, nn::Module& module,
                             const std::vector<std::pair<std::string, Tensor*>>& slots, ProcessGroup group,
                             DType param_dtype, DType reduce_dtype)
    : name_(std::move(name)), module_(&module), group_(std::move(group)), reduce_dtype_(reduce_dtype) {
  MG_CHECK(!slots.empty(), "FSDP: unit '", name_, "' has no parameters");
  const Tensor& first = *slots.front().second;
  const DType master = first.dtype();
  const Device device = first.device();
  for (const auto& [param_name, slot] : slots) {
    MG_CHECK(slot->dtype() == master && slot->device() == device, "FSDP: unit '", name_,
             "' mixes parameters: '", param_name, "' is ", slot->dtype(), " on ", slot->device(), ", '",
             slots.front().first, "' is ", master, " on ", device,
             " (one flat buffer holds one dtype on one device)");
    members_.push_back(Member{param_name, slot->shape(), numel_, slot->numel()});
    slots_.push_back(slot);
    numel_ += slot->numel();
  }
  const int world = group_.size();
  shard_numel_ = std::max<int64_t>(1, (numel_ + world - 1) / world);

  NoGradGuard no_grad;
  // Every rank starts from rank 0's values, padded with zeros.
  Tensor flat = zeros({padded_numel()}, TensorOptions{master, device});
  for (size_t m = 0; m < members_.size(); ++m)
    flat.narrow(0, members_[m].offset, members_[m].numel).copy_(slots_[m]->detach().reshape({-1}));
  if (world > 1) group_.broadcast(flat, 0)->wait();
  shard_ = flat.narrow(0, group_.rank() * shard_numel_, shard_numel_).clone();
  shard_.set_requires_grad(true);

  // The leaf views the module computes with, over the gathered buffer's storage.
  gathered_ = empty({padded_numel()}, TensorOptions{param_dtype, device});
  arrived_.assign(members_.size(), false);
  for (size_t m = 0; m < members_.size(); ++m) {
    const bool requires_grad = slots_[m]->requires_grad();
    Tensor leaf = gathered_.narrow(0, members_[m].offset, members_[m].numel).view(members_[m].shape).detach();
    if (requires_grad) {
      leaf.set_requires_grad(true);
      ++grads_expected_;
    }
    *slots_[m] = leaf;
    leaves_.push_back(leaf);
  }
  if (param_dtype == master) {
    // The values are already here: the unit starts gathered (and fresh until the first step).
    gathered_.copy_(flat);
    state_ = State::Gathered;
    gathered_version_ = shard_.version();
  }
  reshard();
}

FlatParamUnit::~FlatParamUnit() = default;

// ---- parameters ---------------------------------------------------------------------------------

bool FlatParamUnit::fresh() const {
  return state_ != State::Sharded && gathered_version_ == shard_.version();
}

bool FlatParamUnit::start_gather() {
  if (state_ == State::Gathering || (state_ == State::Gathered && fresh())) return false;
  NoGradGuard no_grad;
  gathered_.storage()->reallocate_memory();
  send_ = shard_.detach();
  if (send_.dtype() != gathered_.dtype()) send_ = send_.to(gathered_.dtype());
  gather_work_ = group_.allgather(gathered_, send_);
  gathered_version_ = shard_.version();
  state_ = State::Gathering;
  return true;
}

void FlatParamUnit::wait_gather() {
  start_gather();
  if (state_ != State::Gathering) return;
  // On a GPU this orders the compute stream after the all-gather without a host wait.
  gather_work_->wait_on_device();
  gather_work_.reset();
  send_ = Tensor();
  state_ = State::Gathered;
}

void FlatParamUnit::reshard() {
  if (group_.size() == 1 || state_ == State::Sharded) return;
  if (state_ == State::Gathering) {  // the collective still writes into the memory
    gather_work_->wait_on_device();
    gather_work_.reset();
    send_ = Tensor();
  }
  gathered_.storage()->release_memory();
  state_ = State::Sharded;
}

// ---- gradients ----------------------------------------------------------------------------------

bool FlatParamUnit::accumulate_grad(size_t member) {
  MG_CHECK(!reduce_scatter_posted_, "FSDP: parameter '", members_[member].name,
           "' received a gradient after its unit's gradients were reduce-scattered in this backward "
           "(used again through a reentrant or retain_graph backward?)");
  Tensor& leaf = leaves_[member];
  const Tensor grad = leaf.grad();
  if (!grad.defined()) return false;
  NoGradGuard no_grad;
  if (!flat_grad_.defined())
    flat_grad_ = zeros({padded_numel()}, TensorOptions{reduce_dtype_, shard_.device()});
  Tensor flat = grad.reshape({-1});
  if (flat.dtype() != reduce_dtype_) flat = flat.to(reduce_dtype_);
  flat_grad_.narrow(0, members_[member].offset, members_[member].numel).add_(flat);
  leaf.set_grad(Tensor());  // the full gradient is freed: the flat one holds it until the reduce-scatter
  if (!arrived_[member] && leaf.requires_grad()) {
    arrived_[member] = true;
    ++grads_arrived_;
  }
  return grads_arrived_ == grads_expected_;
}

void FlatParamUnit::start_reduce_scatter() {
  MG_CHECK(!reduce_scatter_posted_, "FSDP: unit '", name_, "' reduce-scattered twice in one backward");
  if (!flat_grad_.defined())
    flat_grad_ = zeros({padded_numel()}, TensorOptions{reduce_dtype_, shard_.device()});
  received_ = empty({shard_numel_}, TensorOptions{reduce_dtype_, shard_.device()});
  reduce_work_ = group_.reduce_scatter(received_, flat_grad_, ReduceOp::Avg);
  reduce_scatter_posted_ = true;
}

void FlatParamUnit::finish_reduce_scatter() {
  if (!reduce_work_) return;
  reduce_work_->wait_on_device();
  reduce_work_.reset();
  flat_grad_ = Tensor();
  NoGradGuard no_grad;
  Tensor grad = received_.dtype() == shard_.dtype() ? received_ : received_.to(shard_.dtype());
  received_ = Tensor();
  if (Tensor accumulated = shard_.grad(); accumulated.defined()) {
    accumulated.add_(grad);  // a second synchronised backward without zero_grad adds to it
  } else {
    shard_.set_grad(grad);
  }
}

void FlatParamUnit::end_pass() {
  arrived_.assign(members_.size(), false);
  grads_arrived_ = 0;
  reduce_scatter_posted_ = false;
}

}  // namespace mg::parallel
