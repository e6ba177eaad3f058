// ZeroRedundancyOptimizer::load_state_dict on a state whose keys do not parse, in a world of one
// rank (no MPI): an mg::Error naming the key, never std::invalid_argument / std::out_of_range
// from std::stoll ("state.x.exp_avg", a 20-digit index), and the optimizer keeps its state.
#include <catch2/catch.hpp>

#include <memory>
#include <string>
#include <vector>

#include "multigrad.h"
#include "optim/adam.h"
#include "parallel/comm/process_group.h"
#include "parallel/zero/zero_redundancy_optimizer.h"

using namespace mg;
using Catch::Matchers::Contains;

TEST_CASE("ZeRO load_state_dict: a state key without a parameter index is an mg::Error naming it", "[zero]") {
  parallel::ProcessGroup pg = parallel::init_process_group();
  manual_seed(1);
  std::vector<Tensor> params = {randn({3, 2}).set_requires_grad(true), randn({4}).set_requires_grad(true)};
  parallel::ZeroRedundancyOptimizer zero(params, pg, [](std::vector<Tensor> shard) {
    return std::unique_ptr<optim::Optimizer>(new optim::AdamW(shard, optim::AdamWOptions{}));
  });
  add(mul(params[0], params[0]).sum(), params[1].sum()).backward();
  zero.step();
  const StateDict good = zero.consolidated_state_dict();
  REQUIRE(good.count("state.0.exp_avg") == 1);
  for (const std::string key : {"state.x.exp_avg", "state.99999999999999999999.exp_avg", "state..exp_avg",
                                "state.-1.exp_avg", "state.1e3.exp_avg"}) {
    INFO(key);
    StateDict bad = good;
    bad[key] = bad.at("state.0.exp_avg");
    std::string error;
    try {
      zero.load_state_dict(bad);
    } catch (const Error& e) {
      error = e.what();
    } catch (const std::exception& e) {
      FAIL("not an mg::Error: " << e.what());
    }
    CHECK_THAT(error, Contains(key));
  }
  zero.load_state_dict(good);  // a good state still loads
  CHECK(zero.consolidated_state_dict().size() == good.size());
}
