// Bucket caps in MB become bytes through one checked conversion (reducer.h, bucket_cap_bytes): inf,
// nan, 1e300, 0 or a negative cap is an mg::Error naming the option -- it was an undefined
// double -> int64 cast in DDP's Reducer and ZeRO-2 (train_ddp --bucket-cap-mb inf). A world of one
// rank: no MPI needed.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "multigrad.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/bucket_autotune.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/reducer.h"

using namespace mg;
using Catch::Matchers::Contains;

TEST_CASE("bucket caps: finite MB in (0, 1 TiB], else an error naming the option", "[ddp][buckets]") {
  CHECK(parallel::bucket_cap_bytes(25, "bucket_cap_mb") == 25 * 1024 * 1024);
  CHECK(parallel::bucket_cap_bytes(0.5, "bucket_cap_mb") == 512 * 1024);
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan(""), 1e300, 0.0, -1.0, 1048577.0}) {
    INFO(bad);
    CHECK_THROWS_WITH(parallel::bucket_cap_bytes(bad, "bucket_cap_mb"),
                      Contains("bucket_cap_mb must be a finite number of MB"));
  }
  parallel::ProcessGroup pg = parallel::init_process_group();
  nn::Linear model(4, 3);
  parallel::DDPOptions options;
  options.bucket_cap_mb = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(parallel::DistributedDataParallel(model, pg, options), Contains("bucket_cap_mb must be"));
  options.bucket_cap_mb = 25;
  options.first_bucket_cap_mb = std::nan("");
  CHECK_THROWS_WITH(parallel::DistributedDataParallel(model, pg, options), Contains("first_bucket_cap_mb"));
}

TEST_CASE("fit_alpha_beta refuses an infinite or NaN sample instead of returning NaN", "[ddp][buckets]") {
  const double inf = std::numeric_limits<double>::infinity();
  for (std::pair<double, double> bad :
       {std::pair<double, double>{1e6, inf}, {inf, 1e-3}, {1e6, std::nan("")}}) {
    INFO(bad.first << " bytes, " << bad.second << " s");
    CHECK_THROWS_WITH(parallel::fit_alpha_beta({{1e3, 1e-5}, bad}), Contains("need finite bytes"));
  }
}
