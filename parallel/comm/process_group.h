// ProcessGroup: the ranks of one training job and the collectives between them.
//
// One process per device ("rank"), started by a launcher:
//
//   mpirun -np 4 ./train_ddp            (OpenMPI; also `mpiexec`)
//   srun -n 8 --gpus-per-task 1 ./train_ddp      (Slurm)
//
// init_process_group() reads the launcher's environment, initialises MPI and returns the
// group. Without a launcher it returns a world of one (every collective is then a no-op), so
// the same program runs unchanged on a laptop.
//
// Every operation is asynchronous and returns a Work (work.h); the caller overlaps compute with
// it and calls wait() when it needs the result. Operations are *in place* on contiguous tensors
// and are executed in the order they were called, which must be the same order on every rank
// (as with MPI and NCCL). Tensors on the CPU go through the MPI backend; CUDA tensors go through
// the NCCL backend (process_group_nccl.cpp), which init_process_group() builds when this build has
// NCCL and the rank's device is a GPU. Without it, CUDA tensors get a clear error. barrier() is
// always the CPU backend's (a host-level barrier).
//
// Failures never hang silently: an op that has not finished after `timeout` (default 10
// minutes) fails with an error naming the op, this rank and the timeout, and so does every later
// op of the group (its communicator can no longer be trusted); at exit the job is then aborted
// instead of finalized. With `verify_collectives` (the default) each collective first
// exchanges a small signature (op, dtype, element count, sequence number) so that ranks calling
// different things fail at once with both sides named, instead of corrupting memory or hanging.
// Every collective is also recorded in the flight recorder (flight_recorder.h), whose dumps after
// such a failure let scripts/flight-report name the rank and the call that went astray.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "base/device.h"
#include "core/tensor.h"
#include "parallel/comm/work.h"

namespace mg::parallel {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);  // "sum", "avg", "max", "min"

struct InitOptions {
  // The device this rank computes on. Default: cuda:<local rank> when CUDA devices exist (and
  // the build has them), else cpu:0. MG_DEVICE=cpu in the environment forces the CPU.
  std::optional<Device> device;
  // An op not finished after this long fails (and poisons the group). MG_TIMEOUT_S overrides.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // Exchange a signature before each collective to catch mismatched calls (see above).
  bool verify_collectives = true;
  // A peer silent this long (dead, hung, or its link cut) is lost: every op of every group fails
  // with a message naming it, on every survivor (parallel/comm/heartbeat.h). 0 turns the heartbeat
  // off. MG_FAILURE_DETECTION_S (seconds, decimals allowed) overrides.
  std::chrono::milliseconds failure_detection = std::chrono::seconds(10);
};

// Where this process sits in the job, as the launcher describes it.
struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank among the processes on this node
  int local_size = 1;
  std::string launcher = "none";  // "openmpi", "slurm", "pmi", "none"
};
// Reads OMPI_COMM_WORLD_*, SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, PMI_RANK/PMI_SIZE.
LaunchInfo detect_launch();

// One communicator's implementation (MPI for CPU tensors; NCCL for CUDA tensors).
// Tensors reaching a backend are contiguous and on the right device type (ProcessGroup checks).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void set_timeout(std::chrono::milliseconds timeout) = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  virtual WorkPtr allreduce(Tensor& tensor, ReduceOp op) = 0;
  virtual WorkPtr broadcast(Tensor& tensor, int root) = 0;
  virtual WorkPtr reduce(Tensor& tensor, int root, ReduceOp op) = 0;
  // output holds size() blocks of input.numel() elements, rank r's input in block r.
  virtual WorkPtr allgather(Tensor& output, const Tensor& input) = 0;
  // input holds size() blocks of output.numel() elements; rank r gets the reduction of block r.
  virtual WorkPtr reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) = 0;
  // Rank r's input lands in block r of root's output (root's output: size() blocks of input.numel();
  // the other ranks' output is not touched).
  virtual WorkPtr gather(Tensor& output, const Tensor& input, int root) = 0;
  // Root's input holds size() blocks of output.numel(); rank r receives block r.
  virtual WorkPtr scatter(Tensor& output, const Tensor& input, int root) = 0;
  // Both hold size() equal blocks: block j of rank i's input becomes block i of rank j's output.
  virtual WorkPtr all_to_all(Tensor& output, const Tensor& input) = 0;
  virtual WorkPtr send(const Tensor& tensor, int dst, int tag) = 0;
  virtual WorkPtr recv(Tensor& tensor, int src, int tag) = 0;
  virtual WorkPtr barrier() = 0;
  // A collective over this backend's ranks: the members of `ranks` (ascending ranks of this
  // backend) get a backend of their own, rank i being ranks[i]; the others get nullptr.
  virtual std::shared_ptr<Backend> new_group(const std::vector<int>& ranks) = 0;
};

