// CUDA tensors end to end, through the public Tensor API: transfers, the caching
// allocator's reuse, statistics and out-of-memory message, streams and events,
// an op without a CUDA kernel, and the gradients and optimizer step of a small
// MLP computed on cuda:0 against the same computation on the CPU.
// Runs only with a GPU (gpu_main.cpp exits 77 otherwise).
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <string>
#include <vector>

#include "core/cuda_allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/optim.h"
#include "optim/adam.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;

TEST_CASE("the CUDA backend is registered and Tensor::to round-trips every dtype", "[gpu][tensor]") {
  REQUIRE(cuda::backend_enabled());
  REQUIRE(cuda_backend() != nullptr);
  manual_seed(11);
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    INFO("dtype " << dt);
    const Tensor x = mul(random_cpu({3, 4, 5}), 10.0).to(dt);
    const Tensor g = x.to(gpu());
    CHECK(g.device() == gpu());
    CHECK(g.dtype() == dt);
    const Tensor back = g.to(Device::cpu());
    CHECK(back.to_vector<double>() == x.to_vector<double>());
    // A strided view and a dtype change on the device, then back.
    const Tensor t = g.transpose(0, 2).contiguous().to(DType::f64).to(Device::cpu());
    CHECK(t.to_vector<double>() == x.transpose(0, 2).contiguous().to(DType::f64).to_vector<double>());
  }
}

TEST_CASE("the caching allocator reuses freed blocks and counts what it holds", "[gpu][allocator]") {
  cuda::synchronize_device(0);
  cuda::empty_cache();
  const AllocatorStats before = cuda::memory_stats(0);
  CHECK(before.reserved_bytes == before.allocated_bytes);  // nothing cached after empty_cache
  {
    Tensor a = empty({1000, 1000}, TensorOptions{DType::f32, gpu()});  // 4 MB: a large block
    const AllocatorStats live = cuda::memory_stats(0);
    CHECK(live.allocated_bytes >= before.allocated_bytes + 4000000);
    CHECK(live.system_allocations == before.system_allocations + 1);
    CHECK(live.peak_allocated_bytes >= live.allocated_bytes);
  }
  const AllocatorStats freed = cuda::memory_stats(0);
  CHECK(freed.allocated_bytes == before.allocated_bytes);
  CHECK(freed.reserved_bytes >= before.reserved_bytes + 4000000);  // cached, not returned
  {
    // A slightly smaller request is served from the cache: no new cudaMalloc.
    Tensor b = empty({999, 1000}, TensorOptions{DType::f32, gpu()});
    const AllocatorStats reused = cuda::memory_stats(0);
    CHECK(reused.system_allocations == freed.system_allocations);
    CHECK(reused.cache_hits == freed.cache_hits + 1);
  }
  cuda::empty_cache();
  const AllocatorStats emptied = cuda::memory_stats(0);
  CHECK(emptied.reserved_bytes == emptied.allocated_bytes);
}

TEST_CASE("a CUDA out-of-memory error says what was asked and what is held", "[gpu][allocator]") {
  Tensor held = empty({1 << 20}, TensorOptions{DType::f32, gpu()});  // so "held" is not zero
  try {
    Tensor huge = empty({int64_t(1) << 50}, TensorOptions{DType::f32, gpu()});  // 4 PiB
    FAIL("allocating 4 PiB succeeded");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("CUDA out of memory on cuda:0") != std::string::npos);
    CHECK(msg.find("asked for") != std::string::npos);
    CHECK(msg.find("4503599627370496 bytes") != std::string::npos);
    CHECK(msg.find("in live tensors") != std::string::npos);
    CHECK(msg.find("free of") != std::string::npos);
  }
  // The allocator still works afterwards.
  Tensor after = ones({10}, TensorOptions{DType::f32, gpu()});
  CHECK(sum(after).item<float>() == 10.0f);
}

