// Every ProcessGroup operation on CUDA tensors over the NCCL backend, run under `mpiexec -n 2`
// with one GPU per rank (tests/parallel/CMakeLists.txt). Each result is compared with the same
// operation on the same data as CPU tensors over the MPI backend of the same group.
//
// Exits 77 (ctest: skipped) when this build has no NCCL, when there is no CUDA device, or when
// two ranks would share one physical GPU (NCCL refuses that; MG_VIRTUAL_GPUS cannot help here).
// MG_REQUIRE_GPU=1 turns the missing device into a failure, as in tests/gpu_main.cpp.

#include <unistd.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/cuda_allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"
#include "core/ops.h"
#include "multigrad.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/ring_allreduce.h"
#include "tests/catch_session.h"

using namespace mg;
using namespace mg::parallel;

namespace {

ProcessGroup* g_group = nullptr;  // one group for the whole run (NCCL communicators are costly)

ProcessGroup& group() {
  MG_CHECK(g_group != nullptr, "test_nccl_collectives: no group (main() sets it)");
  return *g_group;
}
Device gpu() { return group().device(); }

// rank r contributes r*100 + (i % 50) - 20 at element i (small integers: exact in every dtype,
// negative ones so that max and min differ from sum).
Tensor rank_data(int rank, int64_t n, DType dtype) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = rank * 100.0 + static_cast<double>(i % 50) - 20;
  return tensor(values, {n}).to(dtype);
}

std::vector<double> values_of(const Tensor& t) {
  return t.to(Device::cpu()).to(DType::f64).to_vector<double>();
}

// The CUDA result equals the CPU one (exactly for integers and sums of small integers; half
// types get their rounding's worth of slack).
void check_same(const Tensor& on_gpu, const Tensor& on_cpu, const std::string& what) {
  INFO(what);
  REQUIRE(on_gpu.device() == gpu());
  std::vector<double> a = values_of(on_gpu), b = values_of(on_cpu);
  REQUIRE(a.size() == b.size());
  const double tolerance = on_cpu.dtype() == DType::f16 || on_cpu.dtype() == DType::bf16 ? 1e-2 : 1e-6;
  for (size_t i = 0; i < a.size(); ++i) {
    INFO("element " << i << ": cuda " << a[i] << ", cpu " << b[i]);
    REQUIRE(std::abs(a[i] - b[i]) <= tolerance * std::max(1.0, std::abs(b[i])));
  }
}

const DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64};

}  // namespace

TEST_CASE("the group routes CUDA tensors to NCCL", "[nccl]") {
  CHECK(group().backend_name(DeviceType::CUDA) == "nccl");
  CHECK(group().backend_name(DeviceType::CPU) == "mpi");
  CHECK(gpu().is_cuda());
}

TEST_CASE("allreduce sum, avg, max, min over dtypes matches MPI", "[nccl]") {
  ProcessGroup& pg = group();
  for (DType dtype : kAllDTypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
      if (op == ReduceOp::Avg && !is_floating(dtype)) continue;
      Tensor cpu = rank_data(pg.rank(), 1000, dtype);
      Tensor cuda = cpu.to(gpu());
      pg.allreduce(cpu, op)->wait();
      pg.allreduce(cuda, op)->wait();
      check_same(cuda, cpu, str_cat("allreduce(", reduce_op_name(op), ") ", dtype));
    }
  }
  // bool: max is "any", min is "all".
  for (ReduceOp op : {ReduceOp::Max, ReduceOp::Min}) {
    Tensor cpu =
        tensor(std::vector<double>{0, 1, static_cast<double>(pg.rank() % 2), 1}, {4}).to(DType::boolean);
    Tensor cuda = cpu.to(gpu());
    pg.allreduce(cpu, op)->wait();
    pg.allreduce(cuda, op)->wait();
    check_same(cuda, cpu, str_cat("allreduce(", reduce_op_name(op), ") bool"));
  }
}

TEST_CASE("broadcast and reduce from every root match MPI", "[nccl]") {
  ProcessGroup& pg = group();
  for (int root = 0; root < pg.size(); ++root) {
    Tensor b_cpu = rank_data(pg.rank(), 100, DType::f32);
    Tensor b_cuda = b_cpu.to(gpu());
    pg.broadcast(b_cpu, root)->wait();
    pg.broadcast(b_cuda, root)->wait();
    check_same(b_cuda, b_cpu, str_cat("broadcast from ", root));

    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      Tensor r_cpu = rank_data(pg.rank(), 100, DType::f64);
      Tensor r_cuda = r_cpu.to(gpu());
      pg.reduce(r_cpu, root, op)->wait();
      pg.reduce(r_cuda, root, op)->wait();
      // Non-roots keep their input on both backends, so the whole tensor compares.
      check_same(r_cuda, r_cpu, str_cat("reduce(", reduce_op_name(op), ") to ", root));
    }
  }
}

