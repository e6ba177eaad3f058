// The MPI side of one task of the emulated NCCL, run on a stream's thread with every turn taken
// (nccl_tasks.cpp). Sends and receives are posted at once (ncclSend an MPI_Issend, complete only
// once the matching receive is posted, as NCCL's blocking semantics); collectives gather every
// rank's raw bytes (MPI_Iallgather, MPI_Igather, MPI_Ialltoall on MPI_BYTE, kChunk at a time) and
// reduce them locally (nccl_reduce.cpp); broadcast is MPI_Ibcast. Every wait polls and watches
// the abort flag; after a Stop, what MPI can cancel (point-to-point) is cancelled, and what it
// cannot keeps its MPI communicator and scratch buffers alive for good.
#include <algorithm>
#include <memory>
#include <thread>

#include "cuda_emu/nccl_internal.h"

namespace mg_emu::nccl {

void backoff(unsigned& spins) {
  if (++spins < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(spins < 4000 ? 20 : 200));
  }
}

namespace {

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

}  // namespace

void execute(const std::vector<ncclComm*>& comms, const std::vector<Op>& ops) {
  Exec exec(comms);
  try {
    exec.run(ops);
  } catch (...) {
    exec.abandon();
    throw;
  }
}

}  // namespace mg_emu::nccl
