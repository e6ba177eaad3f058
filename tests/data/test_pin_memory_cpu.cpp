// Pinned memory in a CPU-only run (no CUDA backend registered): tensors are not
// pinned, pin_memory() refuses with an error that says why, and
// DataLoaderOptions::pin_memory is accepted and changes nothing. The GPU side
// (pinned pool, async copies, the loader's copy stream) is tested in
// tests/gpu/test_cuda_pinned.cpp.
#include <catch2/catch.hpp>

#include <vector>

#include "core/allocator.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "multigrad.h"

namespace mg {
namespace {

using Catch::Matchers::Contains;

TEST_CASE("without a CUDA backend nothing is pinned and pin_memory says why", "[data][pin_memory]") {
  if (pinned_memory_available()) {
    WARN("a CUDA backend is registered (MG_CUDA_BACKEND=1 on a GPU machine): nothing to check");
    return;
  }
  const Tensor t = arange(6).to(DType::f32);
  CHECK_FALSE(t.is_pinned());
  CHECK_FALSE(Tensor().is_pinned());
  CHECK_THROWS_WITH(t.pin_memory(), Contains("pin_memory") && Contains("CUDA backend"));
}

TEST_CASE("DataLoader pin_memory has no effect in a CPU-only run", "[data][pin_memory]") {
  if (pinned_memory_available()) {
    WARN("a CUDA backend is registered (MG_CUDA_BACKEND=1 on a GPU machine): nothing to check");
    return;
  }
  data::TensorDataset ds(arange(40).to(DType::f32).reshape({20, 2}), arange(20));
  for (int workers : {0, 2}) {
    data::DataLoaderOptions plain_options;
    plain_options.batch_size = 6;
    plain_options.shuffle = true;
    plain_options.seed = 3;
    plain_options.workers = workers;
    data::DataLoaderOptions pinned_options = plain_options;
    pinned_options.pin_memory = true;
    data::DataLoader plain(ds, plain_options);
    data::DataLoader pinned(ds, pinned_options);
    std::vector<std::vector<float>> expected_x, got_x;
    std::vector<std::vector<int64_t>> expected_y, got_y;
    for (auto& batch : plain) {
      expected_x.push_back(batch.data.to_vector<float>());
      expected_y.push_back(batch.target.to_vector<int64_t>());
    }
    for (auto& batch : pinned) {
      CHECK_FALSE(batch.data.is_pinned());
      got_x.push_back(batch.data.to_vector<float>());
      got_y.push_back(batch.target.to_vector<int64_t>());
    }
    INFO("workers = " << workers);
    CHECK(expected_x.size() == 4);
    CHECK(got_x == expected_x);
    CHECK(got_y == expected_y);
  }
}

}  // namespace
}  // namespace mg
