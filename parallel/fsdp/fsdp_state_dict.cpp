// Full and sharded state dicts of FullyShardedDataParallel (see fsdp_state_dict.h).
#include "parallel/fsdp/fsdp_state_dict.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/safetensors.h"

namespace mg::parallel {
namespace {

std::string unit_key(const FlatParamUnit& unit, const std::string& what) {
  return "fsdp/" + unit.name() + "/" + what;
}

const char* const kOptimGroupPrefix = "optim/";  // before param_groups.0.<name> in a sharded dict

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

Tensor layout_tensor(const FlatParamUnit& unit, const ProcessGroup& group) {
  return tensor(std::vector<int64_t>{group.size(), group.rank(), unit.numel(), unit.shard_numel()});
}

std::string shard_file(const std::string& dir, int rank, int world) {
  return (std::filesystem::path(dir) / str_cat("fsdp-rank", rank, "-of", world, ".safetensors")).string();
}

void add_buffers(const FullyShardedDataParallel& fsdp, StateDict& out) {
  for (const auto& [name, slot] : fsdp.module().named_buffer_slots())
    out[name] = slot->detach().to(Device::cpu()).clone();
}

void load_buffers(FullyShardedDataParallel& fsdp, const StateDict& state) {
  NoGradGuard no_grad;
  for (const auto& [name, slot] : fsdp.module().named_buffer_slots()) {
    auto it = state.find(name);
    MG_CHECK(it != state.end(), "FSDP: the state dict has no buffer '", name, "'");
    MG_CHECK(it->second.shape() == slot->shape(), "FSDP: buffer '", name, "' is ",
             shape_str(it->second.shape()), " in the state dict but ", shape_str(slot->shape()),
             " in the module");
    slot->copy_(it->second);
  }
}

// Old ranks' sharded state dicts, each fetched once and only when a range needs it.
class OldShards {
 public:
  explicit OldShards(const std::function<StateDict(int old_rank)>& shard_of) : shard_of_(shard_of) {}

  const StateDict& operator()(int k) {
    auto it = loaded_.find(k);
    if (it == loaded_.end()) it = loaded_.emplace(k, shard_of_(k)).first;
    return it->second;
  }

  // Old rank k's [world size, rank, numel, s] of `unit`, checked against the unit.
  std::vector<int64_t> layout(const FlatParamUnit& unit, int k) {
    const StateDict& state = (*this)(k);
    auto it = state.find(unit_key(unit, "layout"));
    MG_CHECK(it != state.end(), "FSDP: old rank ", k, "'s sharded state dict has no unit '", unit.name(),
             "'");
    std::vector<int64_t> layout = it->second.to_vector<int64_t>();
    MG_CHECK(layout.size() == 4 && layout[1] == k, "FSDP: old rank ", k, "'s layout of unit '", unit.name(),
             "' is malformed");
    MG_CHECK(layout[2] == unit.numel(), "FSDP: unit '", unit.name(), "' has ", unit.numel(),
             " parameter elements but the checkpoint has ", layout[2], " (another model?)");
    return layout;
  }

  // This rank's s elements of the flat tensor stored under `key` in every old shard (the padding
  // zero): copied from the old shards that hold them (old rank k holds [k*s_old, (k+1)*s_old)).
  Tensor reslice(const FlatParamUnit& unit, int rank, const std::string& key) {
    const std::vector<int64_t> layout0 = layout(unit, 0);
    const int64_t old_world = layout0[0], old_s = layout0[3];
    auto first = (*this)(0).find(key);
    MG_CHECK(first != (*this)(0).end(), "FSDP: old rank 0's sharded state dict has no ", key);
    Tensor out = zeros({unit.shard_numel()}, TensorOptions{first->second.dtype()});
    const int64_t begin = rank * unit.shard_numel();
    const int64_t end = std::min(begin + unit.shard_numel(), unit.numel());
    for (int64_t at = begin; at < end;) {
      const int k = static_cast<int>(at / old_s);
      MG_CHECK(k < old_world, "FSDP: unit '", unit.name(), "': element ", at, " is beyond the old shards");
      const std::vector<int64_t> layout_k = layout(unit, k);
      MG_CHECK(layout_k[0] == old_world && layout_k[3] == old_s, "FSDP: old ranks 0 and ", k,
               " disagree on the layout of unit '", unit.name(), "'");
      auto piece = (*this)(k).find(key);
      MG_CHECK(piece != (*this)(k).end() && piece->second.numel() == old_s, "FSDP: old rank ", k,
               "'s sharded state dict has no ", key, " of ", old_s, " elements");
      const int64_t piece_end = std::min(end, (k + 1) * old_s);
      out.narrow(0, at - begin, piece_end - at)
          .copy_(piece->second.narrow(0, at - k * old_s, piece_end - at));
      at = piece_end;
    }
    return out;
  }

