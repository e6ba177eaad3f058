// CheckpointManager: rank 0 writes step checkpoints in the background; everyone resumes from the
// newest valid one (checkpoint_manager.h says what and why).
#include "parallel/resilience/checkpoint_manager.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "core/files.h"
#include "core/grad_mode.h"
#include "core/safetensors.h"
#include "parallel/comm/heartbeat.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/zero/zero_redundancy_optimizer.h"

namespace mg::parallel {
namespace {

const char* kModelFile = "/model.safetensors";
const char* kOptimizerFile = "/optimizer.safetensors";
const char* kSchedulerFile = "/lr_scheduler.safetensors";
const char* kStepPrefix = "step-";
const char* kPartialPrefix = ".partial-step-";  // a checkpoint being written
const char* kOldPrefix = ".old-step-";          // the checkpoint being replaced (portable swap only)

std::atomic<int> sigterm_received{0};
extern "C" void on_sigterm(int) { sigterm_received.store(1); }

void install_sigterm_flag() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction action {};
  action.sa_handler = on_sigterm;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGTERM, &action, nullptr);
}

void remove_tree(const std::string& path) {
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      const std::string child = path + "/" + name;
      struct stat info {};
      if (::lstat(child.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
        remove_tree(child);
      else
        ::unlink(child.c_str());
    }
    ::closedir(d);
  }
  ::rmdir(path.c_str());
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::lstat(path.c_str(), &info) == 0;
}

void rename_or_throw(const std::string& from, const std::string& to) {
  MG_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ",
           std::strerror(errno));
}

// The test hooks (checkpoint_testing in the header).
std::mutex hook_mutex;
std::function<void(const std::string&)> replace_hook;
bool rename_exchange_enabled = true;

void at_replace_stage(const std::string& stage) {
  std::function<void(const std::string&)> hook;
  {
    std::lock_guard<std::mutex> lock(hook_mutex);
    hook = replace_hook;
  }
  if (hook) hook(stage);
}

// Swaps two directory entries in one step (Linux renameat2 RENAME_EXCHANGE). False, errno set,
// where the kernel or the filesystem cannot (ENOSYS, EINVAL: NFS, older kernels).
bool exchange_entries(const std::string& a, const std::string& b) {
  {
    std::lock_guard<std::mutex> lock(hook_mutex);
    if (!rename_exchange_enabled) {
      errno = EINVAL;
      return false;
    }
  }
#if defined(__linux__) && defined(SYS_renameat2)
  constexpr unsigned kRenameExchange = 1u << 1;  // RENAME_EXCHANGE, <linux/fs.h>
  return ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), kRenameExchange) == 0;
#else
  errno = ENOSYS;
  return false;
#endif
}

// Puts the complete directory `fresh` at `target`, which holds a complete checkpoint already, so
// that a crash at any moment leaves a complete checkpoint at `target` -- the old one or the new
// one -- or, on the portable path, the old one at `aside` (tidy_replace_leftovers puts it back).
//   exchange: fresh <-> target in one rename; then the old one (now at `fresh`) is removed;
//   portable: target -> aside, fresh -> target, remove aside.
void replace_directory(const std::string& fresh, const std::string& target, const std::string& aside) {
  if (exchange_entries(fresh, target)) {
    at_replace_stage("exchanged");
    remove_tree(fresh);
    return;
  }
  MG_CHECK(errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP, "cannot exchange ", fresh, " and ",
           target, ": ", std::strerror(errno));
  remove_tree(aside);
  rename_or_throw(target, aside);
  at_replace_stage("old-aside");
  rename_or_throw(fresh, target);
  at_replace_stage("new-in");
  remove_tree(aside);
}

