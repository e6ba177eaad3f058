// DataLoader: batching, epochs, determinism across worker counts, early exit, worker errors; and
// the in-memory datasets it is usually fed (TensorDataset, SyntheticClassification).
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <thread>

#include "core/ops.h"
#include "data/dataloader.h"
#include "data/distributed_sampler.h"
#include "data/synthetic.h"
#include "data/transforms.h"

using namespace mg;
using namespace mg::data;
using Catch::Contains;

namespace {

// Every batch of one pass, as host vectors (data, target).
struct Pass {
  std::vector<std::vector<float>> data;
  std::vector<std::vector<int64_t>> target;
  std::vector<Shape> shapes;
  bool operator==(const Pass& o) const { return data == o.data && target == o.target && shapes == o.shapes; }
};

Pass collect(DataLoader& loader) {
  Pass pass;
  for (auto& [x, y] : loader) {
    pass.data.push_back(x.to_vector<float>());
    pass.target.push_back(y.to_vector<int64_t>());
    pass.shapes.push_back(x.shape());
  }
  return pass;
}

// A dataset that only implements get(): the loader falls back to stacking. It can also sleep
// (to scramble which worker finishes first), count calls, and throw on one index.
class SlowDataset : public Dataset {
 public:
  explicit SlowDataset(int64_t n, int64_t throw_at = -1, int sleep_us = 0)
      : n_(n), throw_at_(throw_at), sleep_us_(sleep_us) {}
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override {
    calls.fetch_add(1);
    if (index == throw_at_) throw Error(str_cat("SlowDataset: sample ", index, " is unreadable"));
    if (sleep_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds((index * 37) % sleep_us_));
    return Example{full({2, 3}, double(index)), scalar_tensor(double(index % 10), TensorOptions{DType::i64})};
  }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t n_, throw_at_;
  int sleep_us_;
};

}  // namespace

TEST_CASE("TensorDataset indexes along dim 0", "[data][dataset]") {
  Tensor x = arange(12).to(DType::f32).view({6, 2}), y = arange(6);
  TensorDataset ds(x, y);
  CHECK(ds.size() == 6);
  Example e = ds.get(4);
  CHECK(e.data.to_vector<float>() == std::vector<float>{8, 9});
  CHECK(e.target.item<int64_t>() == 4);
  Batch b = ds.get_batch({5, 0});
  CHECK(b.data.shape() == Shape{2, 2});
  CHECK(b.data.to_vector<float>() == std::vector<float>{10, 11, 0, 1});
  CHECK(b.target.to_vector<int64_t>() == std::vector<int64_t>{5, 0});
  // The default (stacking) path gives the same batch.
  Batch s = ds.Dataset::get_batch({5, 0});
  CHECK(s.data.to_vector<float>() == b.data.to_vector<float>());
  CHECK(s.target.to_vector<int64_t>() == b.target.to_vector<int64_t>());
  CHECK_THROWS_WITH(ds.get(6), Contains("TensorDataset::get: index 6 is out of range [0, 6)"));
  CHECK_THROWS_WITH(TensorDataset(x, arange(5)), Contains("data has 6 samples") && Contains("targets has 5"));
}

TEST_CASE("SyntheticClassification is deterministic and learnable-shaped", "[data][dataset]") {
  SyntheticClassification a(100, {1, 4, 4}, 10, 3), b(100, {1, 4, 4}, 10, 3), c(100, {1, 4, 4}, 10, 4);
  Example e = a.get(17);
  CHECK(e.data.shape() == Shape{1, 4, 4});
  CHECK(e.target.dim() == 0);
  CHECK(e.data.to_vector<float>() == b.get(17).data.to_vector<float>());
  CHECK(e.data.to_vector<float>() != c.get(17).data.to_vector<float>());
  Batch batch = a.get_batch({17, 3});
  CHECK(batch.data.shape() == Shape{2, 1, 4, 4});
  std::vector<float> all = batch.data.to_vector<float>();
  CHECK(std::vector<float>(all.begin(), all.begin() + 16) == e.data.to_vector<float>());
  CHECK(batch.target.to_vector<int64_t>() == std::vector<int64_t>{a.label(17), a.label(3)});
  std::set<int64_t> labels;
  for (int64_t i = 0; i < 100; ++i) labels.insert(a.label(i));
  CHECK(labels.size() == 10);  // all classes occur
  CHECK_THROWS_WITH(a.get(100), Contains("index 100 is out of range"));
}

