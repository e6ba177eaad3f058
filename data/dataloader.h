// DataLoader: turns a Dataset into a stream of batches for a training loop.
//
//   data::DataLoaderOptions options;
//   options.batch_size = 128;
//   options.shuffle = true;
//   options.workers = 2;
//   data::DataLoader loader(train, options);
//   for (auto& [x, y] : loader) { ... }          // one pass = one epoch
//
// What it does per pass: ask the sampler for the epoch's index list, cut it into batches of
// batch_size (the last one smaller, or dropped with drop_last), and build each batch with
// Dataset::get_batch plus the optional per-sample transform. With workers > 0, that work runs on
// background threads that stay up to workers * prefetch batches ahead of the loop.
//
// Determinism: batch k is always the same tensors for the same (dataset, seed, epoch, options),
// whatever `workers` is. The index list is a pure function of (sampler, epoch); transforms draw
// from Philox keyed by (seed, epoch, sample index); workers may *finish* batches in any order,
// but the loop receives them strictly in order 0, 1, 2, ...
//
// Epochs: with the loader's own sampler (shuffle true/false, no `sampler`), each pass uses
// epoch() and then advances it by one, so `for (epoch...) for (batch : loader)` reshuffles every
// epoch as in PyTorch; set_epoch(e) chooses the next pass's epoch (e.g. when resuming). With a
// user `sampler` (DistributedSampler), the loader uses sampler->epoch() and never changes it:
// call sampler.set_epoch(e) (or loader.set_epoch(e), which forwards) at the top of each epoch.
//
// Leaving the loop early (break, exception) destroys the pass: its threads are told to stop,
// finish the batch in hand and are joined, so nothing keeps running or leaks. An exception thrown
// while building a batch (in a worker or inline) reaches the loop as mg::Error naming the batch.
//
// The Dataset (and a user sampler and transform) must outlive the loader and any pass over it.
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>

#include "base/device.h"
#include "data/dataset.h"
#include "data/sampler.h"
#include "data/transforms.h"

namespace mg::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;        // the loader's own RandomSampler(seed); not with `sampler`
  bool drop_last = false;      // drop the last, incomplete batch
  uint64_t seed = 0;           // shuffle order and transform randomness
  Sampler* sampler = nullptr;  // not owned; decides the order (e.g. DistributedSampler)
  int workers = 0;             // background threads building batches; 0 = build in the loop's thread
  int prefetch = 2;            // batches in flight per worker
  // PyTorch's pin_memory. With the CUDA backend, batches are built in page-locked (pinned) host
  // memory (Tensor::is_pinned); with a CUDA `device` too, the worker (or the loop, workers == 0)
  // queues the copy to the GPU on a separate copy stream, and the loop's stream waits for it on
  // the GPU, so copying batch k+1 overlaps computing on batch k. Device tensors are allocated on
  // the stream current in the loop's thread when the pass begins: use the batches there. In a
  // CPU-only run (no CUDA backend) it is accepted and has no effect. Not yet run on a GPU.
  bool pin_memory = false;
  std::optional<Device> device = std::nullopt;           // batches are moved here (.to(device)) on delivery
  std::shared_ptr<const Transform> transform = nullptr;  // applied to each sample's data
};

class DataLoader {
 public:
  class Iterator;

  DataLoader(const Dataset& dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(DataLoader&&) noexcept;
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts a pass (one epoch) and returns its first batch; end() is past the last.
  Iterator begin();
  Iterator end() const;

  // Batches per pass (PyTorch's len(loader)).
  int64_t size() const;
  int64_t len() const { return size(); }
  // The epoch the next pass uses.
  int64_t epoch() const { return sampler_->epoch(); }
  void set_epoch(int64_t epoch) { sampler_->set_epoch(epoch); }
  // Exact mid-epoch resume: the next pass (only) starts at batch k of its epoch, skipping the
  // first k without building them. Save epoch() and the batches consumed in a checkpoint; on
  // resume call set_epoch(saved epoch) and set_start_batch(consumed).
  void set_start_batch(int64_t k);

  const Dataset& dataset() const { return dataset_; }
  const Sampler& sampler() const { return *sampler_; }
  const DataLoaderOptions& options() const { return options_; }

 private:
  struct Run;  // one pass: the index list, worker threads and finished batches (dataloader.cpp)

  const Dataset& dataset_;
  DataLoaderOptions options_;
  std::unique_ptr<Sampler> own_sampler_;  // when options.sampler is null
  Sampler* sampler_;
  int64_t start_batch_ = 0;  // for the next pass only
};

// An input iterator over one pass. Copies share the pass; the pass ends (threads joined) when the
// last copy is destroyed.
class DataLoader::Iterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;
  using pointer = Batch*;
  using reference = Batch&;

  Iterator() = default;
  Batch& operator*() const;
  Batch* operator->() const { return &**this; }
  Iterator& operator++();
  bool operator==(const Iterator& other) const;
  bool operator!=(const Iterator& other) const { return !(*this == other); }

  int64_t batch_index() const;  // k for the k-th batch of the pass
  int64_t epoch() const;        // the epoch this pass runs

 private:
  friend class DataLoader;
  explicit Iterator(std::shared_ptr<Run> run) : run_(std::move(run)) {}
  bool at_end() const;
  std::shared_ptr<Run> run_;
};

}  // namespace mg::data
