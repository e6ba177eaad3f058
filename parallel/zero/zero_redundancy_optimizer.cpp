#include "parallel/zero/zero_redundancy_optimizer.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "parallel/comm/object_collectives.h"

namespace mg::parallel {
namespace {

// "state.<index>.<name>" -> (index, name); false for any other key. A "state." key whose index is
// not 1 to 18 decimal digits ("state.x.exp_avg", a 20-digit index) is an mg::Error naming it --
// it used to escape as std::invalid_argument / std::out_of_range from std::stoll.
bool parse_state_key(const std::string& key, int64_t& index, std::string& name) {
  const std::string prefix = "state.";
  if (key.compare(0, prefix.size(), prefix) != 0) return false;
  const size_t dot = key.find('.', prefix.size());
  if (dot == std::string::npos) return false;
  const std::string digits = key.substr(prefix.size(), dot - prefix.size());
  MG_CHECK(
      !digits.empty() && digits.size() <= 18 && digits.find_first_not_of("0123456789") == std::string::npos,
      "ZeroRedundancyOptimizer: the state key '", key,
      "' does not name a parameter index (state.<index>.<name>, index 0 to 18 digits)");
  index = std::stoll(digits);
  name = key.substr(dot + 1);
  return true;
}

bool is_group_key(const std::string& key) { return key.compare(0, 15, "param_groups.0.") == 0; }

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<Tensor> params, parallel::ProcessGroup group,
                                                 const OptimizerFactory& make_optimizer, ZeroOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  MG_CHECK(group_.defined(), "ZeroRedundancyOptimizer: the process group is undefined");
  const int world = group_.size();
  MG_CHECK(!params_.empty(), "ZeroRedundancyOptimizer: no parameters");
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined(), "ZeroRedundancyOptimizer: parameter ", i, " is undefined");
    MG_CHECK(p.dtype() == params_[0].dtype() && p.device() == params_[0].device(),
             "ZeroRedundancyOptimizer: parameter ", i, " is ", p.dtype(), " on ", p.device(),
             " but parameter 0 is ", params_[0].dtype(), " on ", params_[0].device(),
             "; every parameter must share one dtype and device");
    MG_CHECK(p.is_contiguous(), "ZeroRedundancyOptimizer: parameter ", i, " is not contiguous");
    total += p.numel();
  }
  segments_.assign(static_cast<size_t>(world), {});

  if (options_.stage == ZeroStage::Gradients) {
    // ZeRO-2: the engine's layout (each bucket cut in N padded ranges); the state code below treats
    // it as a flat partition whose blocks have gaps (the padding).
    options_.partition = ZeroPartition::Flat;
    gradient_reducer_ =
        ShardedGradientReducer::create(params_, group_, options_.bucket_cap_mb, options_.first_bucket_cap_mb);
    for (int r = 0; r < world; ++r)
      for (const auto& s : gradient_reducer_->segments()[static_cast<size_t>(r)])
        segments_[static_cast<size_t>(r)].push_back(
            Segment{s.param, s.param_offset, s.numel, s.block_offset});
    block_numel_ = gradient_reducer_->shard_numel();
  } else if (options_.partition == ZeroPartition::Parameters) {
    MG_CHECK(static_cast<int64_t>(params_.size()) >= world, "ZeroRedundancyOptimizer: ", params_.size(),
             " parameters cannot be sharded over ", world,
             " ranks by parameter (every rank must own one); ZeroPartition::Flat can");
    // Balanced by size, the same on every rank: largest first, each to the least-loaded rank.
    std::vector<int64_t> order(params_.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return params_[a].numel() > params_[b].numel(); });
    std::vector<int64_t> load(static_cast<size_t>(world), 0);
    std::vector<int> owner(params_.size(), 0);
    for (int64_t i : order) {
      const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      owner[static_cast<size_t>(i)] = r;
      load[static_cast<size_t>(r)] += params_[static_cast<size_t>(i)].numel();
    }
    for (size_t i = 0; i < params_.size(); ++i) {  // each block in parameter order
      auto& segments = segments_[static_cast<size_t>(owner[i])];
      const int64_t at = segments.empty() ? 0 : segments.back().block_offset + segments.back().numel;
      segments.push_back(Segment{static_cast<int64_t>(i), 0, params_[i].numel(), at});
    }
    block_numel_ = *std::max_element(load.begin(), load.end());
  } else {
    // The parameters end to end, cut every block_numel_ elements.
    block_numel_ = (total + world - 1) / world;
    int64_t start = 0;  // of the current parameter in the flat order
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t n = params_[i].numel();
      for (int64_t at = start; at < start + n;) {
        const int64_t r = at / block_numel_;
        const int64_t end = std::min(start + n, (r + 1) * block_numel_);
        segments_[static_cast<size_t>(r)].push_back(
            Segment{static_cast<int64_t>(i), at - start, end - at, at - r * block_numel_});
        at = end;
      }
      start += n;
    }
    for (int r = 0; r < world; ++r)
      MG_CHECK(shard_numel(r) > 0, "ZeroRedundancyOptimizer: ", total, " elements leave rank ", r, " of ",
               world, " nothing to own");
  }

  std::vector<Tensor> mine;
  if (options_.partition == ZeroPartition::Parameters) {
    for (const Segment& s : segments_[static_cast<size_t>(group_.rank())]) mine.push_back(params_[s.param]);
  } else {
    NoGradGuard no_grad;
    const int64_t numel = gradient_reducer_ ? block_numel_ : shard_numel(group_.rank());  // ZeRO-2: padded
    flat_shard_ = zeros({numel}, TensorOptions{params_[0].dtype(), params_[0].device()});
    flat_shard_.set_requires_grad(true);
    mine.push_back(flat_shard_);
  }
  local_ = make_optimizer(mine);
  MG_CHECK(local_ != nullptr, "ZeroRedundancyOptimizer: the optimizer factory returned nullptr");
  MG_CHECK(local_->param_groups().size() == 1, "ZeroRedundancyOptimizer: the wrapped ", local_->name(),
           " has ", local_->param_groups().size(), " parameter groups; only one is supported");
  MG_CHECK(local_->num_params() == static_cast<int64_t>(mine.size()), "ZeroRedundancyOptimizer: the wrapped ",
           local_->name(), " holds ", local_->num_params(), " parameters, but this rank's shard has ",
           mine.size(), " (the factory must optimize exactly the parameters it is given)");
}

