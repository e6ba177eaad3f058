// What the MPI tests share. The process group every test case starts from: the launcher's world,
// a 60 s timeout (a broken test fails instead of hanging CI), and the test device -- the CPU, or
// cuda:<local rank> over the NCCL backend with MG_TEST_DEVICE=cuda (the CUDA emulation build runs
// some cases so). And the comparison of a distributed result with its single-device reference.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>

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

// ||a - b|| <= rtol ||b|| + atol over all elements (compared in f64 on the CPU), naming both norms.
inline void require_close(const Tensor& a, const Tensor& b, double rtol, double atol = 1e-7) {
  REQUIRE(a.shape() == b.shape());
  auto u = a.to(Device::cpu()).contiguous().to_vector<double>(),
       v = b.to(Device::cpu()).contiguous().to_vector<double>();
  double diff = 0, norm = 0;
  for (size_t k = 0; k < u.size(); ++k) {
    diff += (u[k] - v[k]) * (u[k] - v[k]);
    norm += v[k] * v[k];
  }
  INFO("|a - b| = " << std::sqrt(diff) << ", |b| = " << std::sqrt(norm));
  REQUIRE(std::sqrt(diff) <= rtol * std::sqrt(norm) + atol);
}

}  // namespace mg::testing
