// The NCCL entry points multigrad calls, emulated over MPI (build mode -DMG_CUDA=EMULATE), with the
// signatures and C linkage of the real nccl.h. Emulated device memory is host memory: MPI carries it.
//
// Communicators. One rank needs no MPI. More need MPI initialised by the program with
// MPI_THREAD_MULTIPLE. A communicator of the whole MPI world splits MPI_COMM_WORLD (key = nccl
// rank). A smaller one (a subgroup's) meets at the process that made its unique id, whose world
// rank the id carries and which must be its rank 0: each member sends it (id, nccl rank, world
// rank), it answers with the members' world ranks in nccl-rank order, and the members make their
// MPI communicator with MPI_Comm_create_group (collective over the members only, as
// ncclCommInitRank is). Then every rank's unique id, rank, host and emulated device
// (mg_emu::current_device()) are allgathered and checked as NCCL does: one id for all
// (ncclInvalidArgument), each rank once, no two ranks on one (host, device) ("Duplicate GPU
// detected", ncclInvalidUsage). Every rank sees the same table, so every rank reaches the same
// verdict.
//
// Calls are checked on the caller's thread in NCCL's order and words (comm, root or peer, type, op,
// pointers: device memory of the comm's device over the extent touched; then the stream), and a
// failure is what ncclGetLastError tells. The work is then enqueued on the stream (mg_emu::enqueue),
// whose thread does the MPI exchange in order with the stream's kernels and copies: a host that
// does not synchronise really races.
// * Reductions are deterministic: every rank's raw bytes are gathered (MPI_Iallgather, MPI_Igather,
//   MPI_Ialltoall on MPI_BYTE, 16 MiB at a time) and reduced locally in rank order 0..n-1, so all
//   ranks get bitwise-identical results. fp16 and bf16 reduce in float, rounded to nearest even
//   after every step like NCCL's per-step reduction. Avg is NCCL's: floats pre-multiply each input
//   by 1/n, integers sum then divide. Integers wrap around. Broadcast is MPI_Ibcast.
// * Send/recv keep NCCL's blocking semantics: ncclSend is an MPI_Issend, complete only once the
//   matching ncclRecv (an MPI_Irecv) is posted; one tag and MPI's non-overtaking order match them
//   in call order. Outside a group each call is a stream task of its own, so two ranks that both
//   send first deadlock, as on NCCL. The outermost ncclGroupEnd (thread-local nesting) enqueues one
//   task that posts all the group's sends and receives at once, runs its collectives in call order
//   and waits for everything. A group over several streams runs on the first, and the others wait
//   for it (NCCL joins them too). Sends to self feed the group's receives from self.
// * Each operation (each group) takes a ticket per communicator when it is enqueued, and its task
//   waits for that communicator's turn: one task at a time per communicator, in call order, across
//   streams too. (NCCL needs every rank to issue a communicator's operations in one order, and MPI
//   collectives on one communicator must not run concurrently from two threads.)
// * No wait is uninterruptible: each polls (MPI_Testall, yields, short sleeps) and watches the abort
//   flag that ncclCommAbort sets from any thread (say a watchdog, while a stream is stuck in a
//   send): the task cancels what MPI can cancel (point-to-point), gives up and frees its stream. A
//   task that fails (an MPI error, mismatched send/recv sizes) sets the communicator's async error
//   (ncclRemoteError, ncclInvalidUsage, ncclSystemError; never ncclInProgress):
//   ncclCommGetAsyncError reports it, later calls return it, queued tasks skip their work.
// * ncclCommDestroy waits for the communicator's queued tasks (an abort cuts that short) and frees
//   its MPI communicator; ncclCommAbort does not wait. A request that could not be cancelled (a
//   collective, an unmatched send) leaks its MPI communicator and scratch buffers on purpose, since
//   MPI may still write there. Handles are never freed (a few hundred bytes each), so a call on a
//   destroyed one fails cleanly.
//
// Unlike real NCCL: nranks > 1 needs MPI; a communicator smaller than MPI_COMM_WORLD needs its
// unique id made by its rank 0's process; ncclCommInitRank is an MPI collective over the members
// (called in the same order on every member; it runs at once even inside a group). Data moves through host
// memory, reductions move n times the data, and sums in rank order may differ from NCCL's rings and trees in
// the last bits. "Duplicate GPU" names the emulated device ordinal, not a bus id. fp8 moves but does not
// reduce; no user-defined ops. A null stream is the calling thread's current device's, which must be the
// communicator's (NCCL switches device first). Collectives of several communicators in one group run one
// after another. ncclGetLastError(comm) tells that communicator's last error when it has one (NCCL ignores
// comm). NCCL_DEBUG=WARN (or INFO, TRACE) prints every error to stderr.
#define OMPI_SKIP_MPICXX 1  // the C API only (the C++ bindings' header warns under -Wextra)
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>
#include <strings.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "cuda_emu/runtime_internal.h"

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

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kTag = 0x6e63;                 // every point-to-point message
constexpr size_t kChunk = size_t(16) << 20;  // bytes per MPI call (a multiple of every type size)
constexpr size_t kNone = ~size_t(0);

std::mutex g_registry_mutex;  // guards g_comms
std::unordered_set<const ncclComm*> g_comms;
std::mutex g_error_mutex;  // guards g_last_error and every ncclComm::last_error
std::string g_last_error;
std::mutex g_init_mutex;    // one MPI_Comm_split of MPI_COMM_WORLD at a time
std::mutex g_launch_mutex;  // a group takes its tickets on all its communicators at once

// ---- errors ------------------------------------------------------------------------------------