std::vector<int64_t> ZeroRedundancyOptimizer::shard(int rank) const {
  std::vector<int64_t> out;
  for (const Segment& s : segments_[static_cast<size_t>(rank)])
    if (out.empty() || out.back() != s.param) out.push_back(s.param);
  return out;
}

int64_t ZeroRedundancyOptimizer::shard_numel(int rank) const {
  int64_t n = 0;
  for (const Segment& s : segments_[static_cast<size_t>(rank)]) n += s.numel;
  return n;
}

void ZeroRedundancyOptimizer::step() {
  NoGradGuard no_grad;
  if (gradient_reducer_) {  // ZeRO-2: the shard's gradients were reduce-scattered during backward
    MG_CHECK(gradient_reducer_->has_gradients(),
             "ZeroRedundancyOptimizer (ZeRO-2): step() without a synchronised backward since the last "
             "zero_grad(): there is no gradient shard to step");
    gradient_reducer_->copy_params_into_shard(flat_shard_);
    flat_shard_.set_grad(gradient_reducer_->grad_shard());
    local_->step();
    flat_shard_.set_grad(Tensor());
    gradient_reducer_->all_gather_params(flat_shard_);
    return;
  }
  const int world = group_.size(), rank = group_.rank();
  const bool flat_partition = options_.partition == ZeroPartition::Flat;
  const TensorOptions flat_options{params_[0].dtype(), params_[0].device()};
  const std::vector<Segment>& my_segments = segments_[static_cast<size_t>(rank)];
  if (flat_partition) {
    for (size_t i = 0; i < params_.size(); ++i)
      MG_CHECK(
          params_[i].grad().defined(), "ZeroRedundancyOptimizer (ZeroPartition::Flat): parameter ", i,
          " has no gradient this step; a flat shard updates every element (use ZeroPartition::Parameters "
          "for models with unused parameters)");
  }

  // This rank's gradients: the reduce-scattered block, or (AllReduced) read out of the parameters.
  Tensor my_grads;
  if (options_.gradients == ZeroGradients::ReduceScatter) {
    // Every rank lays its local gradients out in the owners' blocks; the reduce-scatter leaves
    // each rank the average of its own block. A parameter without a gradient counts as zeros.
    if (!reduce_input_.defined()) reduce_input_ = empty({world * block_numel_}, flat_options);
    Tensor& grads = reduce_input_;
    grads.zero_();
    for (int r = 0; r < world; ++r) {
      for (const Segment& s : segments_[static_cast<size_t>(r)]) {
        const Tensor& g = params_[static_cast<size_t>(s.param)].grad();
        if (!g.defined()) continue;
        grads.narrow(0, r * block_numel_ + s.block_offset, s.numel)
            .copy_(g.reshape({-1}).narrow(0, s.param_offset, s.numel));
      }
    }
    my_grads = empty({block_numel_}, flat_options);
    group_.reduce_scatter(my_grads, grads, parallel::ReduceOp::Avg)->wait();
    if (!flat_partition) {
      for (const Segment& s : my_segments) {
        Tensor& p = params_[static_cast<size_t>(s.param)];
        p.set_grad(my_grads.narrow(0, s.block_offset, s.numel).reshape(p.shape()));
      }
    }
  }
  if (flat_partition) {
    // The wrapped optimizer's one tensor: this rank's range of the parameters and of their gradients.
    Tensor grad = empty({flat_shard_.numel()}, flat_options);
    for (const Segment& s : my_segments) {
      flat_shard_.narrow(0, s.block_offset, s.numel).copy_(flat(s.param).narrow(0, s.param_offset, s.numel));
      if (!my_grads.defined())
        grad.narrow(0, s.block_offset, s.numel)
            .copy_(params_[static_cast<size_t>(s.param)].grad().reshape({-1}).narrow(0, s.param_offset,
                                                                                     s.numel));
    }
    flat_shard_.set_grad(my_grads.defined() ? my_grads.narrow(0, 0, flat_shard_.numel()) : grad);
  }

  local_->step();

  // Every rank's updated shard to every rank: one all-gather of equal-sized blocks.
  if (!gathered_.defined()) {  // the communication buffers live as long as the optimizer
    send_block_ = zeros({block_numel_}, flat_options);  // the padding stays zero
    gathered_ = empty({world * block_numel_}, flat_options);
  }
  Tensor& mine = send_block_;
  if (flat_partition) {
    mine.narrow(0, 0, flat_shard_.numel()).copy_(flat_shard_);
  } else {
    for (const Segment& s : my_segments)
      mine.narrow(0, s.block_offset, s.numel).copy_(flat(s.param).narrow(0, s.param_offset, s.numel));
  }
  Tensor& all = gathered_;
  group_.allgather(all, mine)->wait();
  for (int r = 0; r < world; ++r) {
    if (r == rank && !flat_partition) continue;  // updated in place already
    for (const Segment& s : segments_[static_cast<size_t>(r)])
      flat(s.param)
          .narrow(0, s.param_offset, s.numel)
          .copy_(all.narrow(0, r * block_numel_ + s.block_offset, s.numel));
  }
  if (flat_partition) flat_shard_.set_grad(Tensor());
}