// What a crash can leave in `dir`: ".old-step-N" (the portable swap stopped half-way: put back
// when "step-N" is missing, else removed) and ".partial-step-N" (a write that never finished, or
// the old copy an exchange left: removed). Rank 0 only, with no write in flight.
void tidy_replace_leftovers(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d)) names.emplace_back(entry->d_name);
    ::closedir(d);
  }
  const size_t old_prefix = std::strlen(kOldPrefix), partial_prefix = std::strlen(kPartialPrefix);
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    if (name.compare(0, old_prefix, kOldPrefix) == 0) {
      const std::string target = dir + "/" + kStepPrefix + name.substr(old_prefix);
      if (exists(target)) {
        remove_tree(path);
      } else if (::rename(path.c_str(), target.c_str()) == 0) {
        std::fprintf(stderr, "[multigrad] CheckpointManager: restored %s, interrupted while being replaced\n",
                     target.c_str());
      }
    } else if (name.compare(0, partial_prefix, kPartialPrefix) == 0) {
      remove_tree(path);
    }
  }
  fsync_directory(dir);
}

// A deep copy on the host: the training thread goes on updating the live tensors.
StateDict host_copy(const StateDict& dict) {
  NoGradGuard no_grad;
  StateDict copy;
  for (const auto& [name, tensor] : dict) copy[name] = tensor.detach().to(Device::cpu()).clone();
  return copy;
}

// "seed:offset" per rank, comma-separated.
std::string encode_generators(const std::vector<GeneratorState>& states) {
  std::string text;
  for (const GeneratorState& s : states) text += str_cat(text.empty() ? "" : ",", s.seed, ":", s.offset);
  return text;
}

std::vector<GeneratorState> decode_generators(const std::string& text, const std::string& where) {
  std::vector<GeneratorState> states;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(begin, end - begin);
    const size_t colon = item.find(':');
    MG_CHECK(colon != std::string::npos, where, ": rank_rng entry '", item, "' is not seed:offset");
    try {
      states.push_back({std::stoull(item.substr(0, colon)), std::stoull(item.substr(colon + 1))});
    } catch (const std::exception&) {
      throw Error(str_cat(where, ": rank_rng entry '", item, "' is not seed:offset"));
    }
    begin = end + 1;
  }
  return states;
}

int64_t metadata_number(const SafetensorsMetadata& metadata, const std::string& key,
                        const std::string& where) {
  auto it = metadata.find(key);
  MG_CHECK(it != metadata.end(), where, ": the checkpoint has no '", key,
           "' (not written by CheckpointManager?)");
  try {
    size_t used = 0;
    const long long value = std::stoll(it->second, &used);
    if (used == it->second.size()) return value;
  } catch (const std::exception&) {
  }
  throw Error(str_cat(where, ": metadata '", key, "' is not a number: '", it->second, "'"));
}

// Every file the manager reads must carry its checksums: it wrote them all, so a file without
// them is damaged (or not ours), never a PyTorch file to trust unverified.
SafetensorsFile read_verified(const std::string& path) {
  SafetensorsLoadOptions options;
  options.require_checksums = true;
  return load_safetensors(path, options);
}

// One checkpoint as rank 0 read it (and as it travels to the other ranks): the files' tensors
// under "model/", "optimizer/" (with the scaler's "scaler.*") and "scheduler/", and the metadata.
const char* kModelKey = "model/";
const char* kOptimizerKey = "optimizer/";
const char* kSchedulerKey = "scheduler/";
const char* kDirKey = "__checkpoint_dir__";  // rank 0's path, in the bytes broadcast

struct CheckpointContents {
  std::string dir;
  StateDict model, optimizer, scheduler;
  SafetensorsMetadata metadata;
};

