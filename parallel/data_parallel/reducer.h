// Reducer: DistributedDataParallel's engine room -- gradient buckets all-reduced while the
// backward pass is still running (the idea of PyTorch's c10d Reducer, written anew).
//
// Why buckets? One all-reduce per parameter pays the latency α hundreds of times; one
// all-reduce of everything at the end of backward hides nothing. Buckets of ~25 MB are the
// middle way: big enough to reach the link's bandwidth, small enough that the first ones are
// on the wire while backward is still computing the gradients of earlier layers.
//
//   backward computes grads from the last layer to the first:
//
//   time ─────────────────────────────────────────────────────────────▶
//   compute │ fc3.grad  fc2.grad │ fc1.grad  conv2.grad │ conv1.grad │
//   comm                         │ all-reduce bucket 0  │ bucket 1   │ bucket 2 │
//                                ▲ bucket 0 full         ▲ bucket 1 full         ▲ exposed
//
// How it works:
// * Buckets are filled in *reverse* registration order (the order backward produces grads),
//   the first one capped at first_bucket_cap_mb (1 MB: start communicating early), the others
//   at bucket_cap_mb (25 MB). A bucket holds one dtype: a flat contiguous tensor that every
//   member's gradient is copied into, scaled by 1/world (so the all-reduce's sum is the mean).
// * Each parameter gets a post-accumulate-grad hook. When it fires, the gradient goes into its
//   bucket slot; when a bucket's last member arrives the bucket is *ready*, and ready buckets
//   are launched strictly in bucket order (every rank must issue the same collectives in the
//   same order) as asynchronous all-reduces: native (MPI_Allreduce or ncclAllReduce on the group's
//   communication thread/stream) or our ring.
// * The first hook of a backward queues an end-of-backward callback (autograd::queue_callback)
//   that waits for every bucket and writes the averaged gradients back into .grad (or, with
//   gradient_as_bucket_view, makes .grad a view of the bucket: no second copy).
// * After the first iteration the buckets are rebuilt in the order gradients actually arrived
//   (rank 0's order, broadcast so all ranks agree), which is what the overlap needs when the
//   registration order does not match the execution order.
// * Under no_sync() the hooks do nothing: gradients accumulate locally in .grad, and the next
//   synchronised backward all-reduces the accumulated sum (gradient accumulation).
// * A parameter that got no gradient would leave its bucket forever unready (the classic DDP
//   hang); finalize names such parameters in an error, or, with find_unused_parameters,
//   contributes zeros for them. Where only some ranks lack them, those ranks still send the
//   remaining buckets, under a signature tag that makes the others' all-reduces fail at once;
//   then all ranks exchange the names, so every rank's error names them.
// * static_graph: the first pass counts each parameter's arrivals; later passes mark it ready at
//   its last one (a parameter whose hook fires twice, as under activation checkpointing).
// * Join (join.h): on a rank out of inputs, run_joined_pass() sends zeros for every bucket.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"
#include "parallel/data_parallel/bucket_future.h"
#include "parallel/data_parallel/comm_hooks.h"

namespace mg::parallel {

enum class AllreduceAlgo { Native, Ring };
const char* allreduce_algo_name(AllreduceAlgo algo);  // "native", "ring"

struct ReducerOptions {
  double bucket_cap_mb = 25.0;
  double first_bucket_cap_mb = 1.0;
  AllreduceAlgo algo = AllreduceAlgo::Native;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool rebuild_buckets = true;  // after the first iteration, from the gradients' arrival order
  // The graph is the same every iteration: the first pass records how many times each
  // parameter's gradient hook fires (0: unused) and reduces everything at its end; later passes
  // reduce a parameter once, at its last arrival (activation checkpointing, a parameter used
  // inside and outside a checkpointed block), and give the unused ones zeros.
  bool static_graph = false;
};

// What one synchronised backward pass cost in communication (all in milliseconds).
struct ReducerStats {
  int64_t backward_passes = 0;  // synchronised passes so far
  double comm_ms = 0;           // time the all-reduces kept the link busy (per bucket, in order)
  double exposed_ms = 0;        // end of backward -> all buckets reduced (not hidden by compute)
  double copy_ms = 0;           // grads into buckets and results back into .grad
  int64_t bytes = 0;            // bytes all-reduced (sum of bucket sizes; a comm hook's compressed size)
};

// A bucket cap in MB as bytes: `what` ("bucket_cap_mb") must be a finite number of MB in
// (0, 1048576] (1 TiB; no bucket is bigger), else an mg::Error naming it -- inf, nan or 1e300 were
// an undefined double -> int64 cast.
int64_t bucket_cap_bytes(double megabytes, const char* what);

// Splits tensors (given in the order their gradients are expected) into buckets: a new bucket
// starts when adding the next tensor would pass the cap (first_cap for bucket 0, cap after) or
// when its dtype differs. A tensor larger than the cap gets a bucket of its own. Returns the
// indices (into `bytes`) of each bucket's members, in order.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<size_t>& order,
                                                const std::vector<int64_t>& bytes,
                                                const std::vector<DType>& dtypes, int64_t first_cap,
                                                int64_t cap);