void ZeroRedundancyOptimizer::zero_grad() {
  for (Tensor& p : params_)
    if (p.grad().defined()) p.set_grad(Tensor());
  if (gradient_reducer_) gradient_reducer_->zero_grad();
}

ZeroRedundancyOptimizer::NoSyncGuard ZeroRedundancyOptimizer::no_sync() {
  MG_CHECK(gradient_reducer_ != nullptr,
           "ZeroRedundancyOptimizer::no_sync is ZeRO-2's (ZeroStage::Gradients); at stage 1 the gradients "
           "are DDP's: use DistributedDataParallel::no_sync");
  return NoSyncGuard(*gradient_reducer_);
}

int64_t ZeroRedundancyOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (int64_t i = 0; i < local_->num_params(); ++i)
    for (const auto& [name, t] : local_->state(i)) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

StateDict ZeroRedundancyOptimizer::consolidated_state_dict(int to) {
  const int rank = group_.rank();
  StateDict local = local_->state_dict(), mine;
  const std::vector<Segment>& my_segments = segments_[static_cast<size_t>(rank)];
  for (const auto& [key, tensor] : local) {
    int64_t index = 0;
    std::string name;
    if (!parse_state_key(key, index, name)) continue;
    // Parameters: the state under the parameters' global indices; Flat: the flat range as it is.
    if (options_.partition == ZeroPartition::Parameters)
      mine[str_cat("state.", my_segments[static_cast<size_t>(index)].param, ".", name)] = tensor;
    else
      mine[key] = tensor;
  }
  std::vector<std::string> parts = parallel::gather_object(group_, encode_safetensors(mine), to);
  if (rank != to) return {};
  StateDict whole;
  if (options_.partition == ZeroPartition::Parameters) {
    for (size_t r = 0; r < parts.size(); ++r) {
      SafetensorsFile part = decode_safetensors(parts[r], str_cat("rank ", r, "'s optimizer state"));
      whole.insert(part.tensors.begin(), part.tensors.end());
    }
  } else {
    whole = consolidate_flat(parts);
  }
  // One group over every parameter, with the hyperparameters and step count every rank shares.
  for (const auto& [key, tensor] : local)
    if (is_group_key(key)) whole[key] = tensor;
  whole["param_groups.0.params"] = arange(static_cast<int64_t>(params_.size()), TensorOptions{DType::i64});
  return whole;
}

