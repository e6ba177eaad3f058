// The hand-written ring all-reduce (parallel/comm/ring_allreduce.h) against the native one
// (ProcessGroup::allreduce, i.e. MPI_Allreduce), under `mpiexec -n K` for K = 1, 2, 3, 5
// (tests/parallel/CMakeLists.txt). With MG_TEST_DEVICE=cuda the tensors are CUDA tensors on
// cuda:<local rank> and both go over the NCCL backend (ncclSend/ncclRecv vs ncclAllReduce).
//
// Every rank runs the same test cases in the same order. The data rank r contributes is a
// deterministic function of (case seed, r, element), so each rank can also rebuild every other
// rank's contribution and compute the expected result itself. Failures are CHECKs (not
// REQUIREs) so that a rank whose result is wrong keeps calling the same collectives as the
// others, and the group's timeout is short, so a real hang fails instead of blocking ctest.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_runtime.h"
#include "core/tensor.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/ring_allreduce.h"
#include "tests/test_device.h"

using namespace mg;
using namespace mg::parallel;

namespace {

// cpu, or cuda:<local rank> when MG_TEST_DEVICE=cuda.
Device test_device() { return testing::test_device(detect_launch().local_rank); }

ProcessGroup& group() {
  static ProcessGroup pg = [] {
    InitOptions options;
    options.timeout = std::chrono::seconds(60);  // a failing peer must not hang ctest
    options.device = test_device();
    return init_process_group(options);
  }();
  return pg;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// What rank `rank` contributes at element i in case `seed`:
//   Integers: whole numbers in [-16, 16]. Sums of up to 8 of them are exact in every dtype (bf16
//   holds integers up to 256 exactly), in any order, so ring and native must agree bit for bit.
//   Reals: uniform in [-1, 1), rounded to the dtype; sums then depend on the order of additions.
enum class Data { Integers, Reals };
std::vector<double> contribution(uint64_t seed, int rank, int64_t numel, Data data) {
  std::vector<double> values(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    uint64_t bits = splitmix64(seed * 0x100000001B3ull + static_cast<uint64_t>(rank) * 0x1000193ull +
                               static_cast<uint64_t>(i) * 0x9E3779B1ull);
    values[static_cast<size_t>(i)] = data == Data::Integers ? static_cast<double>(bits % 33) - 16.0
                                                            : static_cast<double>(bits >> 11) * 0x1p-52 - 1.0;
  }
  return values;
}

Tensor make(const std::vector<double>& values, DType dtype, Device device = test_device()) {
  return tensor(values, Shape{static_cast<int64_t>(values.size())},
                TensorOptions{dtype, Device::cpu(), false})
      .to(device);
}

// The exact (float64) reduction of what the ranks contributed, after rounding to `dtype`, plus
// the sum of magnitudes (for the rounding-error bound of real-valued sums).
struct Reference {
  std::vector<double> value;
  std::vector<double> magnitude;
};
Reference reference(uint64_t seed, int world, int64_t numel, Data data, DType dtype, ReduceOp op) {
  Reference ref{std::vector<double>(static_cast<size_t>(numel)),
                std::vector<double>(static_cast<size_t>(numel))};
  for (int r = 0; r < world; ++r) {
    std::vector<double> x = make(contribution(seed, r, numel, data), dtype).to_vector<double>();
    for (size_t i = 0; i < x.size(); ++i) {
      double& v = ref.value[i];
      if (r == 0) {
        v = x[i];
      } else if (op == ReduceOp::Max) {
        v = std::max(v, x[i]);
      } else if (op == ReduceOp::Min) {
        v = std::min(v, x[i]);
      } else {
        v += x[i];
      }
      ref.magnitude[i] += std::abs(x[i]);
    }
  }
  if (op == ReduceOp::Avg) {
    for (size_t i = 0; i < ref.value.size(); ++i) {
      ref.value[i] /= world;
      ref.magnitude[i] /= world;
    }
  }
  return ref;
}

// Unit roundoff-ish: the spacing of numbers just above 1 in each dtype.
double epsilon(DType dtype) {
  switch (dtype) {
    case DType::f64: return 0x1p-52;
    case DType::f32: return 0x1p-23;
    case DType::f16: return 0x1p-10;
    case DType::bf16: return 0x1p-7;
    default: return 0.0;
  }
}

// Elements where |got - want| > tolerance[i]; reports the first one through `first`.
int64_t count_wrong(const std::vector<double>& got, const std::vector<double>& want,
                    const std::vector<double>& tolerance, std::string& first) {
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool ok = got[i] == want[i] || std::abs(got[i] - want[i]) <= tolerance[i];
    if (!ok && wrong++ == 0) first = str_cat("element ", i, ": got ", got[i], ", expected ", want[i]);
  }
  return wrong;
}

const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min};
const DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