 private:
  const std::function<StateDict(int old_rank)>& shard_of_;
  std::map<int, StateDict> loaded_;
};

// The unit whose shard each of the optimizer's parameters is (by the optimizer's index).
std::vector<const FlatParamUnit*> optimizer_units(const FullyShardedDataParallel& fsdp,
                                                  const optim::Optimizer& opt) {
  MG_CHECK(opt.param_groups().size() == 1, "FSDP optimizer state dicts: the ", opt.name(), " has ",
           opt.param_groups().size(), " parameter groups; one is supported");
  std::vector<const FlatParamUnit*> out;
  for (const Tensor& param : opt.param_groups()[0].params) {
    const FlatParamUnit* found = nullptr;
    for (const auto& unit : fsdp.units())
      if (unit->shard().is_same(param)) found = unit.get();
    MG_CHECK(found != nullptr, "FSDP optimizer state dicts: the ", opt.name(), "'s parameter ", out.size(),
             " is not one of fsdp.parameters() (build the optimizer on the shards)");
    MG_CHECK(std::find(out.begin(), out.end(), found) == out.end(), "FSDP optimizer state dicts: unit '",
             found->name(), "' is in the ", opt.name(), " twice");
    out.push_back(found);
  }
  return out;
}

// Each parameter's index in the unwrapped module's parameters() (the plain optimizer's indices).
std::map<std::string, int64_t> plain_indices(const FullyShardedDataParallel& fsdp) {
  std::map<std::string, int64_t> out;
  for (const auto& [name, slot] : fsdp.module().named_parameter_slots())
    out.emplace(name, static_cast<int64_t>(out.size()));
  return out;
}

int64_t plain_index(const std::map<std::string, int64_t>& plain, const std::string& name) {
  auto it = plain.find(name);
  MG_CHECK(it != plain.end(), "FSDP: parameter '", name, "' is not among the module's parameters");
  return it->second;
}

// The entries "<prefix><name>" of `state`, as (name, tensor).
std::vector<std::pair<std::string, Tensor>> entries(const StateDict& state, const std::string& prefix) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto it = state.lower_bound(prefix); it != state.end() && starts_with(it->first, prefix); ++it)
    out.emplace_back(it->first.substr(prefix.size()), it->second);
  return out;
}

int sharded_checkpoint_world(const std::string& dir) {
  int old_world = -1;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = "fsdp-rank0-of", suffix = ".safetensors";
    if (name.size() > prefix.size() + suffix.size() && starts_with(name, prefix) &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      old_world = std::stoi(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
  }
  MG_CHECK(old_world > 0, "FSDP: no sharded checkpoint (fsdp-rank0-of<N>.safetensors) in ", dir);
  return old_world;
}

std::function<StateDict(int)> shard_files(const std::string& dir) {
  const int old_world = sharded_checkpoint_world(dir);
  return [dir, old_world](int k) {
    MG_CHECK(k < old_world, "FSDP: the checkpoint in ", dir, " has ", old_world, " ranks; asked for rank ",
             k);
    return load_safetensors(shard_file(dir, k, old_world)).tensors;
  };
}

}  // namespace

StateDict full_state_dict(const FullyShardedDataParallel& fsdp, int rank) {
  StateDict out;
  ProcessGroup group = fsdp.group();
  const bool mine = rank < 0 || group.rank() == rank;
  NoGradGuard no_grad;
  for (const auto& unit : fsdp.units()) {
    const Tensor& shard = unit->shard();
    Tensor flat = empty({unit->padded_numel()}, TensorOptions{shard.dtype(), shard.device()});
    group.allgather(flat, shard.detach())->wait();
    if (!mine) continue;
    for (const auto& member : unit->members())
      out[member.name] =
          flat.narrow(0, member.offset, member.numel).view(member.shape).to(Device::cpu()).clone();
  }
  if (mine) add_buffers(fsdp, out);
  return out;
}

void load_full_state_dict(FullyShardedDataParallel& fsdp, const StateDict& state) {
  NoGradGuard no_grad;
  const ProcessGroup& group = fsdp.group();
  for (const auto& unit : fsdp.units()) {
    Tensor& shard = unit->shard();
    const int64_t begin = group.rank() * unit->shard_numel(), end = begin + unit->shard_numel();
    for (const auto& member : unit->members()) {
      auto it = state.find(member.name);
      MG_CHECK(it != state.end(), "FSDP: the state dict has no parameter '", member.name, "'");
      MG_CHECK(it->second.shape() == member.shape, "FSDP: parameter '", member.name, "' is ",
               shape_str(it->second.shape()), " in the state dict but ", shape_str(member.shape),
               " in the module");
      // The part of this member inside this rank's range of the flat buffer.
      const int64_t from = std::max(begin, member.offset), to = std::min(end, member.offset + member.numel);
      if (from >= to) continue;
      shard.narrow(0, from - begin, to - from)
          .copy_(it->second.contiguous().reshape({-1}).narrow(0, from - member.offset, to - from));
    }
  }
  load_buffers(fsdp, state);
}

