// A job whose ranks disagree about their collectives, for the flight recorder to catch
// (parallel/comm/flight_recorder.h; check_flight_report.sh runs it and then scripts/flight-report):
//
//   mpiexec -n 3 flight_worker skip  <timeout s> [noverify]  rank 1 skips the all-reduce of step 1
//   mpiexec -n 3 flight_worker size  <timeout s> [noverify]  rank 1 all-reduces 16 elements in step 1, the
//   others 8 mpiexec -n 3 flight_worker stuck <timeout s>             rank 1 sleeps before the final barrier
//   mpiexec -n 3 flight_worker ok    <timeout s>             every rank agrees, then dumps on request
//
// Four steps, each one all-reduce named "step <s>" (a CollectiveCaller), then a barrier named
// "final barrier". With verify_collectives (the default) skip and size end in a mismatch error on
// every rank, and every rank dumps; with `noverify` the ranks' calls no longer match up and the
// collective timeout ends them (those that time out dump, and ask the others to). stuck: the others
// time out in the barrier and ask rank 1, whose heartbeat thread dumps while its main thread sleeps.
// Every rank prints "rank R: <what happened>" and exits 0 (ok) or 3.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "core/tensor.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/process_group.h"

using namespace mg;
using namespace mg::parallel;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "ok";
  const int timeout_s = argc > 2 ? std::atoi(argv[2]) : 2;
  InitOptions options;
  options.timeout = std::chrono::seconds(timeout_s);
  options.verify_collectives = !(argc > 3 && std::strcmp(argv[3], "noverify") == 0);
  ProcessGroup pg = init_process_group(options);
  if (pg.size() < 2) {
    std::printf("flight_worker needs at least 2 ranks\n");
    return 1;
  }
  const bool culprit = pg.rank() == 1;
  try {
    for (int step = 0; step < 4; ++step) {
      if (mode == "skip" && culprit && step == 1) continue;
      const int64_t n = mode == "size" && culprit && step == 1 ? 16 : 8;
      Tensor t = ones({n});
      CollectiveCaller caller(str_cat("step ", step));
      pg.allreduce(t)->wait();
    }
    if (mode == "stuck" && culprit)
      std::this_thread::sleep_for(std::chrono::seconds(30));  // the others' abort ends it
    {
      CollectiveCaller caller("final barrier");
      pg.barrier()->wait();
    }
  } catch (const std::exception& e) {
    std::printf("rank %d: caught: %s\n", pg.rank(), e.what());
    std::fflush(stdout);
    return 3;
  }
  if (mode == "ok") {
    std::printf("rank %d: all steps done, dumped %s\n", pg.rank(),
                dump_flight_recorder("asked by the test").c_str());
    return 0;
  }
  std::printf("rank %d: all steps done, which it must not in mode %s\n", pg.rank(), mode.c_str());
  return 3;
}
