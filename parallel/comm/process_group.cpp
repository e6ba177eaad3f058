// ProcessGroup: launcher detection, device choice, argument checks and dispatch to a backend.
//
// The backends (process_group_mpi.cpp, single_process_backend below) only move bytes; every
// check a user can trip over lives here, once, so each backend can trust its inputs.
#include "parallel/comm/process_group.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/grad_mode.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/heartbeat.h"

namespace mg::parallel {

// Defined in process_group_mpi.cpp (nullptr-returning fallback when built without MPI).
std::shared_ptr<Backend> make_mpi_backend(const LaunchInfo& launch, std::chrono::milliseconds timeout,
                                          bool verify_collectives);
// Defined in process_group_nccl.cpp (nullptr-returning fallback when built without NCCL or CUDA).
// The CPU backend carries NCCL's unique id from rank 0 to the others, and the call signatures.
std::shared_ptr<Backend> make_nccl_backend(std::shared_ptr<Backend> cpu_backend, Device device,
                                           std::chrono::milliseconds timeout, bool verify_collectives);

// ProcessGroup::requested_traffic()'s count (process_group.h says what it counts).
struct TrafficCounter {
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> bytes{0};
};

// What the flight recorder calls a group: every rank must give the same group the same name, so
// names come from the order of collective calls -- "world" for the first init_process_group,
// "world#2" for a second one, "<parent>/<k>[<world ranks>]" for the parent's k-th new_group.
struct FlightGroup {
  std::string name = "unnamed";  // a ProcessGroup built directly from a backend
  std::vector<int> world_ranks;  // world_ranks[r]: the world rank of this group's rank r
  std::atomic<int64_t> sequence{0};
  std::atomic<int> subgroups{0};
  std::once_flag registered;
  int index = -1;  // in the recorder's table of groups
};

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "?";
}

namespace {

// The share of a message each rank sends in one pass of a ring: (N - 1) / N.
double ring_share(int world) { return world > 1 ? static_cast<double>(world - 1) / world : 0.0; }

// A launcher's rank or size variable (OMPI_COMM_WORLD_RANK, ...), checked: never truncated.
std::optional<int> env_int(const char* name, int min) {
  const std::optional<int64_t> value = env::integer(name, min, INT_MAX, "ranks");
  if (!value) return std::nullopt;
  return static_cast<int>(*value);
}

// The heartbeat's bound: 0 turns it off; otherwise at least kMinFailureDetection, since beats go
// out at most every 20 ms and a peer is lost after missing about 10 (heartbeat.h).
constexpr std::chrono::milliseconds kMinFailureDetection{200};
constexpr double kMaxFailureDetectionS = 86400;

// Issues a recorded collective: the record fails with the exception when issuing throws,
// otherwise it follows the Work.
template <class Issue>
WorkPtr issue_recorded(int64_t flight_id, Issue&& issue) {
  WorkPtr work;
  try {
    work = issue();
  } catch (const std::exception& e) {
    detail::flight_finished(flight_id, false, detail::flight_now_ns(), e.what());
    throw;
  }
  work->attach_flight_record(flight_id);
  return work;
}

// The same for a blocking collective (no Work): started at once, finished when `run` returns.
template <class Run>
auto run_recorded(int64_t flight_id, Run&& run) {
  detail::flight_started(flight_id, detail::flight_now_ns());
  try {
    auto result = run();
    detail::flight_finished(flight_id, true, detail::flight_now_ns(), "");
    return result;
  } catch (const std::exception& e) {
    detail::flight_finished(flight_id, false, detail::flight_now_ns(), e.what());
    throw;
  }
}

// "1, 3" for error messages.
std::string join_ranks(const std::vector<int64_t>& ranks) {
  std::string text;
  for (int64_t r : ranks) text += str_cat(text.empty() ? "" : ", ", r);
  return text;
}

}  // namespace