TEST_CASE("DataLoader batches in order, with len() and drop_last", "[data][dataloader]") {
  TensorDataset ds(arange(10).to(DType::f32), arange(10));
  DataLoaderOptions options;
  options.batch_size = 3;
  DataLoader loader(ds, options);
  CHECK(loader.size() == 4);
  CHECK(loader.len() == 4);
  Pass p = collect(loader);
  REQUIRE(p.target.size() == 4);
  CHECK(p.target[0] == std::vector<int64_t>{0, 1, 2});
  CHECK(p.target[3] == std::vector<int64_t>{9});  // the last batch is smaller

  DataLoaderOptions dropping_options;
  dropping_options.batch_size = 3;
  dropping_options.drop_last = true;
  DataLoader dropping(ds, dropping_options);
  CHECK(dropping.size() == 3);
  Pass d = collect(dropping);
  REQUIRE(d.target.size() == 3);
  CHECK(d.target[2] == std::vector<int64_t>{6, 7, 8});

  DataLoaderOptions big_options;
  big_options.batch_size = 32;
  big_options.drop_last = true;
  DataLoader big(ds, big_options);
  CHECK(big.size() == 0);
  CHECK(big.begin() == big.end());

  // Iterator basics.
  auto it = loader.begin();
  CHECK(it.batch_index() == 0);
  CHECK(it->data.shape() == Shape{3});
  ++it;
  CHECK(it.batch_index() == 1);
  CHECK(it != loader.end());
}

TEST_CASE("DataLoader gives identical batches for 0, 1 and 3 workers", "[data][dataloader][determinism]") {
  SyntheticClassification ds(1000, {1, 8, 8}, 10, 5);
  auto transform =
      std::make_shared<Compose>(RandomCrop(8, 2), RandomHorizontalFlip(0.5), Normalize({0.1}, {0.9}));
  std::vector<Pass> passes;
  for (int workers : {0, 1, 3}) {
    for (int prefetch : {1, 4}) {
      DataLoaderOptions options;
      options.batch_size = 64;
      options.shuffle = true;
      options.seed = 11;
      options.workers = workers;
      options.prefetch = prefetch;
      options.transform = transform;
      DataLoader loader(ds, options);
      CHECK(loader.size() == 16);
      passes.push_back(collect(loader));  // epoch 0
      passes.push_back(collect(loader));  // epoch 1
    }
  }
  for (size_t i = 2; i < passes.size(); ++i) CHECK(passes[i] == passes[i % 2]);
  CHECK_FALSE(passes[0] == passes[1]);  // a new shuffle and new augmentation per epoch
  CHECK(passes[0].shapes.back() == Shape{1000 - 15 * 64, 1, 8, 8});

  // Workers finishing out of order (random sleeps) still deliver in order.
  SlowDataset slow(200, -1, 300);
  DataLoaderOptions serial_options;
  serial_options.batch_size = 7;
  serial_options.shuffle = true;
  serial_options.seed = 3;
  DataLoaderOptions parallel_options = serial_options;
  parallel_options.workers = 4;
  parallel_options.prefetch = 1;
  DataLoader serial(slow, serial_options);
  DataLoader parallel(slow, parallel_options);
  CHECK(collect(serial) == collect(parallel));
}

TEST_CASE("DataLoader epochs: shuffle per epoch, set_epoch, a user sampler", "[data][dataloader]") {
  TensorDataset ds(arange(50).to(DType::f32), arange(50));
  DataLoaderOptions options;
  options.batch_size = 50;
  options.shuffle = true;
  options.seed = 1;
  DataLoader loader(ds, options);
  CHECK(loader.epoch() == 0);
  Pass e0 = collect(loader);
  CHECK(loader.epoch() == 1);  // each pass advances the loader's own sampler
  Pass e1 = collect(loader);
  CHECK_FALSE(e0 == e1);
  CHECK(e0.target[0] == RandomSampler(50, 1).indices(0));
  loader.set_epoch(0);
  CHECK(collect(loader) == e0);  // resuming at epoch 0 replays it

  DataLoaderOptions sequential_options;
  sequential_options.batch_size = 50;
  DataLoader sequential(ds, sequential_options);
  CHECK(collect(sequential) == collect(sequential));

  // A user sampler decides the order; the loader never advances its epoch.
  DistributedSamplerOptions sampler_options;
  sampler_options.shuffle = true;
  sampler_options.seed = 8;
  DistributedSampler sampler(50, 1, 2, sampler_options);
  DataLoaderOptions shard_options;
  shard_options.batch_size = 5;
  shard_options.sampler = &sampler;
  shard_options.workers = 2;
  DataLoader shard(ds, shard_options);
  CHECK(shard.size() == 5);
  Pass s0 = collect(shard);
  CHECK(collect(shard) == s0);
  CHECK(sampler.epoch() == 0);
  sampler.set_epoch(1);
  Pass s1 = collect(shard);
  CHECK_FALSE(s1 == s0);
  std::vector<int64_t> flat;
  for (const auto& t : s1.target) flat.insert(flat.end(), t.begin(), t.end());
  CHECK(flat == sampler.indices(1));
  shard.set_epoch(0);  // forwards to the sampler
  CHECK(sampler.epoch() == 0);

  DataLoaderOptions shuffle_and_sampler;
  shuffle_and_sampler.shuffle = true;
  shuffle_and_sampler.sampler = &sampler;
  CHECK_THROWS_WITH(DataLoader(ds, shuffle_and_sampler), Contains("mutually exclusive"));
  DataLoaderOptions empty_batches;
  empty_batches.batch_size = 0;
  CHECK_THROWS_WITH(DataLoader(ds, empty_batches), Contains("batch_size must be >= 1"));
  DataLoaderOptions negative_workers;
  negative_workers.workers = -1;
  CHECK_THROWS_WITH(DataLoader(ds, negative_workers), Contains("workers must be >= 0"));
  DistributedSamplerOptions in_order;
  in_order.shuffle = false;
  DistributedSampler too_big(60, 0, 1, in_order);
  DataLoaderOptions bad_options;
  bad_options.batch_size = 5;
  bad_options.sampler = &too_big;
  DataLoader bad(ds, bad_options);
  CHECK_THROWS_WITH(bad.begin(), Contains("sampler gave index 50") && Contains("dataset of size 50"));
}

