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
//
// The files: nccl_internal.h lists them. This one is the API.
#include <unistd.h>

#include <string>

#include "cuda_emu/nccl_internal.h"

using namespace mg_emu::nccl;

namespace {

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
