// Pinned host memory and the asynchronous host->device copy
// (core/cuda_allocator.cu's PinnedHostPool, Tensor::pin_memory) and the
// DataLoader's pin_memory path (data/dataloader.cpp): pinned tensors say so,
// round-trip through the async copy even when the source is freed and its
// block asked for again at once, and a loader with pin_memory and device
// cuda:0 delivers the same batches as one without. Runs only with a GPU
// (exit 77 otherwise); not yet run on one.
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <vector>

#include "core/cuda_stream.h"
#include "data/dataloader.h"
#include "data/dataset.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using Catch::Matchers::Contains;

TEST_CASE("pin_memory gives a pinned copy; pinned tensors say so", "[gpu][pinned]") {
  const Tensor t = arange(12).to(DType::f32).reshape({3, 4});
  const Tensor view = t.transpose(0, 1);  // not contiguous: pinned as a contiguous copy
  CHECK_FALSE(t.is_pinned());
  const Tensor p = view.pin_memory();
  CHECK(p.is_pinned());
  CHECK(p.is_contiguous());
  CHECK(p.device().is_cpu());
  CHECK(p.to_vector<float>() == view.contiguous().to_vector<float>());
  CHECK(p.pin_memory().storage() == p.storage());  // already pinned: itself
  const Tensor on_gpu = t.to(gpu());
  CHECK_FALSE(on_gpu.is_pinned());
  CHECK_THROWS_WITH(on_gpu.pin_memory(), Contains("only CPU tensors can be pinned"));
}

TEST_CASE("an async copy from pinned memory survives freeing and reusing the source", "[gpu][pinned]") {
  // 64 MiB: long enough (~10 us+) that a block handed out again before the copy
  // finished would be overwritten while the GPU still reads it.
  const int64_t n = int64_t(16) << 20;
  const Tensor expected = random_cpu({n});
  Tensor on_gpu;
  {
    const Tensor source = expected.pin_memory();
    cuda::DeviceGuard guard(0);
    on_gpu = empty({n}, TensorOptions{DType::f32, gpu()});
    on_gpu.copy_(source);  // queued; returns before the copy is done
  }                        // the pinned source is freed here, maybe while the copy runs
  for (int i = 0; i < 4; ++i) {
    Tensor reuse = empty({n}).pin_memory();  // asks the pool for a block of the same size
    reuse.fill_(-1.0);
  }
  cuda::synchronize(cuda::current_stream(0));
  CHECK(on_gpu.to(Device::cpu()).to_vector<float>() == expected.to_vector<float>());
  // And back: device -> pinned host.
  Tensor back = empty({n}).pin_memory();
  back.copy_(on_gpu);
  CHECK(back.to_vector<float>() == expected.to_vector<float>());
}

TEST_CASE("DataLoader with pin_memory and device cuda:0 yields the same batches as without",
          "[gpu][pinned][dataloader]") {
  manual_seed(3);
  data::TensorDataset ds(random_cpu({100, 3, 5}), arange(100));
  for (int workers : {0, 2}) {
    INFO("workers = " << workers);
    data::DataLoaderOptions base;
    base.batch_size = 16;
    base.shuffle = true;
    base.seed = 9;
    base.workers = workers;
    data::DataLoaderOptions pinned_gpu = base, pinned_cpu = base;
    pinned_gpu.pin_memory = pinned_cpu.pin_memory = true;
    pinned_gpu.device = gpu();
    data::DataLoader plain(ds, base), to_gpu(ds, pinned_gpu), pinned(ds, pinned_cpu);
    std::vector<std::vector<float>> want_x;
    std::vector<std::vector<int64_t>> want_y;
    for (auto& b : plain) {
      want_x.push_back(b.data.to_vector<float>());
      want_y.push_back(b.target.to_vector<int64_t>());
    }
    REQUIRE(want_x.size() == 7);
    size_t k = 0;
    for (auto& b : to_gpu) {
      REQUIRE(k < want_x.size());
      CHECK(b.data.device() == gpu());
      CHECK(b.target.device() == gpu());
      CHECK(b.data.to_vector<float>() == want_x[k]);  // reads on the loop's stream, after the copy
      CHECK(b.target.to_vector<int64_t>() == want_y[k]);
      ++k;
    }
    CHECK(k == want_x.size());
    k = 0;
    for (auto& b : pinned) {
      CHECK(b.data.is_pinned());
      CHECK(b.target.is_pinned());
      CHECK(b.data.to_vector<float>() == want_x[k++]);
    }
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
