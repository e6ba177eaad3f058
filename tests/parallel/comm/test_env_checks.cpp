// The MG_* environment variables go through one checked parser (base/env.h): a value out of its
// range, in the wrong form or not finite is an mg::Error naming the variable -- never a
// truncating cast (MG_TIMEOUT_S=4294967297 was a 1 s timeout, 2147483648 "-2147483648000 ms"),
// a negative bound (MG_STALL_WARMUP_S=1e300) or an accepted infinity (MG_FAILURE_DETECTION_S=inf).
// init_process_group checks them in a world of one rank too, so this runs without MPI.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "base/env.h"
#include "parallel/comm/process_group.h"

using namespace mg;
using Catch::Matchers::Contains;

namespace {

// Sets `name` to `value` for the scope (unset after).
struct EnvVar {
  const char* name;
  EnvVar(const char* n, const char* value) : name(n) { ::setenv(name, value, 1); }
  ~EnvVar() { ::unsetenv(name); }
};

// init_process_group's error with `name`=`value` ("" when it succeeded).
std::string init_error(const char* name, const char* value) {
  EnvVar var(name, value);
  try {
    parallel::init_process_group();
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace

TEST_CASE("env::integer: whole numbers in range, else an error naming the variable", "[env]") {
  {
    EnvVar v("MG_TEST_ENV", "60");
    CHECK(env::integer("MG_TEST_ENV", 1, 100, "seconds") == 60);
  }
  CHECK_FALSE(env::integer("MG_TEST_ENV", 1, 100, "seconds").has_value());  // unset
  {
    EnvVar v("MG_TEST_ENV", "");
    CHECK_FALSE(env::integer("MG_TEST_ENV", 1, 100, "seconds").has_value());  // empty = default
  }
  for (const char* bad : {"4294967297", "2147483648", "101", "0", "-1", "99999999999999999999", " 5", "+5",
                          "5s", "0x10", "1.5", "1e3", "-"}) {
    EnvVar v("MG_TEST_ENV", bad);
    INFO(bad);
    CHECK_THROWS_WITH(env::integer("MG_TEST_ENV", 1, 100, "seconds"),
                      Contains("MG_TEST_ENV must be a whole number of seconds from 1 to 100") &&
                          Contains(std::string("got '") + bad + "'"));
  }
}

TEST_CASE("env::number and env::seconds: finite, in range", "[env]") {
  {
    EnvVar v("MG_TEST_ENV", "2.5");
    CHECK(env::number("MG_TEST_ENV", 0, 10, "seconds") == 2.5);
    CHECK(env::seconds("MG_TEST_ENV", 0, 10)->count() == 2500);
  }
  for (const char* bad : {"inf", "nan", "1e300", "-1", "11", "1x", "0x1p3", "", " 1"}) {
    EnvVar v("MG_TEST_ENV", bad);
    INFO(bad);
    if (*bad == '\0') {
      CHECK_FALSE(env::number("MG_TEST_ENV", 0, 10, "seconds").has_value());
      continue;
    }
    CHECK_THROWS_WITH(env::seconds("MG_TEST_ENV", 0, 10),
                      Contains("MG_TEST_ENV must be a number of seconds"));
  }
}

TEST_CASE("init_process_group refuses bad MG_* values, naming the variable", "[env]") {
  // The timeout: a whole number of seconds from 1 s to 30 days, never truncated.
  for (const char* bad : {"4294967297", "2147483648", "0", "-5", "1e3", "abc"}) {
    INFO(bad);
    CHECK_THAT(init_error("MG_TIMEOUT_S", bad), Contains("MG_TIMEOUT_S must be a whole number of seconds"));
  }
  CHECK(init_error("MG_TIMEOUT_S", "30") == "");
  // The failure detection bound: 0 (off) or 0.2 s to one day, finite.
  for (const char* bad : {"inf", "1e300", "nan", "-1", "0.01", "0.19"}) {
    INFO(bad);
    CHECK_THAT(init_error("MG_FAILURE_DETECTION_S", bad), Contains("MG_FAILURE_DETECTION_S must be"));
  }
  for (const char* good : {"0", "0.2", "10", "86400"}) {
    INFO(good);
    CHECK(init_error("MG_FAILURE_DETECTION_S", good) == "");
  }
  // The stall bound's settings.
  CHECK_THAT(init_error("MG_STALL_WARMUP_S", "1e300"),
             Contains("MG_STALL_WARMUP_S must be a number of seconds"));
  CHECK_THAT(init_error("MG_STALL_WARMUP_S", "-3"), Contains("MG_STALL_WARMUP_S"));
  CHECK_THAT(init_error("MG_STALL_FACTOR", "inf"), Contains("MG_STALL_FACTOR must be a number"));
  CHECK_THAT(init_error("MG_STALL_WARMUP_STEPS", "2.5"),
             Contains("MG_STALL_WARMUP_STEPS must be a whole number"));
  CHECK(init_error("MG_STALL_WARMUP_S", "60") == "");
  // The programmatic bound obeys the same range.
  parallel::InitOptions options;
  options.failure_detection = std::chrono::milliseconds(10);
  CHECK_THROWS_WITH(parallel::init_process_group(options),
                    Contains("failure detection bound must be 0 (off) or"));
}

TEST_CASE("a launcher's rank and size variables are checked, not truncated", "[env]") {
  EnvVar rank("OMPI_COMM_WORLD_RANK", "0");
  {
    EnvVar size("OMPI_COMM_WORLD_SIZE", "4294967297");  // was static_cast<int>: a world of 1
    CHECK_THROWS_WITH(parallel::detect_launch(),
                      Contains("OMPI_COMM_WORLD_SIZE must be a whole number of ranks"));
  }
  EnvVar size("OMPI_COMM_WORLD_SIZE", "2");
  CHECK(parallel::detect_launch().world_size == 2);
}
