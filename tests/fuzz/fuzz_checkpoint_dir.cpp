// Fuzzes the checkpoint manager's reader (parallel/resilience/checkpoint_manager.h): a step
// directory on disk -- model.safetensors, optimizer.safetensors, lr_scheduler.safetensors and the
// metadata in them (step, epoch, sampler position, world size, every rank's generator state) --
// read by CheckpointManager::load_latest in a world of one (the single-process backend: no MPI).
//
// Two ways of turning the input into the directory (the first byte's bit 0 chooses):
//   raw         the rest of the input IS the files, split at "\n#MGFILE#\n" into model, optimizer
//               and scheduler (a missing part: that file is absent). Finds what the bytes can do.
//   structured  a valid checkpoint, written by CheckpointManager::save once at start-up, is
//               edited by the input (set or erase a metadata key, erase, rename or replace a
//               tensor with another dtype and shape, drop a file) and written back with the
//               repo's writer, checksums recomputed. Every file then passes the byte-level checks,
//               so the fuzzer reaches what is behind them: the manager's metadata parsing and the
//               module / optimizer / scheduler load_state_dict of mismatched dicts.
// Bit 1 chooses the reader: load_latest (which turns any std::exception of a checkpoint into
// "unusable, try the previous one", so an exception other than mg::Error inside it stays hidden)
// or the pieces it calls, one by one, where any exception but mg::Error is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/safetensors.h"
#include "fuzz_common.h"
#include "fuzz_input.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "optim/checkpoint.h"
#include "optim/lr_scheduler.h"
#include "parallel/resilience/checkpoint_manager.h"