CheckpointContents read_checkpoint(const std::string& dir, bool with_scheduler) {
  CheckpointContents contents;
  contents.dir = dir;
  SafetensorsFile model = read_verified(dir + kModelFile);
  SafetensorsFile optimizer = read_verified(dir + kOptimizerFile);
  MG_CHECK(model.metadata == optimizer.metadata, dir,
           ": model.safetensors and optimizer.safetensors come from different checkpoints (their metadata "
           "differ)");
  if (with_scheduler) {
    SafetensorsFile scheduler = read_verified(dir + kSchedulerFile);
    auto step = scheduler.metadata.find("step");
    MG_CHECK(step != scheduler.metadata.end() && model.metadata.count("step") &&
                 step->second == model.metadata.at("step"),
             dir, kSchedulerFile, ": not the scheduler of this checkpoint (its step differs)");
    contents.scheduler = std::move(scheduler.tensors);
  }
  contents.model = std::move(model.tensors);
  contents.optimizer = std::move(optimizer.tensors);
  contents.metadata = std::move(model.metadata);
  return contents;
}

std::string encode_contents(const CheckpointContents& contents) {
  StateDict all;
  for (const auto& [name, t] : contents.model) all[kModelKey + name] = t;
  for (const auto& [name, t] : contents.optimizer) all[kOptimizerKey + name] = t;
  for (const auto& [name, t] : contents.scheduler) all[kSchedulerKey + name] = t;
  SafetensorsMetadata metadata = contents.metadata;
  metadata[kDirKey] = contents.dir;
  return encode_safetensors(all, metadata);
}

CheckpointContents decode_contents(const std::string& bytes) {
  SafetensorsLoadOptions options;
  options.require_checksums = true;
  SafetensorsFile file = decode_safetensors(bytes, "the checkpoint broadcast by rank 0", options);
  CheckpointContents contents;
  MG_CHECK(file.metadata.count(kDirKey), "the checkpoint broadcast by rank 0 has no ", kDirKey);
  contents.dir = file.metadata.at(kDirKey);
  file.metadata.erase(kDirKey);
  contents.metadata = std::move(file.metadata);
  for (auto& [name, t] : file.tensors) {
    for (auto [prefix, into] : {std::pair<const char*, StateDict*>{kModelKey, &contents.model},
                                {kOptimizerKey, &contents.optimizer},
                                {kSchedulerKey, &contents.scheduler}}) {
      const size_t n = std::strlen(prefix);
      if (name.compare(0, n, prefix) == 0) (*into)[name.substr(n)] = t;
    }
  }
  return contents;
}

void check_state(const TrainingState& state) {
  MG_CHECK(state.module != nullptr, "CheckpointManager: TrainingState::module is required");
  MG_CHECK((state.optimizer != nullptr) != (state.zero != nullptr),
           "CheckpointManager: TrainingState needs exactly one of optimizer and zero");
}