class Reducer : public std::enable_shared_from_this<Reducer> {
 public:
  // Use create(): the hooks hold weak pointers to the reducer.
  static std::shared_ptr<Reducer> create(std::vector<std::pair<std::string, Tensor>> named_parameters,
                                         ProcessGroup group, ReducerOptions options);

  // While false (no_sync), hooks leave gradients to accumulate locally.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  // Waits (on the host) for the all-reduces of passes not yet counted: on a GPU finalize() only
  // orders the stream after them, so their times are known later.
  const ReducerStats& stats() const;
  void reset_stats();
  // Each bucket's parameter names, in bucket order (for tests, benchmarks and printing).
  std::vector<std::vector<std::string>> bucket_layout() const;
  // Bytes of the flat bucket buffers, allocated once and kept for the model's lifetime (with
  // gradient_as_bucket_view they are the gradients themselves).
  int64_t bucket_bytes() const;
  bool buckets_rebuilt() const { return rebuilt_; }
  // Replaces the bucket all-reduce (comm_hooks.h): before the first backward, at most once.
  void register_comm_hook(CommHook hook);

  // Join (join.h): the next passes divide the gradient sum by `ranks` (default: the world size).
  void set_gradient_divisor(int ranks);
  // Join, on a rank that has joined: shadows one synchronised backward of the others -- every
  // bucket, zeros, launched in order through the same path (comm hook included) and waited for;
  // .grad is not written.
  void run_joined_pass();
  bool has_comm_hook() const { return static_cast<bool>(comm_hook_); }

 private:
  // When one bucket's all-reduce was launched and when it finished (set by the backend's
  // progress thread; shared, so it outlives a bucket rebuild).
  struct BucketTiming {
    std::chrono::steady_clock::time_point launched;
    std::atomic<int64_t> finished_ns{0};  // steady_clock, 0 until finished
  };
  struct Bucket {
    std::vector<size_t> members;   // parameter indices
    std::vector<int64_t> offsets;  // element offset of each member in `flat`
    Tensor flat;                   // contiguous, one dtype
    size_t pending = 0;            // members whose gradient has not arrived this pass
    WorkPtr work;
    BucketFuture future;  // the averaged bucket (the comm hook's, or the plain all-reduce's)
    std::shared_ptr<BucketTiming> timing;
  };
  // A synchronised pass whose statistics wait for its all-reduces to finish.
  struct PassRecord {
    std::vector<std::pair<WorkPtr, std::shared_ptr<BucketTiming>>> buckets;
    std::chrono::steady_clock::time_point backward_end;
    double copy_ms = 0;
    int64_t bytes = 0;
  };
  // Adds the recorded passes whose all-reduces have finished (all of them, waiting, if `wait`).
  void count_finished_passes(bool wait) const;

  Reducer(std::vector<std::pair<std::string, Tensor>> named_parameters, ProcessGroup group,
          ReducerOptions options);
  void install_hooks();
  void build_buckets(const std::vector<size_t>& order);
  void on_gradient_ready(size_t index);
  void mark_ready(size_t index, const Tensor& grad);
  void launch_ready_buckets();
  BucketFuture launch_bucket(size_t index);  // the hook, or the plain all-reduce
  void wait_for_bucket(Bucket& bucket);      // the averaged result in bucket.flat
  std::string wait_for_all_buckets();        // in order; the first failure's message, or ""
  void finalize();                           // the plain step: wait, write back, record
  void write_back_gradients();
  void record_pass(std::chrono::steady_clock::time_point backward_end);
  void reset_pass();
  // Beyond the plain step (reducer_variants.cpp):
  void on_static_graph_arrival(size_t index);
  void ready_first_static_pass();
  std::vector<size_t> static_graph_order() const;
  std::string ready_missing_parameters();  // "" or the names for fail_pass
  [[noreturn]] void fail_pass(const std::string& missing_names, const std::string& error);
  void after_first_pass(const std::vector<size_t>& order, const std::vector<int>& arrivals,
                        bool counts_known);

  std::vector<std::string> names_;
  std::vector<Tensor> params_;
  ProcessGroup group_;
  ReducerOptions options_;
  bool sync_ = true;
  CommHook comm_hook_;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> slot_of_;  // parameter -> (bucket, member index)
  std::vector<bool> arrived_;                       // this pass
  std::vector<size_t> arrival_order_;               // this pass, for the rebuild
  size_t next_to_launch_ = 0;
  bool pass_active_ = false;
  bool rebuilt_ = false;
  bool first_pass_done_ = false;  // a synchronised (or, under Join, shadowed) pass has finished
  int gradient_divisor_ = 0;      // 0: the world size (Join may set fewer ranks)
  // static_graph
  bool static_recorded_ = false;
  std::vector<int> expected_arrivals_;  // per parameter, from the first pass (0: unused)
  std::vector<int> arrivals_;           // this pass
  std::vector<int64_t> last_arrival_;   // first pass: when each parameter arrived for the last time
  int64_t arrival_seq_ = 0;
  std::chrono::steady_clock::time_point pass_start_;
  double copy_ms_this_pass_ = 0;
  int64_t synchronised_passes_ = 0;  // ever (stats can be reset)
  mutable std::deque<PassRecord> uncounted_;
  mutable ReducerStats stats_;
};

}  // namespace mg::parallel