void record(ncclComm* comm, const std::string& text) {
  static const bool warn = [] {
    const char* level = std::getenv("NCCL_DEBUG");
    return level != nullptr &&
           (!strcasecmp(level, "WARN") || !strcasecmp(level, "INFO") || !strcasecmp(level, "TRACE"));
  }();
  {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    g_last_error = text;
    if (comm != nullptr) comm->last_error = text;
  }
  if (warn) std::fprintf(stderr, "[pid %d] NCCL WARN (emulated) %s\n", int(getpid()), text.c_str());
}

__attribute__((format(printf, 3, 4))) ncclResult_t fail(ncclComm* comm, ncclResult_t result,
                                                        const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  record(comm, text);
  return result;
}

std::string mpi_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, size_t(length));
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void set_async(ncclComm* comm, ncclResult_t code, const std::string& text) {
  int expected = ncclSuccess;
  comm->async.compare_exchange_strong(expected, code);  // the first error sticks
  record(comm, text);
}

bool registered(const ncclComm* comm) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  return g_comms.count(comm) != 0;
}

// May `comm` take a new operation? (NCCL's CommCheck and ncclCommEnsureReady.)
ncclResult_t usable(ncclComm* comm, const char* name) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "%s : comm argument is NULL", name);
  if (!registered(comm))
    return fail(nullptr, ncclInvalidArgument, "%s : comm %p was not made by ncclCommInitRank", name,
                static_cast<void*>(comm));
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->dead || comm->closing)
      return fail(comm, ncclInvalidUsage, "%s : the communicator has been destroyed or aborted", name);
  }
  // A failed communicator returns its error; its last error still tells the cause.
  return ncclResult_t(comm->async.load());
}

// ---- types and reductions ----------------------------------------------------------------------

size_t type_size(int type) {  // int8 uint8 int32 uint32 int64 uint64 f16 f32 f64 bf16 f8e4m3 f8e5m2
  static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return type >= 0 && type < int(ncclNumTypes) ? sizes[type] : 0;
}

// How a type is reduced: S is how it is stored, V what it is reduced in; up and down convert.
template <class T>
struct Plain {
  using S = T;
  using V = T;
  static V up(S s) { return s; }
  static S down(V v) { return v; }
};
struct Half {  // fp16 in float, rounded to nearest even after every step
  using S = __half;
  using V = float;
  static V up(S s) { return __half2float(s); }
  static S down(V v) { return __float2half_rn(v); }
};
struct BHalf {  // bf16 likewise
  using S = __nv_bfloat16;
  using V = float;
  static V up(S s) { return __bfloat162float(s); }
  static S down(V v) { return __float2bfloat16_rn(v); }
};

template <class V>
V combine(ncclRedOp_t op, V a, V b) {
  if (op == ncclMax) return a < b ? b : a;
  if (op == ncclMin) return b < a ? b : a;
  if constexpr (std::is_integral<V>::value) {  // unsigned arithmetic: wraps, no signed overflow
    using U = std::make_unsigned_t<V>;
    return op == ncclProd ? V(U(a) * U(b)) : V(U(a) + U(b));
  } else {
    return op == ncclProd ? a * b : a + b;
  }
}

// out[i] = in_0[i] op in_1[i] op ... op in_{n-1}[i], left to right; in_r starts at in + r * stride.
template <class Tr>
void reduce_typed(ncclRedOp_t op, int n, const char* in, size_t stride, size_t elems, char* out) {
  using S = typename Tr::S;
  using V = typename Tr::V;
  const auto load = [in](size_t offset) {
    S s;
    std::memcpy(&s, in + offset, sizeof(S));
    return Tr::up(s);
  };
  const auto round = [](V v) { return Tr::up(Tr::down(v)); };
  // Avg as NCCL: floats pre-multiply by 1/n (float, or double for double, rounded to the type).
  const bool premultiply = op == ncclAvg && std::is_floating_point<V>::value;
  const V factor = round(V(1) / V(n));
  for (size_t i = 0; i < elems; ++i) {
    V acc = load(i * sizeof(S));
    if (premultiply) acc = round(acc * factor);
    for (int r = 1; r < n; ++r) {
      V v = load(size_t(r) * stride + i * sizeof(S));
      if (premultiply) v = round(v * factor);
      acc = round(combine(op, acc, v));
    }
    if constexpr (std::is_integral<V>::value) {  // integers: sum, then divide
      using Wide = std::conditional_t<std::is_signed<V>::value, long long, unsigned long long>;
      if (op == ncclAvg) acc = V(Wide(acc) / Wide(n));
    }
    const S s = Tr::down(acc);
    std::memcpy(out + i * sizeof(S), &s, sizeof(S));
  }
}

void reduce(int type, int op_value, int n, const char* in, size_t stride, size_t elems, char* out) {
  const auto op = ncclRedOp_t(op_value);
  switch (type) {
    case ncclInt8: return reduce_typed<Plain<int8_t>>(op, n, in, stride, elems, out);
    case ncclUint8: return reduce_typed<Plain<uint8_t>>(op, n, in, stride, elems, out);
    case ncclInt32: return reduce_typed<Plain<int32_t>>(op, n, in, stride, elems, out);
    case ncclUint32: return reduce_typed<Plain<uint32_t>>(op, n, in, stride, elems, out);
    case ncclInt64: return reduce_typed<Plain<int64_t>>(op, n, in, stride, elems, out);
    case ncclUint64: return reduce_typed<Plain<uint64_t>>(op, n, in, stride, elems, out);
    case ncclFloat16: return reduce_typed<Half>(op, n, in, stride, elems, out);
    case ncclFloat32: return reduce_typed<Plain<float>>(op, n, in, stride, elems, out);
    case ncclFloat64: return reduce_typed<Plain<double>>(op, n, in, stride, elems, out);
    case ncclBfloat16: return reduce_typed<BHalf>(op, n, in, stride, elems, out);
    default: return;  // refused at call time
  }
}

