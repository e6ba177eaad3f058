// Gradient accumulation: k backward passes of (micro-batch mean loss) / k sum,
// in .grad, to the full-batch gradient (optim/grad_accumulation.h), both by
// hand and through GradAccumulator; and one SGD step on the accumulated
// gradient equals the full-batch step.
#include <catch2/catch.hpp>

#include "optim/grad_accumulation.h"
#include "optim/sgd.h"
#include "optim_test_util.h"

using mg::Tensor;
using namespace optim_test;

namespace {

// Mean loss over rows [start, start + n) of the problem's batch.
Tensor micro_loss(const Problem& p, int64_t start, int64_t n) {
  return mg::mean(mg::square(mg::linear(p.X.narrow(0, start, n), p.W, p.b) - p.Y.narrow(0, start, n)));
}

void check_close(const Tensor& a, const Tensor& b, double tol) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  REQUIRE(x.size() == y.size());
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == Approx(y[i]).epsilon(tol).margin(tol));
}

}  // namespace

TEST_CASE("k micro-batch backwards of loss/k give the full-batch gradient", "[optim][accumulation]") {
  Problem full(mg::DType::f64);
  full.loss().backward();

  for (int64_t k : {1, 2, 4, 8}) {
    INFO("k = " << k);
    Problem acc(mg::DType::f64);
    const int64_t n = acc.X.size(0) / k;
    for (int64_t j = 0; j < k; ++j) (micro_loss(acc, j * n, n) / static_cast<double>(k)).backward();
    check_close(acc.W.grad(), full.W.grad(), 1e-13);
    check_close(acc.b.grad(), full.b.grad(), 1e-13);
  }
}

TEST_CASE("GradAccumulator: one step per k micro-batches equals the full-batch step",
          "[optim][accumulation]") {
  Problem full(mg::DType::f64), acc(mg::DType::f64);
  mg::optim::SGDOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  mg::optim::SGD opt_full({full.W, full.b}, sgd);
  mg::optim::SGD opt_acc({acc.W, acc.b}, sgd);
  mg::optim::GradAccumulator accumulator(4);
  const int64_t n = acc.X.size(0) / 4;
  for (int step = 0; step < 3; ++step) {
    full.compute_grads(opt_full);
    opt_full.step();
    for (int64_t j = 0; j < 4; ++j) {
      CHECK(accumulator.count() == j);
      CHECK(accumulator.is_last_micro_batch() == (j == 3));
      const bool done = accumulator.backward(micro_loss(acc, j * n, n));
      CHECK(done == (j == 3));
      if (done) {
        opt_acc.step();
        opt_acc.zero_grad();
      }
    }
    check_close(acc.W, full.W, 1e-12);
    check_close(acc.b, full.b, 1e-12);
  }
  REQUIRE_THROWS_WITH(mg::optim::GradAccumulator(0), Catch::Contains("at least 1"));
  REQUIRE_THROWS_WITH(accumulator.backward(acc.W), Catch::Contains("one-element loss"));
}
