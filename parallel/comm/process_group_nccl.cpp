// The NCCL backend: collectives and point-to-point ops on CUDA tensors (c10d's ProcessGroupNCCL,
// written anew). Built when the build has CUDA and NCCL (MG_HAS_CUDA, MG_HAS_NCCL).
//
// NOTE: this backend compiles and links, but it has never run on a GPU yet (the machines it was
// written on have none). tests/parallel/comm/test_nccl_collectives.cpp is the check to run first on one.
//
// Shape of the implementation:
//
//   caller thread: [signature check over MPI] ─▶ record "ready" on the caller's current stream
//                  ─▶ comm stream waits for "ready" ─▶ ncclAllReduce(..., comm stream)
//                  ─▶ record "done" on the comm stream ─▶ Work handed back at once
//   watchdog thread: polls every in-flight op's "done" event and ncclCommGetAsyncError;
//                    done ─▶ Work completed; late or async error ─▶ every pending Work fails,
//                    ncclCommAbort, the group is poisoned (later ops fail at once)
//
// * Creation. Rank 0 makes the NCCL unique ids and the group's CPU backend (MPI) broadcasts
//   them; every rank then joins the communicators with ncclCommInitRank on its own GPU. NCCL
//   refuses two ranks on one physical GPU, so MG_VIRTUAL_GPUS cannot stand in for a second GPU.
// * Five communicators, each with its own non-blocking stream ("lanes"): one for the
//   collectives, and four for point-to-point messages, chosen by the message's direction (to a
//   higher or to a lower rank) and the parity of its sender. NCCL runs the ops of one
//   communicator one after another, and an unmatched ncclRecv blocks everything queued behind it
//   on its stream; if sends and receives shared one stream, two ranks that each post a receive
//   before their send (the ring all-reduce does exactly that) would wait for each other forever.
//   By direction, a rank's sends to a peer never queue behind its receives from that peer. By
//   sender parity, a middle rank of a ring receives from r-1 and sends to r+1 on two different
//   streams, so every link of the ring moves at once instead of one link after the other (with
//   one upward lane, each rank's send waited on its stream for its receive to complete).
// * Ordering, no host syncs. Each op is ordered after the work already queued on the tensor's
//   current stream by an event ("ready"), and its completion is an event recorded on the lane's
//   stream after the NCCL call ("done"). The op's tensors are recorded on the lane's stream with
//   the caching allocator (record_stream, as c10d does) and not kept referenced: freed by the
//   caller, their memory is handed out again only once the lane's stream has passed the point of
//   the free -- device-side, whenever the watchdog happens to look. Keeping them referenced until
//   the watchdog saw "done" made reuse depend on the watchdog's timing: under load it was late,
//   and FSDP's per-step gradient buffers could not be reused (a cudaMalloc every few steps).
//   Memory the allocator did not hand out (none of the framework's) stays referenced as before.
// * Work::wait() blocks the host until "done" has fired (the watchdog completes the Work), then
//   makes the waiting thread's current stream on the device wait for "done" too (Work's wait
//   hook). Kernels queued after wait() are thus ordered after the communication on the device,
//   whichever stream they go to. Work::then() callbacks run on the watchdog thread with the
//   lane's stream current; they should do host work only (DDP's records a time).
// * Calls are issued on the caller's thread under one mutex, so the ops of a lane reach NCCL in
//   call order (which must be the same on every rank, as with MPI).
// * With verify_collectives, each collective first exchanges the 4-number signature
//   (process_group_signature.h) through the CPU backend's allgather, blocking the caller for one
//   small MPI round trip; every rank then fails a mismatched call with both sides named and
//   skips the NCCL call, so the group stays usable. The exchange can itself meet a different
//   CPU collective on another rank (Join's notification, say, which is on CPU tensors): the CPU
//   backend fails it on every rank alike, and so does this one, still without breaking the group
//   (aborting it here would strand the peers' GPU ops in flight until their timeout).
//   Point-to-point ops have no signature.
// * Avg is ncclAvg (NCCL >= 2.10). bool tensors travel as uint8 and reduce with max/min only.
// * The group's barrier() (ProcessGroup::barrier) stays on the CPU backend: a host-level
//   barrier. This backend's own barrier is an all-reduce of one element on the collective lane.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/heartbeat.h"
#include "parallel/comm/process_group.h"