// ---- operations and their checks ---------------------------------------------------------------

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

const char* name_of(Kind kind) {  // NCCL's opName
  static const char* const names[] = {"AllReduce",     "Broadcast", "Reduce", "AllGather",
                                      "ReduceScatter", "Send",      "Recv"};
  return names[int(kind)];
}

const char* label_of(Kind kind) {  // names the stream task
  static const char* const labels[] = {"ncclAllReduce",     "ncclBroadcast", "ncclReduce", "ncclAllGather",
                                       "ncclReduceScatter", "ncclSend",      "ncclRecv"};
  return labels[int(kind)];
}

bool is_p2p(Kind kind) { return kind == Kind::Send || kind == Kind::Recv; }

ncclResult_t check_pointer(ncclComm* comm, const void* p, size_t bytes, const char* what, const char* name) {
  if (bytes == 0) return ncclSuccess;
  if (p == nullptr || !mg_emu::is_device_range(p, bytes))
    return fail(
        comm, ncclInvalidArgument,
        "%s : %s %p is not a valid pointer (the emulated NCCL needs %zu bytes of device memory there)", name,
        what, p, bytes);
  const int device = mg_emu::device_of_pointer(p);
  if (device != comm->device)
    return fail(comm, ncclInvalidArgument, "%s : %s allocated on device %d mismatchs with NCCL device %d",
                name, what, device, comm->device);
  return ncclSuccess;
}

// NCCL's ArgsCheck order: comm, root, type, op, pointers; then the stream.
ncclResult_t validate(const Op& o) {
  const char* name = name_of(o.kind);
  ncclComm* comm = o.comm;
  ncclResult_t result = usable(comm, name);
  if (result != ncclSuccess) return result;
  const int n = comm->nranks;
  const char* root_word = is_p2p(o.kind) ? "peer" : "root";
  if (o.root < 0 || o.root >= n)
    return fail(comm, ncclInvalidArgument, "%s : invalid %s %d (%s should be in the 0..%d range)", name,
                root_word, o.root, root_word, n - 1);
  if (o.type < 0 || o.type >= int(ncclNumTypes))
    return fail(comm, ncclInvalidArgument, "%s : invalid type %d", name, o.type);
  if (o.kind == Kind::AllReduce || o.kind == Kind::Reduce || o.kind == Kind::ReduceScatter) {
    if (o.op < 0 || o.op >= int(ncclNumOps))
      return fail(comm, ncclInvalidArgument, "%s : invalid reduction operation %d", name, o.op);
    if (o.type == ncclFloat8e4m3 || o.type == ncclFloat8e5m2)
      return fail(comm, ncclInvalidArgument, "%s : the emulated NCCL does not reduce FP8 types", name);
  }
  const size_t size = type_size(o.type);
  if (o.count > kNone / size / size_t(n))
    return fail(comm, ncclInvalidArgument, "%s : count %zu is too large", name, o.count);
  const size_t bytes = o.count * size, all = bytes * size_t(n);
  const bool root = comm->rank == o.root;
  size_t send_bytes = bytes, recv_bytes = bytes;
  switch (o.kind) {
    case Kind::Broadcast: send_bytes = root ? bytes : 0; break;  // only the root's sendbuff is read
    case Kind::Reduce: recv_bytes = root ? bytes : 0; break;     // only the root's recvbuff is written
    case Kind::AllGather: recv_bytes = all; break;
    case Kind::ReduceScatter: send_bytes = all; break;
    case Kind::Send: recv_bytes = 0; break;
    case Kind::Recv: send_bytes = 0; break;
    case Kind::AllReduce: break;
  }
  if ((result = check_pointer(comm, o.send, send_bytes, "sendbuff", name)) != ncclSuccess) return result;
  if ((result = check_pointer(comm, o.recv, recv_bytes, "recvbuff", name)) != ncclSuccess) return result;
  const int stream_device = mg_emu::stream_device(o.stream);
  if (stream_device < 0)
    return fail(comm, ncclUnhandledCudaError, "%s : stream %p is not a valid CUDA stream", name,
                static_cast<void*>(o.stream));
  if (stream_device != comm->device)
    return fail(comm, ncclInvalidUsage,
                "%s : stream %p is on device %d but the communicator on device %d (a null stream is the "
                "calling thread's current device's)",
                name, static_cast<void*>(o.stream), stream_device, comm->device);
  return ncclSuccess;
}

// ---- running a task on a stream thread ---------------------------------------------------------

struct Stop {  // ends a task early; code ncclSuccess: because a communicator was aborted
  ncclResult_t code;
  std::string message;
};

bool any_aborted(const std::vector<ncclComm*>& comms) {
  for (ncclComm* comm : comms)
    if (comm->aborted.load()) return true;
  return false;
}

void backoff(unsigned& spins) {
  if (++spins < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 4000 ? 20 : 200));
  }
}

// The MPI side of one task: its requests and scratch buffers.
class Exec {
 public:
  explicit Exec(const std::vector<ncclComm*>& comms) : comms_(comms) {}

