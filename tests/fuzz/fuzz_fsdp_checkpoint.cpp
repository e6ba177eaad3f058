// Fuzzes FSDP's sharded checkpoint reader (parallel/fsdp/fsdp_state_dict.h): a directory of
// fsdp-rank<r>-of<N>.safetensors files, each holding one old rank's flat shards, their layouts
// [world, rank, numel, s], the buffers and the optimizer's sharded state, re-sliced at load into
// this world's shards -- here a world of one (the single-process backend: no MPI), which reads
// every old rank's file, so every old shard's layout and bytes are checked.
//
// Byte 0 chooses: bits 0-1 the old world size N (1 to 4), bit 2 raw or structured, bit 3 the
// reader, bit 4 whether the optimizer is loaded too.
//   raw         the rest of the input IS the N files, split at "\n#MGFILE#\n".
//   structured  a valid checkpoint -- a real FSDP model and AdamW after two steps, cut into N
//               ranks' shards at start-up -- edited by the input: set a metadata value, erase,
//               replace or rename a tensor (names built from the layout's own words: "fsdp/",
//               unit names, "/layout", "optim_state/", digits), set a layout to awkward integers
//               (0, -1, 2^62, INT64_MIN, ...), drop a file, truncate one, add a stray
//               fsdp-rank*.safetensors name or a file of a second world size. Checksums are
//               recomputed, so the edits reach the layout checks and the re-slicing behind them.
//   reader      load_sharded_checkpoint on the directory (the collective every rank calls: file
//               names, the agreement, all or nothing), or load_sharded_state_dict and
//               load_sharded_optim_state_dict fed from memory (no catch-all in between, so an
//               exception other than mg::Error is seen).
//
// Properties on top of "only mg::Error comes out": a refused load leaves the model's parameters
// and buffers and the optimizer's state exactly as they were (the documented all-or-nothing), and
// an accepted one leaves a model that runs a forward pass and an optimizer step without any exception.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/safetensors.h"
#include "fuzz_common.h"
#include "fuzz_input.h"
#include "multigrad.h"
#include "optim/adam.h"
#include "parallel/fsdp/fsdp_state_dict.h"

