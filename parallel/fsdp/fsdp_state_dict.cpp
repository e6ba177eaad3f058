// Full and sharded state dicts of FullyShardedDataParallel (see fsdp_state_dict.h).
#include "parallel/fsdp/fsdp_state_dict.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <vector>

#include "core/base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/safetensors.h"

namespace mg::parallel {
namespace {

std::string unit_key(const FlatParamUnit& unit, const char* what) {
  return "fsdp/" + unit.name() + "/" + what;
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
    out[unit_key(*unit, "layout")] =
        tensor(std::vector<int64_t>{group.size(), group.rank(), unit->numel(), unit->shard_numel()});
  }
  add_buffers(fsdp, out);
  return out;
}

void load_sharded_state_dict(FullyShardedDataParallel& fsdp,
                             const std::function<StateDict(int old_rank)>& shard_of) {
  NoGradGuard no_grad;
  const ProcessGroup& group = fsdp.group();
  std::map<int, StateDict> loaded;
  auto old = [&](int k) -> const StateDict& {
    auto it = loaded.find(k);
    if (it == loaded.end()) it = loaded.emplace(k, shard_of(k)).first;
    return it->second;
  };
  auto layout_of = [&](const StateDict& state, const FlatParamUnit& unit, int k) {
    auto it = state.find(unit_key(unit, "layout"));
    MG_CHECK(it != state.end() && state.count(unit_key(unit, "flat_shard")), "FSDP: old rank ", k,
             "'s sharded state dict has no unit '", unit.name(), "'");
    std::vector<int64_t> layout = it->second.to_vector<int64_t>();
    MG_CHECK(layout.size() == 4 && layout[1] == k, "FSDP: old rank ", k, "'s layout of unit '", unit.name(),
             "' is malformed");
    MG_CHECK(layout[2] == unit.numel(), "FSDP: unit '", unit.name(), "' has ", unit.numel(),
             " parameter elements but the checkpoint has ", layout[2], " (another model?)");
    return layout;
  };
  const StateDict& first = old(0);
  for (const auto& unit : fsdp.units()) {
    const std::vector<int64_t> layout0 = layout_of(first, *unit, 0);
    const int64_t old_world = layout0[0], old_s = layout0[3];
    Tensor& shard = unit->shard();
    shard.zero_();  // the padding
    const int64_t begin = group.rank() * unit->shard_numel();
    const int64_t end = std::min(begin + unit->shard_numel(), unit->numel());
    for (int64_t at = begin; at < end;) {
      const int k = static_cast<int>(at / old_s);
      MG_CHECK(k < old_world, "FSDP: unit '", unit->name(), "': element ", at, " is beyond the old shards");
      const StateDict& state = old(k);
      const std::vector<int64_t> layout = layout_of(state, *unit, k);
      MG_CHECK(layout[0] == old_world && layout[3] == old_s, "FSDP: old ranks 0 and ", k,
               " disagree on the layout of unit '", unit->name(), "'");
      const int64_t piece_end = std::min(end, (k + 1) * old_s);
      shard.narrow(0, at - begin, piece_end - at)
          .copy_(state.at(unit_key(*unit, "flat_shard")).narrow(0, at - k * old_s, piece_end - at));
      at = piece_end;
    }
  }
  load_buffers(fsdp, first);
}

void save_sharded_checkpoint(const FullyShardedDataParallel& fsdp, const std::string& dir) {
  ProcessGroup group = fsdp.group();
  std::filesystem::create_directories(dir);
  save_safetensors(shard_file(dir, group.rank(), group.size()), sharded_state_dict(fsdp));
  group.barrier()->wait();
}

void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir) {
  int old_world = -1;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    const std::string prefix = "fsdp-rank0-of", suffix = ".safetensors";
    if (name.size() > prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      old_world = std::stoi(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
  }
  MG_CHECK(old_world > 0, "FSDP: no sharded checkpoint (fsdp-rank0-of<N>.safetensors) in ", dir);
  load_sharded_state_dict(fsdp, [&](int k) {
    MG_CHECK(k < old_world, "FSDP: the checkpoint in ", dir, " has ", old_world, " ranks; asked for rank ",
             k);
    return load_safetensors(shard_file(dir, k, old_world)).tensors;
  });
}

}  // namespace mg::parallel
