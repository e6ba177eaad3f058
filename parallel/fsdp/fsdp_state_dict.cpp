// Full and sharded state dicts of FullyShardedDataParallel (see fsdp_state_dict.h).
#include "parallel/fsdp/fsdp_state_dict.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/safetensors.h"
#include "parallel/comm/object_collectives.h"

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

// "'fc0'", or "'' (the root)" for the root unit.
std::string unit_label(const std::string& name) { return name.empty() ? "'' (the root)" : "'" + name + "'"; }

// The units a sharded state dict holds (its "fsdp/<name>/layout" keys), as a sorted list of labels.
std::string units_in(const StateDict& state) {
  std::vector<std::string> names;
  const std::string prefix = "fsdp/", suffix = "/layout";
  for (auto it = state.lower_bound(prefix); it != state.end() && starts_with(it->first, prefix); ++it)
    if (it->first.size() >= prefix.size() + suffix.size() &&
        it->first.compare(it->first.size() - suffix.size(), suffix.size(), suffix) == 0)
      names.push_back(
          unit_label(it->first.substr(prefix.size(), it->first.size() - prefix.size() - suffix.size())));
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out.empty() ? std::string("none") : out;
}

std::string units_of(const std::vector<const FlatParamUnit*>& units) {
  std::vector<std::string> names;
  for (const FlatParamUnit* unit : units) names.push_back(unit_label(unit->name()));
  std::sort(names.begin(), names.end());
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

constexpr int64_t kMaxShardWorld = 1 << 20;  // ranks of a sharded checkpoint; far above any job

// Old ranks' sharded state dicts, each fetched once and only when a range needs it. `source(k)`
// names old rank k's state dict in messages (its file, when it came from one).
class OldShards {
 public:
  using Source = std::function<std::string(int old_rank)>;
  explicit OldShards(const std::function<StateDict(int old_rank)>& shard_of, Source source = {})
      : shard_of_(shard_of), source_(std::move(source)) {}

  const StateDict& operator()(int k) {
    auto it = loaded_.find(k);
    if (it == loaded_.end()) it = loaded_.emplace(k, shard_of_(k)).first;
    return it->second;
  }

  std::string source(int k) const {
    return source_ ? source_(k) : str_cat("old rank ", k, "'s sharded state dict");
  }

  // Old rank 0 holds exactly the units `units` (the same wrap policy and model), else an error
  // naming what this model expects and what the checkpoint has.
  void check_units(const std::vector<const FlatParamUnit*>& units) {
    const StateDict& state = (*this)(0);
    size_t found = 0;
    for (auto it = state.lower_bound("fsdp/"); it != state.end() && starts_with(it->first, "fsdp/"); ++it)
      if (it->first.size() > 7 && it->first.compare(it->first.size() - 7, 7, "/layout") == 0) ++found;
    bool same = found == units.size();
    for (const FlatParamUnit* unit : units) same = same && state.count(unit_key(*unit, "layout")) == 1;
    MG_CHECK(same, "FSDP: ", source(0), " holds the units ", units_in(state),
             " but this model's wrap policy makes ", units_of(units),
             " (saved with another wrap policy, or from another model?)");
  }

  // Old rank k's [world size, rank, numel, s] of `unit`, checked against the unit: a world of at
  // least one rank holding k, the unit's element count, and a shard size s > 0 with world * s
  // covering the unit (s = 0 would divide by zero below; no checksum is required to catch it).
  std::vector<int64_t> layout(const FlatParamUnit& unit, int k) {
    const StateDict& state = (*this)(k);
    auto it = state.find(unit_key(unit, "layout"));
    MG_CHECK(it != state.end(), "FSDP: ", source(k), " has no unit ", unit_label(unit.name()),
             " (its units: ", units_in(state), "; saved with another wrap policy?)");
    MG_CHECK(it->second.dim() == 1 && it->second.numel() == 4 && !is_floating(it->second.dtype()),
             "FSDP: ", source(k), ": the layout of unit ", unit_label(unit.name()), " is not 4 integers");
    std::vector<int64_t> layout = it->second.to(DType::i64).to_vector<int64_t>();
    MG_CHECK(layout[0] >= 1 && layout[0] <= kMaxShardWorld && layout[1] == k && layout[1] < layout[0],
             "FSDP: ", source(k), ": the layout of unit ", unit_label(unit.name()), " says rank ", layout[1],
             " of ", layout[0], " ranks; expected rank ", k, " of at most ", kMaxShardWorld);
    MG_CHECK(layout[2] == unit.numel(), "FSDP: unit ", unit_label(unit.name()), " has ", unit.numel(),
             " parameter elements but ", source(k), " has ", layout[2], " (another model?)");
    // The fewest elements per rank that cover the unit, ceil(numel / world), without overflow.
    const int64_t fewest = layout[2] > 0 ? (layout[2] - 1) / layout[0] + 1 : 0;
    MG_CHECK(layout[3] >= 1 && layout[3] <= layout[2] && layout[3] >= fewest, "FSDP: ", source(k),
             ": the layout of unit ", unit_label(unit.name()), " has a shard size of ", layout[3],
             ", which cannot hold ", layout[2], " elements over ", layout[0], " ranks");
    return layout;
  }

  // This rank's s elements of the flat tensor stored under `key` in every old shard (the padding
  // zero): copied from the old shards that hold them (old rank k holds [k*s_old, (k+1)*s_old)).
  Tensor reslice(const FlatParamUnit& unit, int rank, const std::string& key) {
    const std::vector<int64_t> layout0 = layout(unit, 0);
    const int64_t old_world = layout0[0], old_s = layout0[3];
    auto first = (*this)(0).find(key);
    MG_CHECK(first != (*this)(0).end(), "FSDP: ", source(0), " has no ", key);
    Tensor out = zeros({unit.shard_numel()}, TensorOptions{first->second.dtype()});
    const int64_t begin = rank * unit.shard_numel();
    const int64_t end = std::min(begin + unit.shard_numel(), unit.numel());
    for (int64_t at = begin; at < end;) {
      const int64_t k = at / old_s;
      MG_CHECK(k < old_world, "FSDP: unit ", unit_label(unit.name()), ": element ", at,
               " is beyond the old shards");
      const std::vector<int64_t> layout_k = layout(unit, static_cast<int>(k));
      MG_CHECK(layout_k[0] == old_world && layout_k[3] == old_s, "FSDP: ", source(0), " and ",
               source(static_cast<int>(k)), " disagree on the layout of unit ", unit_label(unit.name()));
      auto piece = (*this)(static_cast<int>(k)).find(key);
      MG_CHECK(piece != (*this)(static_cast<int>(k)).end() && piece->second.dim() == 1 &&
                   piece->second.numel() == old_s && piece->second.dtype() == first->second.dtype(),
               "FSDP: ", source(static_cast<int>(k)), " has no ", key, " of ", old_s, " elements of ",
               dtype_name(first->second.dtype()));
      const int64_t piece_end = std::min(end, (k + 1) * old_s);
      out.narrow(0, at - begin, piece_end - at)
          .copy_(piece->second.narrow(0, at - k * old_s, piece_end - at));
      at = piece_end;
    }
    return out;
  }

 private:
  const std::function<StateDict(int old_rank)>& shard_of_;
  Source source_;
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

// A decimal of 1 to 7 digits without a sign or a leading zero ("0" itself aside), else -1.
int64_t parse_count(const std::string& text) {
  if (text.empty() || text.size() > 7 || text.find_first_not_of("0123456789") != std::string::npos ||
      (text.size() > 1 && text[0] == '0'))
    return -1;
  return std::stoll(text);
}

// The world size N of the sharded checkpoint in `dir`: its files are fsdp-rank<r>-of<N>.safetensors
// for every r < N. Any other file named fsdp-rank*.safetensors (a world or rank that is not a
// number, out of range, a second world size) is an error naming it, as is a missing rank.
int sharded_checkpoint_world(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  MG_CHECK(fs::is_directory(dir, error), "FSDP: no sharded checkpoint in ", dir, ": not a directory");
  std::map<int64_t, std::pair<int64_t, std::string>> worlds;  // N -> its lowest rank's file
  std::set<int64_t> ranks;
  const std::string prefix = "fsdp-rank", middle = "-of", suffix = ".safetensors";
  for (fs::directory_iterator it(dir, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.size() < prefix.size() + suffix.size() || !starts_with(name, prefix) ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string numbers = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
    const size_t of = numbers.find(middle);
    const int64_t rank = of == std::string::npos ? -1 : parse_count(numbers.substr(0, of));
    const int64_t world = of == std::string::npos ? -1 : parse_count(numbers.substr(of + middle.size()));
    MG_CHECK(rank >= 0 && world >= 1 && world <= kMaxShardWorld && rank < world,
             "FSDP: ", (fs::path(dir) / name).string(),
             " is not a sharded checkpoint file's name (fsdp-rank<r>-of<N>", suffix,
             " with 0 <= r < N <= ", kMaxShardWorld, "); remove or rename it");
    auto [entry, added] = worlds.emplace(world, std::make_pair(rank, name));
    if (!added && rank < entry->second.first) entry->second = {rank, name};  // name the lowest rank's
    ranks.insert(rank);
  }
  MG_CHECK(!error, "FSDP: cannot list ", dir, ": ", error.message());
  MG_CHECK(!worlds.empty(), "FSDP: no sharded checkpoint (fsdp-rank0-of<N>.safetensors) in ", dir);
  if (worlds.size() > 1) {
    std::string found;
    for (const auto& [world, file] : worlds)
      found += str_cat(found.empty() ? "" : ", ", file.second, " (", world, " ranks)");
    throw Error(str_cat("FSDP: ", dir, " holds the files of sharded checkpoints of different world sizes: ",
                        found, "; one checkpoint per directory"));
  }
  const int world = static_cast<int>(worlds.begin()->first);
  for (int r = 0; r < world; ++r)
    MG_CHECK(ranks.count(r) == 1, "FSDP: the sharded checkpoint in ", dir, " has ", world,
             " ranks but no file ", shard_file(dir, r, world));
  return world;
}

// Old rank k's file of the checkpoint in `dir`, read when asked (every error names the file).
struct ShardFiles {
  std::string dir;
  int world = 0;
  std::function<StateDict(int)> read;
  OldShards::Source name;
};

ShardFiles shard_files(const std::string& dir) {
  ShardFiles out;
  out.dir = dir;
  out.world = sharded_checkpoint_world(dir);
  const int world = out.world;
  out.read = [dir, world](int k) {
    MG_CHECK(k >= 0 && k < world, "FSDP: the checkpoint in ", dir, " has ", world, " ranks; asked for rank ",
             k);
    return load_safetensors(shard_file(dir, k, world)).tensors;  // its errors name the file
  };
  out.name = [dir, world](int k) { return shard_file(dir, k, world); };
  return out;
}

// What a load puts into the model, computed before anything is changed.
struct PreparedModel {
  std::vector<Tensor> shards;  // by unit
  StateDict buffers;           // old rank 0's state dict, for the buffers
};

PreparedModel prepare_model(const FullyShardedDataParallel& fsdp, OldShards& old) {
  std::vector<const FlatParamUnit*> units;
  for (const auto& unit : fsdp.units()) units.push_back(unit.get());
  old.check_units(units);
  PreparedModel out;
  for (const auto& unit : fsdp.units())
    out.shards.push_back(old.reslice(*unit, fsdp.group().rank(), unit_key(*unit, "flat_shard")));
  for (const auto& [name, slot] : fsdp.module().named_buffer_slots()) {
    auto it = old(0).find(name);
    MG_CHECK(it != old(0).end(), "FSDP: ", old.source(0), " has no buffer '", name, "'");
    MG_CHECK(it->second.shape() == slot->shape(), "FSDP: buffer '", name, "' is ",
             shape_str(it->second.shape()), " in ", old.source(0), " but ", shape_str(slot->shape()),
             " in the module");
    out.buffers[name] = it->second;
  }
  return out;
}

void commit_model(FullyShardedDataParallel& fsdp, const PreparedModel& prepared) {
  NoGradGuard no_grad;
  for (size_t u = 0; u < fsdp.units().size(); ++u) fsdp.units()[u]->shard().copy_(prepared.shards[u]);
  load_buffers(fsdp, prepared.buffers);
}

StateDict prepare_optimizer(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt,
                            OldShards& old);

// Every rank's error text (empty when it succeeded), gathered: the same verdict on every rank.
// Throws on every rank when any failed, with the failed ranks' own messages.
void agree(ProcessGroup& group, const std::string& what, std::string error) {
  constexpr size_t kMaxMessage = 2000;
  if (error.size() > kMaxMessage) error = error.substr(0, kMaxMessage) + "...";
  const std::vector<std::string> errors = all_gather_object(group, error);
  std::map<std::string, std::string> ranks_of;  // a message -> the ranks that failed with it
  int count = 0;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) continue;
    std::string& ranks = ranks_of[errors[r]];
    ranks += str_cat(ranks.empty() ? "" : ", ", r);
    ++count;
  }
  if (count == 0) return;
  std::string failed;
  for (const auto& [message, ranks] : ranks_of)
    failed += str_cat(failed.empty() ? "" : "; ", "rank", ranks.find(',') == std::string::npos ? " " : "s ",
                      ranks, ": ", message);
  throw Error(str_cat(what, " failed on ", count, " of ", errors.size(),
                      " rank(s), so on every rank (nothing was loaded): ", failed));
}

// load_sharded_checkpoint: every rank reads and checks what it needs, the ranks agree, then all
// load (or all throw, with nothing changed).
void load_sharded_checkpoint_agreed(FullyShardedDataParallel& fsdp, optim::Optimizer* opt,
                                    const std::string& dir) {
  std::optional<PreparedModel> model;
  std::optional<StateDict> optimizer_before;
  std::string error;
  try {
    const ShardFiles files = shard_files(dir);
    std::map<int, StateDict> cache;  // one read of each overlapping file serves model and optimizer
    const std::function<StateDict(int)> cached = [&](int k) {
      auto it = cache.find(k);
      if (it == cache.end()) it = cache.emplace(k, files.read(k)).first;
      return it->second;
    };
    OldShards old(cached, files.name);
    model = prepare_model(fsdp, old);
    if (opt != nullptr) {
      StateDict local = prepare_optimizer(fsdp, *opt, old);
      // The optimizer checks the state as it loads it (all or nothing); a rank where another
      // rank failed puts its previous state back below.
      StateDict before;
      for (const auto& [key, value] : opt->state_dict()) before[key] = value.clone();
      optimizer_before = std::move(before);
      opt->load_state_dict(local);
    }
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "an error without a message";
  }
  ProcessGroup group = fsdp.group();
  try {
    agree(group, str_cat("FSDP: loading the sharded checkpoint in ", dir), error);
  } catch (const Error&) {
    if (error.empty() && opt != nullptr && optimizer_before) opt->load_state_dict(*optimizer_before);
    throw;
  }
  commit_model(fsdp, *model);
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
  OldShards old(shard_of);
  commit_model(fsdp, prepare_model(fsdp, old));
}

void save_sharded_checkpoint(const FullyShardedDataParallel& fsdp, const std::string& dir) {
  ProcessGroup group = fsdp.group();
  std::filesystem::create_directories(dir);
  save_safetensors(shard_file(dir, group.rank(), group.size()), sharded_state_dict(fsdp));
  group.barrier()->wait();
}

void load_sharded_checkpoint(FullyShardedDataParallel& fsdp, const std::string& dir) {
  load_sharded_checkpoint_agreed(fsdp, nullptr, dir);
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
  load_sharded_checkpoint_agreed(fsdp, &opt, dir);
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
  OldShards old(shard_of);
  opt.load_state_dict(prepare_optimizer(fsdp, opt, old));
}

namespace {

// The optimizer's state_dict() for this rank's shards, resliced from the old ranks'.
StateDict prepare_optimizer(const FullyShardedDataParallel& fsdp, const optim::Optimizer& opt,
                            OldShards& old) {
  const std::vector<const FlatParamUnit*> units = optimizer_units(fsdp, opt);
  StateDict local;
  for (const auto& [key, value] : entries(old(0), kOptimGroupPrefix)) local[key] = value;
  MG_CHECK(!local.empty(), "FSDP: ", old.source(0), " has no optimizer state (", kOptimGroupPrefix,
           "param_groups.0.*)");
  local["param_groups.0.params"] = arange(static_cast<int64_t>(units.size()), TensorOptions{DType::i64});
  for (size_t j = 0; j < units.size(); ++j) {
    const FlatParamUnit& unit = *units[j];
    const std::string prefix = unit_key(unit, "optim_state/");
    for (const auto& [name, value] : entries(old(0), prefix))
      local[str_cat("state.", j, ".", name)] =
          value.dim() == 0 ? value : old.reslice(unit, fsdp.group().rank(), prefix + name);
  }
  return local;
}

}  // namespace

}  // namespace mg::parallel
