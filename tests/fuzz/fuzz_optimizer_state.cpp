// Fuzzes the optimizer state readers: Optimizer::load_state_dict (SGD with momentum, Adam with
// amsgrad, AdamW, over two parameter groups), ZeroRedundancyOptimizer::load_state_dict (ZeRO-1,
// partitioned by parameter and flat) and GradScaler::load_state_dict, in a world of one (the
// single-process backend: no MPI). A state dict reaches them from a checkpoint file or, for ZeRO,
// from another rank (consolidated_state_dict), so its keys and tensors are untrusted input.
//
// Byte 0 chooses: bits 0-1 the reader (plain optimizer, ZeRO by parameter, ZeRO flat, GradScaler),
// bits 2-3 the optimizer (SGD, Adam, AdamW; 3 is AdamW too), bit 4 how the rest becomes the dict:
//   raw         the rest IS a safetensors file, decoded by decode_safetensors (what a checkpoint
//               load does with the bytes); a refusal there ends the input.
//   structured  a valid state dict, saved once at start-up after two real steps, edited by the
//               input: erase a key, replace a tensor (any dtype, up to 3 dims of up to 4), rename a
//               key, set a 0-d value to an awkward number (NaN, inf, 2^63, -1, ...), or put in an
//               awkward index list. Names come from the words the layout uses ("state.", digits,
//               "exp_avg", "param_groups.", ...), so edits reach the checks behind the key parser.
//
// Properties on top of "only mg::Error comes out":
//   - all or nothing: a refused state leaves the optimizer's state_dict() exactly as before;
//   - an accepted state is usable: its state_dict() loads into a fresh optimizer, and a step on
//     it runs without any exception (a moment of the wrong shape or dtype must have been refused).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
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
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "parallel/zero/zero_redundancy_optimizer.h"

namespace {

using namespace mg;

enum class Reader { Plain, ZeroByParameter, ZeroFlat, Scaler };
enum class Kind { SGD, Adam, AdamW };

// Three parameters of different shapes (so a moment of another parameter's shape is wrong).
struct Params {
  std::vector<Tensor> list;
  Params() {
    manual_seed(11);
    list = {randn({3, 2}), randn({3}), randn({2, 2, 1})};
    for (Tensor& p : list) p.set_requires_grad(true);
  }
  void fill_grads(uint64_t seed) {
    manual_seed(seed);
    for (Tensor& p : list) p.set_grad(randn(p.shape()));
  }
};

std::unique_ptr<optim::Optimizer> make_optimizer(Kind kind, std::vector<Tensor> params, bool two_groups) {
  std::vector<optim::ParamGroup> groups;
  if (two_groups) {
    groups.push_back({{params[0]}, {}});
    groups.push_back({{params.begin() + 1, params.end()}, {{"lr", 0.05}}});
  } else {
    groups.push_back({params, {}});
  }
  switch (kind) {
    case Kind::SGD: {
      optim::SGDOptions o;
      o.momentum = 0.9;
      return std::make_unique<optim::SGD>(groups, o);
    }
    case Kind::Adam: {
      optim::AdamOptions o;
      o.amsgrad = true;
      return std::make_unique<optim::Adam>(groups, o);
    }
    case Kind::AdamW: break;
  }
  return std::make_unique<optim::AdamW>(groups, optim::AdamWOptions{});
}

parallel::ProcessGroup world_of_one() {
  return parallel::ProcessGroup(parallel::make_single_process_backend(), Device::cpu(),
                                parallel::LaunchInfo{});
}

// One reader, made afresh for every input: what a state is loaded into.
struct Target {
  Reader reader;
  Kind kind;
  Params params;
  std::unique_ptr<optim::Optimizer> plain;
  std::unique_ptr<parallel::ZeroRedundancyOptimizer> zero;
  std::unique_ptr<optim::GradScaler> scaler;