LaunchInfo detect_launch() {
  LaunchInfo info;
  // Each launcher names the same four facts differently. OpenMPI first: srun can also start
  // OpenMPI programs, and then OMPI_* are the authoritative ones.
  struct Names {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
    const char* local_size;
  };
  const Names launchers[] = {
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
  };
  for (const Names& names : launchers) {
    auto rank = env_int(names.rank, 0);
    auto size = env_int(names.size, 1);
    if (!rank || !size) continue;
    MG_CHECK(*size >= 1 && *rank >= 0 && *rank < *size, "init_process_group: ", names.rank, "=", *rank,
             " and ", names.size, "=", *size, " do not describe a rank of the job");
    info.launcher = names.launcher;
    info.rank = *rank;
    info.world_size = *size;
    info.local_rank = env_int(names.local_rank, 0).value_or(*rank);
    info.local_size = env_int(names.local_size, 1).value_or(*size);
    break;
  }
  return info;
}

ProcessGroup init_process_group(const InitOptions& options) {
  LaunchInfo launch = detect_launch();
  detail::flight_set_process(launch.rank, launch.world_size);  // reads MG_FLIGHT_RECORDER_*
  detail::flight_install_signal_handler();
  // MG_TIMEOUT_S, MG_FAILURE_DETECTION_S and MG_STALL_* are checked in every world, even one of
  // one rank (base/env.h: range, unit, the variable's name in the message).
  detail::check_heartbeat_env();
  std::chrono::milliseconds timeout = options.timeout;
  if (auto seconds = env::integer("MG_TIMEOUT_S", 1, 30 * 24 * 3600, "seconds"))
    timeout = std::chrono::seconds(*seconds);
  MG_CHECK(timeout.count() > 0, "init_process_group: the timeout must be positive, got ", timeout.count(),
           " ms");
  std::chrono::milliseconds failure_detection = options.failure_detection;
  if (auto bound = env::seconds("MG_FAILURE_DETECTION_S", 0, kMaxFailureDetectionS)) {
    MG_CHECK(bound->count() == 0 || *bound >= kMinFailureDetection,
             "MG_FAILURE_DETECTION_S must be 0 (off) or at least ", kMinFailureDetection.count() / 1000.0,
             " seconds (beats are at least 20 ms apart and a peer is lost after missing about 10), got '",
             *env::text("MG_FAILURE_DETECTION_S"), "'");
    failure_detection = *bound;
  }
  MG_CHECK(failure_detection.count() == 0 ||
               (failure_detection >= kMinFailureDetection &&
                failure_detection <= std::chrono::seconds(static_cast<int64_t>(kMaxFailureDetectionS))),
           "init_process_group: the failure detection bound must be 0 (off) or from ",
           kMinFailureDetection.count(), " ms to ", kMaxFailureDetectionS, " s, got ",
           failure_detection.count(), " ms");

  // The device: asked for, else cuda:<local rank> when this build can hold CUDA tensors and a
  // GPU is there, else cpu:0. Ranks on one node thus each take their own GPU.
  Device device = Device::cpu(0);
  const char* forced = std::getenv("MG_DEVICE");
  if (options.device) {
    device = *options.device;
  } else if (forced != nullptr && *forced != '\0') {
    device = Device::parse(forced);
  } else if (cuda_backend() != nullptr && cuda::device_count() > 0) {
    device = Device::cuda(launch.local_rank % cuda::device_count());
  }

  std::shared_ptr<Backend> backend;
  if (launch.world_size == 1) {
    // No launcher (or a job of one): no MPI needed at all.
    backend = make_single_process_backend();
  } else {
    backend = make_mpi_backend(launch, timeout, options.verify_collectives);
    MG_CHECK(backend != nullptr, "init_process_group: launched as rank ", launch.rank, " of ",
             launch.world_size, " by ", launch.launcher,
             ", but multigrad was built without MPI (install libopenmpi-dev and rebuild)");
    detail::start_heartbeat(failure_detection);
  }
  backend->set_timeout(timeout);

  // CUDA tensors: in a world of one the single-process backend takes them too (every collective
  // of one rank is local); otherwise NCCL, when this build has it and the rank computes on a GPU.
  std::shared_ptr<Backend> cuda_backend;
  if (device.is_cuda()) {
    if (launch.world_size == 1)
      cuda_backend = backend;
    else
      cuda_backend = make_nccl_backend(backend, device, timeout, options.verify_collectives);
  }
  ProcessGroup group(std::move(backend), device, launch, std::move(cuda_backend));
  static std::atomic<int> worlds_made{0};
  const int world_number = ++worlds_made;
  group.flight_->name = world_number == 1 ? std::string("world") : str_cat("world#", world_number);
  return group;
}

