// The emulated NCCL's argument checks, on the caller's thread, in NCCL's order and words (comm,
// root or peer, type, op, pointers: device memory of the comm's device over the extent touched;
// then the stream). A failure is what ncclGetLastError tells.
#include "cuda_emu/nccl_internal.h"
#include "cuda_emu/runtime_internal.h"

namespace mg_emu::nccl {

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

namespace {

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

}  // namespace

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

}  // namespace mg_emu::nccl
