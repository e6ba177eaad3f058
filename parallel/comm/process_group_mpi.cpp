// The MPI backend: collectives on CPU tensors over OpenMPI (or any MPI-3 library).
//
// Shape of the implementation (c10d's ProcessGroupMPI, plus a watchdog and a p2p lane):
//
//   caller threads ──enqueue──▶ collective queue ──▶ collective thread: blocking MPI_Allreduce...
//          │                                           (one op at a time, in call order)
//          └─MPI_Isend/Irecv─▶ p2p queue ──▶ progress thread: MPI_Test until done,
//                                              and the watchdog for both lanes
//   Work::wait() ◀── complete ── either thread
//
// * Every call returns its Work at once; the caller overlaps compute with the communication.
// * Collectives run one at a time, in call order (MPI matches them by order), as *blocking*
//   calls on their own thread: MPI's tuned blocking algorithms measured 3x faster here than the
//   non-blocking MPI_Iallreduce + MPI_Test polling at 1 MB.
// * But OpenMPI's blocking calls spin: a rank waiting inside one for a slow or dead peer burns a
//   core for as long as it waits. So each collective first waits for every rank to arrive, with
//   a non-blocking MPI_Ibarrier polled hard for a moment and then at a backing-off interval
//   (wait_for_arrival), and only then enters the blocking call, which by then has nobody to
//   wait for. The barrier costs a few microseconds when the ranks arrive together (the usual
//   case in a training step); a long wait now sleeps, and a poisoned group's thread stops
//   waiting instead of spinning in MPI until exit.
// * Point-to-point ops are posted non-blocking by the caller, at once, and polled by a second
//   thread: a recv waiting behind a collective could deadlock a correct program, and the ring
//   all-reduce needs many sends and recvs in flight at once.
// * The progress thread is also the watchdog: an op (either lane) not finished `timeout` after
//   it was called fails with an error naming it, this rank and the timeout, and poisons the
//   group: every later op fails at once. A thread stuck inside MPI cannot be cancelled, so a
//   poisoned job is aborted (MPI_Abort) at exit instead of finalised -- never a silent hang.
// * With verify_collectives, each collective first allgathers a 4-number signature (op, root
//   or reduce op, dtype, element count) on a second communicator. Every rank sees every
//   signature, so all ranks fail the same op with the same message and stay in step.
//
// bf16/f16 have no MPI datatype: they travel as MPI_UINT16_T with user-defined reduction ops
// that widen to float, reduce and round back. Avg is a sum followed by one division on our own
// kernel (Tensor::mul_).
//
// MPI is initialised once per process with MPI_THREAD_MULTIPLE (two threads per group call MPI)
// and finalised when the last group is gone at exit.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>  // sigaction

#include "base/error.h"
#include "base/half.h"
#include "core/grad_mode.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/heartbeat.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/process_group_signature.h"

#ifdef MG_HAS_MPI
#include <mpi.h>
#endif