// ---- the handle ----------------------------------------------------------------------------------

ProcessGroup::ProcessGroup(std::shared_ptr<Backend> cpu_backend, Device device, LaunchInfo launch,
                           std::shared_ptr<Backend> cuda_backend)
    : cpu_(std::move(cpu_backend)),
      cuda_(std::move(cuda_backend)),
      device_(device),
      launch_(std::move(launch)),
      requested_(std::make_shared<TrafficCounter>()),
      flight_(std::make_shared<FlightGroup>()) {
  MG_CHECK(cpu_ != nullptr, "ProcessGroup: null backend");
  launch_.rank = cpu_->rank();
  launch_.world_size = cpu_->size();
  for (int r = 0; r < launch_.world_size; ++r) flight_->world_ranks.push_back(r);
}

RequestedTraffic ProcessGroup::requested_traffic() const {
  any_backend("requested_traffic");
  return RequestedTraffic{requested_->calls.load(), requested_->bytes.load()};
}

void ProcessGroup::reset_requested_traffic() {
  any_backend("reset_requested_traffic");
  requested_->calls = 0;
  requested_->bytes = 0;
}

void ProcessGroup::count_requested(double bytes) const {
  requested_->calls += 1;
  requested_->bytes += static_cast<int64_t>(std::llround(bytes));
}

int64_t ProcessGroup::flight_record(const char* op, const char* reduce, int root, int64_t in_count,
                                    int64_t out_count, const char* dtype, bool on_cuda,
                                    const void* return_address) const {
  FlightGroup& group = *flight_;
  std::call_once(group.registered, [&] {
    group.index = detail::flight_register_group(group.name, cpu_->size(), cpu_->rank(), cpu_->name(),
                                                cuda_ != nullptr ? cuda_->name() : std::string("none"));
  });
  detail::FlightCall call;
  call.group = group.index;
  call.sequence = ++group.sequence;
  call.op = op;
  call.reduce = reduce;
  call.root = root;
  call.in_count = in_count;
  call.out_count = out_count;
  call.dtype = dtype;
  call.on_cuda = on_cuda;
  call.return_address = return_address;
  return detail::flight_record(call);
}

int ProcessGroup::rank() const { return any_backend("rank").rank(); }
int ProcessGroup::size() const { return any_backend("size").size(); }

std::string ProcessGroup::backend_name(DeviceType type) const {
  Backend& cpu = any_backend("backend_name");
  if (type != DeviceType::CUDA) return cpu.name();
  if (cuda_ != nullptr) return cuda_->name();
  if (!device_.is_cuda()) return str_cat("none (this rank computes on ", device_, ")");
  return "none (this build has no NCCL backend)";
}

void ProcessGroup::set_timeout(std::chrono::milliseconds timeout) {
  MG_CHECK(timeout.count() > 0, "ProcessGroup::set_timeout: the timeout must be positive, got ",
           timeout.count(), " ms");
  any_backend("set_timeout").set_timeout(timeout);
  if (cuda_ != nullptr && cuda_ != cpu_) cuda_->set_timeout(timeout);
}

std::chrono::milliseconds ProcessGroup::timeout() const { return any_backend("timeout").timeout(); }

Backend& ProcessGroup::any_backend(const char* op) const {
  MG_CHECK(cpu_ != nullptr, "ProcessGroup::", op,
           ": the group is undefined (use parallel::init_process_group())");
  return *cpu_;
}

Backend& ProcessGroup::backend_for(const Tensor& tensor, const char* op) const {
  Backend& backend = any_backend(op);
  MG_CHECK(tensor.defined(), "ProcessGroup::", op, ": the tensor is undefined");
  MG_CHECK(tensor.is_contiguous(), "ProcessGroup::", op, ": the tensor must be contiguous (shape ",
           shape_str(tensor.shape()), ", strides ", shape_str(tensor.strides()),
           "); call .contiguous() first");
  if (!tensor.device().is_cuda()) return backend;
  MG_CHECK(cuda_ != nullptr, "ProcessGroup::", op, ": the tensor is on ", tensor.device(),
           " but this group has no ", "backend for CUDA tensors: ", backend_name(DeviceType::CUDA), " (the ",
           backend.name(), " backend takes CPU tensors)");
  return *cuda_;
}