namespace {

using namespace mg;
namespace fs = std::filesystem;

const std::string kSeparator = "\n#MGFILE#\n";

// Four units under the default wrap policy (each child, and the root's own `scale`), one of them
// with buffers: fc0 16 elements, bn 8 (+ running_mean, running_var, num_batches_tracked), fc1 10,
// the root 2.
struct Net : nn::Module {
  nn::Linear fc0{3, 4};
  nn::BatchNorm1d bn{4};
  nn::Linear fc1{4, 2};
  Tensor scale;
  Net() {
    register_module("fc0", fc0);
    register_module("bn", bn);
    register_module("fc1", fc1);
    scale = full({2}, 1.5);
    register_parameter("scale", scale);
  }
  Tensor forward(const Tensor& x) override { return mul(fc1(relu(bn(fc0(x)))), scale); }
};

parallel::ProcessGroup world_of_one() {
  return parallel::ProcessGroup(parallel::make_single_process_backend(), Device::cpu(),
                                parallel::LaunchInfo{});
}

// What a checkpoint is loaded into. Built once (an FSDP model under ASan costs milliseconds) and
// put back into its saved state after every input that changed it, so no input sees another's.
struct Run {
  std::unique_ptr<Net> model;
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::AdamW> opt;
  explicit Run(uint64_t seed) {
    manual_seed(seed);
    model = std::make_unique<Net>();
    fsdp = std::make_unique<parallel::FullyShardedDataParallel>(*model, world_of_one());
    opt = std::make_unique<optim::AdamW>(fsdp->parameters(), optim::AdamWOptions{});
  }
  void train(uint64_t seed) {
    manual_seed(seed);
    Tensor x = randn({4, 3});
    Tensor y = randint(0, 2, {4});
    nn::cross_entropy(fsdp->forward(x), y).backward();
    opt->step();
    opt->zero_grad();
  }
  // What "usable" means for a loaded checkpoint, at a third of train()'s cost under ASan: a forward
  // through every unit (gathering each shard, reading the buffers) and an optimizer step over
  // every shard with the loaded state (a gradient of the shard's shape is given directly).
  void use() {
    {
      NoGradGuard no_grad;
      manual_seed(4);
      fsdp->forward(randn({4, 3}));
    }
    for (const Tensor& shard : fsdp->parameters()) shard.set_grad(full(shard.shape(), 0.01));
    opt->step();
    opt->zero_grad();
  }
  // Everything a load may change: every unit's shard, the buffers, the optimizer's state.
  StateDict snapshot() const {
    StateDict out;
    for (size_t u = 0; u < fsdp->units().size(); ++u)
      out["shard/" + std::to_string(u)] = fsdp->units()[u]->shard().detach().clone();
    for (const auto& [name, slot] : model->named_buffer_slots()) out["buffer/" + name] = slot->clone();
    for (const auto& [key, value] : opt->state_dict()) out["optimizer/" + key] = value.clone();
    return out;
  }
  void restore(const StateDict& saved) {
    NoGradGuard no_grad;
    for (size_t u = 0; u < fsdp->units().size(); ++u)
      fsdp->units()[u]->shard().copy_(saved.at("shard/" + std::to_string(u)));
    for (const auto& [name, slot] : model->named_buffer_slots()) slot->copy_(saved.at("buffer/" + name));
    StateDict optimizer;
    const std::string prefix = "optimizer/";
    for (const auto& [key, value] : saved)
      if (key.compare(0, prefix.size(), prefix) == 0) optimizer[key.substr(prefix.size())] = value;
    opt->load_state_dict(optimizer);
  }
};

// The one Run every input loads into, with a state of its own (three steps from other weights),
// which a refused load must leave exactly as it is.
Run& target_run() {
  static Run* run = [] {
    auto* r = new Run(9);  // never destroyed: it lives as long as the fuzzer
    r->train(3);
    return r;
  }();
  return *run;
}
const StateDict& target_saved() {
  static const StateDict saved = target_run().snapshot();
  return saved;
}

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string file_name(int rank, int world) {
  return "fsdp-rank" + std::to_string(rank) + "-of" + std::to_string(world) + ".safetensors";
}

// One world-of-one sharded state dict (model and optimizer) cut as N ranks would have saved it:
// every unit's flat tensors split into N shards of s = ceil(numel / N) elements, the last padded
// with zeros, and the layout [N, r, numel, s]. The buffers and hyperparameters go to every rank.
std::vector<StateDict> cut(const StateDict& one, int world) {
  std::map<std::string, int64_t> numel_of;  // "fsdp/<unit>/" -> its element count
  for (const auto& [key, t] : one)
    if (ends_with(key, "/layout")) numel_of[key.substr(0, key.size() - 6)] = t.to_vector<int64_t>()[2];
  std::vector<StateDict> out(static_cast<size_t>(world));
  for (const auto& [key, t] : one) {
    std::string unit;
    for (const auto& [prefix, n] : numel_of)
      if (key.compare(0, prefix.size(), prefix) == 0) unit = prefix;
    if (ends_with(key, "/layout")) continue;
    if (unit.empty() || t.dim() != 1) {  // a buffer, a hyperparameter, a 0-d step count
      for (StateDict& rank : out) rank[key] = t;
      continue;
    }
    const int64_t n = numel_of[unit], s = (n + world - 1) / world;
    Tensor padded = zeros({s * world}, TensorOptions{t.dtype()});
    padded.narrow(0, 0, n).copy_(t.narrow(0, 0, n));
    for (int r = 0; r < world; ++r) out[static_cast<size_t>(r)][key] = padded.narrow(0, r * s, s).clone();
  }
  for (const auto& [unit, n] : numel_of)
    for (int r = 0; r < world; ++r)
      out[static_cast<size_t>(r)][unit + "layout"] =
          tensor(std::vector<int64_t>{world, r, n, (n + world - 1) / world});
  return out;
}

// The template of each world size N (1 to 4): file name -> contents.
const std::map<std::string, SafetensorsFile>& template_files(int world) {
  static std::map<int, std::map<std::string, SafetensorsFile>> cache;
  auto it = cache.find(world);
  if (it != cache.end()) return it->second;
  Run run(5);
  run.train(1);
  run.train(2);
  StateDict one = parallel::sharded_state_dict(*run.fsdp);
  for (const auto& [key, value] : parallel::sharded_optim_state_dict(*run.fsdp, *run.opt)) one[key] = value;
  std::map<std::string, SafetensorsFile> files;
  const std::vector<StateDict> ranks = cut(one, world);
  for (int r = 0; r < world; ++r) files[file_name(r, world)].tensors = ranks[static_cast<size_t>(r)];
  return cache[world] = files;
}

// The input (fuzz_input.h), with this harness's words and awkward values.
struct Input : mg::fuzz::Input {
  // A tensor or file name made of the layout's own words.
  std::string name() {
    // clang-format off
    static const char* const kWords[] = {
        "fsdp/", "fc0", "bn", "fc1", "/", "layout",
        "flat_shard", "optim_state/", "exp_avg", "exp_avg_sq", "step", "optim/",
        "param_groups.0.", "lr", "running_mean", "running_var", "num_batches_tracked", "-of",
        "0", "1", "2", "3", "99999999999", "x",
        ".", "", "-", "0000001", "weight", "bias"
    };
    // clang-format on
    return words(kWords, 7);
  }