// One case on every rank: ring and native on copies of the same data, both checked against the
// reference. Integer data: ring == native bit for bit (over MPI avg too: both divide the same exact
// sum by the same scaling kernel; NCCL's avg premultiplies, see below). Real data: both within the
// rounding bound of the reference.
void check_case(uint64_t seed, int64_t numel, DType dtype, ReduceOp op, Data data, size_t chunk_bytes) {
  ProcessGroup& pg = group();
  CAPTURE(seed, numel, dtype_name(dtype), reduce_op_name(op), chunk_bytes, data == Data::Integers);
  const std::vector<double> mine = contribution(seed, pg.rank(), numel, data);
  Tensor ring = make(mine, dtype);
  Tensor native = make(mine, dtype);
  RingOptions options;
  options.chunk_bytes = chunk_bytes;
  ring_allreduce(pg, ring, op, options);
  pg.allreduce(native, op)->wait();

  const std::vector<double> got = ring.to_vector<double>();
  const std::vector<double> expected = native.to_vector<double>();
  const Reference ref = reference(seed, pg.size(), numel, data, dtype, op);
  std::vector<double> tolerance(ref.value.size(), 0.0);
  const bool exact =
      op == ReduceOp::Max || op == ReduceOp::Min || (data == Data::Integers && op == ReduceOp::Sum);
  if (!exact) {
    // Each of the N-1 additions (and the avg's scaling, and the final rounding) may round.
    for (size_t i = 0; i < tolerance.size(); ++i)
      tolerance[i] = (pg.size() + 1) * epsilon(dtype) * (ref.magnitude[i] + std::abs(ref.value[i]));
  }
  std::string first;
  const int64_t wrong_vs_reference = count_wrong(got, ref.value, tolerance, first);
  INFO("ring vs reference: " << first);
  CHECK(wrong_vs_reference == 0);
  const int64_t native_wrong = count_wrong(expected, ref.value, tolerance, first);
  INFO("native vs reference: " << first);
  CHECK(native_wrong == 0);
  // NCCL's own ncclAvg multiplies each input by 1/N before summing (PreMulSum), the ring divides
  // the exact sum: for N = 3 the two round differently. Over MPI both divide the same sum.
  const bool native_premultiplies = op == ReduceOp::Avg && test_device().is_cuda();
  if (data == Data::Integers && !native_premultiplies) {
    const std::vector<double> zero(got.size(), 0.0);
    const int64_t differ = count_wrong(got, expected, zero, first);
    INFO("ring vs native: " << first);
    CHECK(differ == 0);
  }
}

}  // namespace

TEST_CASE("ring segments cover the buffer, the first len % N one element longer", "[mpi][ring]") {
  for (int world = 1; world <= 8; ++world) {
    for (int64_t numel :
         {int64_t{0}, int64_t{1}, int64_t{world - 1}, int64_t{world}, int64_t{world + 1}, int64_t{7919}}) {
      CAPTURE(world, numel);
      const std::vector<RingSegment> segments = ring_segments(numel, world);
      REQUIRE(segments.size() == static_cast<size_t>(world));
      int64_t next = 0;
      for (int j = 0; j < world; ++j) {
        CHECK(segments[j].offset == next);
        CHECK(segments[j].length == numel / world + (j < numel % world ? 1 : 0));
        next += segments[j].length;
      }
      CHECK(next == numel);
    }
  }
}

TEST_CASE("ring_allreduce refuses what it cannot reduce, naming it", "[mpi][ring]") {
  ProcessGroup& pg = group();
  Tensor strided = zeros({4, 6}).t();
  CHECK_THROWS_WITH(ring_allreduce(pg, strided), Catch::Contains("contiguous") && Catch::Contains("[6, 4]"));
  Tensor ints = zeros({5}, TensorOptions{DType::i64});
  CHECK_THROWS_WITH(ring_allreduce(pg, ints),
                    Catch::Contains("i64") && Catch::Contains("f32, f64, f16 or bf16"));
  Tensor x = zeros({5});
  RingOptions tiny;
  tiny.chunk_bytes = 2;
  CHECK_THROWS_WITH(ring_allreduce(pg, x, ReduceOp::Sum, tiny),
                    Catch::Contains("chunk_bytes (2)") && Catch::Contains("4 bytes"));
  Tensor undefined;
  CHECK_THROWS_WITH(ring_allreduce(pg, undefined), Catch::Contains("undefined"));
}