TEST_CASE("allgather and reduce_scatter match MPI", "[nccl]") {
  ProcessGroup& pg = group();
  const int64_t n = 37;  // odd on purpose
  for (DType dtype : {DType::f32, DType::bf16, DType::i64}) {
    Tensor in_cpu = rank_data(pg.rank(), n, dtype);
    Tensor in_cuda = in_cpu.to(gpu());
    Tensor out_cpu = zeros({n * pg.size()}, TensorOptions{dtype, Device::cpu()});
    Tensor out_cuda = zeros({n * pg.size()}, TensorOptions{dtype, gpu()});
    pg.allgather(out_cpu, in_cpu)->wait();
    pg.allgather(out_cuda, in_cuda)->wait();
    check_same(out_cuda, out_cpu, str_cat("allgather ", dtype));

    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Min}) {
      Tensor big_cpu = rank_data(pg.rank(), n * pg.size(), dtype);
      Tensor big_cuda = big_cpu.to(gpu());
      Tensor part_cpu = zeros({n}, TensorOptions{dtype, Device::cpu()});
      Tensor part_cuda = zeros({n}, TensorOptions{dtype, gpu()});
      pg.reduce_scatter(part_cpu, big_cpu, op)->wait();
      pg.reduce_scatter(part_cuda, big_cuda, op)->wait();
      check_same(part_cuda, part_cpu, str_cat("reduce_scatter(", reduce_op_name(op), ") ", dtype));
    }
  }
}

TEST_CASE("send and recv both ways between every pair", "[nccl]") {
  ProcessGroup& pg = group();
  const int n = pg.size(), r = pg.rank();
  // Around the ring, each rank posting its receive before its send (the order that deadlocks when
  // sends and receives share one NCCL stream).
  Tensor mine = rank_data(r, 1000, DType::f32).to(gpu());
  Tensor from_left = zeros({1000}, TensorOptions{DType::f32, gpu()});
  WorkPtr received = pg.recv(from_left, (r - 1 + n) % n, 5);
  WorkPtr sent = pg.send(mine, (r + 1) % n, 5);
  received->wait();
  sent->wait();
  check_same(from_left, rank_data((r - 1 + n) % n, 1000, DType::f32), "recv from the left neighbour");
  // And the other way round.
  Tensor from_right = zeros({1000}, TensorOptions{DType::f32, gpu()});
  received = pg.recv(from_right, (r + 1) % n, 6);
  sent = pg.send(mine, (r - 1 + n) % n, 6);
  received->wait();
  sent->wait();
  check_same(from_right, rank_data((r + 1) % n, 1000, DType::f32), "recv from the right neighbour");
}

TEST_CASE("the ring all-reduce runs on CUDA tensors over NCCL send/recv", "[nccl]") {
  ProcessGroup& pg = group();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{100000}}) {
      Tensor cpu = rank_data(pg.rank(), n, DType::f32);
      Tensor cuda = cpu.to(gpu());
      RingOptions options;
      options.chunk_bytes = 4096;  // several chunks in flight per step
      ring_allreduce(pg, cuda, op, options);
      pg.allreduce(cpu, op)->wait();
      check_same(cuda, cpu, str_cat("ring_allreduce(", reduce_op_name(op), ") of ", n));
    }
  }
}

TEST_CASE("many ops in flight complete, and wait() orders the caller's stream", "[nccl]") {
  ProcessGroup& pg = group();
  // The inputs are written on a side stream: the NCCL op must wait for that kernel (the ready
  // event), and the kernel after wait() must see the result (the wait hook).
  cuda::Stream side = cuda::create_stream(gpu().index);
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> works;
  {
    cuda::StreamGuard guard(side);
    for (int i = 0; i < 16; ++i) {
      Tensor t = ones({4096}, TensorOptions{DType::f32, gpu()});
      t.mul_(static_cast<double>(i + 1));
      tensors.push_back(t);
      works.push_back(pg.allreduce(tensors.back()));
    }
    for (int i = 15; i >= 0; --i) {  // waited in reverse order
      works[static_cast<size_t>(i)]->wait();
      tensors[static_cast<size_t>(i)].add_(1.0);
    }
  }
  // The adds ran on `side`; the reads below copy on the device's current stream, which does not
  // wait for `side` by itself (the CUDA emulation caught this test reading the last add too early).
  cuda::synchronize(side);
  for (int i = 0; i < 16; ++i) {
    CHECK(works[static_cast<size_t>(i)]->is_completed());
    std::vector<double> v = values_of(tensors[static_cast<size_t>(i)]);
    CHECK(v.front() == (i + 1.0) * pg.size() + 1.0);
    CHECK(v.back() == (i + 1.0) * pg.size() + 1.0);
  }
  // Work::then runs before wait returns.
  Tensor t = ones({10}, TensorOptions{DType::f32, gpu()});
  bool called = false;
  WorkPtr w = pg.allreduce(t);
  w->then([&called] { called = true; });
  w->wait();
  CHECK(called);
}

