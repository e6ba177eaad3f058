// CheckpointManager: rank 0 writes step checkpoints in the background; everyone resumes from the
// newest valid one (checkpoint_manager.h says what and why).
#include "parallel/resilience/checkpoint_manager.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "core/base/error.h"
#include "core/files.h"
#include "core/grad_mode.h"
#include "core/safetensors.h"
#include "parallel/comm/object_collectives.h"

namespace mg::parallel {
namespace {

const char* kSchedulerFile = "/lr_scheduler.safetensors";
const char* kStepPrefix = "step-";
const char* kPartialPrefix = ".partial-step-";

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

int64_t metadata_number(const optim::CheckpointInfo& info, const std::string& key, const std::string& where) {
  auto it = info.extra.find(key);
  MG_CHECK(it != info.extra.end(), where, ": the checkpoint has no '", key,
        "' (not written by CheckpointManager?)");
  try {
    return std::stoll(it->second);
  } catch (const std::exception&) {
    throw Error(str_cat(where, ": metadata '", key, "' is not a number: '", it->second, "'"));
  }
}

void check_state(const TrainingState& state) {
  MG_CHECK(state.module != nullptr, "CheckpointManager: TrainingState::module is required");
  MG_CHECK((state.optimizer != nullptr) != (state.zero != nullptr),
        "CheckpointManager: TrainingState needs exactly one of optimizer and zero");
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
  MG_CHECK(options_.every_steps >= 0, "CheckpointManager: every_steps must be >= 0, got ", options_.every_steps);
  if (options_.save_on_sigterm) install_sigterm_flag();
  if (group_.rank() == 0) make_directory(dir_, "CheckpointManager");
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
  const std::string partial_dir = dir_ + "/" + kPartialPrefix + step_dir_name(position.step).substr(5);
  const int keep_last = options_.keep_last;
  auto write = [this, info, model, optimizer, scaler, scheduler, final_dir, partial_dir, keep_last]() {
    try {
      remove_tree(partial_dir);
      make_directory(partial_dir, "CheckpointManager");
      if (scheduler)
        save_safetensors(partial_dir + kSchedulerFile, *scheduler, {{"step", std::to_string(info.step)}});
      optim::save_checkpoint(partial_dir, *model, *optimizer, info, scaler.get());
      remove_tree(final_dir);  // a checkpoint of the same step from an earlier attempt
      MG_CHECK(::rename(partial_dir.c_str(), final_dir.c_str()) == 0, "cannot rename ", partial_dir, " to ",
            final_dir, ": ", std::strerror(errno));
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
    write();
  }
}

std::optional<ResumePoint> CheckpointManager::load_latest(const TrainingState& state) {
  check_state(state);
  group_.barrier()->wait();  // a save just before is visible (its write was waited for by rank 0)
  std::optional<ResumePoint> found;
  const std::vector<std::string> all = checkpoints();
  for (auto it = all.rbegin(); it != all.rend() && !found; ++it) {
    const std::string& dir = *it;
    try {
      // Validate the scheduler file first: optim::load_checkpoint changes the module and the
      // optimizer only once both of its files are valid, so nothing is half-loaded.
      SafetensorsFile scheduler;
      if (state.scheduler) scheduler = load_safetensors(dir + kSchedulerFile);
      optim::CheckpointInfo info =
          state.zero ? optim::load_checkpoint(
                           dir, *state.module,
                           [&](const StateDict& whole) { state.zero->load_state_dict(whole); }, state.scaler)
                     : optim::load_checkpoint(dir, *state.module, *state.optimizer, state.scaler);
      if (state.scheduler) state.scheduler->load_state_dict(scheduler.tensors);
      ResumePoint point;
      point.dir = dir;
      point.position.step = info.step;
      point.position.epoch = info.epoch;
      point.position.samples_into_epoch = metadata_number(info, "samples_into_epoch", dir);
      point.world_size = static_cast<int>(metadata_number(info, "world_size", dir));
      const auto generators = decode_generators(info.extra.at("rank_rng"), dir);
      MG_CHECK(static_cast<int>(generators.size()) == point.world_size, dir, ": rank_rng has ",
            generators.size(), " entries for a world of ", point.world_size);
      const int r = group_.rank();
      set_generator_state(r < point.world_size
                              ? generators[static_cast<size_t>(r)]
                              : GeneratorState{generators[0].seed + static_cast<uint64_t>(r), 0});
      for (const char* key : {"samples_into_epoch", "world_size", "rank_rng"}) info.extra.erase(key);
      point.info = info;
      found = point;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[multigrad rank %d] checkpoint %s is unusable, trying the previous one: %s\n",
                   group_.rank(), dir.c_str(), e.what());
    }
  }
  // Every rank must resume from the same step (a file changing under the readers would break it).
  const int64_t step = found ? found->position.step : -1;
  Tensor lowest = full({1}, static_cast<double>(step), TensorOptions{DType::i64});
  Tensor highest = lowest.clone();
  group_.allreduce(lowest, ReduceOp::Min)->wait();
  group_.allreduce(highest, ReduceOp::Max)->wait();
  MG_CHECK(lowest.item<int64_t>() == highest.item<int64_t>(), "CheckpointManager(", dir_,
        "): the ranks found different newest valid checkpoints (steps ", lowest.item<int64_t>(), " to ",
        highest.item<int64_t>(), "; -1 = none)");
  return found;
}

}  // namespace mg::parallel