TEST_CASE("in a world of one the ring leaves the tensor as it is", "[mpi][ring]") {
  // A group of one built directly: runs at every world size, with no communication.
  ProcessGroup single(make_single_process_backend(), Device::cpu(), LaunchInfo{});
  for (ReduceOp op : kOps) {
    Tensor x = make(contribution(7, 0, 11, Data::Reals), DType::f32, Device::cpu());
    const std::vector<double> before = x.to_vector<double>();
    WorkPtr work = ring_allreduce_async(single, x, op);
    CHECK(work->is_completed());
    work->wait();
    CHECK(x.to_vector<double>() == before);
  }
}

TEST_CASE("ring == native allreduce for every op, dtype and awkward length", "[mpi][ring]") {
  const int n = group().size();
  uint64_t seed = 1000;
  std::vector<int64_t> lengths = {0, 1, n - 1, n, n + 1, 7919};
  for (DType dtype : kDtypes) {
    const size_t item = dtype_size(dtype);
    for (ReduceOp op : kOps) {
      for (int64_t numel : lengths) {
        // The default chunk (one chunk per segment here), and one so small that every segment is
        // cut into many chunks of uneven count (one element for the tiny lengths, 37 for 7919).
        const size_t small_chunk = (numel > 100 ? 37 : 1) * item;
        for (size_t chunk_bytes : {RingOptions{}.chunk_bytes, small_chunk}) {
          check_case(seed++, numel, dtype, op, Data::Integers, chunk_bytes);
        }
      }
    }
  }
}

TEST_CASE("ring with real-valued data stays within rounding of the exact result", "[mpi][ring]") {
  uint64_t seed = 2000;
  for (DType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      check_case(seed++, 7919, dtype, op, Data::Reals, RingOptions{}.chunk_bytes);
      check_case(seed++, 1009, dtype, op, Data::Reals, 16 * dtype_size(dtype));
    }
  }
}

TEST_CASE("a 1M-element buffer in many pipelined chunks", "[mpi][ring]") {
  const int64_t numel = int64_t{1} << 20;
  check_case(3000, numel, DType::f32, ReduceOp::Sum, Data::Integers, RingOptions{}.chunk_bytes);
  check_case(3001, numel, DType::f32, ReduceOp::Sum, Data::Integers, 64 << 10);  // 64 KiB chunks
  check_case(3002, numel, DType::bf16, ReduceOp::Avg, Data::Reals, 256 << 10);
}

TEST_CASE("many async rings in flight complete in call order with correct results", "[mpi][ring]") {
  ProcessGroup& pg = group();
  const int count = 24;
  std::vector<Tensor> tensors;
  std::vector<WorkPtr> works;
  std::vector<uint64_t> seeds;
  std::vector<int64_t> lengths;
  std::vector<ReduceOp> ops;
  for (int i = 0; i < count; ++i) {
    seeds.push_back(4000 + static_cast<uint64_t>(i));
    lengths.push_back(1 + (i * 997) % 5003);
    ops.push_back(kOps[i % 4]);
    tensors.push_back(make(contribution(seeds[i], pg.rank(), lengths[i], Data::Integers), DType::f32));
  }
  // All launched back to back, as DDP launches its buckets, then observed while they run.
  RingOptions options;
  options.chunk_bytes = 512;  // many messages per ring, so rings overlap the observation below
  for (int i = 0; i < count; ++i) works.push_back(ring_allreduce_async(pg, tensors[i], ops[i], options));
  int64_t order_violations = 0;
  while (!works.back()->is_completed()) {
    // The highest completed ring, then everything before it: completion only goes from false to
    // true, so if rings finish in call order this never sees a gap.
    int highest = -1;
    for (int i = count - 1; i >= 0 && highest < 0; --i) {
      if (works[i]->is_completed()) highest = i;
    }
    for (int i = 0; i < highest; ++i) order_violations += works[i]->is_completed() ? 0 : 1;
    std::this_thread::sleep_for(std::chrono::microseconds(100));  // leave the cores to the rings
  }
  CHECK(order_violations == 0);
  for (int i = 0; i < count; ++i) {
    CAPTURE(i, lengths[i], reduce_op_name(ops[i]));
    CHECK(works[i]->is_completed());
    works[i]->wait();
    const Reference ref = reference(seeds[i], pg.size(), lengths[i], Data::Integers, DType::f32, ops[i]);
    const std::vector<double> got = tensors[i].to_vector<double>();
    std::vector<double> tolerance(got.size(), ops[i] == ReduceOp::Avg ? 1e-5 * 16 : 0.0);
    std::string first;
    const int64_t wrong = count_wrong(got, ref.value, tolerance, first);
    INFO(first);
    CHECK(wrong == 0);
  }
}