TEST_CASE("bad calls on CUDA tensors fail with a clear error", "[nccl]") {
  ProcessGroup& pg = group();
  Tensor on_gpu = zeros({4 * pg.size()}, TensorOptions{DType::f32, gpu()});
  Tensor on_cpu = zeros({4});
  CHECK_THROWS_WITH(pg.allgather(on_gpu, on_cpu), Catch::Contains("output is on") && Catch::Contains("cpu"));
  Tensor ints = zeros({4}, TensorOptions{DType::i32, gpu()});
  CHECK_THROWS_WITH(pg.allreduce(ints, ReduceOp::Avg), Catch::Contains("avg needs a floating dtype"));
  Tensor flags = zeros({4}, TensorOptions{DType::boolean, gpu()});
  CHECK_THROWS_WITH(pg.allreduce(flags, ReduceOp::Sum), Catch::Contains("bool tensors reduce with max"));
}

TEST_CASE("mismatched NCCL collectives fail on every rank, naming both sides, and the group survives",
          "[nccl]") {
  ProcessGroup& pg = group();
  // Rank 0 reduces 10 elements, everyone else 11.
  Tensor t = ones({pg.rank() == 0 ? 10 : 11}, TensorOptions{DType::f32, gpu()});
  WorkPtr w = pg.allreduce(t);
  CHECK_THROWS_WITH(w->wait(), Catch::Contains("calls do not match") && Catch::Contains("f32[10]") &&
                                   Catch::Contains("f32[11]") && Catch::Contains("nccl"));
  Tensor u = ones({4}, TensorOptions{DType::f32, gpu()});
  WorkPtr w2 = pg.rank() == 0 ? pg.broadcast(u, 0) : pg.allreduce(u);
  CHECK_THROWS_WITH(w2->wait(), Catch::Contains("broadcast(root 0)") && Catch::Contains("allreduce(sum)"));
  // Still in step.
  Tensor ok = ones({8}, TensorOptions{DType::f32, gpu()});
  pg.allreduce(ok)->wait();
  CHECK(values_of(ok)[0] == pg.size());
}

// ---- the runner ------------------------------------------------------------------------------------

namespace {

int skip(const std::string& why) {
  std::printf("SKIPPED: %s\n", why.c_str());
  return 77;
}

// NCCL takes one physical GPU per rank: every rank compares (host, physical GPU of `device`) with
// the others' over a CPU-only group (a CUDA group would already fail inside NCCL).
[[maybe_unused]] bool gpus_are_distinct(ProcessGroup& cpu_group, Device device) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const int64_t host_id = static_cast<int64_t>(std::hash<std::string>()(host) & 0x3fffffffffffffff);
  Tensor mine = empty({2}, TensorOptions{DType::i64, Device::cpu()});
  mine.data<int64_t>()[0] = host_id;
  mine.data<int64_t>()[1] = cuda::physical_device(device.index);
  Tensor all = empty({2 * cpu_group.size()}, TensorOptions{DType::i64, Device::cpu()});
  cpu_group.allgather(all, mine)->wait();
  const int64_t* ids = all.data<int64_t>();
  for (int a = 0; a < cpu_group.size(); ++a)
    for (int b = a + 1; b < cpu_group.size(); ++b)
      if (ids[2 * a] == ids[2 * b] && ids[2 * a + 1] == ids[2 * b + 1]) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
#if !(defined(MG_HAS_NCCL) && defined(MG_HAS_CUDA))
  (void)argc;
  (void)argv;
  return skip("this build has no NCCL backend (needs CUDA and NCCL)");
#else
  if (cuda::device_count() == 0) {
    const char* require = std::getenv("MG_REQUIRE_GPU");
    if (require != nullptr && *require != '\0' && std::strcmp(require, "0") != 0) {
      std::fprintf(stderr, "FAIL: MG_REQUIRE_GPU is set but there is %s\n", cuda::describe_devices().c_str());
      return 1;
    }
    return skip(cuda::describe_devices());
  }
  int failures = 0;
  try {
    cuda::enable_backend();
    const LaunchInfo launch = detect_launch();
    if (launch.world_size < 2) return skip("run under mpiexec -n 2 (or more)");
    InitOptions options;
    options.timeout = std::chrono::seconds(60);  // a failing peer must not hang ctest
    options.device = Device::cuda(launch.local_rank % cuda::device_count());
    {
      InitOptions cpu_options = options;
      cpu_options.device = Device::cpu(0);
      ProcessGroup cpu_group = init_process_group(cpu_options);
      if (!gpus_are_distinct(cpu_group, *options.device))
        return skip(
            "two ranks share one physical GPU (NCCL needs one GPU per rank; MG_VIRTUAL_GPUS cannot help)");
    }
    ProcessGroup pg = init_process_group(options);
    g_group = &pg;
    std::printf("rank %d of %d: NCCL tests on %s\n", pg.rank(), pg.size(), cuda::describe_devices().c_str());
    failures = mg::testing::run_catch_session(argc, argv);
    g_group = nullptr;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: %s\n", e.what());
    return 1;
  }
  return failures == 77 ? 1 : failures;
#endif
}