TEST_CASE("an op without a CUDA kernel names itself instead of falling back", "[gpu][dispatch]") {
  // matmul_reference (the triple-loop yardstick) is the one op left that exists on the CPU only.
  const Tensor x = ones({2, 3}, TensorOptions{DType::f32, gpu()});
  try {
    matmul_reference(x, x.t());
    FAIL("matmul_reference ran on cuda:0 although it has no CUDA kernel");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("matmul_reference") != std::string::npos);
    CHECK(msg.find("no CUDA kernel") != std::string::npos);
  }
}

TEST_CASE("streams and events order work and time it", "[gpu][stream]") {
  const cuda::Stream side = cuda::create_stream(0);
  CHECK(side.handle != nullptr);
  const Tensor x = full({1 << 20}, 2.0, TensorOptions{DType::f32, gpu()});
  Tensor y;
  cuda::Event start(true), stop(true), done;
  {
    // The side stream waits for x (made on the default stream), computes y, and the
    // default stream then waits for y before reading it.
    cuda::Event x_ready;
    x_ready.record(cuda::current_stream(0));
    cuda::StreamGuard guard(side);
    CHECK(cuda::current_stream(0) == side);
    x_ready.wait(side);
    start.record(side);
    y = mul(x, 3.0);
    stop.record(side);
    done.record(side);
  }
  CHECK(cuda::current_stream(0) == cuda::default_stream(0));
  done.wait(cuda::current_stream(0));
  CHECK(sum(y).item<double>() == Approx(6.0 * (1 << 20)));
  stop.synchronize();
  CHECK(stop.query());
  CHECK(start.elapsed_ms(stop) >= 0.0f);
}

// The same two-layer MLP, loss, backward and Adam step on the CPU and on cuda:0.
TEST_CASE("MLP gradients and an Adam step on CUDA match the CPU", "[gpu][mlp]") {
  manual_seed(12);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dt);
    const int64_t batch = 64, in = 50, hidden = 40, classes = 10;
    std::vector<Tensor> cpu_params = {random_cpu({hidden, in}, dt, 0.1), random_cpu({hidden}, dt, 0.1),
                                      random_cpu({classes, hidden}, dt, 0.1), random_cpu({classes}, dt, 0.1)};
    std::vector<Tensor> gpu_params;
    for (Tensor& p : cpu_params) {
      gpu_params.push_back(p.to(gpu()).set_requires_grad(true));
      p.set_requires_grad(true);
    }
    const Tensor x = random_cpu({batch, in}, dt);
    std::vector<int64_t> labels(batch);
    for (int64_t i = 0; i < batch; ++i) labels[i] = (i * 3) % classes;
    const Tensor y = tensor<int64_t>(labels);
    auto loss_of = [&](const std::vector<Tensor>& w, const Tensor& xx, const Tensor& yy) {
      const Tensor h = relu(linear(xx, w[0], w[1]));
      const Tensor logits = linear(h, w[2], w[3]);
      return add(cross_entropy(logits, yy), mul(sum(mul(w[0], w[0])), 1e-3));  // + an L2 term (reductions)
    };
    const Tensor loss_cpu = loss_of(cpu_params, x, y);
    const Tensor loss_gpu = loss_of(gpu_params, x.to(gpu()), y.to(gpu()));
    CHECK(loss_gpu.device() == gpu());
    CHECK(loss_gpu.item<double>() ==
          Approx(loss_cpu.item<double>()).epsilon(dt == DType::f32 ? 1e-5 : 1e-12));
    loss_cpu.backward();
    loss_gpu.backward();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      INFO("parameter " << i);
      REQUIRE(gpu_params[i].grad().defined());
      CHECK(gpu_params[i].grad().device() == gpu());
      MG_REQUIRE_CLOSE(gpu_params[i].grad(), cpu_params[i].grad(), dt == DType::f32 ? 1e-5 : 1e-12);
    }
    optim::Adam opt_cpu(cpu_params, optim::AdamOptions{}), opt_gpu(gpu_params, optim::AdamOptions{});
    opt_cpu.step();
    opt_gpu.step();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      INFO("parameter after step " << i);
      MG_REQUIRE_CLOSE(gpu_params[i], cpu_params[i], dt == DType::f32 ? 1e-5 : 1e-12);
    }
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
