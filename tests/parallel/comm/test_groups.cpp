// Subgroups and the rest of the collectives under `mpiexec -n K` (K = 3 and 4): new_group's
// members and non-members, collectives inside disjoint subgroups at the same time, a data x
// tensor grid of groups, gather / scatter / all_to_all against what they must produce, and
// monitored_barrier naming the rank that did not come. With MG_TEST_DEVICE=cuda (the emulation
// build) gather / scatter / all_to_all run on the NCCL backend.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "multigrad.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

namespace {

// rank * 100 + i for i in [0, n): every element says where it came from.
Tensor numbered(int rank, int64_t n, Device device) {
  Tensor t = arange(static_cast<double>(rank * 100), static_cast<double>(rank * 100 + n), 1.0,
                    TensorOptions{DType::f32});
  return t.to(device);
}

std::vector<float> values(const Tensor& t) { return t.to(Device::cpu()).to_vector<float>(); }

}  // namespace

TEST_CASE("gather scatter and all_to_all move the right blocks", "[mpi][groups]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), me = pg.rank();
  const Device device = pg.device();
  const int64_t block = 3;
  for (int root = 0; root < world; root += world - 1) {  // the first and the last rank as root
    INFO("root " << root);
    Tensor gathered = me == root ? zeros({world * block}, TensorOptions{DType::f32, device}) : Tensor();
    pg.gather(gathered, numbered(me, block, device), root)->wait();
    if (me == root) {
      std::vector<float> got = values(gathered);
      for (int r = 0; r < world; ++r)
        for (int64_t i = 0; i < block; ++i) CHECK(got[static_cast<size_t>(r * block + i)] == r * 100 + i);
    }
    Tensor piece = zeros({block}, TensorOptions{DType::f32, device});
    Tensor whole = me == root ? numbered(root, world * block, device) : Tensor();
    pg.scatter(piece, whole, root)->wait();
    std::vector<float> got = values(piece);
    for (int64_t i = 0; i < block; ++i) CHECK(got[static_cast<size_t>(i)] == root * 100 + me * block + i);
  }
  // all_to_all: rank i's block j (values i*100 + j*block + k) lands in rank j's block i.
  Tensor out = zeros({world * block}, TensorOptions{DType::f32, device});
  pg.all_to_all(out, numbered(me, world * block, device))->wait();
  std::vector<float> got = values(out);
  for (int i = 0; i < world; ++i)
    for (int64_t k = 0; k < block; ++k)
      CHECK(got[static_cast<size_t>(i * block + k)] == i * 100 + me * block + k);

  Tensor wrong = zeros({world * block + 1}, TensorOptions{DType::f32, device});
  REQUIRE_THROWS_WITH(pg.all_to_all(wrong, wrong), Catch::Contains("divide into world size"));
}

TEST_CASE("new_group: members get a group of their own, the others an undefined one", "[mpi][groups]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), me = pg.rank();
  // Even and odd ranks: two disjoint groups, each all-reducing at the same time.
  std::vector<int> evens, odds;
  for (int r = 0; r < world; ++r) (r % 2 == 0 ? evens : odds).push_back(r);
  ProcessGroup even = pg.new_group(evens);
  ProcessGroup odd = pg.new_group(odds);
  ProcessGroup& mine = me % 2 == 0 ? even : odd;
  ProcessGroup& other = me % 2 == 0 ? odd : even;
  REQUIRE(mine.defined());
  CHECK_FALSE(other.defined());
  const std::vector<int>& members = me % 2 == 0 ? evens : odds;
  CHECK(mine.size() == static_cast<int>(members.size()));
  CHECK(mine.rank() == me / 2);       // rank i of the group is its i-th smallest member
  const Device device = pg.device();  // CUDA under MG_TEST_DEVICE=cuda: the subgroup's NCCL communicators
  Tensor t = full({4}, static_cast<double>(me + 1), TensorOptions{DType::f32, device});
  mine.allreduce(t)->wait();
  double expected = 0;
  for (int r : members) expected += r + 1;
  CHECK(values(t)[0] == expected);
  // The parent group still works, and its collectives are independent of the subgroups'.
  Tensor all = ones({2}, TensorOptions{DType::f32, device});
  pg.allreduce(all)->wait();
  CHECK(values(all)[1] == world);
  // A subgroup given in any order; a rank named twice or outside the group is refused.
  ProcessGroup reversed = pg.new_group({world - 1, 0});
  if (me == 0 || me == world - 1) {
    REQUIRE(reversed.defined());
    CHECK(reversed.rank() == (me == 0 ? 0 : 1));
    Tensor x = full({1}, static_cast<double>(me), TensorOptions{DType::f32, device});
    reversed.broadcast(x, 1)->wait();
    CHECK(values(x)[0] == world - 1);
  } else {
    CHECK_FALSE(reversed.defined());
    CHECK_THROWS_WITH(reversed.rank(), Catch::Contains("the group is undefined"));
  }
  CHECK_THROWS_WITH(pg.new_group({0, 0}), Catch::Contains("rank 0 is named twice"));
  CHECK_THROWS_WITH(pg.new_group({world}), Catch::Contains("is not a rank of this group"));
  // Both tensor kinds in one subgroup: CPU tensors over MPI beside the device's.
  Tensor host = full({1}, 1.0, TensorOptions{DType::f32});
  mine.allreduce(host)->wait();
  CHECK(values(host)[0] == static_cast<float>(members.size()));
}

