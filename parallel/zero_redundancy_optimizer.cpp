#include "parallel/zero_redundancy_optimizer.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/safetensors.h"
#include "parallel/object_collectives.h"

namespace mg::optim {
namespace {

// "state.<index>.<name>" -> (index, name); false for any other key.
bool parse_state_key(const std::string& key, int64_t& index, std::string& name) {
  const std::string prefix = "state.";
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  index = std::stoll(key.substr(prefix.size(), dot - prefix.size()));
  name = key.substr(dot + 1);
  return true;
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, parallel::ProcessGroup group,
                                                 const OptimizerFactory& make_optimizer, ZeroOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  check(group_.defined(), "ZeroRedundancyOptimizer: the process group is undefined");
  const int world = group_.size();
  check(!params_.empty(), "ZeroRedundancyOptimizer: no parameters");
  check(static_cast<int64_t>(params_.size()) >= world, "ZeroRedundancyOptimizer: ", params_.size(),
        " parameters cannot be sharded over ", world, " ranks (every rank must own at least one)");
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    check(p.defined(), "ZeroRedundancyOptimizer: parameter ", i, " is undefined");
    check(p.dtype() == params_[0].dtype() && p.device() == params_[0].device(),
          "ZeroRedundancyOptimizer: parameter ", i, " is ", p.dtype(), " on ", p.device(), " but parameter 0 is ",
          params_[0].dtype(), " on ", params_[0].device(), "; every parameter must share one dtype and device");
    check(p.is_contiguous(), "ZeroRedundancyOptimizer: parameter ", i, " is not contiguous");
  }

  // Balanced by size, the same on every rank: largest first, each to the least-loaded rank.
  std::vector<int64_t> order(params_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  owner_.assign(params_.size(), 0);
  for (int64_t i : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[static_cast<size_t>(i)] = r;
    load[static_cast<size_t>(r)] += params_[static_cast<size_t>(i)].numel();
  }
  shards_.assign(static_cast<size_t>(world), {});
  offset_.assign(params_.size(), 0);
  std::vector<int64_t> filled(static_cast<size_t>(world), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t r = static_cast<size_t>(owner_[i]);
    shards_[r].push_back(static_cast<int64_t>(i));
    offset_[i] = filled[r];
    filled[r] += params_[i].numel();
  }
  block_numel_ = *std::max_element(load.begin(), load.end());

  std::vector<Tensor> mine;
  for (int64_t i : shard(group_.rank())) mine.push_back(params_[static_cast<size_t>(i)]);
  local_ = make_optimizer(mine);
  check(local_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory returned nullptr");
  check(local_->param_groups().size() == 1, "ZeroRedundancyOptimizer: the wrapped ", local_->name(), " has ",
        local_->param_groups().size(), " parameter groups; only one is supported");
  check(local_->num_params() == static_cast<int64_t>(mine.size()), "ZeroRedundancyOptimizer: the wrapped ",
        local_->name(), " holds ", local_->num_params(), " parameters, but this rank's shard has ", mine.size(),
        " (the factory must optimize exactly the parameters it is given)");
}

void ZeroRedundancyOptimizer::step() {
  NoGradGuard no_grad;
  const int world = group_.size(), rank = group_.rank();
  const Tensor& first = params_[0];
  const TensorOptions flat_options{first.dtype(), first.device()};

  if (options_.gradients == ZeroGradients::ReduceScatter) {
    // Every rank lays its local gradients out in the owners' blocks; the reduce-scatter leaves
    // each rank the average of its own block. A parameter without a gradient counts as zeros.
    Tensor grads = zeros({world * block_numel_}, flat_options);
    for (size_t i = 0; i < params_.size(); ++i) {
      const Tensor& g = params_[i].grad();
      if (!g.defined()) continue;
      grads.narrow(0, owner_[i] * block_numel_ + offset_[i], g.numel()).copy_(g.reshape({-1}));
    }
    Tensor mine = empty({block_numel_}, flat_options);
    group_.reduce_scatter(mine, grads, parallel::ReduceOp::Avg)->wait();
    for (int64_t i : shard(rank)) {
      Tensor& p = params_[static_cast<size_t>(i)];
      p.set_grad(mine.narrow(0, offset_[static_cast<size_t>(i)], p.numel()).reshape(p.shape()));
    }
  }

  local_->step();

  // Every rank's updated shard to every rank: one all-gather of equal-sized blocks.
  Tensor mine = zeros({block_numel_}, flat_options);
  for (int64_t i : shard(rank)) {
    const Tensor& p = params_[static_cast<size_t>(i)];
    mine.narrow(0, offset_[static_cast<size_t>(i)], p.numel()).copy_(p.reshape({-1}));
  }
  Tensor all = empty({world * block_numel_}, flat_options);
  group_.allgather(all, mine)->wait();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] == rank) continue;
    Tensor& p = params_[i];
    p.copy_(all.narrow(0, owner_[i] * block_numel_ + offset_[i], p.numel()).reshape(p.shape()));
  }
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (Tensor& p : params_)
    if (p.grad().defined()) p.set_grad(Tensor());
}

