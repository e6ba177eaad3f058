// DataLoader: one pass = a Run (index list + worker threads + finished batches, delivered in order).
//
// Worker protocol (all under one mutex):
//   next_to_start    the next batch number a worker may claim; a worker claims it only while
//                    next_to_start < next_to_deliver + workers * prefetch (bounded read-ahead)
//   done             finished batches (or their error) keyed by batch number
//   next_to_deliver  the batch the loop waits for; it takes exactly that one from `done`
// Workers claim batches in increasing order but may finish in any order; the loop still sees
// 0, 1, 2, ... and the contents don't depend on who built them.
//
// pin_memory with the CUDA backend: build() copies the finished batch into pinned memory. With a
// CUDA `device` as well, build() then moves it to the GPU itself, on a copy stream of the loader's
// (one per device, shared by all loaders), so the copy overlaps the kernels of the step that runs
// meanwhile on the loop's stream:
//   1. allocate the device tensors with the loop's stream current (the pass's `compute` stream,
//      taken when the pass begins): the caching allocator then reuses them in that stream's order;
//   2. the copy stream waits for an event recorded on `compute` after the allocation (a reused
//      block may still be read by earlier work there), copies, and records `ready`;
//   3. on delivery, the loop's stream waits for `ready` (on the GPU: the host never blocks).
// Without pin_memory (or without the backend) the batch is moved with .to(device) on delivery.
#include "data/dataloader.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"
#include "core/grad_mode.h"

namespace mg::data {

struct DataLoader::Run {
  struct Result {
    Batch batch;
    std::string error;                   // non-empty: building the batch threw this
    std::shared_ptr<cuda::Event> ready;  // set when build() queued the copy to the GPU itself
  };

  Run(const Dataset& dataset, const DataLoaderOptions& options, int64_t epoch, std::vector<int64_t> order)
      : dataset(dataset), options(options), epoch(epoch), order(std::move(order)) {
    const int64_t n = static_cast<int64_t>(this->order.size());
    num_batches =
        options.drop_last ? n / options.batch_size : (n + options.batch_size - 1) / options.batch_size;
    // pin_memory has an effect only with the CUDA backend (none: a CPU-only run, nothing to pin for).
    pin = options.pin_memory && pinned_memory_available();
    if (pin && options.device && options.device->is_cuda()) {
      compute = cuda::current_stream(options.device->index);
      copy = copy_stream(options.device->index);
    }
  }
  ~Run() { stop(); }

  // ---- building one batch (any thread) ----
  std::vector<int64_t> batch_indices(int64_t k) const {
    const int64_t begin = k * options.batch_size;
    const int64_t end = std::min<int64_t>(begin + options.batch_size, static_cast<int64_t>(order.size()));
    return std::vector<int64_t>(order.begin() + begin, order.begin() + end);
  }

  Result build(int64_t k) const {
    Result result;
    const std::vector<int64_t> indices = batch_indices(k);
    try {
      NoGradGuard no_grad;
      result.batch = dataset.get_batch(indices);
      MG_CHECK(result.batch.data.defined() && result.batch.target.defined() && result.batch.data.dim() >= 1 &&
                   result.batch.data.size(0) == static_cast<int64_t>(indices.size()),
               "Dataset::get_batch returned ",
               result.batch.data.defined() ? shape_str(result.batch.data.shape()) : "[]", " for ",
               indices.size(), " indices");
      if (options.transform) {
        result.batch.data = options.transform->apply_batch(result.batch.data, indices, epoch, options.seed);
      }
      if (pin) {
        result.batch.data = result.batch.data.pin_memory();
        result.batch.target = result.batch.target.pin_memory();
      }
      if (copy) copy_to_device(result);
    } catch (const std::exception& e) {
      result.error = e.what();
    } catch (...) {
      result.error = "unknown exception (not derived from std::exception)";
    }
    return result;
  }

  // The loader's copy stream of a device: created on first use, shared by every loader.
  static cuda::Stream copy_stream(int device) {
    static std::mutex mutex;
    static std::map<int, cuda::Stream> streams;
    std::lock_guard<std::mutex> lock(mutex);
    auto it = streams.find(device);
    if (it == streams.end()) it = streams.emplace(device, cuda::create_stream(device)).first;
    return it->second;
  }

