// Every ProcessGroup operation on CPU tensors over MPI, run under `mpiexec -n K` for several K
// (tests/parallel/CMakeLists.txt). Each rank runs the same test cases in the same order; the data
// each rank contributes depends on its rank, so every expected value is known in closed form.
#include <catch2/catch.hpp>

#include <chrono>
#include <vector>

#include "core/ops.h"
#include "multigrad.h"
#include "parallel/comm/process_group.h"

using namespace mg;
using namespace mg::parallel;

namespace {

ProcessGroup test_group() {
  InitOptions options;
  options.timeout = std::chrono::seconds(60);  // a failing peer must not hang ctest
  return init_process_group(options);
}

// rank r contributes r*1000 + i at element i.
Tensor rank_data(int rank, int64_t n, DType dtype) {
  std::vector<double> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = rank * 1000.0 + static_cast<double>(i % 100);
  return tensor(values, {n}).to(dtype);
}

}  // namespace

TEST_CASE("init_process_group reads the launcher", "[mpi]") {
  ProcessGroup pg = test_group();
  LaunchInfo launch = detect_launch();
  CHECK(pg.size() == launch.world_size);
  CHECK(pg.rank() == launch.rank);
  CHECK(pg.device() == Device::cpu(0));
  CHECK(pg.backend_name() == (pg.size() == 1 ? "single-process" : "mpi"));
  CHECK((pg.is_main() == (pg.rank() == 0)));
}

TEST_CASE("allreduce sum, avg, max, min over dtypes", "[mpi]") {
  ProcessGroup pg = test_group();
  const int n = pg.size();
  const int64_t count = 37;
  double rank_sum = 1000.0 * n * (n - 1) / 2;
  for (DType dtype : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
    CAPTURE(dtype_name(dtype));
    // Small values so bf16/f16 represent every input and every sum exactly.
    auto small = [&](int rank) { return (rank_data(rank, count, DType::f64) * (1.0 / 1000)).to(dtype); };
    Tensor sum = small(pg.rank());
    pg.allreduce(sum, ReduceOp::Sum)->wait();
    Tensor max = small(pg.rank());
    pg.allreduce(max, ReduceOp::Max)->wait();
    Tensor min = small(pg.rank());
    pg.allreduce(min, ReduceOp::Min)->wait();
    auto s = sum.to_vector<double>(), mx = max.to_vector<double>(), mn = min.to_vector<double>();
    for (int64_t i = 0; i < count; ++i) {
      // small(r)[i] = r + (i % 100) / 1000, truncated to r in integer dtypes.
      double base = is_floating(dtype) ? static_cast<double>(i % 100) / 1000 : 0.0;
      double expected_sum = n * base + rank_sum / 1000;
      INFO("element " << i);
      CHECK(s[static_cast<size_t>(i)] == Approx(expected_sum).epsilon(dtype == DType::bf16 ? 1e-2 : 2e-3));
      CHECK(mx[static_cast<size_t>(i)] == Approx(small(n - 1).to_vector<double>()[static_cast<size_t>(i)]));
      CHECK(mn[static_cast<size_t>(i)] == Approx(small(0).to_vector<double>()[static_cast<size_t>(i)]));
    }
    if (is_floating(dtype)) {
      Tensor avg = small(pg.rank());
      pg.allreduce(avg, ReduceOp::Avg)->wait();
      auto a = avg.to_vector<double>();
      for (int64_t i = 0; i < count; ++i)
        CHECK(a[static_cast<size_t>(i)] == Approx(s[static_cast<size_t>(i)] / n).epsilon(1e-2));
    }
  }
}

TEST_CASE("allreduce of f32 matches the closed form exactly", "[mpi]") {
  ProcessGroup pg = test_group();
  const int n = pg.size();
  Tensor t = rank_data(pg.rank(), 1000, DType::f32);
  pg.allreduce(t)->wait();
  auto v = t.to_vector<float>();
  for (int64_t i = 0; i < 1000; ++i)
    REQUIRE(v[static_cast<size_t>(i)] == static_cast<float>(1000.0 * n * (n - 1) / 2 + n * (i % 100)));
}

TEST_CASE("broadcast and reduce from every root", "[mpi]") {
  ProcessGroup pg = test_group();
  for (int root = 0; root < pg.size(); ++root) {
    Tensor b = rank_data(pg.rank(), 10, DType::f32);
    pg.broadcast(b, root)->wait();
    CHECK(b.to_vector<float>() == rank_data(root, 10, DType::f32).to_vector<float>());

    Tensor r = rank_data(pg.rank(), 10, DType::f64);
    Tensor original = r.clone();
    pg.reduce(r, root, ReduceOp::Sum)->wait();
    if (pg.rank() == root) {
      double rank_sum = 1000.0 * pg.size() * (pg.size() - 1) / 2;
      for (int64_t i = 0; i < 10; ++i)
        CHECK(r.to_vector<double>()[static_cast<size_t>(i)] == rank_sum + pg.size() * i);
    } else {
      CHECK(r.to_vector<double>() == original.to_vector<double>());  // non-roots keep their input
    }
  }
}

