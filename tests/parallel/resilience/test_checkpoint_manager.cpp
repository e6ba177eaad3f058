// CheckpointManager in a world of one: step directories, keep-last-M, a corrupt or truncated
// newest checkpoint skipped for the previous valid one, exact resume with the scheduler and the
// generator, the background write, replacing a step directory with no moment without a complete
// one (a crash simulated at every stage), and files whose checksums were stripped refused.
// (The multi-rank proofs -- per-rank checkpoint directories, no shared filesystem -- are
// check_sigterm_resume.sh and tests/parallel/multinode/check_recovery.sh.)
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "core/safetensors.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "parallel/resilience/checkpoint_manager.h"
#include "parallel/resilience/sharded_metric.h"

using namespace mg;

namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = "/tmp/mg_ckptmgr_" + std::to_string(::getpid()) + "_" + name;
  std::system(("rm -rf '" + dir + "'").c_str());
  return dir;
}

struct Run {
  nn::MLP model{8, {16}, 3};
  optim::AdamW opt{model.parameters(), optim::AdamWOptions{}};
  optim::CosineAnnealingLR schedule{opt, [] {
                                      optim::CosineAnnealingLROptions o;
                                      o.t_max = 20;
                                      return o;
                                    }()};
  parallel::TrainingState state() {
    parallel::TrainingState s;
    s.module = &model;
    s.optimizer = &opt;
    s.scheduler = &schedule;
    return s;
  }
  void step() {  // data from the default generator: resuming needs its state too
    Tensor loss = cross_entropy(model.forward(randn({8, 8})), randint(0, 3, {8}));
    opt.zero_grad();
    loss.backward();
    opt.step();
    schedule.step();
  }
};

std::vector<float> flat(const nn::Module& m) {
  std::vector<float> all;
  for (const Tensor& p : m.parameters())
    for (float v : p.to_vector<float>()) all.push_back(v);
  return all;
}

std::vector<std::string> entries(const std::string& dir) {  // every name in `dir`, sorted
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* entry = ::readdir(d))
      if (std::string(entry->d_name) != "." && std::string(entry->d_name) != "..")
        names.push_back(entry->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// What `fn` prints on stderr.
std::string stderr_of(const std::function<void()>& fn) {
  std::fflush(stderr);
  char path[] = "/tmp/mg_ckptmgr_stderr_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  fn();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(path);
  return text.str();
}

// Rewrites a safetensors file with every "crc32c:" key taken out of its header: the same tensors,
// metadata and offsets, as PyTorch (or someone stripping them) would leave it.
void strip_checksums(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() >= 8);
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | static_cast<unsigned char>(bytes[i]);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_size));
  auto& metadata = header["__metadata__"];
  size_t stripped = 0;
  for (auto it = metadata.begin(); it != metadata.end();) {
    if (it.key().rfind("crc32c:", 0) == 0) {
      it = metadata.erase(it);
      ++stripped;
    } else {
      ++it;
    }
  }
  REQUIRE(stripped > 0);
  const std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  out += text + bytes.substr(8 + header_size);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out;
  REQUIRE_NOTHROW(load_safetensors(path));  // still a valid file: only the checksums are gone
}

}  // namespace