WorkPtr ProcessGroup::allreduce(Tensor& tensor, ReduceOp op) {
  Backend& backend = backend_for(tensor, "allreduce");
  MG_CHECK(op != ReduceOp::Avg || is_floating(tensor.dtype()),
           "ProcessGroup::allreduce: avg needs a floating dtype, the tensor is ", tensor.dtype());
  count_requested(2.0 * ring_share(size()) * static_cast<double>(tensor.nbytes()));
  const int64_t id =
      flight_record("allreduce", reduce_op_name(op), -1, tensor.numel(), tensor.numel(),
                    dtype_name(tensor.dtype()), tensor.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.allreduce(tensor, op); });
}

WorkPtr ProcessGroup::broadcast(Tensor& tensor, int root) {
  Backend& backend = backend_for(tensor, "broadcast");
  MG_CHECK(root >= 0 && root < size(), "ProcessGroup::broadcast: root ", root,
           " is not a rank of a world of ", size());
  count_requested(ring_share(size()) * static_cast<double>(tensor.nbytes()));
  const int64_t id =
      flight_record("broadcast", nullptr, root, tensor.numel(), tensor.numel(), dtype_name(tensor.dtype()),
                    tensor.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.broadcast(tensor, root); });
}

WorkPtr ProcessGroup::reduce(Tensor& tensor, int root, ReduceOp op) {
  Backend& backend = backend_for(tensor, "reduce");
  MG_CHECK(root >= 0 && root < size(), "ProcessGroup::reduce: root ", root, " is not a rank of a world of ",
           size());
  MG_CHECK(op != ReduceOp::Avg || is_floating(tensor.dtype()),
           "ProcessGroup::reduce: avg needs a floating dtype, the tensor is ", tensor.dtype());
  count_requested(ring_share(size()) * static_cast<double>(tensor.nbytes()));
  const int64_t id =
      flight_record("reduce", reduce_op_name(op), root, tensor.numel(), tensor.numel(),
                    dtype_name(tensor.dtype()), tensor.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.reduce(tensor, root, op); });
}

WorkPtr ProcessGroup::allgather(Tensor& output, const Tensor& input) {
  Backend& backend = backend_for(input, "allgather");
  backend_for(output, "allgather");
  MG_CHECK(output.device() == input.device(), "ProcessGroup::allgather: output is on ", output.device(),
           " but input is on ", input.device());
  MG_CHECK(output.dtype() == input.dtype(), "ProcessGroup::allgather: output dtype ", output.dtype(),
           " differs from input dtype ", input.dtype());
  MG_CHECK(output.numel() == input.numel() * size(), "ProcessGroup::allgather: output has ", output.numel(),
           " elements but needs world size (", size(), ") x input (", input.numel(), ")");
  count_requested(ring_share(size()) * static_cast<double>(output.nbytes()));
  const int64_t id =
      flight_record("allgather", nullptr, -1, input.numel(), output.numel(), dtype_name(input.dtype()),
                    input.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.allgather(output, input); });
}

WorkPtr ProcessGroup::reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) {
  Backend& backend = backend_for(input, "reduce_scatter");
  backend_for(output, "reduce_scatter");
  MG_CHECK(output.device() == input.device(), "ProcessGroup::reduce_scatter: output is on ", output.device(),
           " but input is on ", input.device());
  MG_CHECK(output.dtype() == input.dtype(), "ProcessGroup::reduce_scatter: output dtype ", output.dtype(),
           " differs from input dtype ", input.dtype());
  MG_CHECK(input.numel() == output.numel() * size(), "ProcessGroup::reduce_scatter: input has ",
           input.numel(), " elements but needs world size (", size(), ") x output (", output.numel(), ")");
  MG_CHECK(op != ReduceOp::Avg || is_floating(input.dtype()),
           "ProcessGroup::reduce_scatter: avg needs a floating dtype, the tensor is ", input.dtype());
  count_requested(ring_share(size()) * static_cast<double>(input.nbytes()));
  const int64_t id =
      flight_record("reduce_scatter", reduce_op_name(op), -1, input.numel(), output.numel(),
                    dtype_name(input.dtype()), input.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.reduce_scatter(output, input, op); });
}

