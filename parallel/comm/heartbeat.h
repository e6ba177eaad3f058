// The heartbeat: a dead, hung, cut-off or stuck rank becomes an error on every survivor in seconds.
//
// A collective that waits for a lost peer waits until its timeout (10 minutes by default: a
// slow first step, a checkpoint or an evaluation on one rank must not kill the job). That
// leaves a hung rank (SIGSTOP, a deadlock, a rank spinning in its own code) or a cut link noticed
// only after 10 minutes -- and a dead rank not at all if the MPI library does not report it.
// Beside the collectives, every rank therefore sends a small message ("beat") to every other
// rank every `bound / 10` (but no more often than every 20 ms), on a communicator of its own, from a thread
// of its own, whatever the training thread is doing:
//
//     rank 0 ──beat──▶ rank 1, rank 2 ...      each beat: sequence number, pid, host name, the
//     rank 1 ──beat──▶ rank 0, rank 2 ...      last operation the sender started, and its
//                                              progress (ops started, ops in flight, step)
//
// Two things make a peer lost. Both end the same way: this rank prints one line naming the
// peer, its node and pid, the last operation it was doing and this rank's own, and every process
// group of this process is poisoned with that message (the collective in flight fails with it,
// and so does every later one). The program's error path then ends the process non-zero and the
// MPI job is aborted (process_group_mpi.cpp), so no survivor hangs. Every survivor detects on its
// own, so every survivor reports.
//
// 1. Silence: no beat for `bound` (default 10 s, InitOptions::failure_detection or
//    MG_FAILURE_DETECTION_S), or an MPI error on its connection: the rank died, all its threads
//    stopped (SIGSTOP), or its link is cut.
//
// 2. Stalled progress, for a rank whose beats keep coming but whose training thread is stuck
//    (spinning in a loop, blocked in a read, a lock or a call that never returns). A peer P is
//    stuck, as seen from this rank R, when all of these hold:
//      - R is waiting: an op R started (a collective; on NCCL any op) has not finished;
//      - P is not: every op P started has finished, and P is not inside a SlowPhase;
//      - P is behind: P has started fewer ops than R (it has not entered the op R waits in);
//      - P's progress (ops started, ops in flight, step) has not changed, and R has waited, for
//        longer than the stall bound, as of P's latest beat.
//    The stall bound: until this rank has called note_step 3 times (the warm-up:
//    MG_STALL_WARMUP_STEPS), max(failure detection bound, 5 min (MG_STALL_WARMUP_S)); after it,
//    max(failure detection bound, 5 (MG_STALL_FACTOR) x the slowest step any rank has reported).
//    MG_STALL_FACTOR=0 turns stall detection off (silence is still detected).
//    Not detected as a stall: a rank stuck inside an op (all ranks are then in flight; the
//    collective timeout or the NCCL watchdog finds it); every rank stuck at once (no one waits);
//    a rank blocked in a point-to-point receive on the MPI backend (those ops are not counted).
//
// A rank that ends normally sends a last beat marked "leaving", so a peer still busy (writing a
// checkpoint, evaluating) does not mistake it for lost. A rank that leaves because of an error of
// its own (its main returned or exit() was called with a non-zero status, caught by an on_exit
// handler; or MPI is torn down during stack unwinding) sends the same beat with that status, and
// every peer reports it lost at once ("it is exiting with status S after an error of its own";
// after a grace of min(bound / 4, 0.5 s), in which a peer that begins to exit itself says nothing),
// instead of waiting in its next collective until the collective timeout while the leaving rank
// sits in MPI_Finalize, where mpirun cannot see it exit. Cost: (N - 1) beats of 224 bytes per
// rank per interval -- all-to-all, which suits the tens of ranks this project runs; a large job
// would beat along a tree instead. Its thread wakes every 10 ms for a few MPI_Tests: a small
// all-reduce's latency measured the same with it on or off (bench_allreduce --latency,
// docs/ring-allreduce.md), on one node and across nodes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace mg::parallel {

class Work;

// Tells the heartbeat that training step `step` has just finished on this rank (call it after
// each optimizer step, like a scheduler's step(); examples/train_ddp.cpp does). The steps make
// the stall bound adapt: the time between two calls is a step's duration. Without any call the
// warm-up bound (5 min) holds for the whole run. Cheap: a clock read under a mutex.
void note_step(int64_t step);

// While one is alive, this rank is not reported as stalled however long it keeps its peers
// waiting (they still report it if it goes silent, and the collective timeout still applies).
// For one-sided work the others wait for, longer than a few steps: rank 0 writing a checkpoint
// synchronously, or evaluating alone while the others wait at a barrier.
class SlowPhase {
 public:
  explicit SlowPhase(const std::string& what);
  ~SlowPhase();
  SlowPhase(const SlowPhase&) = delete;
  SlowPhase& operator=(const SlowPhase&) = delete;
};

}  // namespace mg::parallel

namespace mg::parallel::detail {

// Starts the process-wide heartbeat on MPI's world (a collective over it; idempotent: the first
// call's bound holds). Reads MG_STALL_FACTOR, MG_STALL_WARMUP_STEPS and MG_STALL_WARMUP_S.
// Stops (with the "leaving" beat) when stop_heartbeat() runs before MPI_Finalize: exit_status 0
// retires this rank quietly on its peers, anything else makes them report it lost at once. No-op
// in builds without MPI.
void start_heartbeat(std::chrono::milliseconds bound);
// Parses MG_STALL_FACTOR, MG_STALL_WARMUP_STEPS and MG_STALL_WARMUP_S (base/env.h) and throws an
// mg::Error naming a bad one; init_process_group calls it in every world, even one of one rank.
void check_heartbeat_env();
void stop_heartbeat(int exit_status = 0);
// This process has begun to exit (an on_exit handler calls it): a peer that leaves on an error
// from now on is retired quietly, since this rank waits for nothing any more.
void note_process_exiting();

// Called once, on the heartbeat's thread, when peers are lost; returns an id for forget.
int on_peer_lost(std::function<void(const std::string& message)> callback);
void forget_peer_lost(int id);

// An op this rank starts now: its description ("allreduce f32[1024] #57") is sent in every beat
// and named in this rank's own report; it counts as in flight until `work` completes (or is
// destroyed). Backends call it when an op starts talking to its peers. Cheap: a short copy and
// a scan of the ops still in flight, under a mutex.
void note_operation(const std::shared_ptr<Work>& work);

}  // namespace mg::parallel::detail
