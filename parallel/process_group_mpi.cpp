// The MPI backend: collectives on CPU tensors over OpenMPI (or any MPI-3 library).
//
// Shape of the implementation (the same as c10d's, with one twist):
//
//   caller threads ──enqueue──▶ queue ──▶ progress thread ──MPI_I*──▶ MPI
//        ▲                                     │ MPI_Test
//        └──────── Work::wait() ◀── complete ──┘
//
// * Every call becomes an Op on a FIFO queue and returns its Work at once.
// * One progress thread per group owns all MPI calls of that group. It *posts* each op with
//   the non-blocking MPI-3 call (MPI_Iallreduce, MPI_Isend, ...) and then polls the requests
//   with MPI_Test. Because nothing ever blocks inside MPI, the same thread can notice that an
//   op has been in flight for longer than the timeout and fail it: that is the watchdog, and
//   it is why a dead peer becomes an error instead of a hang.
// * Collectives are posted in call order (MPI matches them by order on a communicator);
//   point-to-point ops are posted as soon as they arrive (they match by source and tag, and
//   holding a recv back behind a collective could deadlock a correct program).
// * With verify_collectives, each collective first allgathers a 4-number signature (op, root
//   or reduce op, dtype, element count) on a second communicator, and is posted only when all
//   signatures agree. Every rank sees every signature, so all ranks fail the same op with the
//   same message and the group stays usable.
//
// bf16/f16 have no MPI datatype: they travel as MPI_UINT16_T with user-defined reduction ops
// that widen to float, reduce and round back. Avg is a sum followed by a division on our own
// kernel (Tensor::mul_) when the op completes.
//
// MPI is initialised once per process (MPI_THREAD_MULTIPLE when the library offers it; otherwise
// one mutex serialises the progress threads' MPI calls) and finalised when the last group is
// gone at exit -- or aborted (MPI_Abort) if any op timed out, since a communicator with requests
// stuck in it cannot be finalised.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/grad_mode.h"
#include "core/half.h"
#include "parallel/process_group.h"

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

class MpiRuntime {
 public:
  static std::shared_ptr<MpiRuntime> get() {
    static std::mutex creation;
    static std::shared_ptr<MpiRuntime> runtime;  // lives until exit; groups hold it too
    std::lock_guard<std::mutex> lock(creation);
    if (!runtime) runtime = std::shared_ptr<MpiRuntime>(new MpiRuntime());
    return runtime;
  }

  ~MpiRuntime() {
    if (poisoned_) {
      std::fprintf(stderr,
                   "multigrad: aborting the MPI job: a collective timed out or failed on this rank\n");
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (MPI_Op& op : half_ops_) MPI_Op_free(&op);
    if (owns_mpi_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    }
  }

  // Held around MPI calls when the library is not MPI_THREAD_MULTIPLE.
  std::unique_lock<std::mutex> lock() {
    return multithreaded_ ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(mutex_);
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
      check(code == MPI_SUCCESS, "init_process_group: MPI_Init_thread failed: ", mpi_error_text(code));
      owns_mpi_ = true;
    } else {
      MPI_Query_thread(&provided);
    }
    check(provided >= MPI_THREAD_SERIALIZED, "init_process_group: the MPI library offers thread level ",
          provided, " but multigrad's progress thread needs at least MPI_THREAD_SERIALIZED");
    multithreaded_ = provided == MPI_THREAD_MULTIPLE;
    MPI_Op_create(&reduce_halves<bf16, SumFloat>, 1, &half_ops_[0]);
    MPI_Op_create(&reduce_halves<bf16, MaxFloat>, 1, &half_ops_[1]);
    MPI_Op_create(&reduce_halves<bf16, MinFloat>, 1, &half_ops_[2]);
    MPI_Op_create(&reduce_halves<f16, SumFloat>, 1, &half_ops_[3]);
    MPI_Op_create(&reduce_halves<f16, MaxFloat>, 1, &half_ops_[4]);
    MPI_Op_create(&reduce_halves<f16, MinFloat>, 1, &half_ops_[5]);
  }