namespace mg::parallel {

#ifndef MG_HAS_MPI

std::shared_ptr<Backend> make_mpi_backend(const LaunchInfo&, std::chrono::milliseconds, bool) {
  return nullptr;
}

#else

namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// ---- bf16 / f16 reductions: widen to float, reduce, round back ------------------------------------

template <class Half, class Reduce>
void reduce_halves(void* in, void* inout, int* length, MPI_Datatype*) {
  const Half* a = static_cast<const Half*>(in);
  Half* b = static_cast<Half*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = Half(Reduce()(static_cast<float>(a[i]), static_cast<float>(b[i])));
}
struct SumFloat {
  float operator()(float a, float b) const { return a + b; }
};
struct MaxFloat {
  float operator()(float a, float b) const { return std::max(a, b); }
};
struct MinFloat {
  float operator()(float a, float b) const { return std::min(a, b); }
};

// ---- the process-wide MPI lifetime --------------------------------------------------------------

// The status the process is exiting with (main's return value or exit()'s argument), recorded by
// an on_exit handler (glibc) that runs before the runtime's destructor; -1 until then. Tells a
// normal end from leaving on an error, for the heartbeat's "leaving" beat.
std::atomic<int> exit_status{-1};

#if defined(__GLIBC__)
void record_exit_status(int status, void*) {
  exit_status = status;
  detail::note_process_exiting();
}
#endif

// What the "leaving" beat says: 0 for a normal end, else the (non-zero) status this process is
// exiting with, or 1 when MPI is being torn down while an exception unwinds the stack.
int leaving_status() {
  const int status = exit_status.load();
  if (status > 0 || status < -1) return status;
  return std::uncaught_exceptions() > 0 ? 1 : 0;
}

class MpiRuntime {
 public:
  static std::shared_ptr<MpiRuntime> get() {
    static std::mutex creation;
    static std::shared_ptr<MpiRuntime> runtime;  // lives until exit; groups hold it too
    std::lock_guard<std::mutex> lock(creation);
    if (!runtime) {
      runtime = std::shared_ptr<MpiRuntime>(new MpiRuntime());
#if defined(__GLIBC__)
      // Registered after `runtime` (whose destructor was registered when this function first
      // ran), so at exit it runs before the runtime is destroyed and the status is known there.
      on_exit(record_exit_status, nullptr);
#endif
    }
    return runtime;
  }

  // A poisoned group aborts the whole job at exit (never a hang). It first waits a short grace:
  // the other survivors' watchdogs fire at about the same moment (their collective started at
  // about the same time), and an immediate MPI_Abort would kill them before they report their
  // own error -- each survivor's message is what tells the user which rank waited on what.
  static constexpr std::chrono::milliseconds kAbortGrace{2000};

  ~MpiRuntime() {
    if (poisoned_) {
      std::fprintf(
          stderr,
          "multigrad: aborting the MPI job in %.0f s: a collective timed out or failed on this rank\n",
          std::chrono::duration<double>(kAbortGrace).count());
      std::fflush(stderr);
      std::this_thread::sleep_for(kAbortGrace);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    // Its "leaving" beat, before MPI is gone: a normal end retires this rank quietly on its
    // peers; leaving on an error (a non-zero exit status) makes them report it at once, before
    // mpirun has seen this process go.
    const int leaving = leaving_status();
    detail::stop_heartbeat(leaving);
    for (MPI_Op& op : half_ops_) MPI_Op_free(&op);
    // Leaving on an error, this rank does not finalize: Open MPI's MPI_Finalize waits in a fence
    // for every rank, which the peers, still in their collectives, never join; and a rank blocked
    // there while a survivor's MPI_Abort tears the job down sometimes hangs or crashes mpiexec
    // (PMIx_server_finalize). Exiting without it, the process is gone at once, and mpirun, seeing
    // a rank leave with a non-zero status, ends the job.
    if (owns_mpi_ && leaving == 0) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }

  void poison() { poisoned_ = true; }

  // The user-defined op for (bf16 or f16, sum/max/min); avg uses sum.
  MPI_Op half_op(DType dtype, ReduceOp op) const {
    int which = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;
    return half_ops_[(dtype == DType::bf16 ? 0 : 3) + which];
  }

 private:
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      int code = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      MG_CHECK(code == MPI_SUCCESS, "init_process_group: MPI_Init_thread failed: ", mpi_error_text(code));
      owns_mpi_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    // A write to a dead peer's TCP socket raises SIGPIPE, whose default action ends this process
    // silently (status 141) before the heartbeat can report the peer lost: a survivor killed by its
    // dead neighbour. Ignored (unless the program chose a handler), the write fails with EPIPE,
    // which MPI reports as an error on that connection, and the heartbeat names the peer.
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
      std::signal(SIGPIPE, SIG_IGN);
    MG_CHECK(provided >= MPI_THREAD_MULTIPLE, "init_process_group: the MPI library offers thread level ",
             provided, " but multigrad's two communication threads need MPI_THREAD_MULTIPLE (",
             MPI_THREAD_MULTIPLE, "); use an MPI built with thread support (Debian's OpenMPI is)");
    MPI_Op_create(&reduce_halves<bf16, SumFloat>, 1, &half_ops_[0]);
    MPI_Op_create(&reduce_halves<bf16, MaxFloat>, 1, &half_ops_[1]);
    MPI_Op_create(&reduce_halves<bf16, MinFloat>, 1, &half_ops_[2]);
    MPI_Op_create(&reduce_halves<f16, SumFloat>, 1, &half_ops_[3]);
    MPI_Op_create(&reduce_halves<f16, MaxFloat>, 1, &half_ops_[4]);
    MPI_Op_create(&reduce_halves<f16, MinFloat>, 1, &half_ops_[5]);
  }