  // Steps 1-2 of the pinned path (top of this file): queues the batch's copy to the GPU on the
  // copy stream; result.ready completes when it has landed.
  void copy_to_device(Result& result) const {
    const Device device = *options.device;
    Tensor data, target;
    cuda::Event allocated;
    {
      cuda::StreamGuard on_compute(*compute);
      data = empty(result.batch.data.shape(), TensorOptions{result.batch.data.dtype(), device, false});
      target = empty(result.batch.target.shape(), TensorOptions{result.batch.target.dtype(), device, false});
      allocated.record(*compute);
    }
    allocated.wait(*copy);
    cuda::StreamGuard on_copy(*copy);
    data.copy_(result.batch.data);  // pinned source: queued, no wait
    target.copy_(result.batch.target);
    result.ready = std::make_shared<cuda::Event>();
    result.ready->record(*copy);
    result.batch.data = data;
    result.batch.target = target;
  }

  // ---- worker threads ----
  void start_workers() {
    for (int w = 0; w < options.workers; ++w) threads.emplace_back([this] { worker_loop(); });
  }

  void worker_loop() {
    const int64_t capacity = int64_t(options.workers) * options.prefetch;
    std::unique_lock<std::mutex> lock(mutex);
    for (;;) {
      work_cv.wait(lock, [&] {
        return stopping || next_to_start >= num_batches || next_to_start < next_to_deliver + capacity;
      });
      if (stopping || next_to_start >= num_batches) return;
      const int64_t k = next_to_start++;
      lock.unlock();
      Result result = build(k);
      lock.lock();
      done.emplace(k, std::move(result));
      ready_cv.notify_all();
    }
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      stopping = true;
    }
    work_cv.notify_all();
    for (std::thread& t : threads) t.join();
    threads.clear();
  }

  // ---- the loop's side ----
  // Makes batch `k` current (throws mg::Error if building it failed).
  void advance_to(int64_t k) {
    current = k;
    batch = Batch{};
    if (k >= num_batches) {
      stop();  // the pass is over; the workers have nothing left to do
      return;
    }
    Result result;
    if (options.workers == 0) {
      result = build(k);
    } else {
      std::unique_lock<std::mutex> lock(mutex);
      ready_cv.wait(lock, [&] { return done.count(k) > 0; });
      result = std::move(done.at(k));
      done.erase(k);
      next_to_deliver = k + 1;
      lock.unlock();
      work_cv.notify_all();
    }
    if (!result.error.empty()) {
      current = num_batches;  // a failed pass can't continue
      const std::vector<int64_t> indices = batch_indices(k);
      throw Error(str_cat("DataLoader: building batch ", k, " of ", num_batches, " (epoch ", epoch, ", ",
                          indices.size(), " samples starting at dataset index ", indices.front(),
                          ") failed: ", result.error));
    }
    if (result.ready) result.ready->wait(cuda::current_stream(options.device->index));  // step 3
    if (options.device) {  // a no-op when build() already moved the batch
      result.batch.data = result.batch.data.to(*options.device);
      result.batch.target = result.batch.target.to(*options.device);
    }
    batch = std::move(result.batch);
  }

  const Dataset& dataset;
  const DataLoaderOptions options;
  const int64_t epoch;
  const std::vector<int64_t> order;  // the epoch's dataset indices, from the sampler
  int64_t num_batches = 0;
  bool pin = false;                     // options.pin_memory, and the CUDA backend is there
  std::optional<cuda::Stream> compute;  // with pin and a CUDA device: the loop's stream
  std::optional<cuda::Stream> copy;     // ... and the stream the copies go to

  int64_t current = -1;  // the batch the iterator points at
  Batch batch;

  std::mutex mutex;
  std::condition_variable work_cv;   // workers wait here for room to read ahead (or stop)
  std::condition_variable ready_cv;  // the loop waits here for its next batch
  int64_t next_to_start = 0;
  int64_t next_to_deliver = 0;
  bool stopping = false;
  std::map<int64_t, Result> done;
  std::vector<std::thread> threads;
};