  std::mutex mutex_;
  bool owns_mpi_ = false;
  bool multithreaded_ = false;
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

enum class OpKind : int64_t {
  Allreduce = 1,
  Broadcast,
  Reduce,
  Allgather,
  ReduceScatter,
  Barrier,
  Send,
  Recv
};

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::Allreduce: return "allreduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::Allgather: return "allgather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Barrier: return "barrier";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
  }
  return "?";
}

// What a collective call looks like, exchanged between ranks to catch mismatched calls.
struct Signature {
  int64_t kind = 0;
  int64_t detail = 0;  // the reduce op, or the root
  int64_t dtype = 0;
  int64_t count = 0;

  bool operator==(const Signature& o) const {
    return kind == o.kind && detail == o.detail && dtype == o.dtype && count == o.count;
  }
  // "allreduce(sum) f32[1024]", "broadcast(root 0) f32[10]", "barrier"
  std::string str() const {
    auto op_kind = static_cast<OpKind>(kind);
    std::string text = op_kind_name(op_kind);
    if (op_kind == OpKind::Barrier) return text;
    if (op_kind == OpKind::Broadcast)
      text += str_cat("(root ", detail, ")");
    else if (op_kind == OpKind::Reduce)
      text += str_cat("(", reduce_op_name(static_cast<ReduceOp>(detail % 16)), ", root ", detail / 16, ")");
    else if (op_kind != OpKind::Allgather)
      text += str_cat("(", reduce_op_name(static_cast<ReduceOp>(detail)), ")");
    return str_cat(text, " ", dtype_name(static_cast<DType>(dtype)), "[", count, "]");
  }
};

struct Op {
  WorkPtr work;
  bool collective = true;
  Signature signature;
  // Posts the data transfer; returns an MPI error code.
  std::function<int(MPI_Comm, MPI_Request*)> post;
  // Runs after the transfer completed (averaging, received-length checks); may throw.
  std::function<void(const MPI_Status&)> finish;
  std::vector<Tensor> keep_alive;  // MPI reads/writes these buffers until the op completes
  Clock::time_point enqueued;

  enum class Stage { Queued, Checking, Ready, Running, Done } stage = Stage::Queued;
  std::vector<Signature> all_signatures;  // filled by the verification allgather
  MPI_Request check_request = MPI_REQUEST_NULL;
  MPI_Request data_request = MPI_REQUEST_NULL;
};

// ---- the backend ----------------------------------------------------------------------------------

class MpiBackend : public Backend {
 public:
  MpiBackend(const LaunchInfo& launch, std::chrono::milliseconds timeout, bool verify)
      : runtime_(MpiRuntime::get()), timeout_(timeout), verify_(verify) {
    {
      auto lock = runtime_->lock();
      MPI_Comm_dup(MPI_COMM_WORLD, &data_comm_);
      MPI_Comm_dup(MPI_COMM_WORLD, &check_comm_);
      // Errors come back as return codes (then become mg::Errors) instead of killing the job.
      MPI_Comm_set_errhandler(data_comm_, MPI_ERRORS_RETURN);
      MPI_Comm_set_errhandler(check_comm_, MPI_ERRORS_RETURN);
      MPI_Comm_rank(data_comm_, &rank_);
      MPI_Comm_size(data_comm_, &size_);
    }
    check(rank_ == launch.rank && size_ == launch.world_size, "init_process_group: the launcher (",
          launch.launcher, ") says rank ", launch.rank, " of ", launch.world_size, " but MPI says rank ",
          rank_, " of ", size_, " (was the program started by a different MPI's mpirun?)");
    progress_thread_ = std::thread([this] { progress_loop(); });
  }

  ~MpiBackend() override {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    progress_thread_.join();
    if (!poisoned_) {
      auto lock = runtime_->lock();
      MPI_Comm_free(&data_comm_);
      MPI_Comm_free(&check_comm_);
    }
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
    return enqueue(
        {OpKind::Allreduce, static_cast<int64_t>(op), tensor}, {tensor},
        [=](MPI_Comm comm, MPI_Request* request) {
          return MPI_Iallreduce(MPI_IN_PLACE, data, count, type, mpi_op, comm, request);
        },
        average_after(tensor, op));
  }