TEST_CASE("DataLoader: set_start_batch resumes mid-epoch exactly", "[data][dataloader]") {
  SyntheticClassification ds(100, {1, 2, 3}, 4, 1);
  auto flip = std::make_shared<RandomHorizontalFlip>(0.5);
  for (int workers : {0, 2}) {
    DataLoaderOptions options;
    options.batch_size = 8;
    options.shuffle = true;
    options.seed = 5;
    options.workers = workers;
    options.transform = flip;
    DataLoader full(ds, options);
    full.set_epoch(3);
    const Pass all = collect(full);
    DataLoader resumed(ds, options);
    resumed.set_epoch(3);
    resumed.set_start_batch(5);
    std::vector<int64_t> indices;
    Pass tail;
    for (auto it = resumed.begin(); it != resumed.end(); ++it) {
      indices.push_back(it.batch_index());
      tail.data.push_back(it->data.to_vector<float>());
    }
    CHECK(indices == std::vector<int64_t>{5, 6, 7, 8, 9, 10, 11, 12});
    CHECK(tail.data == std::vector<std::vector<float>>(all.data.begin() + 5, all.data.end()));
    CHECK(resumed.epoch() == 4);
    CHECK(collect(resumed).data.size() == 13);  // only one pass is shortened
    resumed.set_start_batch(13);
    CHECK(resumed.begin() == resumed.end());
    resumed.set_start_batch(14);
    CHECK_THROWS_WITH(resumed.begin(), Contains("start batch 14 is past the 13 batches"));
  }
}

TEST_CASE("DataLoader: breaking out early stops the workers", "[data][dataloader]") {
  SlowDataset ds(100000, -1, 50);
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 20; ++round) {
    DataLoaderOptions options;
    options.batch_size = 10;
    options.workers = 3;
    options.prefetch = 2;
    DataLoader loader(ds, options);
    ds.calls = 0;
    int seen = 0;
    for (auto& [x, y] : loader) {
      CHECK(x.shape() == Shape{10, 2, 3});
      if (++seen == 2) break;
    }
    // Read-ahead is bounded: at most workers * prefetch batches beyond the ones delivered.
    CHECK(ds.calls.load() <= (2 + 3 * 2) * 10);
  }
  // An iterator dropped mid-pass (not via range-for) also cleans up.
  {
    DataLoaderOptions options;
    options.batch_size = 10;
    options.workers = 2;
    DataLoader loader(ds, options);
    auto it = loader.begin();
    ++it;
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("DataLoader rethrows a failed batch with its index", "[data][dataloader]") {
  SlowDataset ds(100, /*throw_at=*/37);
  for (int workers : {0, 1, 3}) {
    INFO("workers " << workers);
    DataLoaderOptions options;
    options.batch_size = 10;
    options.workers = workers;
    DataLoader loader(ds, options);
    int delivered = 0;
    try {
      for (auto& batch : loader) {
        (void)batch;
        ++delivered;
      }
      FAIL("expected an error");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Contains("building batch 3 of 10") && Contains("epoch 0") &&
                           Contains("SlowDataset: sample 37 is unreadable"));
    }
    CHECK(delivered == 3);  // batches 0..2 arrived, in order, before the failure
  }
}

TEST_CASE("DataLoader moves batches to the requested device", "[data][dataloader]") {
  TensorDataset ds(arange(8).to(DType::f32), arange(8));
  DataLoaderOptions options;
  options.batch_size = 4;
  options.workers = 1;
  options.pin_memory = true;
  options.device = Device::cpu(1);
  DataLoader loader(ds, options);
  for (auto& [x, y] : loader) {
    CHECK(x.device() == Device::cpu(1));
    CHECK(y.device() == Device::cpu(1));
  }
}