TEST_CASE("CheckpointManager keeps the last M, resumes exactly, and skips a damaged newest one",
          "[checkpoint][fault]") {
  parallel::ProcessGroup pg = parallel::init_process_group();
  const std::string dir = fresh_dir("main");
  manual_seed(3);
  Run straight;
  for (int i = 0; i < 12; ++i) straight.step();

  manual_seed(3);
  Run first;
  parallel::CheckpointManagerOptions options;
  options.every_steps = 3;
  options.keep_last = 2;
  {
    parallel::CheckpointManager checkpoints(pg, dir, options);
    for (int64_t step = 1; step <= 9; ++step) {
      first.step();
      if (checkpoints.due(step)) checkpoints.save(first.state(), {step, 0, step * 8});
    }
    checkpoints.wait();
    const auto kept = checkpoints.checkpoints();
    REQUIRE(kept.size() == 2);  // steps 6 and 9; step 3 was deleted once 9 was complete
    REQUIRE(kept[0] == dir + "/step-00000006");
    REQUIRE(kept[1] == dir + "/step-00000009");
  }

  SECTION("a resume at the newest continues bit for bit") {
    manual_seed(999);  // anything: the checkpoint restores the generator
    Run resumed;
    parallel::CheckpointManager checkpoints(pg, dir, options);
    auto point = checkpoints.load_latest(resumed.state());
    REQUIRE(point);
    REQUIRE(point->position.step == 9);
    REQUIRE(point->position.samples_into_epoch == 72);
    REQUIRE(point->world_size == 1);
    for (int i = 0; i < 3; ++i) resumed.step();
    REQUIRE(flat(resumed.model) == flat(straight.model));
    REQUIRE(resumed.schedule.last_epoch() == straight.schedule.last_epoch());
  }

  SECTION("a 64-byte overwrite in the newest model file: the previous checkpoint is used") {
    const std::string victim = dir + "/step-00000009/model.safetensors";
    std::fstream file(victim, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-200, std::ios::end);
    file.write(std::string(64, '\x55').data(), 64);
    file.close();
    manual_seed(999);
    Run resumed;
    parallel::CheckpointManager checkpoints(pg, dir, options);
    auto point = checkpoints.load_latest(resumed.state());
    REQUIRE(point);
    REQUIRE(point->position.step == 6);
    for (int i = 0; i < 6; ++i) resumed.step();
    REQUIRE(flat(resumed.model) == flat(straight.model));
  }

  SECTION("a truncated newest optimizer file: the previous checkpoint is used") {
    const std::string victim = dir + "/step-00000009/optimizer.safetensors";
    REQUIRE(::truncate(victim.c_str(), 100) == 0);
    Run resumed;
    parallel::CheckpointManager checkpoints(pg, dir, options);
    auto point = checkpoints.load_latest(resumed.state());
    REQUIRE(point);
    REQUIRE(point->position.step == 6);
  }

  SECTION("no valid checkpoint at all: nothing is loaded") {
    for (const char* step : {"6", "9"})
      REQUIRE(::truncate((dir + "/step-0000000" + step + "/model.safetensors").c_str(), 10) == 0);
    Run resumed;
    const auto before = flat(resumed.model);
    parallel::CheckpointManager checkpoints(pg, dir, options);
    REQUIRE_FALSE(checkpoints.load_latest(resumed.state()));
    REQUIRE(flat(resumed.model) == before);
  }
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("CheckpointManager replaces a step directory with no moment without a complete one",
          "[checkpoint][fault]") {
  // step 6 saved from `old_run`, then saved again from `new_run` (other weights) -- what a job
  // restarted after a crash does when it reaches a step it had saved -- with a crash simulated at
  // each stage of the replacement. Afterwards step 6 must load, whole, as one of the two.
  parallel::ProcessGroup pg = parallel::init_process_group();
  parallel::CheckpointManagerOptions options;
  options.background = GENERATE(false, true);
  const bool exchange = GENERATE(true, false);
  // Stage at which the "crash" strikes, and which checkpoint step 6 must then be.
  const auto [stage, want_new] = GENERATE(table<std::string, bool>(
      {{"written", false}, {"exchanged", true}, {"old-aside", false}, {"new-in", true}, {"none", true}}));
  const bool portable_stage = stage == "old-aside" || stage == "new-in";
  if ((exchange && portable_stage) || (!exchange && stage == "exchanged")) return;  // the other path's
  CAPTURE(options.background, exchange, stage);
  const std::string dir = fresh_dir("replace");
  manual_seed(1);
  Run old_run;
  old_run.step();
  manual_seed(2);
  Run new_run;
  new_run.step();
  new_run.step();
  {
    parallel::CheckpointManager checkpoints(pg, dir, options);
    checkpoints.save(old_run.state(), {3, 0, 24});
    checkpoints.save(old_run.state(), {6, 0, 48});
    checkpoints.wait();
    parallel::checkpoint_testing::use_rename_exchange(exchange);
    parallel::checkpoint_testing::set_replace_hook([&](const std::string& at) {
      if (at == stage) throw Error("simulated crash at " + at);
    });
    checkpoints.save(new_run.state(), {6, 0, 48});
    bool crashed = false;
    try {
      checkpoints.wait();
    } catch (const Error& e) {
      crashed = true;
      CHECK_THAT(e.what(), Catch::Contains("simulated crash at " + stage));
    }
    parallel::checkpoint_testing::set_replace_hook({});
    parallel::checkpoint_testing::use_rename_exchange(true);
    if (exchange && stage == "exchanged" && !crashed) {
      WARN("this filesystem cannot swap directories (renameat2 RENAME_EXCHANGE): the portable path ran");
      std::system(("rm -rf '" + dir + "'").c_str());
      return;
    }
    REQUIRE(crashed == (stage != "none"));
    // A complete step 6 is where load_latest looks for it, whatever the stage -- except between
    // the portable path's two renames, where the old one waits at ".old-step-6" (load_latest
    // renames it back).
    const auto listed = checkpoints.checkpoints();
    REQUIRE(listed.size() == (stage == "old-aside" ? 1 : 2));
    if (stage == "old-aside") REQUIRE(entries(dir).front() == ".old-step-00000006");
    if (stage != "old-aside") REQUIRE(listed.back() == dir + "/step-00000006");
  }
  manual_seed(999);
  Run resumed;
  parallel::CheckpointManager checkpoints(pg, dir, options);
  auto point = checkpoints.load_latest(resumed.state());
  REQUIRE(point);
  CHECK(point->position.step == 6);
  CHECK(flat(resumed.model) == flat(want_new ? new_run.model : old_run.model));
  // The leftovers (".partial-step-6", ".old-step-6") are gone once load_latest has looked.
  CHECK(entries(dir) == std::vector<std::string>{"step-00000003", "step-00000006"});
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("CheckpointManager refuses its own files without checksums, naming the file",
          "[checkpoint][fault]") {
  parallel::ProcessGroup pg = parallel::init_process_group();
  const std::string dir = fresh_dir("stripped");
  manual_seed(3);
  Run run;
  parallel::CheckpointManagerOptions options;
  options.background = false;
  parallel::CheckpointManager checkpoints(pg, dir, options);
  run.step();
  checkpoints.save(run.state(), {1, 0, 8});
  run.step();
  checkpoints.save(run.state(), {2, 0, 16});
  const std::string file =
      GENERATE(as<std::string>{}, "model.safetensors", "optimizer.safetensors", "lr_scheduler.safetensors");
  CAPTURE(file);
  const std::string stripped = dir + "/step-00000002/" + file;
  strip_checksums(stripped);
  Run resumed;
  std::optional<parallel::ResumePoint> point;
  const std::string log = stderr_of([&] { point = checkpoints.load_latest(resumed.state()); });
  REQUIRE(point);
  CHECK(point->position.step == 1);  // step 2 refused, the previous one used
  CHECK_THAT(log, Catch::Contains(stripped) && Catch::Contains("checksum"));
  std::system(("rm -rf '" + dir + "'").c_str());
}

TEST_CASE("ShardedMetric drops the DistributedSampler's padding: each sample counts once", "[metric]") {
  // 10 samples over 3 ranks: 4 + 4 + 4 positions, 2 of them padding (ranks 1 and 2's last).
  int64_t total = 0;
  double sum = 0;
  for (int64_t rank = 0; rank < 3; ++rank) {
    data::DistributedSamplerOptions options;
    options.shuffle = false;
    data::DistributedSampler sampler(10, rank, 3, options);
    REQUIRE(sampler.real_size() == (rank == 0 ? 4 : 3));
    parallel::ShardedMetric metric(sampler);
    metric.add(ones({3}));
    metric.add(ones({1}));  // the padding position on ranks 1 and 2
    total += metric.local().count;
    sum += metric.local().sum;
  }
  REQUIRE(total == 10);
  REQUIRE(sum == 10.0);
  data::DistributedSampler one(10, 0, 1);
  parallel::ShardedMetric metric(one);
  REQUIRE_THROWS_WITH(metric.add(ones({2, 2})), Catch::Contains("one value per sample"));
}