  WorkPtr broadcast(Tensor& tensor, int root) override {
    void* data = tensor.data_ptr();
    int count = checked_count(tensor, "broadcast");
    MPI_Datatype type = mpi_datatype(tensor.dtype());
    return enqueue({OpKind::Broadcast, root, tensor}, {tensor}, [=](MPI_Comm comm, MPI_Request* request) {
      return MPI_Ibcast(data, count, type, root, comm, request);
    });
  }

  WorkPtr reduce(Tensor& tensor, int root, ReduceOp op) override {
    MPI_Op mpi_op = reduction(tensor.dtype(), op, "reduce");
    void* data = tensor.data_ptr();
    int count = checked_count(tensor, "reduce");
    MPI_Datatype type = mpi_datatype(tensor.dtype());
    bool is_root = rank_ == root;
    return enqueue(
        {OpKind::Reduce, root * 16 + static_cast<int64_t>(op), tensor}, {tensor},
        [=](MPI_Comm comm, MPI_Request* request) {
          // The root reduces into its own buffer; the others only send theirs.
          return MPI_Ireduce(is_root ? MPI_IN_PLACE : data, is_root ? data : nullptr, count, type, mpi_op,
                             root, comm, request);
        },
        is_root ? average_after(tensor, op) : nullptr);
  }

  WorkPtr allgather(Tensor& output, const Tensor& input) override {
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    int count = checked_count(input, "allgather");
    MPI_Datatype type = mpi_datatype(input.dtype());
    return enqueue({OpKind::Allgather, 0, input}, {input, output}, [=](MPI_Comm comm, MPI_Request* request) {
      return MPI_Iallgather(in, count, type, out, count, type, comm, request);
    });
  }