namespace {

using namespace mg;

const char* const kFiles[3] = {"model.safetensors", "optimizer.safetensors", "lr_scheduler.safetensors"};
const std::string kSeparator = "\n#MGFILE#\n";
constexpr int64_t kStep = 7;

// What a checkpoint is of: a tiny model, its optimizer and scheduler. Made afresh for every input
// (a few microseconds), so that one input's load never changes what the next one loads into.
struct Run {
  nn::MLP model{2, {3}, 2};
  optim::AdamW opt{model.parameters(), optim::AdamWOptions{}};
  optim::CosineAnnealingLR schedule{opt, [] {
                                      optim::CosineAnnealingLROptions o;
                                      o.t_max = 10;
                                      return o;
                                    }()};
  parallel::TrainingState state() {
    parallel::TrainingState s;
    s.module = &model;
    s.optimizer = &opt;
    s.scheduler = &schedule;
    return s;
  }
};

parallel::ProcessGroup world_of_one() {
  return parallel::ProcessGroup(parallel::make_single_process_backend(), Device::cpu(),
                                parallel::LaunchInfo{});
}

parallel::CheckpointManagerOptions reader_options() {
  parallel::CheckpointManagerOptions options;
  options.background = false;
  options.save_on_sigterm = false;
  return options;
}

// Where the step directory is written (tmpfs when there is one: an input is three files).
const std::string& work_dir() { return mg::fuzz::scratch_dir("mg_fuzz_checkpoint"); }

// The valid checkpoint the structured mode edits: written once by CheckpointManager::save.
const std::map<std::string, SafetensorsFile>& template_files() {
  static const std::map<std::string, SafetensorsFile> files = [] {
    const std::string dir = work_dir() + "/template";
    Run run;
    Tensor loss = cross_entropy(run.model.forward(randn({4, 2})), randint(0, 2, {4}));
    loss.backward();
    run.opt.step();  // so the optimizer has state (exp_avg, exp_avg_sq, step) to save
    run.schedule.step();
    parallel::TrainingPosition position;
    position.step = kStep;
    position.epoch = 1;
    position.samples_into_epoch = 12;
    {
      parallel::CheckpointManager writer(world_of_one(), dir, reader_options());
      writer.save(run.state(), position, {{"note", "fuzz template"}});
      writer.wait();
    }
    std::map<std::string, SafetensorsFile> out;
    const std::string step_dir = dir + "/" + parallel::CheckpointManager::step_dir_name(kStep);
    for (const char* name : kFiles) out[name] = load_safetensors(step_dir + "/" + name);
    std::system(("rm -rf '" + dir + "'").c_str());
    return out;
  }();
  return files;
}

// The input (fuzz_input.h). Its texts are 7-bit: the writer is not what is fuzzed here
// (fuzz_safetensors_writer.cpp is), and JSON headers hold UTF-8 only.
struct Reader : mg::fuzz::Input {
  std::string text() { return mg::fuzz::Input::text(32, true); }
};

// The structured mode: the template, edited by the input. Returns file name -> bytes (absent: dropped).
std::map<std::string, std::string> edited_checkpoint(Reader& in) {
  std::map<std::string, SafetensorsFile> files = template_files();
  std::map<std::string, bool> dropped;
  for (int op = 0; op < 16 && !in.done(); ++op) {
    const uint8_t code = in.byte();
    SafetensorsFile& file = files[kFiles[(code >> 3) % 3]];  // bits 3-4: which file
    switch ((code & 7) % 6) {                                // bits 0-2: what to do
      case 0: {  // set a metadata value (an existing key, or a new one)
        const uint8_t choice = in.byte();
        std::string key =
            choice >= 200 || file.metadata.empty() ? in.text() : mg::fuzz::pick(file.metadata, choice)->first;
        file.metadata[key] = in.text();
        break;
      }
      case 1: {
        auto it = mg::fuzz::pick(file.metadata, in.byte());
        if (it != file.metadata.end()) file.metadata.erase(it);
        break;
      }
      case 2: {
        auto it = mg::fuzz::pick(file.tensors, in.byte());
        if (it != file.tensors.end()) file.tensors.erase(it);
        break;
      }
      case 3: {
        auto it = mg::fuzz::pick(file.tensors, in.byte());
        if (it != file.tensors.end()) it->second = in.tensor();
        break;
      }
      case 4: {
        auto it = mg::fuzz::pick(file.tensors, in.byte());
        if (it != file.tensors.end()) {
          Tensor t = it->second;
          file.tensors.erase(it);
          file.tensors[in.text()] = t;
        }
        break;
      }
      case 5: dropped[kFiles[(code >> 3) % 3]] = true; break;
    }
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : files)
    if (!dropped[name]) out[name] = encode_safetensors(file.tensors, file.metadata);  // may refuse: mg::Error
  return out;
}

// The raw mode: the input split into the files.
std::map<std::string, std::string> raw_checkpoint(const std::string& rest) {
  std::map<std::string, std::string> out;
  size_t begin = 0;
  for (const char* name : kFiles) {
    if (begin > rest.size()) break;
    size_t end = rest.find(kSeparator, begin);
    if (end == std::string::npos) end = rest.size();
    out[name] = rest.substr(begin, end - begin);
    begin = end + kSeparator.size();
  }
  return out;
}

void write_step_dir(const std::string& step_dir, const std::map<std::string, std::string>& files) {
  for (const char* name : kFiles) {
    const std::string path = step_dir + "/" + name;
    auto it = files.find(name);
    if (it == files.end()) {
      ::unlink(path.c_str());
      continue;
    }
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(it->second.data(), static_cast<std::streamsize>(it->second.size()));
    MG_FUZZ_ASSERT(out.good(), "writing the fuzzed checkpoint file");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool structured = data[0] & 1;
  const bool pieces = data[0] & 2;
  const std::string root = work_dir() + "/ckpt";
  const std::string step_dir = root + "/" + parallel::CheckpointManager::step_dir_name(kStep);
  static const bool made = [&] {
    std::system(("mkdir -p '" + step_dir + "'").c_str());
    template_files();  // before any input: the template is not part of what is fuzzed
    return true;
  }();
  (void)made;

  std::map<std::string, std::string> files;
  if (structured) {
    Reader in{{data + 1, size - 1}};
    bool refused = true;  // the edit made a file the writer refuses to write (a reserved key)
    mg::fuzz::expect_only_mg_error([&] {
      files = edited_checkpoint(in);
      refused = false;
    });
    if (refused) return 0;
  } else {
    files = raw_checkpoint(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  }
  write_step_dir(step_dir, files);

  if (pieces) {  // what load_latest does, without its catch-all: only mg::Error may come out
    Run run;
    mg::fuzz::expect_only_mg_error([&] {
      const SafetensorsFile scheduler = load_safetensors(step_dir + "/" + kFiles[2]);
      run.schedule.load_state_dict(scheduler.tensors);
    });
    mg::fuzz::expect_only_mg_error([&] { optim::load_checkpoint(step_dir, run.model, run.opt); });
  } else {
    Run run;
    mg::fuzz::expect_only_mg_error([&] {
      parallel::CheckpointManager reader(world_of_one(), root, reader_options());
      const std::optional<parallel::ResumePoint> point = reader.load_latest(run.state());
      if (point) {
        MG_FUZZ_ASSERT(point->world_size >= 1, "a resumed checkpoint has a world of at least one rank");
        MG_FUZZ_ASSERT(point->dir == step_dir, "it is the one checkpoint there is");
      }
    });
  }
  return 0;
}