// Root-only buffers of gather (output) and scatter (input) are checked on the root only.
WorkPtr ProcessGroup::gather(Tensor& output, const Tensor& input, int root) {
  Backend& backend = backend_for(input, "gather");
  MG_CHECK(root >= 0 && root < size(), "ProcessGroup::gather: root ", root, " is not a rank of a world of ",
           size());
  if (rank() == root) {
    backend_for(output, "gather");
    MG_CHECK(output.device() == input.device() && output.dtype() == input.dtype(),
             "ProcessGroup::gather: output is ", output.dtype(), " on ", output.device(), " but input is ",
             input.dtype(), " on ", input.device());
    MG_CHECK(output.numel() == input.numel() * size(), "ProcessGroup::gather: output has ", output.numel(),
             " elements but needs world size (", size(), ") x input (", input.numel(), ")");
  }
  count_requested(rank() == root ? 0.0 : static_cast<double>(input.nbytes()));
  const int64_t id =
      flight_record("gather", nullptr, root, input.numel(), input.numel() * size(), dtype_name(input.dtype()),
                    input.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.gather(output, input, root); });
}

WorkPtr ProcessGroup::scatter(Tensor& output, const Tensor& input, int root) {
  Backend& backend = backend_for(output, "scatter");
  MG_CHECK(root >= 0 && root < size(), "ProcessGroup::scatter: root ", root, " is not a rank of a world of ",
           size());
  if (rank() == root) {
    backend_for(input, "scatter");
    MG_CHECK(output.device() == input.device() && output.dtype() == input.dtype(),
             "ProcessGroup::scatter: output is ", output.dtype(), " on ", output.device(), " but input is ",
             input.dtype(), " on ", input.device());
    MG_CHECK(input.numel() == output.numel() * size(), "ProcessGroup::scatter: input has ", input.numel(),
             " elements but needs world size (", size(), ") x output (", output.numel(), ")");
  }
  count_requested(rank() == root ? ring_share(size()) * static_cast<double>(input.nbytes()) : 0.0);
  const int64_t id =
      flight_record("scatter", nullptr, root, output.numel() * size(), output.numel(),
                    dtype_name(output.dtype()), output.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.scatter(output, input, root); });
}

WorkPtr ProcessGroup::all_to_all(Tensor& output, const Tensor& input) {
  Backend& backend = backend_for(input, "all_to_all");
  backend_for(output, "all_to_all");
  MG_CHECK(output.device() == input.device() && output.dtype() == input.dtype(),
           "ProcessGroup::all_to_all: output is ", output.dtype(), " on ", output.device(), " but input is ",
           input.dtype(), " on ", input.device());
  MG_CHECK(output.numel() == input.numel() && input.numel() % size() == 0,
           "ProcessGroup::all_to_all: input (", input.numel(), " elements) and output (", output.numel(),
           ") must be equal and divide into world size (", size(), ") blocks");
  count_requested(ring_share(size()) * static_cast<double>(input.nbytes()));
  const int64_t id =
      flight_record("all_to_all", nullptr, -1, input.numel(), output.numel(), dtype_name(input.dtype()),
                    input.device().is_cuda(), __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.all_to_all(output, input); });
}

