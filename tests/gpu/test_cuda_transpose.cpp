// The same-dtype strided copies of kernels/cuda/transpose.cu against the CPU's copy, exactly:
// the tiled transpose (2-d transposes of odd shapes that leave partial tiles on both edges, 3-d and
// 4-d permutations, every dtype width, misaligned sources and destinations, a transposed
// destination, 16-bit elements moved as 4-byte pairs and the
// cases that send them back to 2-byte lanes) and the general strided move (dims too short
// for tiles, steps, broadcasts). Every output lives inside a larger poisoned buffer: the view must
// equal the CPU's and every element around it must still hold the poison, so a tile edge written
// past the view fails. Runs only with a GPU (gpu_main.cpp exits 77 otherwise).
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/kernels.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;

constexpr int64_t kMargin = 8;  // poisoned elements after the output view
const DType kAll[] = {DType::f32, DType::f64, DType::bf16,   DType::f16,
                      DType::i32, DType::i64, DType::boolean};

template <class F>
void on_gpu(F&& gpu_call) {
  cuda::DeviceGuard guard(0);
  gpu_call();
  cuda::synchronize(cuda::current_stream(0));
}

// Random CPU data of any dtype; integers are spread so that a misplaced element shows.
Tensor random_any(const Shape& shape, DType dtype) {
  if (dtype == DType::boolean) return gt(random_cpu(shape), 0.0);
  if (!is_floating(dtype)) return mul(random_cpu(shape, DType::f64), 1000.0).to(dtype);
  return random_cpu(shape, dtype);
}

// Copies `src_g` (on the GPU) into a view of its shape that starts `offset` elements into a
// poisoned buffer, and compares it with the CPU's copy of `src` (the same view of the same data
// on the CPU). bool outputs start as the complement of the expected values instead.
void check_copy(const Tensor& src, const Tensor& src_g, int64_t offset = 0) {
  const DType dtype = src.dtype();
  const int64_t n = src.numel();
  Tensor ref = empty(src.shape(), TensorOptions{dtype});
  kernels::cpu::copy(src.view_for_kernel(), ref.view_for_kernel());
  const double poison = dtype == DType::boolean ? 1.0 : poison_value(dtype);
  Tensor buffer = full({n + offset + kMargin}, poison, TensorOptions{dtype}).to(gpu());
  Tensor out = buffer.narrow(0, offset, n).view(src.shape());
  if (dtype == DType::boolean) out.copy_(eq(ref, 0.0).to(gpu()));
  on_gpu([&] {
    kernels::cuda::copy(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(), out.view_for_kernel());
  });
  CHECK(out.to_vector<double>() == ref.to_vector<double>());
  const std::vector<double> all = buffer.to_vector<double>();
  int64_t bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
    if (i >= offset && i < offset + n) continue;
    const double v = all[static_cast<size_t>(i)];
    bad += (dtype == DType::boolean ? v == 1.0 : (is_floating(dtype) ? std::isnan(v) : v == poison)) ? 0 : 1;
  }
  INFO("elements written outside the output view: " << bad);
  CHECK(bad == 0);
}

TEST_CASE("transpose: 2-d transposes of odd shapes, every dtype", "[gpu][copy][transpose]") {
  manual_seed(41);
  // Partial tiles on both edges (33 x 65), exact tiles, one row or column, dims too short for a
  // tile (the general path), and a few tiles in each direction.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{33, 65}, {65, 33}, {32, 32}, {31, 33}, {1, 40},
                                                           {40, 1},  {64, 8},  {8, 64},  {3, 7},   {129, 257},
                                                           {4, 300}, {300, 4}, {16, 96}, {5000, 8}};
  for (DType dt : kAll) {
    for (const auto& [rows, cols] : shapes) {
      const Tensor x = random_any({rows, cols}, dt), xg = x.to(gpu());
      for (int64_t offset : {0, 1}) {
        INFO("transpose " << dt << " " << rows << "x" << cols << " output offset " << offset);
        check_copy(x.t(), xg.t(), offset);
      }
    }
  }
}