TEST_CASE("a data x tensor grid of groups", "[mpi][groups]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), me = pg.rank();
  if (world % 2 != 0) return;  // the 2 x (N/2) grid needs an even world
  const int tensor_size = 2, data_size = world / tensor_size;
  // rank = d * tensor_size + t: tensor groups of consecutive ranks, data groups across them.
  GroupGrid grid = new_group_grid(pg, tensor_size);
  ProcessGroup tensor_group = grid.tensor, data_group = grid.data;
  REQUIRE(tensor_group.defined());
  REQUIRE(data_group.defined());
  CHECK(tensor_group.size() == tensor_size);
  CHECK(data_group.size() == data_size);
  CHECK(tensor_group.rank() == me % tensor_size);
  CHECK(grid.tensor_rank == me % tensor_size);
  CHECK(data_group.rank() == me / tensor_size);
  CHECK(grid.data_rank == me / tensor_size);
  // Rank 0 of each tensor group broadcasts its world rank: every member learns d * tensor_size.
  Tensor first = full({1}, static_cast<double>(me), TensorOptions{DType::f64});
  tensor_group.broadcast(first, 0)->wait();
  CHECK(first.item<double>() == (me / tensor_size) * tensor_size);
  CHECK_THROWS_WITH(new_group_grid(pg, world + 1), Catch::Contains("does not divide the group's"));
  // A sum over the tensor group, then over the data group, is the sum over everyone.
  Tensor t = full({1}, static_cast<double>(me), TensorOptions{DType::f64, pg.device()});
  tensor_group.allreduce(t)->wait();
  data_group.allreduce(t)->wait();
  CHECK(t.to(Device::cpu()).item<double>() == world * (world - 1) / 2.0);
}

TEST_CASE("monitored_barrier passes when everyone comes and names who did not", "[mpi][groups]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), me = pg.rank();
  pg.monitored_barrier(std::chrono::seconds(20));  // everyone: passes
  // The last rank comes too late for a 1 s barrier: rank 0 and every rank that came name it.
  const int late = world - 1;
  const std::string expected =
      "rank " + std::to_string(late) + " of " + std::to_string(world) + " did not arrive within 1 s";
  if (me == late) {
    // It arrives after rank 0 gave up, and learns that it was late.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    CHECK_THROWS_WITH(pg.monitored_barrier(std::chrono::seconds(1)), Catch::Contains(expected));
    return;
  }
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(pg.monitored_barrier(std::chrono::seconds(1)), Catch::Contains(expected));
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
}

TEST_CASE("requested_traffic() counts what each call asks to move, as the ring algorithms would send it",
          "[mpi][groups][traffic]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), me = pg.rank();
  const Device device = pg.device();
  const double share = static_cast<double>(world - 1) / world;
  pg.barrier()->wait();
  pg.reset_requested_traffic();
  ProcessGroup copy = pg;  // copies share the count
  Tensor t = zeros({1000}, TensorOptions{DType::f32, device});
  copy.allreduce(t)->wait();
  REQUIRE(pg.requested_traffic().calls == 1);
  REQUIRE(pg.requested_traffic().bytes == std::llround(2 * share * 4000));
  Tensor all = zeros({world * 10}, TensorOptions{DType::f32, device});
  pg.allgather(all, zeros({10}, TensorOptions{DType::f32, device}))->wait();
  REQUIRE(pg.requested_traffic().bytes == std::llround(2 * share * 4000) + std::llround(share * world * 40));
  pg.reset_requested_traffic();
  if (me == 0) {
    pg.send(t, 1)->wait();
  } else if (me == 1) {
    pg.recv(t, 0)->wait();
  }
  REQUIRE(pg.requested_traffic().bytes == (me == 0 ? 4000 : 0));
  // A subgroup counts its own calls only.
  ProcessGroup pair = pg.new_group({0, 1});
  if (pair.defined()) {
    Tensor u = zeros({8}, TensorOptions{DType::f32});
    pair.allreduce(u)->wait();
    REQUIRE(pair.requested_traffic().bytes == 32);  // 2 (2 - 1) / 2 x 32 bytes
  }
  REQUIRE(pg.requested_traffic().bytes == (me == 0 ? 4000 : 0));
}