  bool owns_mpi_ = false;
  std::atomic<bool> poisoned_{false};
  std::array<MPI_Op, 6> half_ops_{};
};

MPI_Datatype mpi_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::f16:
    case DType::bf16: return MPI_UINT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::boolean: return MPI_UINT8_T;
  }
  throw Error("mpi_datatype: unknown dtype");
}

// ---- one queued operation --------------------------------------------------------------------

using detail::mismatch_message;
using detail::OpKind;
using detail::Signature;

struct Op {
  WorkPtr work;
  Signature signature;  // collectives only
  // Collectives: runs the blocking MPI call and returns its error code.
  std::function<int(MPI_Comm)> run;
  // After the transfer completed (averaging, received-length checks); may throw.
  std::function<void(const MPI_Status&)> finish;
  std::vector<Tensor> keep_alive;  // MPI reads/writes these buffers until the op completes
  Clock::time_point enqueued;
  MPI_Request request = MPI_REQUEST_NULL;  // point-to-point: posted by the caller
};

// ---- the backend ----------------------------------------------------------------------------------

class MpiBackend : public Backend {
 public:
  // The communicators are duplicates of `comm` (MPI_COMM_WORLD, or a subgroup's split of it).
  MpiBackend(MPI_Comm comm, std::chrono::milliseconds timeout, bool verify)
      : runtime_(MpiRuntime::get()), timeout_(timeout), verify_(verify) {
    MPI_Comm_dup(comm, &data_comm_);
    MPI_Comm_dup(comm, &check_comm_);
    // Errors come back as return codes (then become mg::Errors) instead of killing the job.
    MPI_Comm_set_errhandler(data_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(check_comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(data_comm_, &rank_);
    MPI_Comm_size(data_comm_, &size_);
    collective_thread_ = std::thread([this] { collective_loop(); });
    progress_thread_ = std::thread([this] { progress_loop(); });
    // A peer the heartbeat (heartbeat.h) finds lost fails this group's ops at once.
    peer_lost_id_ =
        detail::on_peer_lost([this](const std::string& message) { poison(message, /*report=*/false); });
  }

  ~MpiBackend() override {
    detail::forget_peer_lost(peer_lost_id_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    collective_cv_.notify_all();
    p2p_cv_.notify_all();
    if (poisoned_) {
      // A thread may be stuck inside MPI for good; the job is aborted at exit (MpiRuntime).
      collective_thread_.detach();
      progress_thread_.detach();
      return;
    }
    collective_thread_.join();
    progress_thread_.join();
    MPI_Comm_free(&data_comm_);
    MPI_Comm_free(&check_comm_);
  }

  std::string name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const override { return timeout_.load(); }

  WorkPtr allreduce(Tensor& tensor, ReduceOp op) override {
    MPI_Op mpi_op = reduction(tensor.dtype(), op, "allreduce");
    void* data = tensor.data_ptr();
    int count = checked_count(tensor, "allreduce");
    MPI_Datatype type = mpi_datatype(tensor.dtype());
    return enqueue_collective(
        {OpKind::Allreduce, static_cast<int64_t>(op), tensor}, {tensor},
        [=](MPI_Comm comm) { return MPI_Allreduce(MPI_IN_PLACE, data, count, type, mpi_op, comm); },
        average_after(tensor, op));
  }

  WorkPtr broadcast(Tensor& tensor, int root) override {
    void* data = tensor.data_ptr();
    int count = checked_count(tensor, "broadcast");
    MPI_Datatype type = mpi_datatype(tensor.dtype());
    return enqueue_collective({OpKind::Broadcast, root, tensor}, {tensor},
                              [=](MPI_Comm comm) { return MPI_Bcast(data, count, type, root, comm); });
  }

  WorkPtr reduce(Tensor& tensor, int root, ReduceOp op) override {
    MPI_Op mpi_op = reduction(tensor.dtype(), op, "reduce");
    void* data = tensor.data_ptr();
    int count = checked_count(tensor, "reduce");
    MPI_Datatype type = mpi_datatype(tensor.dtype());
    bool is_root = rank_ == root;
    return enqueue_collective(
        {OpKind::Reduce, root * 16 + static_cast<int64_t>(op), tensor}, {tensor},
        [=](MPI_Comm comm) {
          // The root reduces into its own buffer; the others only send theirs.
          return MPI_Reduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr, count, type, mpi_op,
                            root, comm);
        },
        is_root ? average_after(tensor, op) : nullptr);
  }

  WorkPtr allgather(Tensor& output, const Tensor& input) override {
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    int count = checked_count(input, "allgather");
    MPI_Datatype type = mpi_datatype(input.dtype());
    return enqueue_collective({OpKind::Allgather, 0, input}, {input, output}, [=](MPI_Comm comm) {
      return MPI_Allgather(in, count, type, out, count, type, comm);
    });
  }

  WorkPtr reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) override {
    MPI_Op mpi_op = reduction(input.dtype(), op, "reduce_scatter");
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    int count = checked_count(output, "reduce_scatter");
    checked_count(input, "reduce_scatter");
    MPI_Datatype type = mpi_datatype(input.dtype());
    return enqueue_collective(
        {OpKind::ReduceScatter, static_cast<int64_t>(op), output}, {input, output},
        [=](MPI_Comm comm) { return MPI_Reduce_scatter_block(in, out, count, type, mpi_op, comm); },
        average_after(output, op));
  }

  WorkPtr barrier() override {
    return enqueue_collective({OpKind::Barrier, 0, Tensor()}, {},
                              [](MPI_Comm comm) { return MPI_Barrier(comm); });
  }

  WorkPtr gather(Tensor& output, const Tensor& input, int root) override {
    const void* in = input.data_ptr();
    void* out = rank_ == root ? output.data_ptr() : nullptr;  // significant at the root only
    int count = checked_count(input, "gather");
    MPI_Datatype type = mpi_datatype(input.dtype());
    std::vector<Tensor> keep = {input};
    if (rank_ == root) keep.push_back(output);
    return enqueue_collective({OpKind::Gather, root, input}, keep, [=](MPI_Comm comm) {
      return MPI_Gather(in, count, type, out, count, type, root, comm);
    });
  }

  WorkPtr scatter(Tensor& output, const Tensor& input, int root) override {
    const void* in = rank_ == root ? input.data_ptr() : nullptr;
    void* out = output.data_ptr();
    int count = checked_count(output, "scatter");
    MPI_Datatype type = mpi_datatype(output.dtype());
    std::vector<Tensor> keep = {output};
    if (rank_ == root) keep.push_back(input);
    return enqueue_collective({OpKind::Scatter, root, output}, keep, [=](MPI_Comm comm) {
      return MPI_Scatter(in, count, type, out, count, type, root, comm);
    });
  }

  WorkPtr all_to_all(Tensor& output, const Tensor& input) override {
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    checked_count(input, "all_to_all");
    int block = static_cast<int>(input.numel() / size_);
    MPI_Datatype type = mpi_datatype(input.dtype());
    return enqueue_collective({OpKind::AllToAll, 0, input}, {input, output}, [=](MPI_Comm comm) {
      return MPI_Alltoall(in, block, type, out, block, type, comm);
    });
  }

  // MPI_Comm_split on the collective thread, in call order like every collective (it is one on
  // this communicator); the members then build a backend of their own on the new communicator.
  std::shared_ptr<Backend> new_group(const std::vector<int>& ranks) override {
    const auto position = std::find(ranks.begin(), ranks.end(), rank_);
    const bool member = position != ranks.end();
    const int color = member ? 0 : MPI_UNDEFINED;
    const int key = member ? static_cast<int>(position - ranks.begin()) : 0;
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the ranks: every rank must name the same
    for (int r : ranks) hash = (hash ^ static_cast<uint64_t>(r)) * 1099511628211ull;
    auto split = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
    WorkPtr work = enqueue_collective(
        {OpKind::NewGroup, static_cast<int64_t>(hash >> 2), Tensor(), static_cast<int64_t>(ranks.size())}, {},
        [split, color, key](MPI_Comm comm) { return MPI_Comm_split(comm, color, key, split.get()); });
    work->wait();
    if (!member) return nullptr;
    auto backend = std::make_shared<MpiBackend>(*split, timeout_.load(), verify_);
    MPI_Comm_free(split.get());
    return backend;
  }

  WorkPtr send(const Tensor& tensor, int dst, int tag) override {
    const void* data = tensor.data_ptr();
    int count = checked_count(tensor, "send");
    MPI_Datatype type = mpi_datatype(tensor.dtype());
    return enqueue_p2p(
        str_cat("send ", dtype_name(tensor.dtype()), "[", count, "] to rank ", dst, " tag ", tag), tensor,
        [=](MPI_Comm comm, MPI_Request* request) {
          return MPI_Isend(data, count, type, dst, tag, comm, request);
        });
  }

  WorkPtr recv(Tensor& tensor, int src, int tag) override {
    void* data = tensor.data_ptr();
    int count = checked_count(tensor, "recv");
    MPI_Datatype type = mpi_datatype(tensor.dtype());
    std::string what =
        str_cat("recv ", dtype_name(tensor.dtype()), "[", count, "] from rank ", src, " tag ", tag);
    return enqueue_p2p(
        what, tensor,
        [=](MPI_Comm comm, MPI_Request* request) {
          return MPI_Irecv(data, count, type, src, tag, comm, request);
        },
        [=](const MPI_Status& status) {
          int received = 0;
          MPI_Get_count(&status, type, &received);
          MG_CHECK(received == count, what, ": the sender sent ", received, " elements, this rank expected ",
                   count);
        });
  }

 private:
  struct CallShape {
    OpKind kind;
    int64_t detail;
    Tensor tensor;      // dtype and count for the signature (undefined for barrier)
    int64_t ranks = 0;  // new_group: how many ranks the new group has
  };

  static int checked_count(const Tensor& tensor, const char* op) {
    MG_CHECK(tensor.numel() <= INT_MAX, "ProcessGroup::", op, ": ", tensor.numel(),
             " elements exceed MPI's int count; split the tensor");
    return static_cast<int>(tensor.numel());
  }

  MPI_Op reduction(DType dtype, ReduceOp op, const char* what) const {
    if (dtype == DType::bf16 || dtype == DType::f16) return runtime_->half_op(dtype, op);
    MG_CHECK(dtype != DType::boolean || op == ReduceOp::Max || op == ReduceOp::Min, "ProcessGroup::", what,
             "(", reduce_op_name(op), "): bool tensors reduce with max (any) or min (all) only");
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: return MPI_SUM;
      case ReduceOp::Max: return MPI_MAX;
      case ReduceOp::Min: return MPI_MIN;
    }
    return MPI_SUM;
  }