  void run(const std::vector<Op>& ops) {
    // Sends and receives first, all posted at once, so that a group's progress together.
    std::vector<const Op*> self_sends, self_recvs;
    for (const Op& o : ops) {
      if (!is_p2p(o.kind)) continue;
      if (o.root == o.comm->rank) {
        (o.kind == Kind::Send ? self_sends : self_recvs).push_back(&o);
        continue;
      }
      const size_t bytes = o.count * type_size(o.type);
      for (size_t off = 0; off < bytes; off += kChunk) {
        const int len = int(std::min(kChunk, bytes - off));
        MPI_Request request = MPI_REQUEST_NULL;
        const int rc = o.kind == Kind::Send ? MPI_Issend(static_cast<const char*>(o.send) + off, len,
                                                         MPI_BYTE, o.root, kTag, o.comm->mpi, &request)
                                            : MPI_Irecv(static_cast<char*>(o.recv) + off, len, MPI_BYTE,
                                                        o.root, kTag, o.comm->mpi, &request);
        check(rc, o, o.kind == Kind::Send ? "MPI_Issend" : "MPI_Irecv");
        add(request, true, o.kind == Kind::Recv ? size_t(len) : kNone, &o);
      }
    }
    // Messages to self: the i-th send to self of a communicator feeds its i-th receive from self.
    std::vector<bool> used(self_recvs.size(), false);
    size_t unmatched = self_recvs.size();
    for (const Op* send : self_sends) {
      size_t j = 0;
      while (j < self_recvs.size() && (used[j] || self_recvs[j]->comm != send->comm)) ++j;
      if (j == self_recvs.size()) {
        ++unmatched;
        continue;
      }
      used[j] = true;
      --unmatched;
      const size_t sent = send->count * type_size(send->type);
      const size_t wanted = self_recvs[j]->count * type_size(self_recvs[j]->type);
      if (sent != wanted) throw mismatch(*self_recvs[j], wanted, std::to_string(sent));
      std::memmove(self_recvs[j]->recv, send->send, sent);
    }
    for (const Op& o : ops)
      if (!is_p2p(o.kind)) collective(o);
    wait(0);
    unsigned spins = 0;
    while (unmatched > 0) {  // a message to self never matched: blocks until an abort, as on NCCL
      halt_if_aborted();
      backoff(spins);
    }
  }

  // After a Stop: cancels what can be cancelled (point-to-point requests). Whatever cannot be keeps
  // the task's MPI communicators and scratch buffers alive for good, since MPI may still use them.
  void abandon() {
    bool stuck = false;
    for (size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      if (infos_[i].p2p) {
        MPI_Cancel(&requests_[i]);
      } else {
        stuck = true;  // collectives cannot be cancelled
      }
    }
    const auto deadline = Clock::now() + milliseconds(100);
    for (size_t i = 0; i < requests_.size(); ++i) {
      for (unsigned spins = 0; requests_[i] != MPI_REQUEST_NULL && infos_[i].p2p; backoff(spins)) {
        int done = 0;
        MPI_Test(&requests_[i], &done, MPI_STATUS_IGNORE);
        if (!done && Clock::now() > deadline) {  // e.g. a send OpenMPI cannot cancel
          stuck = true;
          break;
        }
      }
    }
    if (stuck) {
      for (auto& buffer : scratch_) buffer.release();
      for (ncclComm* comm : comms_) {
        std::lock_guard<std::mutex> lock(comm->mutex);
        comm->leaked = true;
      }
    }
    requests_.clear();
    infos_.clear();
  }

 private:
  struct Info {
    bool p2p;
    size_t expect;  // the bytes a receive expects; kNone otherwise
    const Op* op;
  };

  static std::string text(const Op& o, const std::string& what) {
    std::string where = std::string(name_of(o.kind)) + " on rank " + std::to_string(o.comm->rank) + " of " +
                        std::to_string(o.comm->nranks);
    if (is_p2p(o.kind))
      where += (o.kind == Kind::Send ? " to rank " : " from rank ") + std::to_string(o.root);
    return where + ": " + what;
  }

  static Stop mismatch(const Op& recv, size_t wanted, const std::string& sent) {
    return Stop{ncclInvalidUsage,
                text(recv, std::to_string(wanted) + " bytes expected, the matching Send sent " + sent +
                               " (NCCL needs matching counts and types)")};
  }

  void check(int rc, const Op& o, const char* call) {
    if (rc != MPI_SUCCESS)
      throw Stop{ncclRemoteError, text(o, std::string(call) + " failed: " + mpi_text(rc))};
  }

  void add(MPI_Request request, bool p2p, size_t expect, const Op* op) {
    requests_.push_back(request);
    infos_.push_back(Info{p2p, expect, op});
  }

  char* scratch(size_t bytes) {
    scratch_.emplace_back(new char[std::max<size_t>(bytes, 1)]);
    return scratch_.back().get();
  }

  void halt_if_aborted() {
    if (any_aborted(comms_)) throw Stop{ncclSuccess, std::string()};
  }

  // Polls requests_[first..] until all are complete; throws on an abort or an MPI error.
  void wait(size_t first) {
    const int n = int(requests_.size() - first);
    if (n == 0) return;
    std::vector<MPI_Status> statuses(static_cast<size_t>(n));
    for (unsigned spins = 0;; backoff(spins)) {
      int done = 0;
      const int rc = MPI_Testall(n, &requests_[first], &done, statuses.data());
      if (rc != MPI_SUCCESS) {
        for (size_t i = 0; i < size_t(n); ++i) {
          const int code = rc == MPI_ERR_IN_STATUS ? statuses[i].MPI_ERROR : rc;
          if (code == MPI_SUCCESS || code == MPI_ERR_PENDING) continue;
          const Info& info = infos_[first + i];
          int error_class = 0;
          MPI_Error_class(code, &error_class);
          if (error_class == MPI_ERR_TRUNCATE) throw mismatch(*info.op, info.expect, "more");
          throw Stop{ncclRemoteError, text(*info.op, "MPI failed: " + mpi_text(code))};
        }
        throw Stop{ncclRemoteError, "MPI_Testall failed: " + mpi_text(rc)};
      }
      if (done) break;
      halt_if_aborted();
    }
    for (size_t i = 0; i < size_t(n); ++i) {
      const Info& info = infos_[first + i];
      int got = 0;
      if (info.expect != kNone && MPI_Get_count(&statuses[i], MPI_BYTE, &got) == MPI_SUCCESS &&
          size_t(got) != info.expect)
        throw mismatch(*info.op, info.expect, std::to_string(got));
    }
    requests_.resize(first);
    infos_.resize(first);
  }

