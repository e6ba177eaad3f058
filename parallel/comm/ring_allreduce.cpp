// Ring all-reduce: the algorithm (run_ring) and the per-group background thread that runs it
// asynchronously (RingWorker). The algorithm and its cost are explained in ring_allreduce.h.
#include "parallel/comm/ring_allreduce.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "base/error.h"
#include "core/cuda_stream.h"
#include "core/grad_mode.h"
#include "core/ops.h"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace mg::parallel {

std::vector<RingSegment> ring_segments(int64_t numel, int world) {
  MG_CHECK(world >= 1, "ring_segments: world size must be >= 1, got ", world);
  MG_CHECK(numel >= 0, "ring_segments: numel must be >= 0, got ", numel);
  std::vector<RingSegment> segments(static_cast<size_t>(world));
  const int64_t base = numel / world;
  const int64_t longer = numel % world;  // this many segments get one extra element
  for (int j = 0; j < world; ++j) {
    segments[j].offset = j * base + std::min<int64_t>(j, longer);
    segments[j].length = base + (j < longer ? 1 : 0);
  }
  return segments;
}

namespace {

int mod(int64_t a, int n) { return static_cast<int>(((a % n) + n) % n); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// acc = op(acc, incoming) element-wise, on acc's device, by the framework's own kernels.
// (Avg reduces like Sum; the division by N happens once, on the owned segment.)
void reduce_into(Tensor& acc, const Tensor& incoming, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: acc.add_(incoming); return;
    case ReduceOp::Max: acc.copy_(maximum(acc, incoming)); return;
    case ReduceOp::Min: acc.copy_(minimum(acc, incoming)); return;
  }
}

// ---- the ring --------------------------------------------------------------------------------
//
// Runs on the group's ring thread (or on the caller's, for a world of one). `flat` is the
// one-dimensional, contiguous view of the user's tensor; every piece below is a narrow() of it,
// so the data is reduced and received in place and never copied except into `scratch`.
//
// Pipeline bookkeeping, per rank. A message is identified by (step t, chunk k): chunk k of the
// segment sent at step t. Because the segment sent at step t+1 is the segment received at step t,
// chunk k of step t+1 can go as soon as chunk k of step t has arrived (and, while reducing, been
// added in). So the loop is
//
//   post recv(0, k) and send(0, k) for every chunk k            (step 0 sends our own data)
//   for t = 0 .. 2N-3, for each chunk k of step t's received segment:
//     wait recv(t, k); reduce it in (reduce-scatter) - it was received in place (all-gather)
//     post recv(t+1, k), then send(t+1, k) = the chunk we just finished
//
// Receives are posted in (t, k) order and so are the left neighbour's sends, and each (t, k) has
// its own tag, so every message meets the receive meant for it. No wait ever depends on a later
// step of any rank, so the ring cannot deadlock: step-0 sends need nothing, and recv(t, k) only
// needs the left neighbour to have finished its recv(t-1, k).
//
// Buffers. Reduce-scatter receives go into `scratch` (one longest segment): recv(t+1, k) reuses
// chunk k's slot only after recv(t, k) has been added in. All-gather receives land directly in
// the tensor; such a region was last sent during the reduce-scatter (step t+1-N), so that send is
// waited for before the receive overwrites it (MPI forbids touching a buffer still being sent).
void run_ring(ProcessGroup& pg, Tensor& flat, ReduceOp op, const RingOptions& opts) {
  const int n = pg.size();
  const int r = pg.rank();
  const int64_t numel = flat.numel();
  if (n == 1 || numel == 0) return;  // one rank: the tensor is the sum, average, max and min

  const int right = (r + 1) % n;
  const int left = (r - 1 + n) % n;
  const std::vector<RingSegment> segments = ring_segments(numel, n);
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(opts.chunk_bytes / flat.itemsize()));
  const int steps = 2 * (n - 1);
  const int last_reduce_step = n - 2;  // steps 0 .. n-2 reduce-scatter, n-1 .. 2n-3 all-gather

  auto send_segment = [&](int t) { return mod(r - t, n); };
  auto recv_segment = [&](int t) { return mod(r - t - 1, n); };
  auto chunks_in = [&](int segment) { return ceil_div(segments[segment].length, chunk); };
  // Elements [begin, begin + length) of chunk k of a segment.
  auto chunk_begin = [&](int64_t k) { return k * chunk; };
  auto chunk_length = [&](int segment, int64_t k) {
    return std::min(chunk, segments[segment].length - k * chunk);
  };
  auto in_tensor = [&](int segment, int64_t k) {
    return flat.narrow(0, segments[segment].offset + chunk_begin(k), chunk_length(segment, k));
  };
  // The longest segment has the most chunks: it sizes the tag space of one step.
  const int64_t max_chunks = chunks_in(0);
  auto tag = [&](int t, int64_t k) {
    return opts.tag_base + static_cast<int>((static_cast<int64_t>(t) * max_chunks + k) % kRingTagSpan);
  };

