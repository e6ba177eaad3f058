// A job in which one rank fails, to show that the others get an error instead of a hang.
//
//   mpiexec -n 3 timeout_worker stuck [timeout s]   rank 1 never joins the second allreduce (it sleeps)
//   mpiexec -n 3 timeout_worker dead  [timeout s]   rank 1 is killed (SIGKILL) before it
//   mpiexec -n 3 timeout_worker stop  [timeout s]   rank 1 is stopped (SIGSTOP) before it: hung
//   mpiexec -n 3 timeout_worker error [timeout s]   rank 1 fails on its own error (an mg::Error,
//                                                   caught in main, which returns 1) before it
//   mpiexec -n 3 timeout_worker same  [timeout s]   every rank returns 5 at the same point (as a
//                                                   test's 77 "skipped" does): nobody is reported,
//                                                   no MPI_Abort, the job's status stays 5
//   mpiexec -n 3 timeout_worker early [timeout s]   rank 1 ends normally (returns 0) before it;
//                                                   the others sleep 3 s and end normally too:
//                                                   nobody may be reported
//   ... <mode> <timeout s> cuda                       the same with CUDA tensors (the NCCL backend)
//
// stuck is found by the collective timeout (the rank is alive, it just never calls); dead and
// stop by the heartbeat when it is shorter (MG_FAILURE_DETECTION_S), else by the timeout; error
// by the heartbeat at once, whatever the bound (rank 1's "leaving" beat carries its exit status).
// Every surviving rank prints "rank R caught after S s: <the error>"; check_timeout_survivors.sh
// checks that every survivor did, and S against the group's timeout (default 2 s).
//
// Stalled progress (heartbeat.h): three training steps (allreduce + note_step) first, then
//   spin   rank 1 spins in a compute loop instead of the fourth step's allreduce. Its warm-up
//          steps take 0.4 s each (it sleeps), so the stall bound is 5 x 0.4 = 2 s, above the
//          failure-detection bound the test sets (1 s): the survivors must report it at 2 s.
//   block  rank 1 blocks in poll() on a pipe no one writes to (a wait outside any collective).
//          Fast warm-up steps: the stall bound is the failure-detection bound itself.
//   slow   nobody is stuck; must end with every rank printing "rank R: all steps done". The
//          warm-up steps take 0.3 s on rank 1 (stall bound 1.5 s, above the 1 s failure bound).
//          In the fourth step every rank computes 2 s (longer than the stall bound, but nobody
//          waits for anybody), then rank 1 alone another 2 s inside a SlowPhase while the
//          others wait for it (exempt). The bound adapts only after the step, so both count.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include <poll.h>
#include <unistd.h>

#include "base/error.h"
#include "core/tensor.h"
#include "parallel/comm/heartbeat.h"
#include "parallel/comm/process_group.h"

using namespace mg;
using namespace mg::parallel;

namespace {

using Clock = std::chrono::steady_clock;

void sleep_s(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }

// Busy for `seconds` (or until killed): a rank computing, never calling into multigrad.
double spin_s(double seconds) {
  volatile double sink = 1.0;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < end)
    for (int i = 0; i < 100000; ++i) sink = sink * 1.0000001 + 1e-9;
  return sink;
}

// Blocked in a system call outside multigrad for `seconds` (or until killed).
void block_s(double seconds) {
  int fds[2];
  if (pipe(fds) != 0) return;
  pollfd readable{fds[0], POLLIN, 0};
  poll(&readable, 1, static_cast<int>(seconds * 1000));  // nobody ever writes fds[1]
}

// One training step: `compute_s` of work, the gradient allreduce, note_step.
void step(ProcessGroup& pg, Tensor& t, int64_t number, double compute_s) {
  if (compute_s > 0) sleep_s(compute_s);
  pg.allreduce(t)->wait();
  note_step(number);
}