  void collective(const Op& o) {
    ncclComm* comm = o.comm;
    const int n = comm->nranks;
    const size_t size = type_size(o.type), bytes = o.count * size;
    const auto* send = static_cast<const char*>(o.send);
    auto* recv = static_cast<char*>(o.recv);
    const bool root = comm->rank == o.root;
    if (n == 1) {  // no MPI: one rank's collective is a copy (Avg's factor is 1)
      if ((o.kind != Kind::Reduce || root) && send != recv) std::memmove(recv, send, bytes);
      return;
    }
    if (o.kind == Kind::Broadcast && root && send != recv) std::memmove(recv, send, bytes);
    const size_t step = std::min(bytes, kChunk);
    const bool gathers = o.kind != Kind::Broadcast && (o.kind != Kind::Reduce || root);
    char* gathered = gathers ? scratch(size_t(n) * step) : nullptr;
    char* packed = o.kind == Kind::ReduceScatter ? scratch(size_t(n) * step) : nullptr;
    for (size_t off = 0; off < bytes; off += step) {
      const size_t len = std::min(step, bytes - off);
      const int ilen = int(len);
      MPI_Request request = MPI_REQUEST_NULL;
      int rc = MPI_SUCCESS;
      const char* call = "MPI_Iallgather";
      if (o.kind == Kind::AllReduce || o.kind == Kind::AllGather) {
        rc = MPI_Iallgather(send + off, ilen, MPI_BYTE, gathered, ilen, MPI_BYTE, comm->mpi, &request);
      } else if (o.kind == Kind::Reduce) {
        call = "MPI_Igather";
        rc = MPI_Igather(send + off, ilen, MPI_BYTE, gathered, ilen, MPI_BYTE, o.root, comm->mpi, &request);
      } else if (o.kind == Kind::ReduceScatter) {  // rank j receives every rank's slice j
        call = "MPI_Ialltoall";
        for (int j = 0; j < n; ++j)
          std::memcpy(packed + size_t(j) * len, send + size_t(j) * bytes + off, len);
        rc = MPI_Ialltoall(packed, ilen, MPI_BYTE, gathered, ilen, MPI_BYTE, comm->mpi, &request);
      } else {
        call = "MPI_Ibcast";
        rc = MPI_Ibcast(recv + off, ilen, MPI_BYTE, o.root, comm->mpi, &request);
      }
      check(rc, o, call);
      add(request, false, kNone, &o);
      wait(requests_.size() - 1);
      // The results are written only now, so an in-place call has read this chunk of its input.
      if (o.kind == Kind::AllReduce || o.kind == Kind::ReduceScatter || (o.kind == Kind::Reduce && root))
        reduce(o.type, o.op, n, gathered, len, len / size, recv + off);
      if (o.kind == Kind::AllGather)
        for (int r = 0; r < n; ++r)
          std::memcpy(recv + size_t(r) * bytes + off, gathered + size_t(r) * len, len);
    }
  }

  const std::vector<ncclComm*>& comms_;
  std::vector<MPI_Request> requests_;
  std::vector<Info> infos_;
  std::vector<std::unique_ptr<char[]>> scratch_;
};

// One operation or one group, as enqueued: it runs on its first stream ("leader"); a task on each
// of the group's other streams waits until it is done.
struct Task {
  std::vector<Op> ops;
  std::vector<ncclComm*> comms;  // distinct, in order of first use
  std::vector<uint64_t> tickets;
  int followers = 0;
  std::mutex mutex;  // guards arrived and done
  std::condition_variable cv;
  int arrived = 0;
  bool done = false;
};

// Waits for the ticket's turn on `comm`: true once it has it (release() passes it on), false if the
// communicator is aborted first.
bool take_turn(ncclComm* comm, uint64_t ticket) {
  std::unique_lock<std::mutex> lock(comm->mutex);
  while (comm->turn != ticket && !comm->aborted.load()) comm->cv.wait_for(lock, milliseconds(5));
  return comm->turn == ticket;
}

// With every turn taken: may the task use MPI? Not on an aborted or failed communicator.
bool begin(ncclComm* comm) {
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (comm->aborted.load() || comm->async.load() != ncclSuccess) return false;
  comm->in_mpi = true;
  return true;
}

void release(ncclComm* comm, bool owned, bool began) {
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (began) comm->in_mpi = false;
  if (owned) ++comm->turn;
  ++comm->finished;
  comm->cv.notify_all();
}