StateDict sharded_state_dict(const FullyShardedDataParallel& fsdp) {
  StateDict out;
  const ProcessGroup& group = fsdp.group();
  for (const auto& unit : fsdp.units()) {
    out[unit_key(*unit, "flat_shard")] = unit->shard().detach().to(Device::cpu()).clone();
    out[unit_key(*unit, "layout")] = layout_tensor(*unit, group);
  }
  add_buffers(fsdp, out);
  return out;
}

void load_sharded_state_dict(FullyShardedDataParallel& fsdp,
                             const std::function<StateDict(int old_rank)>& shard_of) {
  NoGradGuard no_grad;
  OldShards old(shard_of);
  for (const auto& unit : fsdp.units())
    unit->shard().copy_(old.reslice(*unit, fsdp.group().rank(), unit_key(*unit, "flat_shard")));
  load_buffers(fsdp, old(0));
}

void save_sharded_checkpoint(const FullyShardedDataParallel& fsdp, const std::string& dir) {
  ProcessGroup group = fsdp.group();
  std::filesystem::create_directories(dir);
  save_safetensors(shard_file(dir, group.rank(), group.size()), sharded_state_dict(fsdp));
  group.barrier()->wait();
}

void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir) {
  load_sharded_state_dict(fsdp, shard_files(dir));
}

void save_sharded_checkpoint(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt,
                             const std::string& dir) {
  ProcessGroup group = fsdp.group();
  std::filesystem::create_directories(dir);
  StateDict both = sharded_state_dict(fsdp);
  for (auto& [key, t] : sharded_optim_state_dict(fsdp, opt)) both[key] = t;  // the layouts coincide
  save_safetensors(shard_file(dir, group.rank(), group.size()), both);
  group.barrier()->wait();
}

void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, optim::Optimizer& opt, const std::string& dir) {
  // One read of each overlapping file serves the model and the optimizer.
  std::map<int, StateDict> files;
  const std::function<StateDict(int)> read = shard_files(dir);
  const std::function<StateDict(int)> cached = [&](int k) {
    auto it = files.find(k);
    if (it == files.end()) it = files.emplace(k, read(k)).first;
    return it->second;
  };
  load_sharded_state_dict(fsdp, cached);
  load_sharded_optim_state_dict(fsdp, opt, cached);
}

StateDict full_optim_state_dict(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt, int rank) {
  ProcessGroup group = fsdp.group();
  const bool mine = rank < 0 || group.rank() == rank;
  const std::vector<const FlatParamUnit*> units = optimizer_units(fsdp, opt);
  const std::map<std::string, int64_t> plain = plain_indices(fsdp);
  const StateDict local = opt.state_dict();
  NoGradGuard no_grad;
  StateDict out;
  for (size_t j = 0; j < units.size(); ++j) {
    const FlatParamUnit& unit = *units[j];
    for (const auto& [name, value] : entries(local, str_cat("state.", j, "."))) {
      Tensor flat;  // the whole padded state, or the 0-d counter every member gets
      if (value.dim() == 0) {
        flat = value;
      } else {
        MG_CHECK(value.numel() == unit.shard_numel(), "FSDP: the ", opt.name(), "'s ", name, " of unit '",
                 unit.name(), "' has ", value.numel(), " elements, its shard ", unit.shard_numel());
        flat = empty({unit.padded_numel()}, TensorOptions{value.dtype(), value.device()});
        group.allgather(flat, value.contiguous())->wait();
      }
      if (!mine) continue;
      for (const auto& member : unit.members()) {
        const std::string key = str_cat("state.", plain_index(plain, member.name), ".", name);
        out[key] = value.dim() == 0 ? flat.clone()
                                    : flat.narrow(0, member.offset, member.numel)
                                          .view(member.shape)
                                          .to(Device::cpu())
                                          .clone();  // the padding stays behind
      }
    }
  }
  if (!mine) return out;
  for (const auto& [name, value] : entries(local, "param_groups.0."))
    if (name != "params") out["param_groups.0." + name] = value;
  out["param_groups.0.params"] = arange(static_cast<int64_t>(plain.size()), TensorOptions{DType::i64});
  return out;
}