  // Avg = sum on the wire, then one scaling on our own kernel.
  std::function<void(const MPI_Status&)> average_after(const Tensor& tensor, ReduceOp op) const {
    if (op != ReduceOp::Avg) return nullptr;
    Tensor target = tensor;
    double scale = 1.0 / size_;
    return [target, scale](const MPI_Status&) mutable {
      NoGradGuard no_grad;
      target.mul_(scale);
    };
  }

  WorkPtr enqueue_collective(CallShape shape, std::vector<Tensor> keep_alive,
                             std::function<int(MPI_Comm)> run,
                             std::function<void(const MPI_Status&)> finish = nullptr) {
    auto op = std::make_unique<Op>();
    op->signature.kind = static_cast<int64_t>(shape.kind);
    op->signature.detail = shape.detail | detail::current_signature_tag;
    if (shape.tensor.defined()) {
      op->signature.dtype = static_cast<int64_t>(shape.tensor.dtype());
      op->signature.count = shape.tensor.numel();
    }
    if (shape.kind == OpKind::NewGroup) op->signature.count = shape.ranks;
    int64_t number = ++collective_count_;
    op->work =
        std::make_shared<Work>(str_cat(op->signature.str(), " #", number, " on rank ", rank_, " of ", size_));
    op->keep_alive = std::move(keep_alive);
    op->run = std::move(run);
    op->finish = std::move(finish);
    return push(std::move(op), collective_queue_, collective_cv_);
  }