void run_task(Task& task) {
  const size_t count = task.comms.size();
  Exec exec(task.comms);
  std::vector<char> owned(count, 0), began(count, 0);
  try {
    {
      std::unique_lock<std::mutex> lock(task.mutex);  // the group's other streams have reached it
      while (task.arrived < task.followers) {
        if (any_aborted(task.comms)) throw Stop{ncclSuccess, std::string()};
        task.cv.wait_for(lock, milliseconds(5));
      }
    }
    // Taking every turn before using MPI on any: an abort never waits for a task that waits for a
    // turn. (All groups take their tickets in one global order, so the turns cannot deadlock.)
    for (size_t i = 0; i < count; ++i)
      if (!(owned[i] = take_turn(task.comms[i], task.tickets[i]))) throw Stop{ncclSuccess, std::string()};
    for (size_t i = 0; i < count; ++i)
      if (!(began[i] = begin(task.comms[i]))) throw Stop{ncclSuccess, std::string()};
    exec.run(task.ops);
  } catch (const Stop& stop) {
    exec.abandon();
    for (ncclComm* comm : task.comms) {
      if (stop.code != ncclSuccess) {
        set_async(comm, stop.code, stop.message);
      } else if (count > 1 && !comm->aborted.load() && comm->async.load() == ncclSuccess) {
        set_async(comm, ncclSystemError,
                  "a group gave up: another of its communicators was aborted or failed");
      }
    }
  } catch (const std::exception& e) {  // std::bad_alloc for scratch buffers
    exec.abandon();
    for (ncclComm* comm : task.comms)
      set_async(comm, ncclSystemError, std::string("emulated NCCL: ") + e.what());
  }
  // A live communicator must not stall behind this task: turns not taken yet are passed on too.
  for (size_t i = 0; i < count; ++i) {
    if (!owned[i]) owned[i] = take_turn(task.comms[i], task.tickets[i]);
    release(task.comms[i], owned[i], began[i]);
  }
  std::lock_guard<std::mutex> lock(task.mutex);
  task.done = true;
  task.cv.notify_all();
}

void follow(Task& task) {
  std::unique_lock<std::mutex> lock(task.mutex);
  ++task.arrived;
  task.cv.notify_all();
  while (!task.done && !any_aborted(task.comms)) task.cv.wait_for(lock, milliseconds(5));
}

ncclResult_t launch(std::vector<Op> ops, const char* label) {
  if (ops.empty()) return ncclSuccess;
  auto task = std::make_shared<Task>();
  std::vector<cudaStream_t> streams;
  for (const Op& o : ops) {
    if (std::find(task->comms.begin(), task->comms.end(), o.comm) == task->comms.end())
      task->comms.push_back(o.comm);
    if (std::find(streams.begin(), streams.end(), o.stream) == streams.end()) streams.push_back(o.stream);
  }
  for (ncclComm* comm : task->comms) {  // a group's communicators may have failed since its calls
    const ncclResult_t result = usable(comm, "ncclGroupEnd");
    if (result != ncclSuccess) return result;
  }
  task->ops = std::move(ops);
  task->followers = int(streams.size()) - 1;
  std::lock_guard<std::mutex> launching(g_launch_mutex);
  for (ncclComm* comm : task->comms) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    task->tickets.push_back(comm->tickets++);
  }
  try {
    for (size_t i = 1; i < streams.size(); ++i) mg_emu::enqueue(streams[i], label, [task] { follow(*task); });
    mg_emu::enqueue(streams[0], label, [task] { run_task(*task); });
  } catch (const std::exception& e) {
    // The task will never run and its turns never come: its communicators cannot go on.
    for (ncclComm* comm : task->comms) {
      set_async(comm, ncclUnhandledCudaError,
                std::string(label) + ": enqueueing on the stream failed: " + e.what());
      std::lock_guard<std::mutex> lock(comm->mutex);
      comm->aborted.store(true);
      comm->cv.notify_all();
    }
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

struct GroupState {
  int depth = 0;
  std::vector<Op> ops;
  ncclResult_t error = ncclSuccess;  // a call of the group failed: ncclGroupEnd fails, nothing runs
};
thread_local GroupState g_group;

ncclResult_t submit(const Op& o) {
  const ncclResult_t result = validate(o);
  if (result != ncclSuccess) {
    if (g_group.depth > 0 && g_group.error == ncclSuccess) g_group.error = result;
    return result;
  }
  if (o.count == 0) return ncclSuccess;  // nothing moves, on any rank
  if (g_group.depth > 0) {
    g_group.ops.push_back(o);
    return ncclSuccess;
  }
  return launch({o}, label_of(o.kind));
}

// ncclCommDestroy (wait_pending) and ncclCommAbort, once `closing` is set.
ncclResult_t close_comm(ncclComm* comm, bool wait_pending) {
  std::unique_lock<std::mutex> lock(comm->mutex);
  while (wait_pending && comm->finished < comm->tickets && !comm->aborted.load())
    comm->cv.wait_for(lock, milliseconds(5));
  comm->aborted.store(true);
  comm->cv.notify_all();
  while (comm->in_mpi) comm->cv.wait_for(lock, milliseconds(5));  // the running task gives up
  comm->dead = true;
  if (comm->mpi != MPI_COMM_NULL && !comm->leaked && mpi_usable()) MPI_Comm_free(&comm->mpi);
  return ncclSuccess;
}

// An enum argument as the int the caller passed (a value outside the enum is never loaded as one).
template <class E>
int raw(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "NCCL's enums are ints");
  int value = 0;
  std::memcpy(&value, &e, sizeof(int));
  return value;
}

struct PeerInfo {  // what ncclCommInitRank allgathers
  char id[NCCL_UNIQUE_ID_BYTES];
  int32_t rank;
  int32_t device;
  char host[256];
};

// A communicator smaller than the MPI world: its members meet at the id's creator (its rank 0),
// which tells each of them every member's world rank; then MPI_Comm_create_group, over the
// members only. Blocking, like ncclCommInitRank.
constexpr size_t kIdCreatorOffset = 16;  // after the (pid, counter) stamp
constexpr int kMeetTag = 0x4e43;         // "NC", on MPI_COMM_WORLD

struct Registration {  // a member to the creator
  char id[NCCL_UNIQUE_ID_BYTES];
  int32_t rank;
  int32_t world_rank;
};

