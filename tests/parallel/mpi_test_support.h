// What the MPI tests share. The process group every test case starts from: the launcher's world,
// a 60 s timeout (a broken test fails instead of hanging CI), and the test device -- the CPU, or
// cuda:<local rank> over the NCCL backend with MG_TEST_DEVICE=cuda (the CUDA emulation build runs
// some cases so). And the comparison of a distributed result with its single-device reference.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "optim/adam.h"
#include "optim/sgd.h"

#include "parallel/comm/process_group.h"
#include "tests/test_device.h"

namespace mg::testing {

inline Device mpi_test_device() { return test_device(parallel::detect_launch().local_rank); }

inline parallel::ProcessGroup mpi_test_group() {
  parallel::InitOptions options;
  options.timeout = std::chrono::seconds(60);
  options.device = mpi_test_device();
  return parallel::init_process_group(options);
}

// The optimizers the equivalence tests train with (as factories: ZeRO takes one).
inline std::unique_ptr<optim::Optimizer> sgd_momentum(std::vector<Tensor> params) {
  optim::SGDOptions options;
  options.lr = 0.1;
  options.momentum = 0.9;
  options.weight_decay = 0.01;
  return std::make_unique<optim::SGD>(params, options);
}
inline std::unique_ptr<optim::Optimizer> adamw(std::vector<Tensor> params) {
  optim::AdamWOptions options;
  options.lr = 0.01;
  options.weight_decay = 0.05;
  return std::make_unique<optim::AdamW>(params, options);
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