void ProcessGroup::monitored_barrier(std::chrono::milliseconds timeout) {
  Backend& backend = any_backend("monitored_barrier");
  const int world = size(), me = rank();
  if (world == 1) return;
  // In the flight recorder from here until it returns (failed when it throws).
  struct Recorded {
    int64_t id;
    int exceptions_before = std::uncaught_exceptions();
    ~Recorded() {
      const bool ok = std::uncaught_exceptions() == exceptions_before;
      detail::flight_finished(id, ok, detail::flight_now_ns(),
                              ok ? "" : "monitored_barrier threw (see its error)");
    }
  } recorded{flight_record("monitored_barrier", nullptr, -1, 0, 0, "", false, __builtin_return_address(0))};
  detail::flight_started(recorded.id, detail::flight_now_ns());
  const int tag = 0x6d62;  // "mb"
  // Arrival: every rank tells rank 0; release: rank 0 answers each arrived rank with the number of
  // missing ranks, followed by their list, so every arrived rank can name them.
  if (me != 0) {
    Tensor arrived = full({1}, static_cast<double>(me), TensorOptions{DType::i64});
    backend.send(arrived, 0, tag)->wait();
    Tensor missing_count = zeros({1}, TensorOptions{DType::i64});
    backend.recv(missing_count, 0, tag)->wait();
    const int64_t n = missing_count.item<int64_t>();
    if (n == 0) return;
    Tensor missing = zeros({n}, TensorOptions{DType::i64});
    backend.recv(missing, 0, tag)->wait();
    std::vector<int64_t> ranks = missing.to_vector<int64_t>();
    throw Error(str_cat("monitored_barrier: rank", n > 1 ? "s " : " ", join_ranks(ranks), " of ", world,
                        " did not arrive within ", std::chrono::duration<double>(timeout).count(),
                        " s (reported by rank 0 to rank ", me, ")"));
  }
  std::vector<Tensor> arrivals;
  std::vector<WorkPtr> works;
  for (int r = 1; r < world; ++r) {
    arrivals.push_back(zeros({1}, TensorOptions{DType::i64}));
    works.push_back(backend.recv(arrivals.back(), r, tag));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto all_done = [&] {
    for (const WorkPtr& w : works)
      if (!w->is_completed()) return false;
    return true;
  };
  while (!all_done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::vector<int64_t> missing;
  for (int r = 1; r < world; ++r)
    if (!works[static_cast<size_t>(r - 1)]->is_completed() || works[static_cast<size_t>(r - 1)]->failed())
      missing.push_back(r);
  // The answer goes to the missing ranks too, without waiting: one that comes late gets its
  // arrival matched by the receive still posted above and learns that it was late. (One that
  // never comes leaves those ops to the group's timeout.)
  for (int r = 1; r < world; ++r) {
    const bool late = std::find(missing.begin(), missing.end(), r) != missing.end();
    Tensor count = full({1}, static_cast<double>(missing.size()), TensorOptions{DType::i64});
    WorkPtr sent = backend.send(count, r, tag);
    if (!late) sent->wait();
    if (!missing.empty()) {
      Tensor list =
          tensor<int64_t>(missing, Shape{static_cast<int64_t>(missing.size())}, TensorOptions{DType::i64});
      WorkPtr listed = backend.send(list, r, tag);
      if (!late) listed->wait();
    }
  }
  MG_CHECK(missing.empty(), "monitored_barrier: rank", missing.size() > 1 ? "s " : " ", join_ranks(missing),
           " of ", world, " did not arrive within ", std::chrono::duration<double>(timeout).count(), " s");
}

ProcessGroup ProcessGroup::new_group(std::vector<int> ranks) const {
  Backend& backend = any_backend("new_group");
  std::sort(ranks.begin(), ranks.end());
  MG_CHECK(!ranks.empty(), "ProcessGroup::new_group: no ranks");
  for (size_t i = 0; i < ranks.size(); ++i) {
    MG_CHECK(ranks[i] >= 0 && ranks[i] < size(), "ProcessGroup::new_group: rank ", ranks[i],
             " is not a rank of this group of ", size());
    MG_CHECK(i == 0 || ranks[i] != ranks[i - 1], "ProcessGroup::new_group: rank ", ranks[i],
             " is named twice");
  }
  const int64_t flight_id =
      flight_record("new_group", nullptr, -1, static_cast<int64_t>(ranks.size()),
                    static_cast<int64_t>(ranks.size()), "", false, __builtin_return_address(0));
  std::shared_ptr<Backend> sub = run_recorded(flight_id, [&] { return backend.new_group(ranks); });
  const int subgroup_number = ++flight_->subgroups;  // on every rank, member or not: names stay in step
  // CUDA tensors: the single-process backend serves both; NCCL makes communicators of its own
  // for the members (a collective of the parent's NCCL backend, right after the CPU one: every
  // rank takes part, members or not).
  std::shared_ptr<Backend> cuda_sub;
  if (cuda_ == cpu_)
    cuda_sub = sub;
  else if (cuda_ != nullptr)
    cuda_sub = cuda_->new_group(ranks);
  if (sub == nullptr) return ProcessGroup();  // not a member
  ProcessGroup subgroup(sub, device_, launch_, cuda_sub);
  std::string members;
  subgroup.flight_->world_ranks.clear();
  for (int r : ranks) {
    const int world_rank = flight_->world_ranks.at(static_cast<size_t>(r));
    subgroup.flight_->world_ranks.push_back(world_rank);
    members += str_cat(members.empty() ? "" : ",", world_rank);
  }
  subgroup.flight_->name = str_cat(flight_->name, "/", subgroup_number, "[", members, "]");
  return subgroup;
}

WorkPtr ProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  Backend& backend = backend_for(tensor, "send");
  MG_CHECK(dst >= 0 && dst < size() && dst != rank(), "ProcessGroup::send: destination ", dst,
           " must be another rank of a world of ", size(), " (this is rank ", rank(), ")");
  MG_CHECK(tag >= 0, "ProcessGroup::send: tag must be >= 0, got ", tag);
  count_requested(static_cast<double>(tensor.nbytes()));
  return backend.send(tensor, dst, tag);
}

WorkPtr ProcessGroup::recv(Tensor& tensor, int src, int tag) {
  Backend& backend = backend_for(tensor, "recv");
  MG_CHECK(src >= 0 && src < size() && src != rank(), "ProcessGroup::recv: source ", src,
           " must be another rank of a world of ", size(), " (this is rank ", rank(), ")");
  MG_CHECK(tag >= 0, "ProcessGroup::recv: tag must be >= 0, got ", tag);
  return backend.recv(tensor, src, tag);
}

WorkPtr ProcessGroup::barrier() {
  Backend& backend = any_backend("barrier");
  const int64_t id = flight_record("barrier", nullptr, -1, 0, 0, "", false, __builtin_return_address(0));
  return issue_recorded(id, [&] { return backend.barrier(); });
}

// ---- the world of one ------------------------------------------------------------------------------

namespace {

class SingleProcessBackend : public Backend {
 public:
  std::string name() const override { return "single-process"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void set_timeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  // One rank: the sum, average, max and min of one tensor is the tensor.
  WorkPtr allreduce(Tensor&, ReduceOp op) override {
    return completed_work(str_cat("allreduce(", reduce_op_name(op), ")"));
  }
  WorkPtr broadcast(Tensor&, int) override { return completed_work("broadcast"); }
  WorkPtr reduce(Tensor&, int, ReduceOp) override { return completed_work("reduce"); }
  WorkPtr allgather(Tensor& output, const Tensor& input) override {
    NoGradGuard no_grad;
    output.copy_(input.view(output.shape()));
    return completed_work("allgather");
  }
  WorkPtr reduce_scatter(Tensor& output, const Tensor& input, ReduceOp) override {
    NoGradGuard no_grad;
    output.copy_(input.view(output.shape()));
    return completed_work("reduce_scatter");
  }
  WorkPtr gather(Tensor& output, const Tensor& input, int) override {
    NoGradGuard no_grad;
    output.copy_(input.view(output.shape()));
    return completed_work("gather");
  }
  WorkPtr scatter(Tensor& output, const Tensor& input, int) override {
    NoGradGuard no_grad;
    output.copy_(input.view(output.shape()));
    return completed_work("scatter");
  }
  WorkPtr all_to_all(Tensor& output, const Tensor& input) override {
    NoGradGuard no_grad;
    output.copy_(input.view(output.shape()));
    return completed_work("all_to_all");
  }
  std::shared_ptr<Backend> new_group(const std::vector<int>& ranks) override {
    MG_CHECK(ranks.size() == 1 && ranks[0] == 0, "new_group: a world of one has only rank 0");
    return std::make_shared<SingleProcessBackend>();
  }
  // ProcessGroup refuses send/recv to oneself before they get here.
  WorkPtr send(const Tensor&, int dst, int) override {
    throw Error(str_cat("send to rank ", dst, " in a world of one"));
  }
  WorkPtr recv(Tensor&, int src, int) override {
    throw Error(str_cat("recv from rank ", src, " in a world of one"));
  }
  WorkPtr barrier() override { return completed_work("barrier"); }

 private:
  std::chrono::milliseconds timeout_ = std::chrono::minutes(10);
};

}  // namespace

std::shared_ptr<Backend> make_single_process_backend() { return std::make_shared<SingleProcessBackend>(); }

}  // namespace mg::parallel
