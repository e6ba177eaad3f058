// The process group every MPI test case starts from: the launcher's world, a 60 s timeout (a
// broken test fails instead of hanging CI), and the test device -- the CPU, or cuda:<local rank>
// over the NCCL backend with MG_TEST_DEVICE=cuda (the CUDA emulation build runs some cases so).
#pragma once

#include <chrono>

#include "parallel/process_group.h"
#include "tests/test_device.h"

namespace mg::testing {

inline Device mpi_test_device() { return test_device(parallel::detect_launch().local_rank); }

inline parallel::ProcessGroup mpi_test_group() {
  parallel::InitOptions options;
  options.timeout = std::chrono::seconds(60);
  options.device = mpi_test_device();
  return parallel::init_process_group(options);
}

}  // namespace mg::testing