int64_t ZeroRedundancyOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (int64_t i = 0; i < local_->num_params(); ++i)
    for (const auto& [name, t] : local_->state(i)) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

StateDict ZeroRedundancyOptimizer::consolidated_state_dict(int to) {
  const int rank = group_.rank();
  const std::vector<int64_t>& mine = shard(rank);
  // This rank's per-parameter state under the parameters' global indices.
  StateDict local = local_->state_dict(), renamed;
  for (const auto& [key, tensor] : local) {
    int64_t index = 0;
    std::string name;
    if (parse_state_key(key, index, name))
      renamed[str_cat("state.", mine[static_cast<size_t>(index)], ".", name)] = tensor;
  }
  std::vector<std::string> parts =
      parallel::gather_object(group_, encode_safetensors(renamed), to);
  if (rank != to) return {};
  StateDict whole;
  for (size_t r = 0; r < parts.size(); ++r) {
    SafetensorsFile part = decode_safetensors(parts[r], str_cat("rank ", r, "'s optimizer state"));
    whole.insert(part.tensors.begin(), part.tensors.end());
  }
  // One group over every parameter, with the hyperparameters and step count every rank shares.
  for (const auto& [key, tensor] : local)
    if (key.compare(0, 15, "param_groups.0.") == 0) whole[key] = tensor;
  whole["param_groups.0.params"] = arange(static_cast<int64_t>(params_.size()), TensorOptions{DType::i64});
  return whole;
}

void ZeroRedundancyOptimizer::load_state_dict(const StateDict& state) {
  const auto params_key = state.find("param_groups.0.params");
  check(params_key != state.end(), "ZeroRedundancyOptimizer.load_state_dict: no param_groups.0.params");
  check(state.count("param_groups.1.params") == 0,
        "ZeroRedundancyOptimizer.load_state_dict: the state has several parameter groups; only one is supported");
  check(params_key->second.numel() == static_cast<int64_t>(params_.size()),
        "ZeroRedundancyOptimizer.load_state_dict: the state is for ", params_key->second.numel(),
        " parameters but this optimizer has ", params_.size());
  const std::vector<int64_t>& mine = shard(group_.rank());
  std::vector<int64_t> local_index(params_.size(), -1);
  for (size_t j = 0; j < mine.size(); ++j) local_index[static_cast<size_t>(mine[j])] = static_cast<int64_t>(j);
  StateDict local;
  for (const auto& [key, tensor] : state) {
    int64_t index = 0;
    std::string name;
    if (parse_state_key(key, index, name)) {
      check(index >= 0 && index < static_cast<int64_t>(params_.size()), "ZeroRedundancyOptimizer.load_state_dict: ",
            key, " names parameter ", index, " of ", params_.size());
      const int64_t j = local_index[static_cast<size_t>(index)];
      if (j >= 0) local[str_cat("state.", j, ".", name)] = tensor;
    } else {
      local[key] = tensor;  // the group's hyperparameters; anything unknown, the wrapped optimizer names
    }
  }
  local["param_groups.0.params"] = arange(static_cast<int64_t>(mine.size()), TensorOptions{DType::i64});
  local_->load_state_dict(local);
}

}  // namespace mg::optim