// Loads `contents` into `state` -- all of it or, on an error, nothing -- and sets this rank's
// generator: its own saved state, or (a rank beyond the saved world) a fresh stream.
ResumePoint apply_checkpoint(const CheckpointContents& contents, const TrainingState& state, int rank) {
  const std::string& dir = contents.dir;
  const SafetensorsMetadata& meta = contents.metadata;
  ResumePoint point;
  point.dir = dir;
  point.position.step = metadata_number(meta, "step", dir);
  point.position.epoch = metadata_number(meta, "epoch", dir);
  point.position.samples_into_epoch = metadata_number(meta, "samples_into_epoch", dir);
  point.world_size = static_cast<int>(metadata_number(meta, "world_size", dir));
  MG_CHECK(point.world_size >= 1, dir, ": world_size ", point.world_size, " is not positive");
  MG_CHECK(meta.count("rank_rng"), dir,
           ": the checkpoint has no 'rank_rng' (not written by CheckpointManager?)");
  const auto generators = decode_generators(meta.at("rank_rng"), dir);
  MG_CHECK(static_cast<int>(generators.size()) == point.world_size, dir, ": rank_rng has ", generators.size(),
           " entries for a world of ", point.world_size);

  StateDict optimizer_state, scaler_state;
  const std::string scaler_prefix = "scaler.";
  for (const auto& [key, value] : contents.optimizer) {
    if (key.compare(0, scaler_prefix.size(), scaler_prefix) == 0) {
      scaler_state[key.substr(scaler_prefix.size())] = value;
    } else {
      optimizer_state[key] = value;
    }
  }
  MG_CHECK(!state.scaler || !scaler_state.empty(), dir, kOptimizerFile,
           ": a GradScaler was given but the checkpoint has no scaler state");

  // Nothing half-loaded: the scaler is validated on a copy, each load_state_dict validates before
  // it writes, and if a later one refuses, the earlier ones get their previous values back.
  optim::GradScaler loaded_scaler = state.scaler ? *state.scaler : optim::GradScaler();
  if (state.scaler) loaded_scaler.load_state_dict(scaler_state);
  const StateDict module_backup = host_copy(state.module->state_dict());
  const StateDict scheduler_backup = state.scheduler ? host_copy(state.scheduler->state_dict()) : StateDict();
  state.module->load_state_dict(contents.model);
  try {
    if (state.scheduler) state.scheduler->load_state_dict(contents.scheduler);
    if (state.zero) {
      state.zero->load_state_dict(optimizer_state);
    } else {
      state.optimizer->load_state_dict(optimizer_state);
    }
  } catch (...) {
    state.module->load_state_dict(module_backup);
    if (state.scheduler) state.scheduler->load_state_dict(scheduler_backup);
    throw;
  }
  if (state.scaler) *state.scaler = loaded_scaler;
  set_generator_state(rank < point.world_size
                          ? generators[static_cast<size_t>(rank)]
                          : GeneratorState{generators[0].seed + static_cast<uint64_t>(rank), 0});

  optim::CheckpointInfo& info = point.info;
  info.step = point.position.step;
  info.epoch = point.position.epoch;
  info.batches_into_epoch =
      meta.count("batches_into_epoch") ? metadata_number(meta, "batches_into_epoch", dir) : 0;
  info.rng = generators[0];
  for (const auto& [key, value] : meta)
    if (key != "step" && key != "epoch" && key != "batches_into_epoch" && key != "rng_seed" &&
        key != "rng_offset" && key != "samples_into_epoch" && key != "world_size" && key != "rank_rng")
      info.extra[key] = value;
  return point;
}

}  // namespace

// Rank 0's writer: one background write at a time, and the error of the last one.
struct CheckpointManager::Writer {
  std::thread thread;
  std::string error;  // set by the thread, read after join
};

std::string CheckpointManager::step_dir_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "%s%08lld", kStepPrefix, static_cast<long long>(step));
  return name;
}

