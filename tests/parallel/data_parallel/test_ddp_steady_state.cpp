// What a steady-state DDP step costs the device, on emulated GPUs over the NCCL backend (the CUDA
// emulation build only: the counters are the emulator's, cuda_emu/emulator.h). After warm-up a
// step must allocate no device memory (the caching allocator serves the buckets and every tensor)
// and make the host wait for the device only where the loop asks (reading the loss): the
// gradient all-reduce is ordered on the device, not waited for by the host. The same for a
// steady-state FullyShardedDataParallel step: each unit's all-gathers (forward, backward, prefetch)
// and reduce-scatter ordered on the device, the gathered buffers and flat gradients served again
// by the caching allocator.
#include <catch2/catch.hpp>

#include <cstdio>
#include <vector>

#include "cuda_emu/emulator.h"
#include "multigrad.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

TEST_CASE("a steady-state DDP step allocates nothing and syncs the host only for the loss read",
          "[mpi][ddp][counters]") {
  ProcessGroup pg = testing::mpi_test_group();
  const Device device = pg.device();
  REQUIRE(device.is_cuda());  // run with MG_TEST_DEVICE=cuda
  manual_seed(3);
  nn::MLP model(32, std::vector<int64_t>{64, 64}, 10);
  model.to(device);
  DDPOptions options;
  options.bucket_cap_mb = 0.01;  // several buckets: several all-reduces per step
  options.first_bucket_cap_mb = 0.005;
  DistributedDataParallel ddp(model, pg, options);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3;
  optim::AdamW opt(ddp.parameters(), adamw);
  manual_seed(4 + static_cast<uint64_t>(pg.rank()));
  const Tensor x = randn({16, 32}).to(device), y = randint(0, 10, {16}).to(device);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(ddp(x), y);
    loss.backward();
    opt.step();
    return loss.item<double>();  // the one read the loop asks for
  };
  for (int s = 0; s < 3; ++s) step();
  REQUIRE(ddp.bucket_layout().size() > 1);
  const mg_emu::Counters before = mg_emu::counters();
  const int64_t host_waits_before = Work::host_waits_for_device_ops();
  const int steps = 5;
  for (int s = 0; s < steps; ++s) step();
  const mg_emu::Counters after = mg_emu::counters();
  // The all-reduces were ordered on the device (Work::wait_on_device), never waited for on the host.
  CHECK(Work::host_waits_for_device_ops() == host_waits_before);
  const double syncs = double(after.host_syncs - before.host_syncs) / steps;
  const double mallocs = double(after.device_mallocs - before.device_mallocs) / steps;
  std::printf("rank %d, per DDP step: %.1f kernel launches, %.1f host syncs, %.1f cudaMalloc, %zu buckets\n",
              pg.rank(), double(after.kernel_launches - before.kernel_launches) / steps, syncs, mallocs,
              ddp.bucket_layout().size());
  CHECK(mallocs == 0);
  CHECK(syncs == 1);
  // The statistics still come: stats() waits for the last passes' all-reduces itself.
  CHECK(ddp.stats().backward_passes == 3 + steps);
  CHECK(ddp.stats().comm_ms > 0);
}

TEST_CASE("a steady-state FSDP step allocates nothing and syncs the host only for the loss read",
          "[mpi][fsdp][counters]") {
  ProcessGroup pg = testing::mpi_test_group();
  const Device device = pg.device();
  REQUIRE(device.is_cuda());  // run with MG_TEST_DEVICE=cuda
  manual_seed(3);
  nn::MLP model(32, std::vector<int64_t>{64, 64}, 10);
  model.to(device);
  FSDPOptions options;  // reshard after forward, prefetch in forward and backward (the defaults)
  options.auto_wrap = AutoWrapPolicy::module_types_of({"Linear"});  // 3 units, the root empty
  FullyShardedDataParallel fsdp(model, pg, options);
  REQUIRE(fsdp.units().size() >= 3);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-3;
  optim::AdamW opt(fsdp.parameters(), adamw);
  manual_seed(4 + static_cast<uint64_t>(pg.rank()));
  const Tensor x = randn({16, 32}).to(device), y = randint(0, 10, {16}).to(device);
  auto step = [&] {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(fsdp(x), y);
    loss.backward();
    opt.step();
    return loss.item<double>();  // the one read the loop asks for
  };
  for (int s = 0; s < 3; ++s) step();
  const FSDPStats warm = fsdp.stats();
  const mg_emu::Counters before = mg_emu::counters();
  const int64_t host_waits_before = Work::host_waits_for_device_ops();
  const int steps = 5;
  for (int s = 0; s < steps; ++s) step();
  const mg_emu::Counters after = mg_emu::counters();
  const double syncs = double(after.host_syncs - before.host_syncs) / steps;
  const double mallocs = double(after.device_mallocs - before.device_mallocs) / steps;
  const double gathers = double(fsdp.stats().all_gathers - warm.all_gathers) / steps;
  const double reduce_scatters = double(fsdp.stats().reduce_scatters - warm.reduce_scatters) / steps;
  std::printf(
      "rank %d, per FSDP step: %.1f kernel launches, %.1f host syncs, %.1f cudaMalloc, %zu units, "
      "%.1f all-gathers, %.1f reduce-scatters, %.1f host waits for collectives\n",
      pg.rank(), double(after.kernel_launches - before.kernel_launches) / steps, syncs, mallocs,
      fsdp.units().size(), gathers, reduce_scatters,
      double(Work::host_waits_for_device_ops() - host_waits_before) / steps);
  // Every unit was gathered (forward; the blocks again for backward) and reduce-scattered each
  // step -- so the counts below are of a step that communicated -- and ordered on the device.
  CHECK(reduce_scatters == double(fsdp.units().size()));
  CHECK(gathers >= double(fsdp.units().size()));
  CHECK(Work::host_waits_for_device_ops() == host_waits_before);
  CHECK(mallocs == 0);
  CHECK(syncs <= 1);
  CHECK(fsdp.gathered_bytes_alive() == 0);
}