// ---- DataLoader -------------------------------------------------------------------------------

DataLoader::DataLoader(const Dataset& dataset, DataLoaderOptions options)
    : dataset_(dataset), options_(std::move(options)) {
  MG_CHECK(options_.batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", options_.batch_size);
  MG_CHECK(options_.workers >= 0, "DataLoader: workers must be >= 0, got ", options_.workers);
  MG_CHECK(options_.prefetch >= 1, "DataLoader: prefetch must be >= 1, got ", options_.prefetch);
  MG_CHECK(!(options_.sampler && options_.shuffle),
           "DataLoader: shuffle = true and a sampler are mutually exclusive (the sampler decides the order; "
           "give the sampler shuffling instead, e.g. RandomSampler or DistributedSampler with shuffle)");
  if (options_.device && options_.device->is_cuda()) {
    MG_CHECK(options_.device->index < cuda::device_count(), "DataLoader: device ", *options_.device,
             " requested, but ", cuda::describe_devices());
  }
  if (options_.sampler) {
    sampler_ = options_.sampler;
  } else {
    if (options_.shuffle) {
      own_sampler_ = std::make_unique<RandomSampler>(dataset_.size(), options_.seed);
    } else {
      own_sampler_ = std::make_unique<SequentialSampler>(dataset_.size());
    }
    sampler_ = own_sampler_.get();
  }
}

DataLoader::~DataLoader() = default;
DataLoader::DataLoader(DataLoader&&) noexcept = default;

void DataLoader::set_start_batch(int64_t k) {
  MG_CHECK(k >= 0, "DataLoader::set_start_batch: k must be >= 0, got ", k);
  start_batch_ = k;
}

int64_t DataLoader::size() const {
  const int64_t n = sampler_->size();
  return options_.drop_last ? n / options_.batch_size : (n + options_.batch_size - 1) / options_.batch_size;
}

DataLoader::Iterator DataLoader::begin() {
  const int64_t epoch = sampler_->epoch();
  std::vector<int64_t> order = sampler_->indices(epoch);
  const int64_t n = dataset_.size();
  for (size_t p = 0; p < order.size(); ++p) {
    MG_CHECK(order[p] >= 0 && order[p] < n, "DataLoader: the sampler gave index ", order[p], " (position ", p,
             " of epoch ", epoch, ") for a dataset of size ", n);
  }
  if (own_sampler_) own_sampler_->set_epoch(epoch + 1);  // the next pass is the next epoch
  const int64_t first = start_batch_;
  start_batch_ = 0;
  auto run = std::make_shared<Run>(dataset_, options_, epoch, std::move(order));
  MG_CHECK(first <= run->num_batches, "DataLoader: start batch ", first, " is past the ", run->num_batches,
           " batches of epoch ", epoch);
  run->next_to_start = run->next_to_deliver = first;
  run->start_workers();
  run->advance_to(first);
  return Iterator(std::move(run));
}

DataLoader::Iterator DataLoader::end() const { return Iterator(); }

// ---- Iterator ---------------------------------------------------------------------------------

bool DataLoader::Iterator::at_end() const { return !run_ || run_->current >= run_->num_batches; }

Batch& DataLoader::Iterator::operator*() const {
  MG_CHECK(!at_end(), "DataLoader::Iterator: dereferencing the end of the pass");
  return run_->batch;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  MG_CHECK(!at_end(), "DataLoader::Iterator: incrementing past the end of the pass");
  run_->advance_to(run_->current + 1);
  return *this;
}

bool DataLoader::Iterator::operator==(const Iterator& other) const {
  if (at_end() || other.at_end()) return at_end() == other.at_end();
  return run_ == other.run_;
}

int64_t DataLoader::Iterator::batch_index() const { return run_ ? run_->current : -1; }
int64_t DataLoader::Iterator::epoch() const { return run_ ? run_->epoch : -1; }

}  // namespace mg::data
