// The heartbeat: a dead, hung or cut-off rank becomes an error on every survivor in seconds.
//
// A collective that waits for a lost peer waits until its timeout (10 minutes by default: a
// slow first step, a checkpoint or an evaluation on one rank must not kill the job). That
// leaves a hung rank (SIGSTOP, a deadlock, a GPU that stopped answering) or a cut link noticed
// only after 10 minutes -- and a dead rank not at all if the MPI library does not report it.
// Beside the collectives, every rank therefore sends a small message ("beat") to every other
// rank every `bound / 10` (but no more often than every 20 ms), on a communicator of its own, from a thread
// of its own, whatever the training thread is doing:
//
//     rank 0 ──beat──▶ rank 1, rank 2 ...      each beat: sequence number, pid, host name and
//     rank 1 ──beat──▶ rank 0, rank 2 ...      the last operation the sender started
//
// A peer not heard from for `bound` (default 10 s, InitOptions::failure_detection or
// MG_FAILURE_DETECTION_S), or whose connection reports an MPI error, is lost: this rank prints
// one line naming the lost rank(s), their node and pid, the last operation each was doing and
// this rank's own, and every process group of this process is poisoned with that message (the
// collective in flight fails with it, and so does every later one). The program's error path
// then ends the process non-zero and the MPI job is aborted (process_group_mpi.cpp), so no
// survivor hangs. Every survivor detects on its own, so every survivor reports.
//
// A rank that ends normally sends a last beat marked "leaving", so a peer still busy (writing a
// checkpoint, evaluating) does not mistake it for lost. Cost: (N - 1) beats of 192 bytes per
// rank per interval -- all-to-all, which suits the tens of ranks this project runs; a large job
// would beat along a tree instead.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace mg::parallel::detail {

// Starts the process-wide heartbeat on MPI's world (a collective over it; idempotent: the first
// call's bound holds). Stops (with the "leaving" beat) when stop_heartbeat() runs before
// MPI_Finalize. No-op in builds without MPI.
void start_heartbeat(std::chrono::milliseconds bound);
void stop_heartbeat();

// Called once, on the heartbeat's thread, when peers are lost; returns an id for forget.
int on_peer_lost(std::function<void(const std::string& message)> callback);
void forget_peer_lost(int id);

// What this rank is doing now ("allreduce f32[1024] #57"): sent in every beat, and named in
// this rank's own report. Cheap (a short copy under a mutex); backends call it per operation.
void note_operation(const std::string& description);

}  // namespace mg::parallel::detail