  Tensor scratch = empty({segments[0].length}, TensorOptions{flat.dtype(), flat.device(), false});
  std::vector<WorkPtr> pending_recv(static_cast<size_t>(max_chunks));   // recv(t, k) by k
  std::vector<std::vector<WorkPtr>> sends(static_cast<size_t>(steps));  // send(t, k)
  std::vector<Tensor> recv_buffer(static_cast<size_t>(max_chunks));     // where recv(t, k) lands

  auto post_recv = [&](int t, int64_t k) {
    const int segment = recv_segment(t);
    Tensor into;
    if (t <= last_reduce_step) {
      into = scratch.narrow(0, chunk_begin(k), chunk_length(segment, k));
    } else {
      into = in_tensor(segment, k);
      // This region left us at step t+1-N (reduce-scatter); that send must be over first.
      const int sent_at = t + 1 - n;
      if (sent_at >= 0) sends[sent_at][k]->wait();
    }
    recv_buffer[k] = into;
    pending_recv[k] = pg.recv(into, left, tag(t, k));
  };
  for (int t = 0; t < steps; ++t) sends[t].resize(static_cast<size_t>(chunks_in(send_segment(t))));
  auto post_send = [&](int t, int64_t k) {
    sends[t][k] = pg.send(in_tensor(send_segment(t), k), right, tag(t, k));
  };

  // Step 0: all receives first, then our own data goes out whole, chunk by chunk.
  for (int64_t k = 0; k < chunks_in(recv_segment(0)); ++k) post_recv(0, k);
  for (int64_t k = 0; k < chunks_in(send_segment(0)); ++k) post_send(0, k);

  const double avg_scale = 1.0 / n;
  for (int t = 0; t < steps; ++t) {
    const int segment = recv_segment(t);
    const int64_t chunks = chunks_in(segment);
    const bool has_next = t + 1 < steps;
    for (int64_t k = 0; k < chunks; ++k) {
      pending_recv[k]->wait();
      if (t <= last_reduce_step) {
        Tensor acc = in_tensor(segment, k);
        reduce_into(acc, recv_buffer[k], op);
        // The last reduce-scatter step completes our own segment: average it once, here.
        if (t == last_reduce_step && op == ReduceOp::Avg) acc.mul_(avg_scale);
      }
      if (has_next) {
        // recv(t+1, k) first (its slot is free now), then pass chunk k on.
        if (k < chunks_in(recv_segment(t + 1))) post_recv(t + 1, k);
        post_send(t + 1, k);
      }
    }
    // Step t+1 may receive one chunk more than step t had (segment lengths differ by one).
    if (has_next) {
      for (int64_t k = chunks; k < chunks_in(recv_segment(t + 1)); ++k) post_recv(t + 1, k);
    }
  }
  // Our data may still be on its way out: the tensor is not ours again until every send is done.
  for (auto& step_sends : sends) {
    for (auto& work : step_sends) {
      if (work) work->wait();
    }
  }
}

// ---- the per-group ring thread ------------------------------------------------------------------
//
// DDP calls ring_allreduce_async from the autograd thread, bucket after bucket, and must not wait.
// Each group gets one thread that takes rings from a FIFO queue and runs them one at a time: since
// every rank enqueues the same rings in the same order, every rank also runs them in that order,
// which is what keeps the ranks' messages matched.
class RingWorker {
 public:
  explicit RingWorker(std::string name) : name_(std::move(name)), thread_([this] { loop(); }) {}

  // At exit: rings still queued are failed (nobody can wait for them any more), the running one
  // is finished (it ends by itself, or fails when the group's timeout expires), then the thread
  // is joined.
  ~RingWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void enqueue(WorkPtr work, std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      MG_CHECK(!stopping_, "ring_allreduce: the ring thread of ", name_, " is shutting down (process exit); ",
               work->description(), " was not started");
      queue_.push_back(Job{std::move(work), std::move(job)});
    }
    wake_.notify_one();
  }

 private:
  struct Job {
    WorkPtr work;
    std::function<void()> run;
  };

  void loop() {
#ifdef _OPENMP
    // The ring reduces one chunk (1 MiB by default) at a time while the next ones are in flight.
    // Such an addition is bound by memory, not arithmetic, and a second OpenMP thread would only
    // take the core from the MPI progress thread that performs the shared-memory copies (as
    // MPI_Allreduce does, the reduction stays on one thread). nthreads is per thread: the rest of
    // the program keeps its OpenMP team.
    omp_set_num_threads(1);
#endif
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (stopping_) {
          for (Job& left_over : queue_) {
            left_over.work->mark_failed(str_cat(left_over.work->description(),
                                                ": not run, the process is exiting (ring thread of ", name_,
                                                " stopped)"));
          }
          queue_.clear();
          return;
        }
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        job.run();
        job.work->mark_completed();
      } catch (const std::exception& e) {
        job.work->mark_failed(str_cat(job.work->description(), " failed: ", e.what()));
      }
    }
  }

  std::string name_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Job> queue_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after the members it uses exist
};