#if defined(MG_HAS_NCCL) && defined(MG_HAS_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>

#include "core/cuda_allocator.h"
#include "core/cuda_stream.h"
#include "parallel/comm/process_group_signature.h"
#endif

namespace mg::parallel {

#if !(defined(MG_HAS_NCCL) && defined(MG_HAS_CUDA))

std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Backend>, Device, std::chrono::milliseconds,
                                           bool) {
  return nullptr;
}

#else

namespace {

using Clock = std::chrono::steady_clock;
using detail::OpKind;
using detail::Signature;

// NCCL's own words for a failed call, plus the communicator's last error when there is one.
std::string nccl_error_text(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += str_cat(" (", last, ")");
  return text;
}

void nccl_check(ncclResult_t result, ncclComm_t comm, const std::string& what) {
  MG_CHECK(result == ncclSuccess, what, " failed: ", nccl_error_text(result, comm));
}

ncclDataType_t nccl_datatype(DType dtype) {
  switch (dtype) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::f16: return ncclFloat16;
    case DType::bf16: return ncclBfloat16;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::boolean: return ncclUint8;
  }
  throw Error("nccl_datatype: unknown dtype");
}

ncclRedOp_t nccl_reduction(DType dtype, ReduceOp op, const char* what) {
  MG_CHECK(dtype != DType::boolean || op == ReduceOp::Max || op == ReduceOp::Min, "ProcessGroup::", what, "(",
           reduce_op_name(op), "): bool tensors reduce with max (any) or min (all) only");
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  return ncclSum;
}

// One communicator and the stream its ops run on.
struct Lane {
  const char* name;
  ncclComm_t comm = nullptr;
  cuda::Stream stream;
};
enum LaneId : int { kCollectiveLane = 0, kLanes = 5 };

// The lane of a message from `sender` to `receiver`: 1 + 2 * (downward) + (sender parity). Both
// ends compute the same lane, so the send and its receive meet on one communicator.
LaneId p2p_lane(int sender, int receiver) {
  return static_cast<LaneId>(1 + 2 * (receiver < sender ? 1 : 0) + sender % 2);
}

// An op NCCL has been given and the watchdog is waiting for.
struct InFlight {
  WorkPtr work;
  LaneId lane;
  std::shared_ptr<cuda::Event> done;
  std::vector<Tensor> keep_alive;  // tensors not recorded with the allocator: used until `done`
  Clock::time_point started;
};

