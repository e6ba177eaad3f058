// FSDP sharded checkpoints that are damaged or do not fit, under `mpiexec -n K`: loading is a
// collective that every rank passes or every rank fails, with an mg::Error naming the file and
// the reason -- never a SIGFPE (a shard size of 0), a std::invalid_argument from a stray file
// name, one rank going on while another failed (and then hanging in the next all-gather), or
// the files of two world sizes mixed. A failed load leaves the model and optimizer as they were.
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "multigrad.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/fsdp/fsdp_state_dict.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;
using Catch::Matchers::Contains;

namespace {

struct Net : nn::Module {
  nn::Linear fc0{6, 11}, fc1{11, 3};
  Tensor scale;
  Net() {
    register_module("fc0", fc0);
    register_module("fc1", fc1);
    scale = ones({3});
    register_parameter("scale", scale);
  }
  Tensor forward(const Tensor& x) override { return mul(fc1(relu(fc0(x))), scale); }
};

namespace fs = std::filesystem;

std::string shared_temp_dir(ProcessGroup& pg, const std::string& what) {
  Tensor id = tensor(std::vector<int64_t>{static_cast<int64_t>(std::random_device{}() & 0x7fffffff)});
  pg.broadcast(id, 0)->wait();
  return (fs::temp_directory_path() / str_cat("mg_fsdp_ckpt_", what, "_", id.item<int64_t>())).string();
}

std::string shard_name(int rank, int world) {
  return str_cat("fsdp-rank", rank, "-of", world, ".safetensors");
}

FSDPOptions with_policy(AutoWrapPolicy policy) {
  FSDPOptions options;
  options.auto_wrap = policy;
  return options;
}

// A model (seeded `seed`) with its FSDP and AdamW after one step, so the optimizer has state.
struct Trained {
  std::shared_ptr<Net> model;
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  std::unique_ptr<optim::Optimizer> opt;
  Trained(ProcessGroup& pg, uint64_t seed, const FSDPOptions& options = {}) {
    manual_seed(seed);
    model = std::make_shared<Net>();
    model->to(pg.device());
    fsdp = std::make_unique<FullyShardedDataParallel>(*model, pg, options);
    opt = testing::adamw(fsdp->parameters());
    manual_seed(100 + static_cast<uint64_t>(pg.rank()));
    nn::cross_entropy((*fsdp)(randn({4, 6}).to(pg.device())), randint(0, 3, {4}).to(pg.device())).backward();
    opt->step();
    opt->zero_grad();
  }
};

// Rank 0 saves a good checkpoint with the optimizer (every rank its file) into `dir`.
void save_good(ProcessGroup& pg, const std::string& dir) {
  Trained t(pg, 1);
  save_sharded_checkpoint(*t.fsdp, *t.opt, dir);
}

// This rank's error from loading `dir` ("" when it loaded), and whether the model and optimizer
// kept their values when it failed. Any exception that is not an mg::Error is a failure too.
struct Outcome {
  std::string error;
  bool unchanged = true;
};
Outcome load(ProcessGroup& pg, const std::string& dir, bool with_optimizer, const FSDPOptions& options = {}) {
  Trained t(pg, 2, options);
  const StateDict before_model = sharded_state_dict(*t.fsdp);
  const StateDict before_opt = t.opt->state_dict();
  Outcome out;
  try {
    if (with_optimizer)
      load_sharded_checkpoint(*t.fsdp, *t.opt, dir);
    else
      load_sharded_checkpoint(*t.fsdp, dir);
  } catch (const Error& e) {
    out.error = e.what();
  } catch (const std::exception& e) {
    out.error = str_cat("NOT an mg::Error: ", e.what());
  }
  if (!out.error.empty()) {
    auto same = [](const StateDict& a, const StateDict& b) {
      if (a.size() != b.size()) return false;
      for (const auto& [key, value] : a) {
        auto it = b.find(key);
        if (it == b.end() || it->second.shape() != value.shape()) return false;
        auto values = [](const Tensor& t) {
          return t.to(Device::cpu()).to(DType::f64).contiguous().to_vector<double>();
        };
        if (values(value) != values(it->second)) return false;
      }
      return true;
    };
    out.unchanged = same(sharded_state_dict(*t.fsdp), before_model) && same(t.opt->state_dict(), before_opt);
  }
  return out;
}

// Every rank failed with an mg::Error containing each of `parts`, and kept its state.
void require_all_fail(ProcessGroup& pg, const Outcome& got, const std::vector<std::string>& parts) {
  INFO("rank " << pg.rank() << ": " << got.error);
  CHECK(!got.error.empty());
  CHECK_THAT(got.error, !Contains("NOT an mg::Error"));
  for (const std::string& part : parts) CHECK_THAT(got.error, Contains(part));
  CHECK(got.unchanged);
  // Every rank's verdict, so that a rank that loaded while another failed is seen on every rank.
  CHECK(all_ranks(pg, !got.error.empty()));
}

// Rewrites this rank's file of `dir` with unit fc0's layout entry replaced by `layout`.
void rewrite_layout(ProcessGroup& pg, const std::string& dir, std::vector<int64_t> layout) {
  const std::string file = (fs::path(dir) / shard_name(pg.rank(), pg.size())).string();
  StateDict state = load_safetensors(file).tensors;
  REQUIRE(state.count("fsdp/fc0/layout") == 1);
  layout[1] = pg.rank();
  state["fsdp/fc0/layout"] = tensor(layout);
  save_safetensors(file, state);
}

}  // namespace