  std::string text() { return mg::fuzz::Input::text(16, true); }

  int64_t awkward_integer() {
    // clang-format off
    static const int64_t kValues[] = {
        0, 1, 2, 3, 4, -1,
        5, 8, 9, 10, 16, 17,
        std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min(),
        int64_t{1} << 62, int64_t{1} << 31, (int64_t{1} << 20) + 1
    };
    // clang-format on
    return one_of(kValues);
  }
};

// The structured mode: the template of world N, edited. Returns file name -> bytes.
std::map<std::string, std::string> edited_checkpoint(int world, Input& in) {
  std::map<std::string, SafetensorsFile> files = template_files(world);
  std::map<std::string, size_t> truncated;
  for (int op = 0; op < 16 && !in.done(); ++op) {
    const uint8_t code = in.byte();
    auto file = mg::fuzz::pick(files, in.byte());
    if (file == files.end()) break;
    std::map<std::string, Tensor>& tensors = file->second.tensors;
    switch (code % 9) {
      case 0: file->second.metadata[in.name()] = in.text(); break;
      case 1: {
        auto it = mg::fuzz::pick(tensors, in.byte());
        if (it != tensors.end()) tensors.erase(it);
        break;
      }
      case 2: {
        auto it = mg::fuzz::pick(tensors, in.byte());
        if (it != tensors.end()) it->second = in.tensor();
        break;
      }
      case 3: {
        auto it = mg::fuzz::pick(tensors, in.byte());
        if (it != tensors.end()) {
          Tensor t = it->second;
          tensors.erase(it);
          tensors[in.name()] = t;
        }
        break;
      }
      case 4: {  // a layout of awkward integers (or a new one under a made-up unit name)
        std::vector<std::string> layouts;
        for (const auto& entry : tensors)
          if (ends_with(entry.first, "/layout")) layouts.push_back(entry.first);
        const uint8_t choice = in.byte();
        std::vector<int64_t> values(4);
        for (int64_t& v : values) v = in.awkward_integer();
        if (choice >= 224 || layouts.empty())
          tensors["fsdp/" + in.name() + "/layout"] = tensor(values);
        else
          tensors[layouts[choice % layouts.size()]] = tensor(values);
        break;
      }
      case 5: files.erase(file); break;
      case 6: {  // a stray name
        const SafetensorsFile copy = file->second;
        std::string middle = in.name();
        for (char& c : middle)
          if (c == '/') c = '_';  // a file name, not a path
        files["fsdp-rank" + middle + ".safetensors"] = copy;
        break;
      }
      case 7: {  // a file of a second world size
        const SafetensorsFile copy = file->second;
        const int b = 1 + in.byte() % 5, a = in.byte() % 5;
        files[file_name(a, b)] = copy;
        break;
      }
      case 8: truncated[file->first] = static_cast<size_t>(in.byte()) * 8; break;
    }
  }
  std::map<std::string, std::string> out;
  for (const auto& [name, file] : files) {
    std::string bytes = encode_safetensors(file.tensors, file.metadata);  // may refuse: mg::Error
    auto cut_at = truncated.find(name);
    if (cut_at != truncated.end() && cut_at->second < bytes.size()) bytes.resize(cut_at->second);
    out[name] = bytes;
  }
  return out;
}

std::map<std::string, std::string> raw_checkpoint(int world, const std::string& rest) {
  std::map<std::string, std::string> out;
  size_t begin = 0;
  for (int r = 0; r < world && begin <= rest.size(); ++r) {
    size_t end = rest.find(kSeparator, begin);
    if (end == std::string::npos) end = rest.size();
    out[file_name(r, world)] = rest.substr(begin, end - begin);
    begin = end + kSeparator.size();
  }
  return out;
}

// Where the rank files are written (tmpfs when there is one).
const std::string& work_dir() { return mg::fuzz::scratch_dir("mg_fuzz_fsdp"); }

void write_dir(const std::string& dir, const std::map<std::string, std::string>& files) {
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) fs::remove(entry.path(), error);
  for (const auto& [name, bytes] : files) {
    std::ofstream out(dir + "/" + name, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    MG_FUZZ_ASSERT(out.good(), "writing the fuzzed checkpoint file");
  }
}

// The template itself loads at every world size, with and without the optimizer, and gives back
// the model it was cut from: the harness checks itself once, so a harness that refuses everything
// cannot pass for a robust reader.
void check_template_loads() {
  Run source(5);
  source.train(1);
  source.train(2);
  const StateDict expected = source.snapshot();  // the same units and optimizer, so comparable
  for (int world = 1; world <= 4; ++world) {
    std::map<std::string, std::string> files;
    for (const auto& [name, file] : template_files(world)) files[name] = encode_safetensors(file.tensors, {});
    write_dir(work_dir(), files);
    Run run(9);
    parallel::load_sharded_checkpoint(*run.fsdp, *run.opt, work_dir());
    MG_FUZZ_ASSERT(mg::fuzz::same_state(run.snapshot(), expected),
                   "the template loads back as the model it was cut from");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const bool checked = [] {
    check_template_loads();
    return true;
  }();
  (void)checked;
  const int world = 1 + (data[0] & 3);
  const bool structured = data[0] & 4;
  const bool in_memory = data[0] & 8;
  const bool with_optimizer = !(data[0] & 16);
  target_saved();  // before any input: the state every input starts from

  std::map<std::string, std::string> files;
  if (structured) {
    Input in{{data + 1, size - 1}};
    bool refused = true;  // the edit made a file the writer refuses to write (a reserved name)
    mg::fuzz::expect_only_mg_error([&] {
      files = edited_checkpoint(world, in);
      refused = false;
    });
    if (refused) return 0;
  } else {
    files = raw_checkpoint(world, std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  }

  Run& run = target_run();
  const StateDict& before = target_saved();
  bool accepted = false, changed = false;
  if (in_memory) {
    const std::function<StateDict(int)> shard_of = [&](int k) {
      auto it = files.find(file_name(k, world));
      if (it == files.end()) throw Error("no file of old rank " + std::to_string(k));
      return decode_safetensors(it->second).tensors;
    };
    bool model_loaded = false;
    StateDict after_model;
    mg::fuzz::expect_only_mg_error([&] {
      parallel::load_sharded_state_dict(*run.fsdp, shard_of);
      model_loaded = changed = true;
      after_model = run.snapshot();
      if (with_optimizer) parallel::load_sharded_optim_state_dict(*run.fsdp, *run.opt, shard_of);
      accepted = true;
    });
    if (!model_loaded)
      MG_FUZZ_ASSERT(mg::fuzz::same_state(run.snapshot(), before),
                     "a refused model load leaves the model as it was");
    else if (!accepted)
      MG_FUZZ_ASSERT(mg::fuzz::same_state(run.snapshot(), after_model),
                     "a refused optimizer load leaves it as it was");
  } else {
    write_dir(work_dir(), files);
    mg::fuzz::expect_only_mg_error([&] {
      if (with_optimizer)
        parallel::load_sharded_checkpoint(*run.fsdp, *run.opt, work_dir());
      else
        parallel::load_sharded_checkpoint(*run.fsdp, work_dir());
      accepted = changed = true;
    });
    if (!accepted)
      MG_FUZZ_ASSERT(mg::fuzz::same_state(run.snapshot(), before), "a refused load changes nothing");
  }
  if (accepted) {
    try {
      run.use();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "an accepted checkpoint is unusable: %s\n", e.what());
      std::abort();
    }
  }
  if (changed) run.restore(before);
  return 0;
}