class NcclBackend : public Backend {
 public:
  NcclBackend(std::shared_ptr<Backend> cpu, Device device, std::chrono::milliseconds timeout, bool verify)
      : cpu_(std::move(cpu)), device_(device), timeout_(timeout), verify_(verify) {
    MG_CHECK(device_.is_cuda(), "NCCL backend: the rank's device must be a CUDA device, got ", device_);
    rank_ = cpu_->rank();
    size_ = cpu_->size();
    lanes_[kCollectiveLane].name = "collective";
    lanes_[1].name = "point-to-point (even ranks to higher ranks)";
    lanes_[2].name = "point-to-point (odd ranks to higher ranks)";
    lanes_[3].name = "point-to-point (even ranks to lower ranks)";
    lanes_[4].name = "point-to-point (odd ranks to lower ranks)";

    // Rank 0 makes one unique id per communicator; the CPU backend broadcasts them as bytes.
    constexpr int64_t kIdWords = (sizeof(ncclUniqueId) + sizeof(int64_t) - 1) / sizeof(int64_t);
    Tensor ids = zeros({kLanes * kIdWords}, TensorOptions{DType::i64, Device::cpu()});
    auto* id_bytes = static_cast<char*>(ids.data_ptr());
    if (rank_ == 0) {
      for (int lane = 0; lane < kLanes; ++lane) {
        ncclUniqueId id;
        nccl_check(ncclGetUniqueId(&id), nullptr, "init_process_group: ncclGetUniqueId");
        std::memcpy(id_bytes + lane * kIdWords * sizeof(int64_t), &id, sizeof(id));
      }
    }
    cpu_->broadcast(ids, 0)->wait();

    // Every rank joins the communicators in the same order (ncclCommInitRank blocks until all
    // ranks of that communicator have joined).
    cuda::DeviceGuard guard(device_.index);
    for (int lane = 0; lane < kLanes; ++lane) {
      ncclUniqueId id;
      std::memcpy(&id, id_bytes + lane * kIdWords * sizeof(int64_t), sizeof(id));
      nccl_check(ncclCommInitRank(&lanes_[lane].comm, size_, id, rank_), nullptr,
                 str_cat("init_process_group: ncclCommInitRank (", lanes_[lane].name, " communicator, rank ",
                         rank_, " of ", size_, " on ", device_, ", physical GPU ",
                         cuda::physical_device(device_.index), ")"));
      lanes_[lane].stream = cuda::create_stream(device_.index);
    }
    watchdog_ = std::thread([this] { watchdog_loop(); });
    // A peer the heartbeat finds lost poisons this group too -- on the watchdog's thread, since
    // the abort may wait for an NCCL call to return and the heartbeat must keep beating.
    peer_lost_id_ = detail::on_peer_lost([this](const std::string& message) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        peer_lost_message_ = message;
      }
      wake_.notify_all();
    });
  }

  ~NcclBackend() override {
    detail::forget_peer_lost(peer_lost_id_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    // The watchdog stops once every in-flight op has finished or failed (timeouts still apply).
    if (watchdog_.joinable()) watchdog_.join();
    if (aborted_) return;  // ncclCommAbort freed the communicators, nothing left to destroy
    for (Lane& lane : lanes_)
      if (lane.comm != nullptr) ncclCommDestroy(lane.comm);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const override { return timeout_.load(); }

  WorkPtr allreduce(Tensor& tensor, ReduceOp op) override {
    check_device(tensor, "allreduce");
    ncclRedOp_t nccl_op = nccl_reduction(tensor.dtype(), op, "allreduce");
    void* data = tensor.data_ptr();
    size_t count = static_cast<size_t>(tensor.numel());
    ncclDataType_t type = nccl_datatype(tensor.dtype());
    return collective({OpKind::Allreduce, static_cast<int64_t>(op), tensor}, {tensor},
                      [=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclAllReduce(data, data, count, type, nccl_op, comm, stream);
                      });
  }

  WorkPtr broadcast(Tensor& tensor, int root) override {
    check_device(tensor, "broadcast");
    void* data = tensor.data_ptr();
    size_t count = static_cast<size_t>(tensor.numel());
    ncclDataType_t type = nccl_datatype(tensor.dtype());
    return collective({OpKind::Broadcast, root, tensor}, {tensor}, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(data, data, count, type, root, comm, stream);
    });
  }

  WorkPtr reduce(Tensor& tensor, int root, ReduceOp op) override {
    check_device(tensor, "reduce");
    ncclRedOp_t nccl_op = nccl_reduction(tensor.dtype(), op, "reduce");
    void* data = tensor.data_ptr();
    size_t count = static_cast<size_t>(tensor.numel());
    ncclDataType_t type = nccl_datatype(tensor.dtype());
    // In place: only the root's buffer receives the result (as with the MPI backend).
    return collective({OpKind::Reduce, root * 16 + static_cast<int64_t>(op), tensor}, {tensor},
                      [=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclReduce(data, data, count, type, nccl_op, root, comm, stream);
                      });
  }

  WorkPtr allgather(Tensor& output, const Tensor& input) override {
    check_device(input, "allgather");
    check_device(output, "allgather");
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    size_t count = static_cast<size_t>(input.numel());
    ncclDataType_t type = nccl_datatype(input.dtype());
    return collective({OpKind::Allgather, 0, input}, {input, output},
                      [=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclAllGather(in, out, count, type, comm, stream);
                      });
  }

  WorkPtr reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) override {
    check_device(input, "reduce_scatter");
    check_device(output, "reduce_scatter");
    ncclRedOp_t nccl_op = nccl_reduction(input.dtype(), op, "reduce_scatter");
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    size_t count = static_cast<size_t>(output.numel());
    ncclDataType_t type = nccl_datatype(input.dtype());
    return collective({OpKind::ReduceScatter, static_cast<int64_t>(op), output}, {input, output},
                      [=](ncclComm_t comm, cudaStream_t stream) {
                        return ncclReduceScatter(in, out, count, type, nccl_op, comm, stream);
                      });
  }

  WorkPtr barrier() override {
    Tensor one = zeros({1}, TensorOptions{DType::f32, device_});
    void* data = one.data_ptr();
    return collective({OpKind::Barrier, 0, Tensor()}, {one}, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm, stream);
    });
  }

  // gather, scatter and all-to-all are NCCL point-to-point ops in one group (NCCL has no such
  // collectives); a rank's own block is a device copy on the same stream.
  WorkPtr gather(Tensor& output, const Tensor& input, int root) override {
    check_device(input, "gather");
    const bool is_root = rank_ == root;
    if (is_root) check_device(output, "gather");
    const char* in = static_cast<const char*>(input.data_ptr());
    char* out = is_root ? static_cast<char*>(output.data_ptr()) : nullptr;
    const size_t count = static_cast<size_t>(input.numel()), bytes = input.nbytes();
    ncclDataType_t type = nccl_datatype(input.dtype());
    const int me = rank_, world = size_;
    std::vector<Tensor> keep = {input};
    if (is_root) keep.push_back(output);
    return collective({OpKind::Gather, root, input}, keep, [=](ncclComm_t comm, cudaStream_t stream) {
      return grouped([&]() -> ncclResult_t {
        if (!is_root) return ncclSend(in, count, type, root, comm, stream);
        for (int r = 0; r < world; ++r) {
          if (r == me) {
            if (cudaMemcpyAsync(out + r * bytes, in, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
              return ncclUnhandledCudaError;
          } else if (ncclResult_t e = ncclRecv(out + r * bytes, count, type, r, comm, stream);
                     e != ncclSuccess) {
            return e;
          }
        }
        return ncclSuccess;
      });
    });
  }

  WorkPtr scatter(Tensor& output, const Tensor& input, int root) override {
    check_device(output, "scatter");
    const bool is_root = rank_ == root;
    if (is_root) check_device(input, "scatter");
    const char* in = is_root ? static_cast<const char*>(input.data_ptr()) : nullptr;
    char* out = static_cast<char*>(output.data_ptr());
    const size_t count = static_cast<size_t>(output.numel()), bytes = output.nbytes();
    ncclDataType_t type = nccl_datatype(output.dtype());
    const int me = rank_, world = size_;
    std::vector<Tensor> keep = {output};
    if (is_root) keep.push_back(input);
    return collective({OpKind::Scatter, root, output}, keep, [=](ncclComm_t comm, cudaStream_t stream) {
      return grouped([&]() -> ncclResult_t {
        if (!is_root) return ncclRecv(out, count, type, root, comm, stream);
        for (int r = 0; r < world; ++r) {
          if (r == me) {
            if (cudaMemcpyAsync(out, in + r * bytes, bytes, cudaMemcpyDeviceToDevice, stream) != cudaSuccess)
              return ncclUnhandledCudaError;
          } else if (ncclResult_t e = ncclSend(in + r * bytes, count, type, r, comm, stream);
                     e != ncclSuccess) {
            return e;
          }
        }
        return ncclSuccess;
      });
    });
  }

  WorkPtr all_to_all(Tensor& output, const Tensor& input) override {
    check_device(input, "all_to_all");
    check_device(output, "all_to_all");
    const char* in = static_cast<const char*>(input.data_ptr());
    char* out = static_cast<char*>(output.data_ptr());
    const size_t count = static_cast<size_t>(input.numel() / size_), bytes = input.nbytes() / size_;
    ncclDataType_t type = nccl_datatype(input.dtype());
    const int me = rank_, world = size_;
    return collective(
        {OpKind::AllToAll, 0, input}, {input, output}, [=](ncclComm_t comm, cudaStream_t stream) {
          return grouped([&]() -> ncclResult_t {
            for (int r = 0; r < world; ++r) {
              if (r == me) {
                if (cudaMemcpyAsync(out + r * bytes, in + r * bytes, bytes, cudaMemcpyDeviceToDevice,
                                    stream) != cudaSuccess)
                  return ncclUnhandledCudaError;
                continue;
              }
              if (ncclResult_t e = ncclSend(in + r * bytes, count, type, r, comm, stream); e != ncclSuccess)
                return e;
              if (ncclResult_t e = ncclRecv(out + r * bytes, count, type, r, comm, stream); e != ncclSuccess)
                return e;
            }
            return ncclSuccess;
          });
        });
  }

  // The members' own NCCL backend: a CPU subgroup of ours carries its unique ids (every rank
  // of this backend calls this, as ProcessGroup::new_group does; the others get nullptr).
  std::shared_ptr<Backend> new_group(const std::vector<int>& ranks) override {
    std::shared_ptr<Backend> cpu_members = cpu_->new_group(ranks);
    if (cpu_members == nullptr) return nullptr;
    return std::make_shared<NcclBackend>(std::move(cpu_members), device_, timeout_.load(), verify_);
  }

  // NCCL matches sends and receives between two ranks by order, not by tag: the tag is only
  // named in messages. (The ring all-reduce posts them in matching order on both sides.)
  WorkPtr send(const Tensor& tensor, int dst, int tag) override {
    check_device(tensor, "send");
    const void* data = tensor.data_ptr();
    size_t count = static_cast<size_t>(tensor.numel());
    ncclDataType_t type = nccl_datatype(tensor.dtype());
    std::string what =
        str_cat("send ", dtype_name(tensor.dtype()), "[", count, "] to rank ", dst, " tag ", tag);
    return issue(what, nullptr, p2p_lane(rank_, dst), {tensor}, [=](ncclComm_t comm, cudaStream_t stream) {
      // A group of one: NCCL's documented way to post a lone point-to-point op.
      ncclResult_t started = ncclGroupStart();
      if (started != ncclSuccess) return started;
      ncclResult_t result = ncclSend(data, count, type, dst, comm, stream);
      ncclResult_t ended = ncclGroupEnd();
      return result != ncclSuccess ? result : ended;
    });
  }

  WorkPtr recv(Tensor& tensor, int src, int tag) override {
    check_device(tensor, "recv");
    void* data = tensor.data_ptr();
    size_t count = static_cast<size_t>(tensor.numel());
    ncclDataType_t type = nccl_datatype(tensor.dtype());
    std::string what =
        str_cat("recv ", dtype_name(tensor.dtype()), "[", count, "] from rank ", src, " tag ", tag);
    return issue(what, nullptr, p2p_lane(src, rank_), {tensor}, [=](ncclComm_t comm, cudaStream_t stream) {
      ncclResult_t started = ncclGroupStart();
      if (started != ncclSuccess) return started;
      ncclResult_t result = ncclRecv(data, count, type, src, comm, stream);
      ncclResult_t ended = ncclGroupEnd();
      return result != ncclSuccess ? result : ended;
    });
  }

 private:
  using Call = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

  struct CallShape {
    OpKind kind;
    int64_t detail;
    Tensor tensor;  // dtype and count for the signature (undefined for barrier)
  };

  // Runs `calls` between ncclGroupStart and ncclGroupEnd; the first error wins.
  static ncclResult_t grouped(const std::function<ncclResult_t()>& calls) {
    ncclResult_t started = ncclGroupStart();
    if (started != ncclSuccess) return started;
    ncclResult_t result = calls();
    ncclResult_t ended = ncclGroupEnd();
    return result != ncclSuccess ? result : ended;
  }

  void check_device(const Tensor& tensor, const char* op) const {
    MG_CHECK(tensor.device() == device_, "ProcessGroup::", op, ": the tensor is on ", tensor.device(),
             " but this rank's NCCL communicator is on ", device_, " (move the tensor with .to(", device_,
             "))");
  }

  WorkPtr collective(CallShape shape, std::vector<Tensor> keep_alive, Call call) {
    Signature signature;
    signature.kind = static_cast<int64_t>(shape.kind);
    signature.detail = shape.detail | detail::current_signature_tag;
    if (shape.tensor.defined()) {
      signature.dtype = static_cast<int64_t>(shape.tensor.dtype());
      signature.count = shape.tensor.numel();
    }
    std::string what = str_cat(signature.str(), " #", ++collective_count_);
    return issue(what, &signature, kCollectiveLane, std::move(keep_alive), std::move(call));
  }

  // Checks the signature (collectives), orders the op after the caller's stream, hands it to
  // NCCL on the lane's stream and to the watchdog. Returns at once.
  WorkPtr issue(const std::string& what, const Signature* signature, LaneId lane_id,
                std::vector<Tensor> keep_alive, const Call& call) {
    auto work = std::make_shared<Work>(str_cat(what, " on rank ", rank_, " of ", size_, " (nccl)"));
    std::lock_guard<std::mutex> issuing(issue_mutex_);
    if (refuse_if_poisoned(*work)) return work;
    detail::note_operation(work);  // what the heartbeat tells the peers; in flight until it completes
    if (signature != nullptr && verify_ && size_ > 1 && !signatures_match(*signature, work)) return work;
    if (refuse_if_poisoned(*work)) return work;

    Lane& lane = lanes_[lane_id];
    auto done = std::make_shared<cuda::Event>();
    std::string failure;
    {
      // ncclCommAbort frees the communicator, so the watchdog must not abort it while this
      // thread is inside NCCL with it (NCCL: one thread at a time on a communicator). Holding
      // calls_mutex_ keeps abort_communicators() out; it sets poisoned_ before it waits for the
      // mutex, so checking again here means an op never reaches an aborted communicator.
      std::lock_guard<std::timed_mutex> calls(calls_mutex_);
      if (refuse_if_poisoned(*work)) return work;
      try {
        // The comm stream waits for whatever the caller queued before this call (e.g. the kernel
        // that wrote the gradient bucket); the event can go once the wait is queued.
        cuda::Event ready;
        ready.record(cuda::current_stream(device_.index));
        ready.wait(lane.stream);
        cuda::DeviceGuard guard(device_.index);
        ncclResult_t result = call(lane.comm, static_cast<cudaStream_t>(lane.stream.handle));
        if (result != ncclSuccess) {
          failure = str_cat(work->description(), ": NCCL error: ", nccl_error_text(result, lane.comm));
        } else {
          done->record(lane.stream);
        }
      } catch (const std::exception& e) {  // a CUDA error while ordering or recording
        failure = str_cat(work->description(), ": ", e.what());
      }
    }
    if (!failure.empty()) {  // poison() aborts the communicators: only once calls_mutex_ is free
      poison(failure, work);
      return work;
    }
    // The lane's stream uses the tensors from here on: the allocator waits for it (device-side)
    // before reusing their memory, so nothing needs to hold them until the watchdog sees "done".
    std::vector<Tensor> held;
    for (Tensor& t : keep_alive) {
      try {
        if (t.defined() && t.device().is_cuda()) {
          cuda::record_stream(t, lane.stream);
          continue;
        }
      } catch (const Error&) {  // not the caching allocator's memory: keep it referenced
      }
      held.push_back(std::move(t));
    }
    keep_alive = std::move(held);
    // Kernels queued on the waiting thread after wait() run after the communication.
    const int device_index = device_.index;
    work->set_wait_hook([done, device_index] { done->wait(cuda::current_stream(device_index)); });
    work->mark_started();  // queued on the device
    std::string abandoned;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (poisoned_) {
        // poison() ran (on the watchdog) while this op was being issued, after it had failed the
        // ops in flight: fail this one too instead of leaving it for a watchdog that no longer
        // looks, and keep its tensors, which the aborted NCCL call may have been using.
        abandoned = poison_message_;
        abandoned_.insert(abandoned_.end(), keep_alive.begin(), keep_alive.end());
      } else {
        in_flight_.push_back(InFlight{work, lane_id, done, std::move(keep_alive), Clock::now()});
      }
    }
    if (!abandoned.empty()) {
      work->mark_failed(str_cat(work->description(), ": abandoned: ", abandoned));
      return work;
    }
    wake_.notify_one();
    return work;
  }

  bool refuse_if_poisoned(Work& work) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!poisoned_) return false;
    work.mark_failed(str_cat(work.description(), ": not started: ", poison_message_));
    return true;
  }

  // Allgathers every rank's signature over the CPU backend (MPI). On a mismatch every rank fails
  // this op with the same message and skips it, so the ranks stay in step for the next call.
  bool signatures_match(const Signature& mine, const WorkPtr& work) {
    Tensor local = empty({4}, TensorOptions{DType::i64, Device::cpu()});
    std::memcpy(local.data_ptr(), &mine, sizeof(Signature));
    Tensor all = empty({4 * static_cast<int64_t>(size_)}, TensorOptions{DType::i64, Device::cpu()});
    WorkPtr exchange;
    try {
      {
        detail::SignatureTagScope tag(detail::kSignatureCheckTag);
        exchange = cpu_->allgather(all, local);
      }
      exchange->wait();
    } catch (const std::exception& e) {
      if (exchange && exchange->failed_by_mismatch()) {
        // The CPU backend met another CPU collective on some rank (say Join's notification, a
        // CPU tensor): every rank's exchange failed the same way and was skipped, so both
        // groups are still in step. Fail this op, do not break the group: its GPU ops still in
        // flight must finish on every rank.
        work->mark_mismatched(str_cat(work->description(), ": not run: ", e.what()));
        return false;
      }
      poison(str_cat(work->description(),
                     ": exchanging call signatures over the CPU backend failed: ", e.what()),
             work);
      return false;
    }
    const auto* theirs = static_cast<const Signature*>(all.data_ptr());
    for (int r = 0; r < size_; ++r) {
      if (theirs[r] == mine) continue;
      const std::string message = detail::mismatch_message(work->description(), rank_, mine, r, theirs[r]);
      work->mark_mismatched(message);
      detail::flight_dump_on_failure(message, /*ask_peers=*/false);  // every rank sees it and dumps
      return false;
    }
    return true;
  }

  // ---- the watchdog ----

  void watchdog_loop() {
    auto last_progress = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (in_flight_.empty()) {
          if (stopping_) return;
          // Nothing to poll: wake for new ops, or every 100 ms to look at the async errors.
          wake_.wait_for(lock, std::chrono::milliseconds(100),
                         [this] { return stopping_ || !in_flight_.empty() || !peer_lost_message_.empty(); });
          if (stopping_ && in_flight_.empty()) return;
        }
      }
      std::string lost;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        lost.swap(peer_lost_message_);
      }
      if (!lost.empty()) poison(lost, nullptr);
      if (!poisoned_) check_async_errors();

      // Which ops have finished, and is the oldest unfinished one late?
      std::vector<InFlight> finished;
      std::string late;
      std::string failure;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto limit = timeout_.load();
        const auto now = Clock::now();
        std::vector<InFlight> still_running;
        for (InFlight& op : in_flight_) {
          bool done = false;
          try {
            done = op.done->query();
          } catch (const std::exception& e) {
            if (failure.empty()) failure = str_cat(op.work->description(), ": CUDA error: ", e.what());
          }
          if (done) {
            finished.push_back(std::move(op));
            continue;
          }
          if (late.empty() && now - op.started > limit) late = op.work->description();
          still_running.push_back(std::move(op));
        }
        in_flight_.swap(still_running);
      }
      for (InFlight& op : finished) {
        cuda::StreamGuard guard(lanes_[op.lane].stream);  // for kernels a then() callback may queue
        op.keep_alive.clear();
        op.work->mark_completed();
      }
      if (!failure.empty()) {
        poison(failure, nullptr);
      } else if (!late.empty()) {
        poison(
            str_cat(late, " did not complete within ", std::chrono::duration<double>(timeout_.load()).count(),
                    " s: a peer rank is dead or stuck, or did not make the same call. The NCCL communicators "
                    "were aborted and this group cannot be used any more (timeout: InitOptions::timeout or "
                    "MG_TIMEOUT_S)"),
            nullptr);
      }

      // Poll hard right after progress (latency), then back off to leave the cores to compute.
      const auto now = Clock::now();
      if (!finished.empty()) {
        last_progress = now;
      } else if (now - last_progress < std::chrono::microseconds(500)) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  // NCCL reports failures it sees inside its kernels and proxy threads (a peer's connection
  // lost, a remote error) through ncclCommGetAsyncError.
  // Polling a communicator while another thread issues ops on it is allowed (NCCL's thread-safety
  // notes); polling one that ncclCommAbort has freed is not, hence abort_mutex_.
  void check_async_errors() {
    std::string error_text;
    const char* lane_name = nullptr;
    {
      std::lock_guard<std::mutex> comms(abort_mutex_);
      if (aborted_) return;
      for (Lane& lane : lanes_) {
        ncclResult_t async = ncclSuccess;
        ncclResult_t result = ncclCommGetAsyncError(lane.comm, &async);
        if (result == ncclSuccess && (async == ncclSuccess || async == ncclInProgress)) continue;
        error_text = nccl_error_text(result != ncclSuccess ? result : async, lane.comm);
        lane_name = lane.name;
        break;
      }
    }
    if (lane_name == nullptr) return;
    std::string oldest;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!in_flight_.empty()) oldest = in_flight_.front().work->description();
    }
    poison(str_cat(oldest.empty() ? str_cat("NCCL backend on rank ", rank_, " of ", size_) : oldest,
                   ": NCCL reported an asynchronous error on the ", lane_name, " communicator: ", error_text,
                   " (a peer rank has probably died). The NCCL communicators were aborted and this group "
                   "cannot be used any more"),
           nullptr);
  }

  // ncclCommAbort on every communicator, once. It frees them, so it waits (calls_mutex_) for an
  // op that is inside NCCL on this rank to come out first. An op that does not come out (a
  // blocking connection to a dead peer) can only be released by the abort itself, so after a
  // grace period the communicators are aborted anyway, as PyTorch's watchdog does.
  void abort_communicators() {
    std::unique_lock<std::timed_mutex> calls(calls_mutex_, std::defer_lock);
    if (!calls.try_lock_for(std::chrono::seconds(10)))
      std::fprintf(stderr, "[multigrad rank %d] an NCCL call has not returned for 10 s: aborting under it\n",
                   rank_);
    std::lock_guard<std::mutex> comms(abort_mutex_);
    if (aborted_) return;
    aborted_ = true;
    for (Lane& lane : lanes_)
      if (lane.comm != nullptr) ncclCommAbort(lane.comm);
  }

  // Fails every in-flight op (and `current`, an op that never reached the watchdog), aborts the
  // communicators so no NCCL kernel waits forever, and makes every later op fail at once.
  void poison(const std::string& message, const WorkPtr& current) {
    std::vector<InFlight> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (poisoned_) {
        if (current)
          current->mark_failed(str_cat(current->description(), ": not started: ", poison_message_));
        return;
      }
      poisoned_ = true;
      poison_message_ = message;
      pending.swap(in_flight_);
    }
    std::fprintf(stderr, "[multigrad rank %d] %s\n", rank_, message.c_str());
    std::fflush(stderr);
    if (current) current->mark_failed(message);
    for (InFlight& op : pending) {
      const std::string& what = op.work->description();
      const bool is_the_culprit = message.compare(0, what.size(), what) == 0;
      op.work->mark_failed(is_the_culprit ? message : str_cat(what, ": abandoned: ", message));
    }
    // Aborting stops NCCL's kernels and proxy threads; the buffers they used are kept until the
    // backend is destroyed all the same. (The caller never holds calls_mutex_ here.)
    abort_communicators();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (InFlight& op : pending)
        abandoned_.insert(abandoned_.end(), op.keep_alive.begin(), op.keep_alive.end());
    }
    detail::flight_dump_on_failure(message, /*ask_peers=*/true);  // and ask the peers for theirs
  }

  std::shared_ptr<Backend> cpu_;  // carries the unique ids and the signatures
  Device device_;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<std::chrono::milliseconds> timeout_;
  bool verify_;
  std::atomic<int64_t> collective_count_{0};
  Lane lanes_[kLanes];

  std::mutex issue_mutex_;            // one op at a time into NCCL, in call order
  std::timed_mutex calls_mutex_;      // held while an op is inside NCCL (see abort_communicators)
  std::mutex abort_mutex_;            // ncclCommAbort against the watchdog's polling of the comms
  std::atomic<bool> aborted_{false};  // ncclCommAbort has freed the communicators (set under abort_mutex_)
  std::mutex mutex_;                  // guards everything below
  std::condition_variable wake_;
  std::vector<InFlight> in_flight_;  // in issue order
  bool stopping_ = false;
  std::atomic<bool> poisoned_{false};
  std::string poison_message_;
  std::string peer_lost_message_;  // from the heartbeat, for the watchdog to act on
  int peer_lost_id_ = 0;
  std::vector<Tensor> abandoned_;

  std::thread watchdog_;  // last: starts after the members it uses exist
};

}  // namespace

std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Backend> cpu_backend, Device device,
                                           std::chrono::milliseconds timeout, bool verify_collectives) {
  return std::make_shared<NcclBackend>(std::move(cpu_backend), device, timeout, verify_collectives);
}

#endif  // MG_HAS_NCCL && MG_HAS_CUDA

}  // namespace mg::parallel
