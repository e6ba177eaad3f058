// The collective flight recorder: every rank remembers its last N collectives, so that when a job
// hangs or fails, the ranks' histories can be laid side by side and the first collective they
// disagree on -- a rank that never arrived, or a different op, size or dtype -- can be named
// (scripts/flight-report). A timeout's error names only the op this rank waited in; the culprit is
// usually another rank, and only the others' histories say which.
//
// What is kept, per collective (ProcessGroup records every one it issues, point-to-point ops aside):
// the group and its sequence number there (1, 2, ... per group: the same number on every rank for
// the same call), op, element counts in and out, dtype, device and backend, the state (queued ->
// started -> completed or failed) with the time of each transition, and the calling function (a
// CollectiveCaller label such as "Reducer bucket 3", else the caller's symbol from its return
// address). N = 2000 by default, MG_FLIGHT_RECORDER_ENTRIES overrides, 0 turns it off. Recording
// costs one short critical section per call and per transition (docs/fault-tolerance.md has the
// measured cost).
//
// Dumps: each rank writes its buffer to MG_FLIGHT_RECORDER_DIR (default ./flight-recorder)/rank-<R>.json,
// atomically (a temporary file renamed), when
//   - a collective times out, the backend reports an error, or verify_collectives finds the ranks'
//     calls differ (the backends call detail::flight_dump_on_failure);
//   - the heartbeat finds a peer lost or stuck (parallel/comm/heartbeat.cpp);
//   - a peer dumped for one of the reasons above: its beats carry a count of such dumps, and a rank
//     seeing it grow dumps too -- so a rank stuck in its own code still leaves its history;
//   - the process gets SIGUSR1 (the handler only writes a byte to a pipe; a thread dumps);
//   - the program calls dump_flight_recorder().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mg::parallel {

enum class FlightState { Queued, Started, Completed, Failed };
const char* flight_state_name(FlightState state);  // "queued", "started", "completed", "failed"

// One recorded collective, as flight_recorder_entries() returns it.
struct FlightEntry {
  int64_t id = 0;         // the record's number in this process: 0, 1, 2, ...
  std::string group;      // "world", a subgroup "world/1[0,2]" (its parent, which new_group, its ranks)
  int group_size = 0;     // ranks in the group
  int group_rank = 0;     // this process's rank in it
  int64_t sequence = 0;   // the group's collectives numbered 1, 2, ... in call order
  std::string op;         // "allreduce(sum)", "broadcast(root 0)", "barrier", ...
  int64_t in_count = 0;   // elements going in (gather, scatter: the same figure on every rank)
  int64_t out_count = 0;  // elements coming out
  std::string dtype;      // "f32"; "" for barrier and new_group
  std::string device;     // "cpu" or "cuda"
  std::string backend;    // "mpi", "nccl", "single-process"
  FlightState state = FlightState::Queued;
  int64_t queued_ns = 0;  // wall-clock times (ns since the epoch); 0 = not (yet)
  int64_t started_ns = 0;
  int64_t finished_ns = 0;
  std::string caller;  // a CollectiveCaller label, or the calling function
  std::string error;   // when failed: the op's message (its first 200 characters)
};

// Replaces the buffer with an empty one of `entries` entries (0: off) and sets the dump folder.
// Without a call, MG_FLIGHT_RECORDER_ENTRIES and MG_FLIGHT_RECORDER_DIR decide at the first record.
void configure_flight_recorder(size_t entries, const std::string& dir);
size_t flight_recorder_capacity();
std::string flight_recorder_dir();
// The entries still in the buffer, oldest first.
std::vector<FlightEntry> flight_recorder_entries();
// Writes this rank's dump now (see above) and returns its path; "" when the recorder is off.
// Throws mg::Error when the file cannot be written.
std::string dump_flight_recorder(const std::string& reason);

// Names the code issuing collectives on this thread while it lives, for the recorder:
//   { CollectiveCaller caller(str_cat("Reducer bucket ", i)); group.allreduce(bucket); }
// Nested ones: the innermost names the call.
class CollectiveCaller {
 public:
  explicit CollectiveCaller(std::string label);
  ~CollectiveCaller();
  CollectiveCaller(const CollectiveCaller&) = delete;
  CollectiveCaller& operator=(const CollectiveCaller&) = delete;

 private:
  std::string label_;
  const char* outer_;
};

namespace detail {

// A group as the recorder names it (registered once per group; returns its index).
int flight_register_group(const std::string& name, int size, int rank, const std::string& cpu_backend,
                          const std::string& cuda_backend);

// What ProcessGroup knows when a collective is called.
struct FlightCall {
  int group = 0;
  int64_t sequence = 0;
  const char* op = "";           // a string literal: "allreduce"
  const char* reduce = nullptr;  // "sum" ... or nullptr
  int root = -1;                 // -1: no root
  int64_t in_count = 0, out_count = 0;
  const char* dtype = "";  // a string literal (dtype_name)
  bool on_cuda = false;
  const void* return_address = nullptr;  // used when no CollectiveCaller is alive
};
// Records a call in state queued; returns its id, or -1 when the recorder is off.
int64_t flight_record(const FlightCall& call);
void flight_started(int64_t id, int64_t at_ns);
void flight_finished(int64_t id, bool ok, int64_t at_ns, const std::string& error);
int64_t flight_now_ns();  // the recorder's clock (system_clock, ns)

// This process's rank and world size (the dump's file name); the first init_process_group sets it.
void flight_set_process(int rank, int world_size);
// Makes SIGUSR1 dump (when its disposition is still the default one). Idempotent.
void flight_install_signal_handler();

// A failure this rank saw: dumps (never throws; a failed write is reported on stderr) and, with
// `ask_peers`, counts it so that the heartbeat's beats ask the peers to dump too.
void flight_dump_on_failure(const std::string& reason, bool ask_peers);
// How many dumps with ask_peers this rank has made (a beat carries it).
int32_t flight_dumps_asking_peers();
// A peer's count grew: dump, naming it.
void flight_dump_for_peer(int peer, const std::string& peer_host);

}  // namespace detail
}  // namespace mg::parallel