int stall_job(ProcessGroup& pg, const std::string& mode) {
  Tensor t = ones({1024});
  double warmup_s = 0;
  if (pg.rank() == 1 && mode != "block") warmup_s = mode == "slow" ? 0.3 : 0.4;
  for (int64_t s = 1; s <= 3; ++s) step(pg, t, s, warmup_s);
  if (mode == "slow") {
    sleep_s(2.0);  // every rank
    if (pg.rank() == 1) {
      SlowPhase phase("one-sided work the others wait for");
      sleep_s(2.0);
    }
    step(pg, t, 4, 0);
    std::printf("rank %d: all steps done\n", pg.rank());
    return 0;
  }
  if (pg.rank() == 1) {
    if (mode == "spin") spin_s(30);
    if (mode == "block") block_s(30);
    return 0;  // the survivors' abort ends the job well before
  }
  const auto start = Clock::now();
  try {
    pg.allreduce(t)->wait();
    std::printf("rank %d: the second allreduce completed, which it must not\n", pg.rank());
  } catch (const std::exception& e) {
    std::printf("rank %d caught after %.1f s: %s\n", pg.rank(),
                std::chrono::duration<double>(Clock::now() - start).count(), e.what());
  }
  std::fflush(stdout);
  return 3;  // the group is poisoned: its destructor aborts the job (never a hang)
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "stuck";
  const int timeout_s = argc > 2 ? std::atoi(argv[2]) : 2;
  const bool on_cuda = argc > 3 && std::strcmp(argv[3], "cuda") == 0;  // the NCCL backend's ops
  InitOptions options;
  options.timeout = std::chrono::seconds(timeout_s);
  // With CUDA tensors the survivors are to wait inside the NCCL all-reduce itself, not in the
  // call-signature exchange on the CPU backend that precedes it.
  options.verify_collectives = !on_cuda;
  ProcessGroup pg = init_process_group(options);
  if (pg.size() < 2) {
    std::printf("timeout_worker needs at least 2 ranks\n");
    return 1;
  }
  if (on_cuda && !pg.device().is_cuda()) {
    std::printf("timeout_worker: no CUDA device on rank %d: skipped\n", pg.rank());
    return 77;
  }
  if (std::strcmp(mode, "spin") == 0 || std::strcmp(mode, "block") == 0 || std::strcmp(mode, "slow") == 0)
    return stall_job(pg, mode);
  Tensor t = ones({1024}, TensorOptions{DType::f32, on_cuda ? pg.device() : Device::cpu()});
  pg.allreduce(t)->wait();               // everyone is alive here
  if (std::strcmp(mode, "same") == 0) {  // every rank ends with status 5 at once: nobody is reported
    std::printf("rank %d: ending with status 5\n", pg.rank());
    return 5;
  }
  if (std::strcmp(mode, "early") == 0) {
    if (pg.rank() != 1) sleep_s(3);  // longer than the failure-detection bound the test sets
    std::printf("rank %d: done\n", pg.rank());
    return 0;
  }
  if (pg.rank() == 1 && std::strcmp(mode, "error") == 0) {
    try {
      throw Error("the dataset directory /nonexistent does not exist");  // like a rank's bad input
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank 1: error: %s\n", e.what());
      return 1;
    }
  }
  if (pg.rank() == 1) {
    if (std::strcmp(mode, "dead") == 0) std::raise(SIGKILL);
    if (std::strcmp(mode, "stop") == 0) std::raise(SIGSTOP);
    std::this_thread::sleep_for(std::chrono::seconds(30));  // stuck: never reaches the collective
    return 0;
  }
  auto start = std::chrono::steady_clock::now();
  try {
    pg.allreduce(t)->wait();
    std::printf("rank %d: the second allreduce completed, which it must not\n", pg.rank());
  } catch (const std::exception& e) {
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("rank %d caught after %.1f s: %s\n", pg.rank(), seconds, e.what());
  }
  std::fflush(stdout);
  return 3;  // the group is poisoned: its destructor aborts the job (never a hang)
}
