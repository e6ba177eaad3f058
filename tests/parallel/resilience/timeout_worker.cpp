// A job in which one rank fails, to show that the others get an error instead of a hang.
//
//   mpiexec -n 3 timeout_worker stuck [timeout s]   rank 1 never joins the second allreduce (it sleeps)
//   mpiexec -n 3 timeout_worker dead  [timeout s]   rank 1 is killed (SIGKILL) before it
//   mpiexec -n 3 timeout_worker stop  [timeout s]   rank 1 is stopped (SIGSTOP) before it: hung
//   ... <mode> <timeout s> cuda                       the same with CUDA tensors (the NCCL backend)
//
// stuck is found by the collective timeout (the rank is alive, it just never calls); dead and
// stop by the heartbeat when it is shorter (MG_FAILURE_DETECTION_S), else by the timeout.
// Every surviving rank prints "rank R caught after S s: <the error>"; check_timeout_survivors.sh
// checks that every survivor did, and S against the group's timeout (default 2 s).
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"

using namespace mg;
using namespace mg::parallel;

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
  Tensor t = ones({1024}, TensorOptions{DType::f32, on_cuda ? pg.device() : Device::cpu()});
  pg.allreduce(t)->wait();  // everyone is alive here
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