TEST_CASE("FSDP sharded checkpoints: a damaged or mismatched one fails on every rank", "[mpi][fsdp]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int n = pg.size();
  const std::string root = shared_temp_dir(pg, "errors");
  int case_number = 0;
  // A fresh good checkpoint per case (rank 0 damages it), then every rank loads.
  auto fresh = [&]() {
    const std::string dir = str_cat(root, "/case", case_number++);
    save_good(pg, dir);
    return dir;
  };
  auto on_rank0 = [&](const std::function<void()>& damage) {
    if (pg.rank() == 0) damage();
    pg.barrier()->wait();
  };

  SECTION("shard size 0 (a layout without checksums to catch it): no division by zero") {
    const std::string dir = fresh();
    rewrite_layout(pg, dir, {n, 0, 77, 0});  // fc0: 6*11 + 11 = 77 elements, s = 0
    pg.barrier()->wait();
    for (bool with_opt : {false, true}) {
      Outcome got = load(pg, dir, with_opt);
      require_all_fail(pg, got, {"fc0", "layout"});
    }
  }
  SECTION("a layout whose world size times shard size cannot hold the unit") {
    const std::string dir = fresh();
    rewrite_layout(pg, dir, {n, 0, 77, 1});
    pg.barrier()->wait();
    require_all_fail(pg, load(pg, dir, false), {"fc0", "layout"});
  }
  SECTION("a layout of INT64_MAX ranks (fuzz finding 11: the coverage check overflowed)") {
    const std::string dir = fresh();
    rewrite_layout(pg, dir, {std::numeric_limits<int64_t>::max(), 0, 77, 1});
    pg.barrier()->wait();
    require_all_fail(pg, load(pg, dir, false), {"fc0", "layout", "of at most"});
  }
  SECTION("a stray file whose world size is not a number") {
    const std::string dir = fresh();
    on_rank0([&] { std::ofstream(fs::path(dir) / "fsdp-rank0-ofX.safetensors") << "x"; });
    require_all_fail(pg, load(pg, dir, false), {"fsdp-rank0-ofX.safetensors"});
  }
  SECTION("a stray file whose world size overflows") {
    const std::string dir = fresh();
    on_rank0([&] { std::ofstream(fs::path(dir) / "fsdp-rank0-of99999999999.safetensors") << "x"; });
    require_all_fail(pg, load(pg, dir, false), {"fsdp-rank0-of99999999999.safetensors"});
  }
  SECTION("the last rank's file is missing") {
    const std::string dir = fresh();
    on_rank0([&] { fs::remove(fs::path(dir) / shard_name(n - 1, n)); });
    for (bool with_opt : {false, true}) require_all_fail(pg, load(pg, dir, with_opt), {shard_name(n - 1, n)});
  }
  SECTION("the last rank's file is truncated") {
    const std::string dir = fresh();
    on_rank0([&] { fs::resize_file(fs::path(dir) / shard_name(n - 1, n), 40); });
    for (bool with_opt : {false, true}) require_all_fail(pg, load(pg, dir, with_opt), {shard_name(n - 1, n)});
  }
  SECTION("files of two world sizes in one directory") {
    const std::string dir = fresh();
    on_rank0([&] {
      for (int r = 0; r <= n; ++r)
        fs::copy_file(fs::path(dir) / shard_name(std::min(r, n - 1), n),
                      fs::path(dir) / shard_name(r, n + 1));
    });
    require_all_fail(pg, load(pg, dir, false), {shard_name(0, n), shard_name(0, n + 1)});
  }
  SECTION("another wrap policy: the expected and the found units are named") {
    const std::string dir = fresh();
    require_all_fail(pg, load(pg, dir, false, with_policy(AutoWrapPolicy::none())),
                     {"wrap policy", "fc0", "fc1"});
  }
  SECTION("not a directory") { require_all_fail(pg, load(pg, root + "/nowhere", false), {"nowhere"}); }
  SECTION("a good checkpoint still loads on every rank") {
    const std::string dir = fresh();
    Outcome got = load(pg, dir, true);
    INFO(got.error);
    CHECK(got.error.empty());
  }
  pg.barrier()->wait();
  if (pg.rank() == 0) fs::remove_all(root);
}