void load_full_optim_state_dict(const FullyShardedDataParallel& fsdp, optim::Optimizer& opt,
                                const StateDict& state) {
  const std::vector<const FlatParamUnit*> units = optimizer_units(fsdp, opt);
  const std::map<std::string, int64_t> plain = plain_indices(fsdp);
  auto params = state.find("param_groups.0.params");
  MG_CHECK(params != state.end(), "FSDP: the optimizer state has no param_groups.0.params");
  MG_CHECK(state.count("param_groups.1.params") == 0,
           "FSDP: the optimizer state has several parameter groups; one is supported");
  MG_CHECK(params->second.numel() == static_cast<int64_t>(plain.size()), "FSDP: the optimizer state is for ",
           params->second.numel(), " parameters but the module has ", plain.size());
  StateDict local;
  for (const auto& [name, value] : entries(state, "param_groups.0."))
    if (name != "params") local["param_groups.0." + name] = value;
  local["param_groups.0.params"] = arange(static_cast<int64_t>(units.size()), TensorOptions{DType::i64});
  const int64_t rank = fsdp.group().rank();
  for (size_t j = 0; j < units.size(); ++j) {
    const FlatParamUnit& unit = *units[j];
    const int64_t begin = rank * unit.shard_numel(), end = begin + unit.shard_numel();
    // The names the first member has; every member must have the same (one shard, one state).
    const auto& first = unit.members().front();
    for (const auto& [name, value] : entries(state, str_cat("state.", plain_index(plain, first.name), "."))) {
      if (value.dim() == 0) {
        local[str_cat("state.", j, ".", name)] = value;
        continue;
      }
      Tensor shard = zeros({unit.shard_numel()}, TensorOptions{value.dtype()});  // the padding: zeros
      for (const auto& member : unit.members()) {
        const std::string key = str_cat("state.", plain_index(plain, member.name), ".", name);
        auto it = state.find(key);
        MG_CHECK(it != state.end(), "FSDP: the optimizer state has ", first.name, "'s ", name, " but no ",
                 key, " (", member.name, " is in the same unit)");
        MG_CHECK(it->second.shape() == member.shape, "FSDP: ", key, " is ", shape_str(it->second.shape()),
                 " but parameter '", member.name, "' is ", shape_str(member.shape));
        const int64_t from = std::max(begin, member.offset), to = std::min(end, member.offset + member.numel);
        if (from >= to) continue;
        shard.narrow(0, from - begin, to - from)
            .copy_(it->second.contiguous().reshape({-1}).narrow(0, from - member.offset, to - from));
      }
      local[str_cat("state.", j, ".", name)] = shard;
    }
  }
  opt.load_state_dict(local);
}

StateDict sharded_optim_state_dict(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt) {
  const std::vector<const FlatParamUnit*> units = optimizer_units(fsdp, opt);
  const StateDict local = opt.state_dict();
  StateDict out;
  for (size_t j = 0; j < units.size(); ++j) {
    out[unit_key(*units[j], "layout")] = layout_tensor(*units[j], fsdp.group());
    for (const auto& [name, value] : entries(local, str_cat("state.", j, ".")))
      out[unit_key(*units[j], "optim_state/" + name)] = value.to(Device::cpu()).clone();
  }
  for (const auto& [name, value] : entries(local, "param_groups.0."))
    if (name != "params") out[kOptimGroupPrefix + ("param_groups.0." + name)] = value;
  return out;
}

void load_sharded_optim_state_dict(const FullyShardedDataParallel& fsdp, optim::Optimizer& opt,
                                   const std::function<StateDict(int old_rank)>& shard_of) {
  const std::vector<const FlatParamUnit*> units = optimizer_units(fsdp, opt);
  OldShards old(shard_of);
  StateDict local;
  for (const auto& [key, value] : entries(old(0), kOptimGroupPrefix)) local[key] = value;
  MG_CHECK(!local.empty(), "FSDP: old rank 0's sharded state dict has no optimizer state (",
           kOptimGroupPrefix, "param_groups.0.*)");
  local["param_groups.0.params"] = arange(static_cast<int64_t>(units.size()), TensorOptions{DType::i64});
  for (size_t j = 0; j < units.size(); ++j) {
    const FlatParamUnit& unit = *units[j];
    const std::string prefix = unit_key(unit, "optim_state/");
    for (const auto& [name, value] : entries(old(0), prefix))
      local[str_cat("state.", j, ".", name)] =
          value.dim() == 0 ? value : old.reslice(unit, fsdp.group().rank(), prefix + name);
  }
  opt.load_state_dict(local);
}

}  // namespace mg::parallel