CheckpointManager::CheckpointManager(const ProcessGroup& group, std::string dir,
                                     CheckpointManagerOptions options)
    : group_(group), dir_(std::move(dir)), options_(options), writer_(std::make_unique<Writer>()) {
  MG_CHECK(!dir_.empty(), "CheckpointManager: the directory is empty");
  MG_CHECK(options_.keep_last >= 1, "CheckpointManager: keep_last must be >= 1, got ", options_.keep_last);
  MG_CHECK(options_.every_steps >= 0, "CheckpointManager: every_steps must be >= 0, got ",
           options_.every_steps);
  if (options_.save_on_sigterm) install_sigterm_flag();
  // Rank 0 creates the directory (and its parents); a failure there is an error on every rank, so
  // that no rank goes on into a collective rank 0 never joins.
  std::string error;
  if (group_.rank() == 0) {
    try {
      for (size_t slash = dir_.find('/', 1); slash != std::string::npos; slash = dir_.find('/', slash + 1))
        make_directory(dir_.substr(0, slash), "CheckpointManager");
      make_directory(dir_, "CheckpointManager");
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  MG_CHECK(!any_rank(group_, !error.empty()), "CheckpointManager(", dir_, "): ",
           error.empty() ? std::string("rank 0 cannot create the directory (its error says why)") : error);
}

CheckpointManager::~CheckpointManager() {
  finish_background_write();
  if (!writer_->error.empty())
    std::fprintf(stderr, "[multigrad rank %d] CheckpointManager: the last checkpoint write failed: %s\n",
                 group_.rank(), writer_->error.c_str());
}

bool CheckpointManager::preempted() { return any_rank(group_, sigterm_received.load() != 0); }

std::vector<std::string> CheckpointManager::checkpoints() const {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir_.c_str())) {
    const size_t prefix = std::strlen(kStepPrefix);
    while (dirent* entry = ::readdir(d)) {
      const std::string name = entry->d_name;
      if (name.size() == prefix + 8 && name.compare(0, prefix, kStepPrefix) == 0 &&
          name.find_first_not_of("0123456789", prefix) == std::string::npos)
        names.push_back(name);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());  // zero-padded: name order is step order
  for (std::string& name : names) name = dir_ + "/" + name;
  return names;
}

void CheckpointManager::finish_background_write() {
  if (writer_->thread.joinable()) writer_->thread.join();
}

void CheckpointManager::raise_write_error_everywhere() {
  finish_background_write();
  if (!any_rank(group_, !writer_->error.empty())) return;
  const std::string error = writer_->error.empty()
                                ? std::string("rank 0 failed to write a checkpoint (its error says why)")
                                : writer_->error;
  writer_->error.clear();
  throw Error(str_cat("CheckpointManager(", dir_, "): ", error));
}

void CheckpointManager::wait() { raise_write_error_everywhere(); }

void CheckpointManager::save(const TrainingState& state, const TrainingPosition& position,
                             const std::map<std::string, std::string>& extra) {
  check_state(state);
  raise_write_error_everywhere();  // the previous write, finished and checked on every rank

  // 1. Gathered and copied now, on the training thread.
  const GeneratorState mine = generator_state();
  Tensor local = tensor<int64_t>({static_cast<int64_t>(mine.seed), static_cast<int64_t>(mine.offset)});
  Tensor all = zeros({2 * group_.size()}, TensorOptions{DType::i64});
  group_.allgather(all, local)->wait();
  StateDict optimizer_state = state.zero ? state.zero->consolidated_state_dict(0) : StateDict();
  if (group_.rank() != 0) return;

  std::vector<GeneratorState> generators;
  const auto words = all.to_vector<int64_t>();
  for (int r = 0; r < group_.size(); ++r)
    generators.push_back({static_cast<uint64_t>(words[2 * r]), static_cast<uint64_t>(words[2 * r + 1])});
  optim::CheckpointInfo info;
  info.step = position.step;
  info.epoch = position.epoch;
  info.rng = generators[0];
  info.extra = extra;
  info.extra["samples_into_epoch"] = std::to_string(position.samples_into_epoch);
  info.extra["world_size"] = std::to_string(group_.size());
  info.extra["rank_rng"] = encode_generators(generators);
  auto model = std::make_shared<StateDict>(host_copy(state.module->state_dict()));
  auto optimizer =
      std::make_shared<StateDict>(host_copy(state.zero ? optimizer_state : state.optimizer->state_dict()));
  std::shared_ptr<StateDict> scaler, scheduler;
  if (state.scaler) scaler = std::make_shared<StateDict>(host_copy(state.scaler->state_dict()));
  if (state.scheduler) scheduler = std::make_shared<StateDict>(host_copy(state.scheduler->state_dict()));

  // 2. The files, on rank 0's writer thread.
  const std::string final_dir = dir_ + "/" + step_dir_name(position.step);
  const std::string digits = step_dir_name(position.step).substr(std::strlen(kStepPrefix));
  const std::string partial_dir = dir_ + "/" + kPartialPrefix + digits;
  const std::string old_dir = dir_ + "/" + kOldPrefix + digits;
  const int keep_last = options_.keep_last;
  auto write = [this, info, model, optimizer, scaler, scheduler, final_dir, partial_dir, old_dir,
                keep_last]() {
    try {
      remove_tree(partial_dir);
      make_directory(partial_dir, "CheckpointManager");
      if (scheduler)
        save_safetensors(partial_dir + kSchedulerFile, *scheduler, {{"step", std::to_string(info.step)}});
      optim::save_checkpoint(partial_dir, *model, *optimizer, info, scaler.get());
      fsync_directory(partial_dir);
      at_replace_stage("written");
      // A checkpoint of the same step from an earlier attempt is swapped out, never removed first.
      if (exists(final_dir)) {
        replace_directory(partial_dir, final_dir, old_dir);
      } else {
        rename_or_throw(partial_dir, final_dir);
      }
      fsync_directory(dir_);
      std::vector<std::string> complete = checkpoints();
      for (size_t i = 0; i + static_cast<size_t>(keep_last) < complete.size(); ++i) remove_tree(complete[i]);
    } catch (const std::exception& e) {
      writer_->error = e.what();
    }
  };
  if (options_.background) {
    writer_->thread = std::thread(write);
  } else {
    SlowPhase writing("rank 0 writing a checkpoint");  // the others wait: not a stalled rank
    write();
  }
}

std::optional<ResumePoint> CheckpointManager::load_latest(const TrainingState& state) {
  check_state(state);
  // 1. Rank 0 alone reads: the newest checkpoint whose files all verify and that loads into its
  //    own state, trying older ones after a failure. The other ranks need no access to its files.
  std::string chosen;  // encoded, empty: none
  std::optional<ResumePoint> found;
  if (group_.rank() == 0) {
    SlowPhase reading("rank 0 reading a checkpoint");  // the others wait in the broadcast below
    finish_background_write();  // a save just before is on disk (its error surfaces at the next save)
    tidy_replace_leftovers(dir_);
    const std::vector<std::string> all = checkpoints();
    for (auto it = all.rbegin(); it != all.rend() && !found; ++it) {
      try {
        CheckpointContents contents = read_checkpoint(*it, state.scheduler != nullptr);
        std::string encoded = group_.size() > 1 ? encode_contents(contents) : std::string();
        found = apply_checkpoint(contents, state, 0);
        chosen = std::move(encoded);  // never empty when there is more than one rank
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[multigrad rank 0] checkpoint %s is unusable, trying the previous one: %s\n",
                     it->c_str(), e.what());
      }
    }
  }
  if (group_.size() == 1) return found;

  // 2. Its choice travels to every rank: the model, optimizer and scheduler state and the metadata
  //    (every rank's generator state among it), checksummed again for the trip.
  const std::string bytes = broadcast_object(group_, chosen, 0);
  if (bytes.empty()) return std::nullopt;  // no valid checkpoint: nothing loaded anywhere
  std::string error;
  if (group_.rank() != 0) {
    try {
      found = apply_checkpoint(decode_contents(bytes), state, group_.rank());
    } catch (const std::exception& e) {
      error = e.what();
      std::fprintf(stderr,
                   "[multigrad rank %d] CheckpointManager: cannot load the checkpoint rank 0 chose: %s\n",
                   group_.rank(), e.what());
    }
  }
  MG_CHECK(!any_rank(group_, !error.empty()), "CheckpointManager(", dir_,
           "): the checkpoint rank 0 loaded does not load on every rank (a different model or optimizer?)",
           error.empty() ? std::string() : str_cat("; here: ", error));
  return found;
}

namespace checkpoint_testing {

void set_replace_hook(std::function<void(const std::string& stage)> hook) {
  std::lock_guard<std::mutex> lock(hook_mutex);
  replace_hook = std::move(hook);
}

void use_rename_exchange(bool enabled) {
  std::lock_guard<std::mutex> lock(hook_mutex);
  rename_exchange_enabled = enabled;
}

}  // namespace checkpoint_testing

}  // namespace mg::parallel
