// What the files of the emulated NCCL share (nccl*.cpp only): the communicator, one operation as
// the API records it, and the functions each file offers the others. nccl.cpp describes the design.
//
//   nccl.cpp         the API: errors, collectives, point-to-point, groups, communicator queries and
//                    teardown
//   nccl_setup.cpp   communicator set-up: unique ids, ncclCommInitRank, members meeting over MPI
//   nccl_errors.cpp  error recording (ncclGetLastError, NCCL_DEBUG) and the communicator registry
//   nccl_checks.cpp  argument checks in NCCL's order and words
//   nccl_reduce.cpp  the types and reductions (deterministic, in rank order)
//   nccl_tasks.cpp   operations as stream tasks: tickets, turns, groups over several streams
//   nccl_exec.cpp    the MPI side of one task: requests, chunks, waits, cancellation
#pragma once

#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings' header warns under -Wextra)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

// What a ncclComm_t points to. Never freed (see above).
struct ncclComm {
  int nranks = 1;
  int rank = 0;
  int device = 0;
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL for one rank

  std::mutex mutex;  // guards what follows, except the atomics
  std::condition_variable cv;
  uint64_t tickets = 0;   // handed out, one per operation or group
  uint64_t turn = 0;      // the ticket whose task may run now
  uint64_t finished = 0;  // tasks done, run or skipped
  bool in_mpi = false;    // the turn's task is using `mpi`
  bool closing = false;   // ncclCommDestroy or ncclCommAbort under way
  bool dead = false;      // destroyed or aborted: calls are refused
  bool leaked = false;    // a request was left behind: `mpi` is never freed
  std::atomic<bool> aborted{false};
  std::atomic<int> async{ncclSuccess};
  std::string last_error;  // guarded by g_error_mutex
};

namespace mg_emu::nccl {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kTag = 0x6e63;                 // every point-to-point message
constexpr size_t kChunk = size_t(16) << 20;  // bytes per MPI call (a multiple of every type size)
constexpr size_t kNone = ~size_t(0);

// ---- errors and the registry of communicators (nccl_errors.cpp) ------------------------------------
extern std::mutex g_registry_mutex;  // guards g_comms
extern std::unordered_set<const ncclComm*> g_comms;
extern std::mutex g_error_mutex;  // guards g_last_error and every ncclComm::last_error
extern std::string g_last_error;

// Records `text` as the last error (of `comm` too, when given); NCCL_DEBUG=WARN prints it.
void record(ncclComm* comm, const std::string& text);
// Records the printf-formatted text and returns `result`.
__attribute__((format(printf, 3, 4))) ncclResult_t fail(ncclComm* comm, ncclResult_t result,
                                                        const char* format, ...);
std::string mpi_text(int code);
bool mpi_usable();  // MPI initialised and not finalised
// The communicator's async error (the first one sticks), recorded as its last error.
void set_async(ncclComm* comm, ncclResult_t code, const std::string& text);
bool registered(const ncclComm* comm);  // made by ncclCommInitRank
// May `comm` take a new operation? (NCCL's CommCheck and ncclCommEnsureReady.)
ncclResult_t usable(ncclComm* comm, const char* name);

// ---- types and reductions (nccl_reduce.cpp) ------------------------------------------------------
size_t type_size(int type);  // 0 for a type outside ncclDataType_t
// out[i] = in_0[i] op in_1[i] op ... op in_{n-1}[i], left to right; in_r starts at in + r * stride.
void reduce(int type, int op_value, int n, const char* in, size_t stride, size_t elems, char* out);

// ---- one operation and its checks (nccl_checks.cpp) ----------------------------------------------
enum class Kind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter, Send, Recv };

struct Op {
  Kind kind;
  ncclComm* comm;
  const void* send;
  void* recv;
  size_t count;  // per rank (all-gather: sent; reduce-scatter: received)
  int type;      // ncclDataType_t and ncclRedOp_t as the caller's ints (checked before use)
  int op;
  int root;  // the root, or the peer of a send/recv
  cudaStream_t stream;
};

const char* name_of(Kind kind);   // NCCL's opName: "AllReduce"
const char* label_of(Kind kind);  // names the stream task: "ncclAllReduce"
inline bool is_p2p(Kind kind) { return kind == Kind::Send || kind == Kind::Recv; }
// NCCL's ArgsCheck order: comm, root, type, op, pointers; then the stream.
ncclResult_t validate(const Op& o);

// ---- running a task (nccl_exec.cpp) --------------------------------------------------------------
struct Stop {  // ends a task early; code ncclSuccess: because a communicator was aborted
  ncclResult_t code;
  std::string message;
};

inline bool any_aborted(const std::vector<ncclComm*>& comms) {
  for (ncclComm* comm : comms)
    if (comm->aborted.load()) return true;
  return false;
}
void backoff(unsigned& spins);  // yield, then sleep a little longer
// Runs the ops of one task (every turn taken) over MPI: sends and receives posted at once, then the
// collectives in call order. Throws Stop on an abort or a failure, after cancelling what MPI can.
void execute(const std::vector<ncclComm*>& comms, const std::vector<Op>& ops);

// ---- operations as stream tasks (nccl_tasks.cpp) -------------------------------------------------
// Checks `o` and runs it (outside a group) or records it for the group's ncclGroupEnd.
ncclResult_t submit(const Op& o);
// Enqueues one operation or one group on its streams; each communicator takes a ticket.
ncclResult_t launch(std::vector<Op> ops, const char* label);
struct GroupState {
  int depth = 0;
  std::vector<Op> ops;
  ncclResult_t error = ncclSuccess;  // a call of the group failed: ncclGroupEnd fails, nothing runs
};
extern thread_local GroupState g_group;  // this thread's open group, if any

}  // namespace mg_emu::nccl