TEST_CASE("allgather and reduce_scatter", "[mpi]") {
  ProcessGroup pg = test_group();
  const int n = pg.size();
  Tensor input = rank_data(pg.rank(), 5, DType::f32);
  Tensor gathered = zeros({n, 5});
  pg.allgather(gathered, input)->wait();
  for (int r = 0; r < n; ++r)
    CHECK(gathered.select(0, r).to_vector<float>() == rank_data(r, 5, DType::f32).to_vector<float>());

  // Block b of every rank's input is (rank + 1) * (b + 1): rank r receives sum over ranks of (q+1)*(r+1).
  Tensor blocks = zeros({n, 3});
  for (int b = 0; b < n; ++b) blocks.select(0, b).fill_((pg.rank() + 1.0) * (b + 1.0));
  Tensor mine = zeros({3});
  pg.reduce_scatter(mine, blocks, ReduceOp::Sum)->wait();
  double expected = (n * (n + 1) / 2.0) * (pg.rank() + 1.0);
  for (float v : mine.to_vector<float>()) CHECK(v == expected);
}

TEST_CASE("send and recv around a ring", "[mpi]") {
  ProcessGroup pg = test_group();
  if (pg.size() == 1) {
    Tensor t = zeros({2});
    CHECK_THROWS_WITH(pg.send(t, 0), Catch::Contains("must be another rank"));
    return;
  }
  int right = (pg.rank() + 1) % pg.size(), left = (pg.rank() + pg.size() - 1) % pg.size();
  Tensor out = rank_data(pg.rank(), 1 << 16, DType::f32);
  Tensor in = zeros({1 << 16});
  // Post the recv first; both are asynchronous, so the order cannot deadlock anyway.
  WorkPtr r = pg.recv(in, left, 7);
  WorkPtr s = pg.send(out, right, 7);
  r->wait();
  s->wait();
  CHECK(in.to_vector<float>() == rank_data(left, 1 << 16, DType::f32).to_vector<float>());
}

TEST_CASE("many ops in flight complete, whatever order they are waited in", "[mpi]") {
  ProcessGroup pg = test_group();
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 20; ++k) {
    tensors.push_back(full({100 + k}, static_cast<double>(k + pg.rank())));
    works.push_back(pg.allreduce(tensors.back()));
  }
  for (int k = 19; k >= 0; --k) works[static_cast<size_t>(k)]->wait();
  double rank_sum = pg.size() * (pg.size() - 1) / 2.0;
  for (int k = 0; k < 20; ++k) {
    CHECK(works[static_cast<size_t>(k)]->is_completed());
    CHECK(tensors[static_cast<size_t>(k)].to_vector<float>()[0] == k * pg.size() + rank_sum);
  }
  pg.barrier()->wait();
}

TEST_CASE("Work::then runs before wait returns", "[mpi]") {
  ProcessGroup pg = test_group();
  Tensor t = ones({4});
  bool ran = false;
  WorkPtr w = pg.allreduce(t);
  w->then([&] { ran = true; });
  w->wait();
  CHECK(ran);
}

TEST_CASE("bad calls fail with a clear error", "[mpi]") {
  ProcessGroup pg = test_group();
  Tensor strided = zeros({4, 4}).t();
  CHECK_THROWS_WITH(pg.allreduce(strided), Catch::Contains("must be contiguous"));
  Tensor ints = zeros({3}, TensorOptions{DType::i32});
  CHECK_THROWS_WITH(pg.allreduce(ints, ReduceOp::Avg), Catch::Contains("avg needs a floating dtype"));
  Tensor out = zeros({3});
  CHECK_THROWS_WITH(pg.allgather(out, zeros({2})), Catch::Contains("needs world size"));
  CHECK_THROWS_WITH(pg.broadcast(out, pg.size()), Catch::Contains("is not a rank"));
  ProcessGroup undefined;
  CHECK_THROWS_WITH(undefined.rank(), Catch::Contains("undefined"));
}

TEST_CASE("mismatched collectives fail on every rank, naming both sides, and the group survives", "[mpi]") {
  ProcessGroup pg = test_group();
  if (pg.size() == 1) return;
  // Rank 0 reduces 10 elements, everyone else 11.
  Tensor t = ones({pg.rank() == 0 ? 10 : 11});
  WorkPtr w = pg.allreduce(t);
  CHECK_THROWS_WITH(w->wait(), Catch::Contains("calls do not match") && Catch::Contains("f32[10]") &&
                                   Catch::Contains("f32[11]"));
  // Different ops: allreduce vs broadcast.
  Tensor u = ones({4});
  WorkPtr w2 = pg.rank() == 0 ? pg.broadcast(u, 0) : pg.allreduce(u);
  CHECK_THROWS_WITH(w2->wait(), Catch::Contains("broadcast(root 0)") && Catch::Contains("allreduce(sum)"));
  // The group is still in step.
  Tensor ok = ones({8});
  pg.allreduce(ok)->wait();
  CHECK(ok.to_vector<float>()[0] == pg.size());
}

TEST_CASE("recv of the wrong length names both counts", "[mpi]") {
  ProcessGroup pg = test_group();
  if (pg.size() == 1) return;
  if (pg.rank() == 0) {
    Tensor small = ones({5});
    pg.send(small, 1, 3)->wait();
  } else if (pg.rank() == 1) {
    Tensor big = zeros({8});
    CHECK_THROWS_WITH(pg.recv(big, 0, 3)->wait(),
                      Catch::Contains("sent 5 elements") && Catch::Contains("expected 8"));
  }
  pg.barrier()->wait();
}