TEST_CASE("transpose: 16-bit elements moved in pairs", "[gpu][copy][transpose]") {
  manual_seed(46);
  // Even sizes, 4-byte aligned rows: the 64 x 64 pair tiles, whole and partial (66 x 130), one
  // tile wide or tall; then what sends them back to 2-byte lanes: an odd size, an odd row pitch,
  // a source or a destination that starts on a 2-byte boundary.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{66, 130}, {130, 66}, {64, 64}, {16, 96},
                                                           {96, 16},  {2, 200},  {200, 2}, {18, 34}};
  for (DType dt : {DType::bf16, DType::f16}) {
    for (const auto& [rows, cols] : shapes) {
      const Tensor x = random_any({rows, cols}, dt), xg = x.to(gpu());
      for (int64_t offset : {0, 1, 2}) {
        INFO("transpose " << dt << " " << rows << "x" << cols << " output offset " << offset);
        check_copy(x.t(), xg.t(), offset);
      }
    }
    const Tensor base = random_any({70, 104}, dt), base_g = base.to(gpu());
    for (int64_t col_offset : {0, 1, 2}) {
      INFO("transpose of a column slice at " << col_offset << " " << dt);
      check_copy(base.narrow(1, col_offset, 66).t(), base_g.narrow(1, col_offset, 66).t());
      check_copy(base.narrow(1, col_offset, 65).t(), base_g.narrow(1, col_offset, 65).t());
    }
    const Tensor x3 = random_any({4, 34, 66}, dt), x3g = x3.to(gpu());
    for (const std::vector<int64_t>& perm :
         {std::vector<int64_t>{0, 2, 1}, {2, 1, 0}, {1, 2, 0}, {2, 0, 1}}) {
      INFO("permute [4, 34, 66] by " << perm[0] << perm[1] << perm[2] << " " << dt);
      check_copy(x3.permute(perm), x3g.permute(perm));
    }
  }
}

TEST_CASE("transpose: misaligned, sliced, stepped and broadcast sources", "[gpu][copy][transpose]") {
  manual_seed(42);
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::boolean}) {
    const int64_t rows = 70, pitch = 103;
    const Tensor base = random_any({rows, pitch}, dt), base_g = base.to(gpu());
    for (int64_t col_offset : {1, 3}) {  // rows start misaligned: tiles straddle sectors
      INFO("transpose of a column slice at " << col_offset << " " << dt);
      check_copy(base.narrow(1, col_offset, 65).t(), base_g.narrow(1, col_offset, 65).t());
    }
    {  // steps: no unit-stride dim in the source (the general path)
      INFO("transpose of a stepped slice " << dt);
      check_copy(base.slice(1, 0, pitch, 2).t(), base_g.slice(1, 0, pitch, 2).t());
      check_copy(base.slice(0, 1, rows, 3).t(), base_g.slice(0, 1, rows, 3).t());
    }
    {  // a broadcast column, transposed: the input's unit stride is 0 along the output's rows
      INFO("transpose of a broadcast column " << dt);
      const Tensor col = random_any({rows, 1}, dt), col_g = col.to(gpu());
      check_copy(col.expand({rows, 50}).t(), col_g.expand({rows, 50}).t());
      check_copy(col.t().expand({40, rows}).t(), col_g.t().expand({40, rows}).t());
    }
  }
}

TEST_CASE("transpose: 3-d and 4-d permutations", "[gpu][copy][transpose]") {
  manual_seed(43);
  for (DType dt : {DType::f32, DType::bf16, DType::i64, DType::boolean}) {
    const Shape shape{5, 33, 65};
    const Tensor x = random_any(shape, dt), xg = x.to(gpu());
    std::vector<int64_t> perm{0, 1, 2};
    do {
      INFO("permute [5, 33, 65] by " << perm[0] << perm[1] << perm[2] << " " << dt);
      check_copy(x.permute(perm), xg.permute(perm), 1);
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
  for (DType dt : {DType::f16, DType::i32}) {
    const Shape shape{3, 17, 33, 9};
    const Tensor x = random_any(shape, dt), xg = x.to(gpu());
    std::vector<int64_t> perm{0, 1, 2, 3};
    do {
      INFO("permute [3, 17, 33, 9] by " << perm[0] << perm[1] << perm[2] << perm[3] << " " << dt);
      check_copy(x.permute(perm), xg.permute(perm));
    } while (std::next_permutation(perm.begin(), perm.end()));
  }
  {  // a batch of transposes whose batch dim sits between the two tiled ones
    const Tensor x = random_any({40, 6, 70}, DType::f32), xg = x.to(gpu());
    INFO("transpose(0, 2) of [40, 6, 70]");
    check_copy(x.transpose(0, 2), xg.transpose(0, 2));
  }
}

TEST_CASE("transpose: into a transposed destination", "[gpu][copy][transpose]") {
  manual_seed(44);
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const int64_t rows = 45, cols = 77;
    const Tensor src = random_any({cols, rows}, dt), src_g = src.to(gpu());
    // dst: a [rows, cols] buffer seen as [cols, rows]: the output's unit stride is its dim 0.
    Tensor buffer = poisoned({rows, cols}, dt, gpu());
    Tensor dst = buffer.t();
    on_gpu([&] {
      kernels::cuda::copy(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(), dst.view_for_kernel());
    });
    INFO("contiguous -> transposed view " << dt);
    CHECK(buffer.to_vector<double>() == src.t().contiguous().to_vector<double>());
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