  WorkPtr reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) override {
    MPI_Op mpi_op = reduction(input.dtype(), op, "reduce_scatter");
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    int count = checked_count(output, "reduce_scatter");
    checked_count(input, "reduce_scatter");
    MPI_Datatype type = mpi_datatype(input.dtype());
    return enqueue(
        {OpKind::ReduceScatter, static_cast<int64_t>(op), output}, {input, output},
        [=](MPI_Comm comm, MPI_Request* request) {
          return MPI_Ireduce_scatter_block(in, out, count, type, mpi_op, comm, request);
        },
        average_after(output, op));
  }

  WorkPtr barrier() override {
    return enqueue({OpKind::Barrier, 0, Tensor()}, {},
                   [](MPI_Comm comm, MPI_Request* request) { return MPI_Ibarrier(comm, request); });
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
          check(received == count, what, ": the sender sent ", received, " elements, this rank expected ",
                count);
        });
  }

 private:
  struct CallShape {
    OpKind kind;
    int64_t detail;
    Tensor tensor;  // dtype and count for the signature (undefined for barrier)
  };

  static int checked_count(const Tensor& tensor, const char* op) {
    check(tensor.numel() <= INT_MAX, "ProcessGroup::", op, ": ", tensor.numel(),
          " elements exceed MPI's int count; split the tensor");
    return static_cast<int>(tensor.numel());
  }

  MPI_Op reduction(DType dtype, ReduceOp op, const char* what) const {
    if (dtype == DType::bf16 || dtype == DType::f16) return runtime_->half_op(dtype, op);
    check(dtype != DType::boolean || op == ReduceOp::Max || op == ReduceOp::Min, "ProcessGroup::", what, "(",
          reduce_op_name(op), "): bool tensors reduce with max (any) or min (all) only");
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

  WorkPtr enqueue(CallShape shape, std::vector<Tensor> keep_alive,
                  std::function<int(MPI_Comm, MPI_Request*)> post,
                  std::function<void(const MPI_Status&)> finish = nullptr) {
    auto op = std::make_unique<Op>();
    op->collective = true;
    op->signature.kind = static_cast<int64_t>(shape.kind);
    op->signature.detail = shape.detail;
    if (shape.tensor.defined()) {
      op->signature.dtype = static_cast<int64_t>(shape.tensor.dtype());
      op->signature.count = shape.tensor.numel();
    }
    int64_t number = ++collective_count_;
    op->work =
        std::make_shared<Work>(str_cat(op->signature.str(), " #", number, " on rank ", rank_, " of ", size_));
    op->keep_alive = std::move(keep_alive);
    op->post = std::move(post);
    op->finish = std::move(finish);
    return push(std::move(op));
  }

  WorkPtr enqueue_p2p(const std::string& what, const Tensor& tensor,
                      std::function<int(MPI_Comm, MPI_Request*)> post,
                      std::function<void(const MPI_Status&)> finish = nullptr) {
    auto op = std::make_unique<Op>();
    op->collective = false;
    op->work = std::make_shared<Work>(str_cat(what, " on rank ", rank_, " of ", size_));
    op->keep_alive = {tensor};
    op->post = std::move(post);
    op->finish = std::move(finish);
    return push(std::move(op));
  }

  WorkPtr push(std::unique_ptr<Op> op) {
    WorkPtr work = op->work;
    op->enqueued = Clock::now();
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      if (poisoned_) {
        work->mark_failed(str_cat(work->description(), ": not started: ", poison_message_));
        return work;
      }
      queue_.push_back(std::move(op));
    }
    queue_cv_.notify_one();
    return work;
  }

  // ---- the progress thread ----

  void progress_loop() {
    auto last_progress = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        if (active_.empty()) {
          // Nothing in flight: sleep until there is work (no polling while idle).
          queue_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
          if (queue_.empty() && stopping_) return;
        }
        while (!queue_.empty()) {
          active_.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
      }
      bool progressed = false;
      {
        auto mpi_lock = runtime_->lock();
        progressed = advance();
      }
      check_timeouts();
      // Poll hard right after progress (latency), then back off so an idle wait leaves the
      // cores to the computation this communication is meant to overlap with.
      auto now = Clock::now();
      if (progressed) {
        last_progress = now;
      } else if (now - last_progress < std::chrono::microseconds(200)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // One pass over the active ops; returns whether anything changed.
  bool advance() {
    bool progressed = false;
    bool collective_blocked = false;  // an earlier collective is not posted yet: keep order
    for (auto& op_ptr : active_) {
      Op& op = *op_ptr;
      if (op.stage == Op::Stage::Done) continue;
      if (!op.collective) {
        if (op.stage == Op::Stage::Queued) progressed |= post_data(op);
      } else {
        if (op.stage == Op::Stage::Queued && verify_ && size_ > 1) {
          // Signatures are posted eagerly, in call order, on their own communicator.
          op.all_signatures.resize(static_cast<size_t>(size_));
          int code = MPI_Iallgather(&op.signature, 4, MPI_INT64_T, op.all_signatures.data(), 4, MPI_INT64_T,
                                    check_comm_, &op.check_request);
          if (!fail_on_error(op, code, "posting the signature exchange")) op.stage = Op::Stage::Checking;
          progressed = true;
        } else if (op.stage == Op::Stage::Queued) {
          op.stage = Op::Stage::Ready;
        }
        if (op.stage == Op::Stage::Checking) {
          int done = 0;
          int code = MPI_Test(&op.check_request, &done, MPI_STATUS_IGNORE);
          if (fail_on_error(op, code, "exchanging signatures")) {
            progressed = true;
          } else if (done) {
            progressed = true;
            verify_signatures(op);
          }
        }
        if (op.stage == Op::Stage::Ready && !collective_blocked) progressed |= post_data(op);
        if (op.stage == Op::Stage::Checking || op.stage == Op::Stage::Ready) collective_blocked = true;
      }
      if (op.stage == Op::Stage::Running) {
        int done = 0;
        MPI_Status status;
        int code = MPI_Test(&op.data_request, &done, &status);
        if (fail_on_error(op, code, "in flight")) {
          progressed = true;
        } else if (done) {
          progressed = true;
          complete(op, status);
        }
      }
    }
    // Drop finished ops from the front (the rest keep their order).
    while (!active_.empty() && active_.front()->stage == Op::Stage::Done) active_.pop_front();
    return progressed;
  }

  bool post_data(Op& op) {
    int code = op.post(data_comm_, &op.data_request);
    if (!fail_on_error(op, code, "posting")) op.stage = Op::Stage::Running;
    return true;
  }

  void verify_signatures(Op& op) {
    for (int r = 0; r < size_; ++r) {
      const Signature& theirs = op.all_signatures[static_cast<size_t>(r)];
      if (theirs == op.signature) continue;
      // Every rank sees the same table, so every rank fails this op with the same words and
      // the group stays in step for the next call.
      std::string message = str_cat(op.work->description(), ": the ranks' calls do not match: rank ", rank_,
                                    " called ", op.signature.str(), ", rank ", r, " called ", theirs.str(),
                                    " (collectives must be called in the same order with the same dtype and "
                                    "element count on every rank)");
      op.stage = Op::Stage::Done;
      op.work->mark_failed(message);
      return;
    }
    op.stage = Op::Stage::Ready;
  }

  void complete(Op& op, const MPI_Status& status) {
    op.stage = Op::Stage::Done;
    try {
      if (op.finish) op.finish(status);
    } catch (const std::exception& e) {
      op.work->mark_failed(e.what());
      op.keep_alive.clear();
      return;
    }
    op.keep_alive.clear();
    op.work->mark_completed();
  }

  // An MPI error poisons the group: the communicator's state is unknown from here on.
  bool fail_on_error(Op& op, int code, const char* when) {
    if (code == MPI_SUCCESS) return false;
    poison_all(str_cat(op.work->description(), ": MPI error ", when, ": ", mpi_error_text(code),
                       " (a peer rank has probably died)"));
    return true;
  }

  void check_timeouts() {
    auto limit = timeout_.load();
    auto now = Clock::now();
    for (auto& op : active_) {
      if (op->stage == Op::Stage::Done || now - op->enqueued <= limit) continue;
      auto seconds = std::chrono::duration<double>(limit).count();
      poison_all(str_cat(op->work->description(), " did not complete within ", seconds,
                         " s: a peer rank is dead or stuck, or did not make the same call. This group "
                         "cannot be used any more; the job is aborted at exit (timeout: "
                         "InitOptions::timeout or MG_TIMEOUT_S)"));
      return;
    }
  }

  // Fails every active and queued op with `message`; later calls fail at once.
  void poison_all(const std::string& message) {
    if (poisoned_) return;
    std::fprintf(stderr, "[multigrad rank %d] %s\n", rank_, message.c_str());
    std::fflush(stderr);
    runtime_->poison();
    std::deque<std::unique_ptr<Op> > queued;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      poisoned_ = true;
      poison_message_ = message;
      queued.swap(queue_);
    }
    for (auto& op : active_) {
      if (op->stage == Op::Stage::Done) continue;
      op->stage = Op::Stage::Done;
      const std::string& what = op->work->description();
      bool is_the_culprit = message.compare(0, what.size(), what) == 0;
      op->work->mark_failed(is_the_culprit ? message : str_cat(what, ": abandoned: ", message));
      // Requests still inside MPI may touch these buffers: keep them until the process ends.
      abandoned_.insert(abandoned_.end(), op->keep_alive.begin(), op->keep_alive.end());
    }
    for (auto& op : queued)
      op->work->mark_failed(str_cat(op->work->description(), ": not started: ", message));
    active_.clear();
  }

  std::shared_ptr<MpiRuntime> runtime_;
  MPI_Comm data_comm_ = MPI_COMM_NULL;
  MPI_Comm check_comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<std::chrono::milliseconds> timeout_;
  bool verify_;
  std::atomic<int64_t> collective_count_{0};

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::unique_ptr<Op> > queue_;  // called, not yet seen by the progress thread
  bool stopping_ = false;
  std::atomic<bool> poisoned_{false};
  std::string poison_message_;

  // Progress-thread state.
  std::deque<std::unique_ptr<Op> > active_;
  std::vector<Tensor> abandoned_;
  std::thread progress_thread_;
};

}  // namespace

std::shared_ptr<Backend> make_mpi_backend(const LaunchInfo& launch, std::chrono::milliseconds timeout,
                                          bool verify_collectives) {
  return std::make_shared<MpiBackend>(launch, timeout, verify_collectives);
}

#endif  // MG_HAS_MPI

}  // namespace mg::parallel