ncclResult_t meet_members(const ncclUniqueId& id, int nranks, int rank, MPI_Comm* out) {
  int32_t creator = -1, me = 0;
  std::memcpy(&creator, id.internal + kIdCreatorOffset, sizeof(creator));
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (creator < 0 || creator >= world)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: this unique id names no MPI process (made before MPI started?); a "
                "communicator of %d of the %d MPI ranks meets at the process that made its id",
                nranks, world);
  if ((rank == 0) != (creator == me))
    return fail(
        nullptr, ncclInvalidUsage,
        "ncclCommInitRank: the emulated NCCL needs the unique id of a communicator smaller than the MPI "
        "world (%d of %d ranks) made by its rank 0's process (world rank %d made it; this is world rank "
        "%d, nccl rank %d)",
        nranks, world, creator, me, rank);
  std::vector<int32_t> members(static_cast<size_t>(nranks), -1);
  if (rank == 0) {
    // Every registration is answered, even after a bad one: the table, or -1s (the member fails).
    members[0] = me;
    std::vector<int32_t> registrants;
    char problem[256] = "";
    for (int k = 1; k < nranks; ++k) {
      Registration r{};
      MPI_Recv(&r, int(sizeof r), MPI_BYTE, MPI_ANY_SOURCE, kMeetTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      registrants.push_back(r.world_rank);
      if (std::memcmp(r.id, id.internal, sizeof(r.id)) != 0)
        std::snprintf(problem, sizeof problem, "world rank %d joined with another unique id", r.world_rank);
      else if (r.rank <= 0 || r.rank >= nranks || members[static_cast<size_t>(r.rank)] >= 0)
        std::snprintf(problem, sizeof problem,
                      "world rank %d joined as nccl rank %d of %d, which is out of range or taken",
                      r.world_rank, r.rank, nranks);
      else
        members[static_cast<size_t>(r.rank)] = r.world_rank;
    }
    if (problem[0] != '\0') std::fill(members.begin(), members.end(), -1);
    for (int32_t registrant : registrants)
      MPI_Send(members.data(), nranks, MPI_INT32_T, registrant, kMeetTag, MPI_COMM_WORLD);
    if (problem[0] != '\0') return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: %s", problem);
  } else {
    Registration r{};
    std::memcpy(r.id, id.internal, sizeof(r.id));
    r.rank = rank;
    r.world_rank = me;
    MPI_Send(&r, int(sizeof r), MPI_BYTE, creator, kMeetTag, MPI_COMM_WORLD);
    MPI_Recv(members.data(), nranks, MPI_INT32_T, creator, kMeetTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (members[0] < 0)
      return fail(
          nullptr, ncclInvalidUsage,
          "ncclCommInitRank: rank 0 (world rank %d) refused the members' registrations (see its error)",
          creator);
  }
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, members.data(), &group);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, kMeetTag, out);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS)
    return fail(nullptr, ncclSystemError, "ncclCommInitRank: MPI_Comm_create_group failed: %s",
                mpi_text(rc).c_str());
  return ncclSuccess;
}

// Every rank has the same table, so every rank reaches the same verdict.
ncclResult_t check_peers(const std::vector<PeerInfo>& peers, int rank) {
  const int n = int(peers.size());
  std::vector<bool> taken(peers.size(), false);
  for (const PeerInfo& p : peers) {
    if (std::memcmp(p.id, peers[0].id, sizeof(p.id)) != 0)
      return fail(nullptr, ncclInvalidArgument,
                  "ncclCommInitRank: ranks %d and %d were given different unique ids (every rank of a "
                  "communicator must pass the same ncclUniqueId)",
                  peers[0].rank, p.rank);
    if (taken[size_t(p.rank)])
      return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: two processes asked to be rank %d of %d",
                  p.rank, n);
    taken[size_t(p.rank)] = true;
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      const PeerInfo &a = peers[size_t(i)], &b = peers[size_t(j)];
      if (a.device != b.device || std::strncmp(a.host, b.host, sizeof(a.host)) != 0) continue;
      const int me = b.rank == rank ? b.rank : a.rank;  // NCCL: the reporting rank first
      return fail(nullptr, ncclInvalidUsage,
                  "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", me,
                  me == a.rank ? b.rank : a.rank, a.device);
    }
  }
  return ncclSuccess;
}

ncclResult_t attribute(ncclComm* comm, int* out, int ncclComm::*field, const char* name, const char* what) {
  if (comm == nullptr || !registered(comm)) return usable(comm, name);
  if (out == nullptr) return fail(comm, ncclInvalidArgument, "%s : %s argument is NULL", name, what);
  *out = comm->*field;
  return ncclSuccess;
}

}  // namespace