// One RingWorker per communicator, created on first use and keyed by ProcessGroup::id() (the
// backend object a group handle points to). Copies of one group (the common case: DDP's copy of
// the world group) therefore share their thread, and two distinct groups never do, so their rings
// run side by side; within one group the rings run in call order, the rule for collectives anyway.
//
// The registry is a function-local static: it is created on the first ring, i.e. after
// init_process_group(), so it is destroyed (threads joined) before the MPI backend shuts down.
RingWorker& worker_for(const ProcessGroup& pg) {
  static std::mutex mutex;
  // A worker holds no group of its own
  // (each task carries one), so a later group at a recycled address may reuse it safely.
  static std::map<const void*, std::unique_ptr<RingWorker>> workers;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<RingWorker>& worker = workers[pg.id()];
  if (!worker)
    worker = std::make_unique<RingWorker>(
        str_cat(pg.backend_name(DeviceType::CPU), " rank ", pg.rank(), " of ", pg.size()));
  return *worker;
}

std::atomic<uint64_t> ring_sequence{0};

// One stream per CUDA device for the rings' kernels, created on first use and shared by every
// group's ring thread (rings of different groups then serialise on the device, which is correct).
cuda::Stream ring_stream(int device) {
  static std::mutex mutex;
  static std::map<int, cuda::Stream> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams.find(device);
  if (found == streams.end()) found = streams.emplace(device, cuda::create_stream(device)).first;
  return found->second;
}

}  // namespace

WorkPtr ring_allreduce_async(ProcessGroup& pg, Tensor& tensor, ReduceOp op, RingOptions opts) {
  MG_CHECK(pg.defined(),
           "ring_allreduce: the process group is undefined (use parallel::init_process_group())");
  MG_CHECK(tensor.defined(), "ring_allreduce: the tensor is undefined");
  MG_CHECK(tensor.is_contiguous(), "ring_allreduce: the tensor must be contiguous (shape ",
           shape_str(tensor.shape()), ", strides ", shape_str(tensor.strides()),
           "); call .contiguous() first");
  const DType dtype = tensor.dtype();
  MG_CHECK(dtype == DType::f32 || dtype == DType::f64 || dtype == DType::f16 || dtype == DType::bf16,
           "ring_allreduce: dtype ", dtype, " is not supported (f32, f64, f16 or bf16)");
  MG_CHECK(opts.chunk_bytes >= tensor.itemsize(), "ring_allreduce: chunk_bytes (", opts.chunk_bytes,
           ") is smaller than one element of ", dtype, " (", tensor.itemsize(), " bytes)");
  MG_CHECK(opts.tag_base >= 0, "ring_allreduce: tag_base must be >= 0, got ", opts.tag_base);

  auto work = std::make_shared<Work>(str_cat("ring_allreduce(", reduce_op_name(op), ") ", dtype,
                                             shape_str({tensor.numel()}), " #", ring_sequence++));
  // Nothing to exchange: done now. (Rings queued before this one touch other tensors.)
  if (pg.size() == 1 || tensor.numel() == 0) {
    work->mark_completed();
    return work;
  }
  // The job holds its own handles: the group's communicator and the tensor's storage stay alive
  // until the ring is over, whatever the caller does with theirs.
  Tensor flat = tensor.detach().view({tensor.numel()});
  ProcessGroup group = pg;
  // A CUDA tensor: the ring runs on a stream of its own, ordered after what the caller has queued
  // so far on its current stream (e.g. the kernel that filled the bucket).
  std::shared_ptr<cuda::Event> queued_before;
  if (flat.device().is_cuda()) {
    queued_before = std::make_shared<cuda::Event>();
    queued_before->record(cuda::current_stream(flat.device().index));
  }
  worker_for(pg).enqueue(work, [group, flat, op, opts, queued_before]() mutable {
    NoGradGuard no_grad;  // the reduction is communication, never part of a graph
    if (!flat.device().is_cuda()) {
      run_ring(group, flat, op, opts);
      return;
    }
    // The worker thread's kernels (reductions, scratch) go to the ring stream of the tensor's
    // device; the group's send/recv order their transfers after it, and their wait() orders it
    // after the transfers. The ring is complete when that stream has drained (no device sync).
    const cuda::Stream stream = ring_stream(flat.device().index);
    cuda::StreamGuard guard(stream);
    queued_before->wait(stream);
    try {
      run_ring(group, flat, op, opts);
    } catch (...) {
      // Kernels already queued may still use the tensor and the scratch: let them finish before
      // the job lets go of its references (the original error is the one worth reporting).
      try {
        cuda::synchronize(stream);
      } catch (...) {
      }
      throw;
    }
    cuda::synchronize(stream);
  });
  return work;
}

void ring_allreduce(ProcessGroup& pg, Tensor& tensor, ReduceOp op, RingOptions opts) {
  ring_allreduce_async(pg, tensor, op, opts)->wait();
}

}  // namespace mg::parallel