  WorkPtr enqueue_p2p(const std::string& what, const Tensor& tensor,
                      std::function<int(MPI_Comm, MPI_Request*)> post,
                      std::function<void(const MPI_Status&)> finish = nullptr) {
    auto op = std::make_unique<Op>();
    op->work = std::make_shared<Work>(str_cat(what, " on rank ", rank_, " of ", size_));
    op->keep_alive = {tensor};
    op->finish = std::move(finish);
    // Posted here, on the caller's thread (MPI_THREAD_MULTIPLE allows it): the message is on its
    // way without waiting for the progress thread to be scheduled, which matters to the ring
    // all-reduce's many chunks. The progress thread only tests it from here on.
    if (!poisoned_) {
      int code = post(data_comm_, &op->request);
      if (code != MPI_SUCCESS) {
        op->work->mark_failed(
            str_cat(op->work->description(), ": MPI error while posting: ", mpi_error_text(code)));
        return op->work;
      }
    }
    return push(std::move(op), p2p_queue_, p2p_cv_);
  }

  WorkPtr push(std::unique_ptr<Op> op, std::deque<std::unique_ptr<Op> >& queue, std::condition_variable& cv) {
    WorkPtr work = op->work;
    op->enqueued = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (poisoned_) {
        work->mark_failed(str_cat(work->description(), ": not started: ", poison_message_));
        return work;
      }
      queue.push_back(std::move(op));
    }
    cv.notify_one();
    return work;
  }

  // Completion of either lane: the finishing step may throw (a recv of the wrong length).
  static void complete(Op& op, const MPI_Status& status) {
    try {
      if (op.finish) op.finish(status);
    } catch (const std::exception& e) {
      op.keep_alive.clear();
      op.work->mark_failed(e.what());
      return;
    }
    op.keep_alive.clear();
    op.work->mark_completed();
  }

  // ---- lane 1: collectives, one at a time, blocking, in call order ----

  void collective_loop() {
    for (;;) {
      std::unique_ptr<Op> op;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        collective_cv_.wait(lock, [this] { return stopping_ || !collective_queue_.empty(); });
        if (collective_queue_.empty()) return;  // stopping, nothing left
        op = std::move(collective_queue_.front());
        collective_queue_.pop_front();
        if (poisoned_) {
          op->work->mark_failed(str_cat(op->work->description(), ": not started: ", poison_message_));
          continue;
        }
        running_collective_ = op->work;
        running_since_ = op->enqueued;
      }
      run_collective(*op);
      std::lock_guard<std::mutex> lock(mutex_);
      running_collective_.reset();
      if (poisoned_) abandoned_.insert(abandoned_.end(), op->keep_alive.begin(), op->keep_alive.end());
    }
  }

  void run_collective(Op& op) {
    detail::note_operation(op.work);  // what the heartbeat tells the peers; in flight until it completes
    op.work->mark_started();
    if (size_ > 1 && !wait_for_arrival(op)) return;
    if (verify_ && size_ > 1) {
      std::vector<Signature> all(static_cast<size_t>(size_));
      int code = MPI_Allgather(&op.signature, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, check_comm_);
      if (code != MPI_SUCCESS) {
        poison(str_cat(op.work->description(), ": MPI error while exchanging call signatures: ",
                       mpi_error_text(code), " (a peer rank has probably died)"));
        return;
      }
      for (int r = 0; r < size_; ++r) {
        const Signature& theirs = all[static_cast<size_t>(r)];
        if (theirs == op.signature) continue;
        // Every rank sees the same table, so every rank fails this op with the same words and
        // the group stays in step for the next call.
        const std::string message = mismatch_message(op.work->description(), rank_, op.signature, r, theirs);
        op.work->mark_mismatched(message);
        detail::flight_dump_on_failure(message, /*ask_peers=*/false);  // every rank sees it and dumps
        return;
      }
    }
    int code = op.run(data_comm_);
    if (code != MPI_SUCCESS) {
      poison(str_cat(op.work->description(), ": MPI error: ", mpi_error_text(code),
                     " (a peer rank has probably died)"));
      return;
    }
    MPI_Status status{};
    complete(op, status);
  }

  // Waits until every rank has called this collective: an MPI_Ibarrier on check_comm_ (only
  // this thread uses it, in call order), tested hard for 200 us (ranks in step arrive within
  // microseconds), then yielding until 2 ms, then sleeping 50 us growing to 2 ms between tests.
  // A sleeping rank leaves its core to whatever else runs: the peers it waits for, above all.
  // Returns false if the group was poisoned meanwhile (the watchdog or a lost peer: the op has
  // been failed already). The barrier's request is then left posted: MPI cannot cancel a
  // collective, and a poisoned job is aborted at exit, not finalised.
  bool wait_for_arrival(Op& op) {
    MPI_Request request = MPI_REQUEST_NULL;
    int code = MPI_Ibarrier(check_comm_, &request);
    auto started = Clock::now();
    auto nap = std::chrono::microseconds(50);
    int done = 0;
    while (code == MPI_SUCCESS) {
      code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS || done) break;
      if (poisoned_) return false;
      auto waited = Clock::now() - started;
      if (waited < std::chrono::microseconds(200)) continue;
      if (waited < std::chrono::milliseconds(2)) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(nap);
      nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(2));
    }
    if (code != MPI_SUCCESS) {
      poison(str_cat(op.work->description(), ": MPI error while waiting for the ranks to arrive: ",
                     mpi_error_text(code), " (a peer rank has probably died)"));
      return false;
    }
    return true;
  }

  // ---- lane 2: point-to-point ops, and the watchdog for both lanes ----

  void progress_loop() {
    std::deque<std::unique_ptr<Op> > active;
    auto last_progress = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (active.empty()) {
          // Nothing to poll: wake for new p2p ops, or every 100 ms to watch the collective lane.
          p2p_cv_.wait_for(lock, std::chrono::milliseconds(100),
                           [this] { return stopping_ || !p2p_queue_.empty(); });
          if (stopping_ && p2p_queue_.empty()) return;
        }
        while (!p2p_queue_.empty()) {
          active.push_back(std::move(p2p_queue_.front()));
          p2p_queue_.pop_front();
        }
        if (poisoned_) {
          for (auto& op : active)
            op->work->mark_failed(str_cat(op->work->description(), ": abandoned: ", poison_message_));
          for (auto& op : active)
            abandoned_.insert(abandoned_.end(), op->keep_alive.begin(), op->keep_alive.end());
          active.clear();
          continue;
        }
      }
      bool progressed = false;
      for (auto& op : active) {
        int done = 0;
        MPI_Status status;
        int code = MPI_Test(&op->request, &done, &status);
        if (code != MPI_SUCCESS) {
          poison(str_cat(op->work->description(), ": MPI error: ", mpi_error_text(code),
                         " (a peer rank has probably died)"));
          break;
        }
        if (done) {
          progressed = true;
          complete(*op, status);
          op.reset();
        }
      }
      active.erase(std::remove(active.begin(), active.end(), nullptr), active.end());
      watch(active);
      // Poll hard right after progress (latency), then back off so a long wait leaves the cores
      // to the computation this communication is meant to overlap with.
      auto now = Clock::now();
      if (progressed) {
        last_progress = now;
      } else if (!active.empty()) {
        if (now - last_progress < std::chrono::microseconds(500))
          std::this_thread::yield();
        else
          std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  // The watchdog: the oldest unfinished op of either lane against the timeout.
  void watch(const std::deque<std::unique_ptr<Op> >& active) {
    auto limit = timeout_.load();
    auto now = Clock::now();
    std::string late;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (poisoned_) return;
      if (running_collective_ && now - running_since_ > limit) late = running_collective_->description();
    }
    for (auto& op : active)
      if (late.empty() && now - op->enqueued > limit) late = op->work->description();
    if (late.empty()) return;
    poison(str_cat(
        late, " did not complete within ", std::chrono::duration<double>(limit).count(),
        " s: a peer rank is dead or stuck, or did not make the same call. This group cannot be used any "
        "more; the job is aborted at exit (timeout: InitOptions::timeout or MG_TIMEOUT_S)"));
  }

  // Fails the running collective and everything queued with `message`; later calls fail at once.
  // (The progress thread fails its own active p2p ops when it sees the flag.) `report`: print
  // the message (the heartbeat prints its own once, not once per group).
  void poison(const std::string& message, bool report = true) {
    std::deque<std::unique_ptr<Op> > queued;
    WorkPtr running;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (poisoned_) return;
      poisoned_ = true;
      poison_message_ = message;
      queued.swap(collective_queue_);
      for (auto& op : p2p_queue_) queued.push_back(std::move(op));
      p2p_queue_.clear();
      running = running_collective_;
    }
    if (report) {
      std::fprintf(stderr, "[multigrad rank %d] %s\n", rank_, message.c_str());
      std::fflush(stderr);
    }
    runtime_->poison();
    if (running) {
      const std::string& what = running->description();
      bool is_the_culprit = message.compare(0, what.size(), what) == 0;
      running->mark_failed(is_the_culprit ? message : str_cat(what, ": abandoned: ", message));
    }
    for (auto& op : queued)
      op->work->mark_failed(str_cat(op->work->description(), ": not started: ", message));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& op : queued)
        abandoned_.insert(abandoned_.end(), op->keep_alive.begin(), op->keep_alive.end());
    }
    // The flight recorder's dump, which asks the peers for theirs (a lost peer: the heartbeat dumps).
    if (report) detail::flight_dump_on_failure(message, /*ask_peers=*/true);
  }

  std::shared_ptr<MpiRuntime> runtime_;
  MPI_Comm data_comm_ = MPI_COMM_NULL;
  MPI_Comm check_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<std::chrono::milliseconds> timeout_;
  bool verify_;
  std::atomic<int64_t> collective_count_{0};
  int peer_lost_id_ = 0;

  std::mutex mutex_;  // guards everything below
  std::condition_variable collective_cv_, p2p_cv_;
  std::deque<std::unique_ptr<Op> > collective_queue_, p2p_queue_;
  WorkPtr running_collective_;
  Clock::time_point running_since_;
  bool stopping_ = false;
  std::atomic<bool> poisoned_{false};
  std::string poison_message_;
  std::vector<Tensor> abandoned_;  // buffers MPI may still touch after a failure: kept until exit

  std::thread collective_thread_, progress_thread_;
};

}  // namespace

std::shared_ptr<Backend> make_mpi_backend(const LaunchInfo& launch, std::chrono::milliseconds timeout,
                                          bool verify_collectives) {
  auto backend = std::make_shared<MpiBackend>(MPI_COMM_WORLD, timeout, verify_collectives);
  MG_CHECK(backend->rank() == launch.rank && backend->size() == launch.world_size,
           "init_process_group: the launcher (", launch.launcher, ") says rank ", launch.rank, " of ",
           launch.world_size, " but MPI says rank ", backend->rank(), " of ", backend->size(),
           " (was the program started by a different MPI's mpirun?)");
  return backend;
}

#endif  // MG_HAS_MPI

}  // namespace mg::parallel