  Target(Reader r, Kind k) : reader(r), kind(k) {
    if (reader == Reader::Plain) {
      plain = make_optimizer(kind, params.list, true);
    } else if (reader == Reader::Scaler) {
      scaler = std::make_unique<optim::GradScaler>();
    } else {
      parallel::ZeroOptions options;
      options.partition =
          reader == Reader::ZeroFlat ? parallel::ZeroPartition::Flat : parallel::ZeroPartition::Parameters;
      const Kind which = kind;
      zero = std::make_unique<parallel::ZeroRedundancyOptimizer>(
          params.list, world_of_one(),
          [which](std::vector<Tensor> shard) { return make_optimizer(which, std::move(shard), false); },
          options);
    }
  }
  StateDict state() {
    if (plain) return plain->state_dict();
    if (zero) return zero->consolidated_state_dict(0);
    return scaler->state_dict();
  }
  void load(const StateDict& s) {
    if (plain) return plain->load_state_dict(s);
    if (zero) return zero->load_state_dict(s);
    scaler->load_state_dict(s);
  }
  void step(uint64_t seed) {
    if (scaler) {
      // A scaler step drives a real optimizer: unscale, the inf check, the step, the update.
      auto opt = make_optimizer(Kind::SGD, params.list, false);
      params.fill_grads(seed);
      scaler->step(*opt);
      scaler->update();
      return;
    }
    params.fill_grads(seed);
    if (plain) plain->step();
    if (zero) zero->step();
  }
};

// The valid state of each (reader, kind): two real steps, then saved.
const StateDict& template_state(Reader reader, Kind kind) {
  static std::map<std::pair<int, int>, StateDict> cache;
  const auto key = std::make_pair(static_cast<int>(reader), static_cast<int>(kind));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Target t(reader, kind);
  t.step(1);
  t.step(2);
  return cache[key] = t.state();
}

// The input (fuzz_input.h), with this harness's words and awkward values.
struct Input : mg::fuzz::Input {
  // A key made of the layout's words: what the key parsers must take apart.
  std::string name() {
    // clang-format off
    static const char* const kWords[] = {
        "state.", "param_groups.", "0", "1", "2", "3",
        "7", ".", "x", "exp_avg", "exp_avg_sq", "max_exp_avg_sq",
        "step", "momentum_buffer", "lr", "params", "beta1", "eps",
        "weight_decay", "momentum", "amsgrad", "nesterov", "scale", "growth_tracker",
        "99999999999999999999", "-1", "18446744073709551616", "", "..", "00"
    };
    // clang-format on
    return words(kWords, 6);
  }

  double awkward_number() {
    // clang-format off
    static const double kValues[] = {
        0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 1e300, -1e300,
        9.2233720368547758e18, -9.2233720368547758e18,  // 2^63: one past int64
        4294967296.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
        std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(), 1e-320
    };
    // clang-format on
    return one_of(kValues);
  }

  std::vector<int64_t> awkward_indices() {
    static const int64_t kValues[] = {0,
                                      1,
                                      2,
                                      3,
                                      -1,
                                      7,
                                      std::numeric_limits<int64_t>::max(),
                                      std::numeric_limits<int64_t>::min(),
                                      int64_t{1} << 32};
    std::vector<int64_t> out(byte() % 5);
    for (int64_t& v : out) v = one_of(kValues);
    return out;
  }
};

StateDict edited(StateDict state, Input& in) {
  for (int op = 0; op < 12 && !in.done(); ++op) {
    const uint8_t code = in.byte();
    auto it = mg::fuzz::pick(state, in.byte());
    switch (code % 6) {
      case 0:
        if (it != state.end()) state.erase(it);
        break;
      case 1:
        if (it != state.end()) it->second = in.tensor();
        break;
      case 2:
        if (it != state.end()) {
          Tensor t = it->second;
          state.erase(it);
          state[in.name()] = t;
        }
        break;
      case 3:
        if (it != state.end()) it->second = scalar_tensor(in.awkward_number(), TensorOptions{DType::f64});
        break;
      case 4: {  // an index list (param_groups.<g>.params, or anything else)
        const std::vector<int64_t> indices = in.awkward_indices();
        Tensor t = tensor(indices);
        if (it != state.end() && (in.byte() & 1))
          it->second = t;
        else
          state[in.name()] = t;
        break;
      }
      case 5: state[in.name()] = in.tensor(); break;
    }
  }
  return state;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Reader reader = static_cast<Reader>(data[0] & 3);
  const Kind kind = static_cast<Kind>(std::min((data[0] >> 2) & 3, 2));
  const bool structured = data[0] & 16;

  StateDict state;
  if (structured) {
    Input in{{data + 1, size - 1}};
    state = edited(template_state(reader, kind), in);
  } else {
    bool decoded = false;
    mg::fuzz::expect_only_mg_error([&] {
      state = decode_safetensors(std::string(reinterpret_cast<const char*>(data) + 1, size - 1)).tensors;
      decoded = true;
    });
    if (!decoded) return 0;
  }

  Target target(reader, kind);
  target.step(3);  // a state of its own, which a refused load must leave as it is
  const StateDict before = target.state();
  bool accepted = false;
  mg::fuzz::expect_only_mg_error([&] {
    target.load(state);
    accepted = true;
  });
  if (!accepted) {
    MG_FUZZ_ASSERT(mg::fuzz::same_state(target.state(), before),
                   "a refused state leaves the optimizer as it was");
    return 0;
  }
  // Accepted: the state it now holds loads into a fresh one, and a step runs. Any exception here
  // means the load took a state it cannot use.
  try {
    const StateDict now = target.state();
    Target fresh(reader, kind);
    fresh.load(now);
    MG_FUZZ_ASSERT(mg::fuzz::same_state(fresh.state(), now), "an accepted state reloads as it is");
    target.step(4);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "an accepted state is unusable: %s\n", e.what());
    std::abort();
  }
  return 0;
}