// What this rank's calls asked the collectives to move -- a figure computed from each call's
// arguments, NOT a measurement: nothing is read from MPI, NCCL or the network. Each call adds the
// bytes this rank sends when the collective runs as the bandwidth-optimal ring algorithm (nccl-tests'
// "bus bytes"), whatever algorithm the backend really picks: MPI may choose recursive doubling or a
// tree (more or fewer bytes), and the backends' own headers, the call signatures of
// verify_collectives and the heartbeat are not counted. For a message of S bytes (the tensor's
// nbytes) on N ranks:
//   all-reduce 2(N-1)/N S; all-gather, reduce-scatter, all-to-all, broadcast and reduce (N-1)/N S
//   of the full-size side (the all-gather's output, the reduce-scatter's input); gather S from each
//   non-root rank, 0 on the root; scatter (N-1)/N S on the root, 0 elsewhere; send S (so
//   ring_allreduce, built on send/recv, counts the chunks it really sends); recv, barrier and
//   monitored_barrier are not counted at all.
// Each call's figure is rounded to whole bytes. It is what a strategy's traffic formula predicts
// (docs/model-parallel.md): bench_parallelism fails when the two differ. Bytes that crossed a real
// link are measured elsewhere, from the interface counters (tests/parallel/multinode/wire_worker.cpp:
// 1.002 x these bytes for all-reduces, an all-gather and a broadcast over TCP between two nodes).
struct RequestedTraffic {
  int64_t calls = 0;  // collectives and sends
  int64_t bytes = 0;  // the sum of the per-call figures above
};
struct TrafficCounter;
struct FlightGroup;  // the group's name and sequence numbers for the flight recorder (flight_recorder.h)

// A cheap, copyable handle (copies share the same communicators).
class ProcessGroup {
 public:
  ProcessGroup() = default;  // undefined: every call throws
  // `cuda_backend` takes the CUDA tensors (nullptr: none, they are refused with an error).
  ProcessGroup(std::shared_ptr<Backend> cpu_backend, Device device, LaunchInfo launch,
               std::shared_ptr<Backend> cuda_backend = nullptr);

  bool defined() const { return cpu_ != nullptr; }
  // Identifies the communicator: equal for copies of one group, different for different groups.
  const void* id() const { return cpu_.get(); }
  int rank() const;
  int size() const;
  int local_rank() const { return launch_.local_rank; }
  const LaunchInfo& launch() const { return launch_; }
  // This rank's compute device (see InitOptions::device).
  Device device() const { return device_; }
  bool is_main() const { return rank() == 0; }
  // The backend that takes tensors of `type`: "mpi", "nccl", "single-process", or "none (why)".
  std::string backend_name(DeviceType type = DeviceType::CPU) const;
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;

  // All in place; tensors must be contiguous. Avg = sum / size() (floating dtypes only).
  WorkPtr allreduce(Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  WorkPtr broadcast(Tensor& tensor, int root = 0);
  WorkPtr reduce(Tensor& tensor, int root = 0, ReduceOp op = ReduceOp::Sum);  // result on root
  WorkPtr allgather(Tensor& output, const Tensor& input);
  WorkPtr reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::Sum);
  // Every rank's input, concatenated in rank order, in root's output (size() x input.numel()
  // elements); on the other ranks `output` is not used and may be undefined.
  WorkPtr gather(Tensor& output, const Tensor& input, int root = 0);
  // Root's input cut into size() equal blocks, block r to rank r's output; on the other ranks
  // `input` is not used and may be undefined.
  WorkPtr scatter(Tensor& output, const Tensor& input, int root = 0);
  // input and output of size() equal blocks: rank i's block j goes to rank j's block i.
  WorkPtr all_to_all(Tensor& output, const Tensor& input);
  WorkPtr send(const Tensor& tensor, int dst, int tag = 0);
  WorkPtr recv(Tensor& tensor, int src, int tag = 0);
  WorkPtr barrier();
  // A barrier that says who is missing (PyTorch's monitored_barrier): rank 0 waits up to `timeout`
  // for every other rank, then releases them; if some did not arrive, rank 0 and every rank that
  // did throw mg::Error naming the missing ranks. Blocking; CPU backend.
  void monitored_barrier(std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // Subgroups (PyTorch's new_group): a collective over this group -- every rank calls it with the
  // same `ranks` (ranks of this group, any order, no repeats), in the same order as any other
  // collective. Members get the new group (its rank i is the i-th smallest of `ranks`); the other
  // ranks get an undefined group (defined() is false). Collectives of different groups may run at
  // the same time. CPU tensors go over MPI as in the parent; where the parent has an NCCL backend,
  // the subgroup gets NCCL communicators of its own (made from a unique id its rank 0 sends over
  // the CPU subgroup), so CUDA tensors work in subgroups too.
  ProcessGroup new_group(std::vector<int> ranks) const;

  // What this handle's calls asked the collectives to move since the group was made or
  // reset_requested_traffic() (see RequestedTraffic: a formula per call, not a measurement).
  // Copies of the handle share the count; a subgroup has its own.
  RequestedTraffic requested_traffic() const;
  void reset_requested_traffic();

 private:
  Backend& backend_for(const Tensor& tensor, const char* op) const;
  Backend& any_backend(const char* op) const;
  void count_requested(double bytes) const;
  friend ProcessGroup init_process_group(const InitOptions& options);  // names the world for the recorder
  // Records a collective this handle issues in the flight recorder; returns its id (-1: off).
  int64_t flight_record(const char* op, const char* reduce, int root, int64_t in_count, int64_t out_count,
                        const char* dtype, bool on_cuda, const void* return_address) const;

  std::shared_ptr<Backend> cpu_;
  std::shared_ptr<Backend> cuda_;  // nullptr when CUDA tensors have no backend
  Device device_;
  LaunchInfo launch_;
  std::shared_ptr<TrafficCounter> requested_;  // shared by copies; a subgroup has its own
  std::shared_ptr<FlightGroup> flight_;        // likewise
};

// Builds the group from the launcher's environment (a world of one without a launcher).
ProcessGroup init_process_group(const InitOptions& options = {});

// The world-of-one backend: collectives leave tensors as they are (Avg/Sum of one rank is the
// tensor itself), send/recv to oneself are refused. Used without a launcher and in tests.
std::shared_ptr<Backend> make_single_process_backend();

}  // namespace mg::parallel