// Flat: each rank sent state.0.<name> for its block (or a 0-d counter); each segment of each rank's
// block goes back to its place in its parameter (ZeRO-2's padding is dropped).
StateDict ZeroRedundancyOptimizer::consolidate_flat(const std::vector<std::string>& parts) const {
  std::vector<StateDict> ranks;
  for (size_t r = 0; r < parts.size(); ++r)
    ranks.push_back(decode_safetensors(parts[r], str_cat("rank ", r, "'s optimizer state")).tensors);
  StateDict whole;
  for (const auto& [key, first] : ranks[0]) {
    const std::string name = key.substr(std::string("state.0.").size());
    if (first.dim() == 0) {  // a counter ("step"): the same on every rank, one per parameter
      for (size_t i = 0; i < params_.size(); ++i) whole[str_cat("state.", i, ".", name)] = first.clone();
      continue;
    }
    std::vector<Tensor> per_param;
    for (const Tensor& p : params_) per_param.push_back(zeros({p.numel()}, TensorOptions{first.dtype()}));
    for (size_t r = 0; r < ranks.size(); ++r) {
      MG_CHECK(ranks[r].count(key) == 1, "ZeroRedundancyOptimizer: rank ", r, " has no ", key,
               " but rank 0 has");
      const Tensor& block = ranks[r].at(key);
      for (const Segment& s : segments_[r])
        per_param[static_cast<size_t>(s.param)]
            .narrow(0, s.param_offset, s.numel)
            .copy_(block.narrow(0, s.block_offset, s.numel));
    }
    for (size_t i = 0; i < params_.size(); ++i)
      whole[str_cat("state.", i, ".", name)] = per_param[i].reshape(params_[i].shape());
  }
  return whole;
}

void ZeroRedundancyOptimizer::load_state_dict(const StateDict& state) {
  const auto params_key = state.find("param_groups.0.params");
  MG_CHECK(params_key != state.end(), "ZeroRedundancyOptimizer.load_state_dict: no param_groups.0.params");
  MG_CHECK(state.count("param_groups.1.params") == 0,
           "ZeroRedundancyOptimizer.load_state_dict: the state has several parameter groups; only one is "
           "supported");
  MG_CHECK(params_key->second.numel() == static_cast<int64_t>(params_.size()),
           "ZeroRedundancyOptimizer.load_state_dict: the state is for ", params_key->second.numel(),
           " parameters but this optimizer has ", params_.size());
  const std::vector<Segment>& my_segments = segments_[static_cast<size_t>(group_.rank())];
  StateDict local;
  for (const auto& [key, tensor] : state) {
    int64_t index = 0;
    std::string name;
    if (!parse_state_key(key, index, name)) {
      local[key] = tensor;  // the group's hyperparameters; anything unknown, the wrapped optimizer names
      continue;
    }
    MG_CHECK(index >= 0 && index < static_cast<int64_t>(params_.size()),
             "ZeroRedundancyOptimizer.load_state_dict: ", key, " names parameter ", index, " of ",
             params_.size());
  }
  if (options_.partition == ZeroPartition::Parameters) {
    for (size_t j = 0; j < my_segments.size(); ++j) {
      const std::string prefix = str_cat("state.", my_segments[j].param, ".");
      for (auto it = state.lower_bound(prefix);
           it != state.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
        local[str_cat("state.", j, ".", it->first.substr(prefix.size()))] = it->second;
    }
    local["param_groups.0.params"] =
        arange(static_cast<int64_t>(my_segments.size()), TensorOptions{DType::i64});
  } else {
    // Parameter 0's state names the entries; each is cut to this rank's range.
    const std::string prefix = "state.0.";
    for (auto it = state.lower_bound(prefix);
         it != state.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      const std::string name = it->first.substr(prefix.size());
      if (it->second.dim() == 0) {
        local["state.0." + name] = it->second;
        continue;
      }
      // This rank's block: its segments at their offsets (ZeRO-2's padding: zeros), in the
      // parameters' dtype. Every piece must be a float tensor of its parameter's shape: anything
      // else would be cut at the wrong offsets or converted out of range.
      Tensor block = zeros({flat_shard_.numel()}, TensorOptions{flat_shard_.dtype(), it->second.device()});
      for (const Segment& s : my_segments) {
        const std::string key = str_cat("state.", s.param, ".", name);
        MG_CHECK(state.count(key) == 1, "ZeroRedundancyOptimizer.load_state_dict: ", key, " is missing");
        const Tensor& piece = state.at(key);
        const Shape& want = params_[static_cast<size_t>(s.param)].shape();
        MG_CHECK(is_floating(piece.dtype()) && piece.shape() == want,
                 "ZeroRedundancyOptimizer.load_state_dict: ", key, " is ", shape_str(piece.shape()), " ",
                 dtype_name(piece.dtype()), "; expected ", shape_str(want), " float like parameter ",
                 s.param);
        block.narrow(0, s.block_offset, s.numel)
            .copy_(piece.reshape({-1}).narrow(0, s.param_offset, s.numel));
      }
      local["state.0." + name] = block;
    }
    local["param_groups.0.params"] = arange(int64_t{1}, TensorOptions{DType::i64});
  }
  local_->load_state_dict(local);
}

}  // namespace mg::parallel