// ---- the API -----------------------------------------------------------------------------------

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string copy;
  const bool known = comm != nullptr && registered(comm);
  std::lock_guard<std::mutex> lock(g_error_mutex);
  copy = known && !comm->last_error.empty() ? comm->last_error : g_last_error;
  return copy.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(nullptr, ncclInvalidArgument, "GetVersion : version argument is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return fail(nullptr, ncclInvalidArgument, "GetUniqueId : uniqueId argument is NULL");
  static std::atomic<uint64_t> counter{0};
  uint64_t seed = uint64_t(Clock::now().time_since_epoch().count()) ^ (uint64_t(getpid()) << 32);
  try {
    seed ^= std::random_device{}();
  } catch (const std::exception&) {  // no entropy source: the time, the pid and the counter
  }
  std::mt19937_64 random(seed);
  for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; i += 8) {
    const uint64_t word = random();
    std::memcpy(id->internal + i, &word, 8);
  }
  const uint64_t stamp[2] = {uint64_t(getpid()), counter.fetch_add(1)};  // ids differ within a process
  std::memcpy(id->internal, stamp, sizeof(stamp));
  // Where a communicator smaller than the world meets: this process's MPI world rank (-1 without MPI).
  int32_t world_rank = -1;
  if (mpi_usable()) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::memcpy(id->internal + kIdCreatorOffset, &world_rank, sizeof(world_rank));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr) return fail(nullptr, ncclInvalidArgument, "CommInitRank : comm argument is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument, "Invalid rank requested : %d/%d", rank, nranks);
  const int device = mg_emu::current_device();
  MPI_Comm mpi = MPI_COMM_NULL;
  if (nranks > 1) {
    if (!mpi_usable())
      return fail(
          nullptr, ncclInvalidUsage,
          "ncclCommInitRank: the emulated NCCL carries its traffic over MPI, and MPI is not initialised "
          "(MPI_Init_thread with MPI_THREAD_MULTIPLE must come before a communicator of %d ranks)",
          nranks);
    int level = MPI_THREAD_SINGLE, world = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
      return fail(
          nullptr, ncclInvalidUsage,
          "ncclCommInitRank: the emulated NCCL needs MPI initialised with MPI_THREAD_MULTIPLE (stream "
          "threads call MPI), not thread level %d",
          level);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (nranks > world)
      return fail(nullptr, ncclInvalidUsage,
                  "ncclCommInitRank: %d ranks, but the MPI world (the emulated NCCL's transport) has %d",
                  nranks, world);
    PeerInfo mine{};
    std::memcpy(mine.id, id.internal, sizeof(mine.id));
    mine.rank = rank;
    mine.device = device;
    gethostname(mine.host, sizeof(mine.host) - 1);
    std::vector<PeerInfo> peers(static_cast<size_t>(nranks));
    std::unique_lock<std::mutex> lock(g_init_mutex);
    if (nranks == world) {
      const int rc = MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &mpi);  // blocks until every rank is here
      if (rc != MPI_SUCCESS)
        return fail(nullptr, ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed: %s",
                    mpi_text(rc).c_str());
    } else {
      const ncclResult_t met = meet_members(id, nranks, rank, &mpi);
      if (met != ncclSuccess) return met;
    }
    int rc = MPI_SUCCESS;
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    rc = MPI_Allgather(&mine, int(sizeof(PeerInfo)), MPI_BYTE, peers.data(), int(sizeof(PeerInfo)), MPI_BYTE,
                       mpi);
    lock.unlock();
    const ncclResult_t verdict =
        rc != MPI_SUCCESS ? fail(nullptr, ncclRemoteError, "ncclCommInitRank: MPI_Allgather failed: %s",
                                 mpi_text(rc).c_str())
                          : check_peers(peers, rank);
    if (verdict != ncclSuccess) {
      MPI_Comm_free(&mpi);
      return verdict;
    }
  }
  auto* comm = new ncclComm;
  comm->nranks = nranks;
  comm->rank = rank;
  comm->device = device;
  comm->mpi = mpi;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    g_comms.insert(comm);
  }
  *out = comm;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (!registered(comm)) return usable(comm, "CommDestroy");
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->dead || comm->closing)
      return fail(comm, ncclInvalidUsage, "CommDestroy : the communicator was already destroyed or aborted");
    comm->closing = true;
  }
  return close_comm(comm, true);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  if (!registered(comm)) return usable(comm, "CommAbort");
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->dead) return ncclSuccess;
    comm->aborted.store(true);  // also cuts short a ncclCommDestroy waiting on another thread
    comm->cv.notify_all();
    if (comm->closing) return ncclSuccess;  // which then finishes the job
    comm->closing = true;
  }
  return close_comm(comm, false);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == nullptr || !registered(comm)) return usable(comm, "ncclGetAsyncError");
  if (asyncError == nullptr)
    return fail(comm, ncclInvalidArgument, "ncclGetAsyncError : asyncError argument is NULL");
  *asyncError = ncclResult_t(comm->async.load());
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return attribute(comm, count, &ncclComm::nranks, "CommCount", "count");
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return attribute(comm, rank, &ncclComm::rank, "CommUserRank", "rank");
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return attribute(comm, device, &ncclComm::device, "CommCuDevice", "device");
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return submit(Op{Kind::AllReduce, comm, sendbuff, recvbuff, count, raw(datatype), raw(op), 0, stream});
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(Op{Kind::Broadcast, comm, sendbuff, recvbuff, count, raw(datatype), ncclSum, root, stream});
}

ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream) {
  return ncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return submit(Op{Kind::Reduce, comm, sendbuff, recvbuff, count, raw(datatype), raw(op), root, stream});
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return submit(Op{Kind::AllGather, comm, sendbuff, recvbuff, sendcount, raw(datatype), ncclSum, 0, stream});
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return submit(
      Op{Kind::ReduceScatter, comm, sendbuff, recvbuff, recvcount, raw(datatype), raw(op), 0, stream});
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return submit(Op{Kind::Send, comm, sendbuff, nullptr, count, raw(datatype), ncclSum, peer, stream});
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return submit(Op{Kind::Recv, comm, nullptr, recvbuff, count, raw(datatype), ncclSum, peer, stream});
}

ncclResult_t ncclGroupStart() {
  ++g_group.depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (g_group.depth == 0) return fail(nullptr, ncclInvalidUsage, "ncclGroupEnd: not in a group call.");
  if (--g_group.depth > 0) return ncclSuccess;
  std::vector<Op> ops;
  ops.swap(g_group.ops);
  const ncclResult_t error = g_group.error;
  g_group.error = ncclSuccess;
  if (error != ncclSuccess) return error;
  const char* label = ops.size() == 1 ? label_of(ops[0].kind) : "ncclGroupEnd";
  return launch(std::move(ops), label);
}
