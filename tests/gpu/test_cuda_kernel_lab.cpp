// The kernel lab (kernels/cuda/kernel_lab.h): every rung of the softmax and layer-norm ladders
// against the CPU kernels (kernels/cpu/softmax.h, layer_norm.h), and the production forward's two
// designs (registers, online) in every floating dtype.
//
// Shapes: 37 rows (no multiple of the 8 rows a warp-per-row block takes, nor of anything else) of
// 1, 31, 33, 100, 1000 and 4097 columns (a warp per row up to 1024 f32, a block per row above; 31,
// 33 and 4097 start three rows of four off a 16-byte boundary, so packs follow a scalar head and end
// in a scalar tail), 0 columns for layer norm's production kernels, and a few rows too long for
// registers (the online fallback). Each runs with the input and output 16-byte aligned, both one
// element past it (packs after a scalar head), and only the input one element past it (no packs:
// element accesses). Outputs are poisoned (NaN) first, so an element a kernel forgets shows up.
//
// Softmax inputs are 3 x standard normal, with special rows: every third element -inf, all values
// near 1e4 (exp overflows without the max subtracted), the whole row -inf and one +inf (NaN rows,
// as on the CPU). Layer norm inputs are standard normal + 3 (|mean| >> std: the corrected two-pass
// matters), with and without weight and bias.
//
// Tolerances: those of test_cuda_kernels.cpp (softmax: 4 x tolerance(dtype)) and
// test_cuda_kernels_nn.cpp (layer norm: y 2 x, mean 1 x, rstd 2 x tolerance(statistics dtype)). For
// the rows too long for registers (65541 f16/bf16 columns) the CPU's own f32 statistics, one
// sequential sum, are ~1e-5 off: mean and rstd are held to the CPU's f64 answer there.
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cmath>
#include <limits>
#include <vector>

#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/kernel_lab.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using kernels::cuda::RowKernel;

template <class F>
void on_gpu(F&& gpu_call) {
  cuda::DeviceGuard guard(0);
  gpu_call();
  cuda::synchronize(cuda::current_stream(0));
}

const DType kFloatDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

// Where the input and the output start: 0 or 1 element past a 16-byte boundary.
struct Offsets {
  int64_t x, y;
};
const Offsets kOffsets[] = {{0, 0}, {1, 1}, {1, 0}};

// `values` (rows x cols of them) stored `offset` elements into a buffer one element longer, as
// `dtype`, on the CPU; view() is the rows x cols matrix inside it.
struct Padded {
  Tensor buffer;
  int64_t offset = 0, rows = 0, cols = 0;
  Padded(const std::vector<double>& values, int64_t r, int64_t c, int64_t off, DType dtype)
      : offset(off), rows(r), cols(c) {
    std::vector<double> padded(values.size() + 1, 0.0);
    for (size_t i = 0; i < values.size(); ++i) padded[i + static_cast<size_t>(off)] = values[i];
    buffer = tensor<double>(padded, TensorOptions{dtype});
  }
  Padded(Tensor b, int64_t off, int64_t r, int64_t c) : buffer(std::move(b)), offset(off), rows(r), cols(c) {}
  Tensor view() const { return buffer.narrow(0, offset, rows * cols).view({rows, cols}); }
  void* ptr() const { return view().data_ptr(); }
  Padded to_gpu() const { return Padded(buffer.to(gpu()), offset, rows, cols); }
};

// An output of rows x cols, poisoned, on the GPU.
Padded poisoned_output(int64_t rows, int64_t cols, int64_t off, DType dtype) {
  return Padded(poisoned({rows * cols + 1}, dtype, gpu()), off, rows, cols);
}

std::vector<double> softmax_input(int64_t rows, int64_t cols) {
  std::vector<double> v = random_cpu({rows, cols}, DType::f64, 3.0).to_vector<double>();
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t r = 0; r < rows && cols > 1; ++r) {
    double* row = v.data() + r * cols;
    switch (r) {
      case 0:
        for (int64_t c = 0; c < cols; c += 3) row[c] = -inf;
        break;
      case 1:
        for (int64_t c = 0; c < cols; ++c) row[c] += 1e4;
        break;
      case 2:
        for (int64_t c = 0; c < cols; ++c) row[c] = -inf;
        break;
      case 3: row[cols / 2] = inf; break;
      default: break;
    }
  }
  return v;
}

// softmax over [rows, cols] of `dtype` with `run` (given the input and output pointers) against the CPU.
template <class Run>
void check_softmax(int64_t rows, int64_t cols, DType dtype, bool log, Run run) {
  const std::vector<double> values = softmax_input(rows, cols);
  for (const Offsets& o : kOffsets) {
    INFO("x offset " << o.x << ", y offset " << o.y);
    const Padded x(values, rows, cols, o.x, dtype);
    Tensor ref = empty({rows, cols}, TensorOptions{dtype});
    kernels::cpu::softmax_forward(dtype, kernels::SoftmaxShape{rows, cols, 1},
                                  x.view().contiguous().data_ptr(), ref.data_ptr(), log);
    const Padded xg = x.to_gpu();
    const Padded y = poisoned_output(rows, cols, o.y, dtype);
    on_gpu([&] { run(xg.ptr(), y.ptr()); });
    MG_REQUIRE_CLOSE(y.view(), ref, 4 * tolerance(dtype));
  }
}

// layer norm over [rows, cols] of `dtype` with `run` (x, weight, bias, y, mean, rstd) against the CPU.
template <class Run>
void check_layer_norm(int64_t rows, int64_t cols, DType dtype, bool affine, Run run) {
  const DType st = dtype == DType::f64 ? DType::f64 : DType::f32;
  const std::vector<double> values = random_cpu({rows, cols}, DType::f64, 1.0, 3.0).to_vector<double>();
  const Tensor w = random_cpu({cols}, dtype, 0.5, 1.0), b = random_cpu({cols}, dtype);
  const Tensor wg = w.to(gpu()), bg = b.to(gpu());
  for (const Offsets& o : kOffsets) {
    INFO("x offset " << o.x << ", y offset " << o.y);
    const Padded x(values, rows, cols, o.x, dtype);
    Tensor ref = empty({rows, cols}, TensorOptions{dtype});
    Tensor ref_mean = empty({rows}, TensorOptions{st}), ref_rstd = empty({rows}, TensorOptions{st});
    kernels::cpu::layer_norm_forward(dtype, x.view().contiguous().data_ptr(), affine ? w.data_ptr() : nullptr,
                                     affine ? b.data_ptr() : nullptr, rows, cols, 1e-5, ref.data_ptr(),
                                     ref_mean.data_ptr(), ref_rstd.data_ptr());
    const Padded xg = x.to_gpu();
    const Padded y = poisoned_output(rows, cols, o.y, dtype);
    Tensor mean = poisoned({rows}, st, gpu()), rstd = poisoned({rows}, st, gpu());
    on_gpu([&] {
      run(xg.ptr(), affine ? wg.data_ptr() : nullptr, affine ? bg.data_ptr() : nullptr, y.ptr(),
          mean.data_ptr(), rstd.data_ptr());
    });
    MG_REQUIRE_CLOSE(y.view(), ref, 2 * tolerance(dtype));
    if (cols > 10000) {
      // The CPU's statistics are one sequential float sum over the row: at 65541 columns its own
      // error (~1e-5) is past the tolerance. The statistics are held to the CPU's f64 answer there.
      const Tensor x64 = x.view().to(DType::f64).contiguous();
      Tensor y64 = empty({rows, cols}, TensorOptions{DType::f64});
      ref_mean = empty({rows}, TensorOptions{DType::f64});
      ref_rstd = empty({rows}, TensorOptions{DType::f64});
      kernels::cpu::layer_norm_forward(DType::f64, x64.data_ptr(), nullptr, nullptr, rows, cols, 1e-5,
                                       y64.data_ptr(), ref_mean.data_ptr(), ref_rstd.data_ptr());
    }
    MG_REQUIRE_CLOSE(mean, ref_mean, tolerance(st));
    MG_REQUIRE_CLOSE(rstd, ref_rstd, 2 * tolerance(st));
  }
}

cudaStream_t stream() { return cuda::current_kernel_stream(); }

TEST_CASE("kernel lab: every softmax rung matches the CPU", "[gpu][lab][softmax]") {
  manual_seed(41);
  for (RowKernel rung : kernels::cuda::kAllRowKernels) {
    for (int64_t cols : {1, 31, 33, 100, 1000, 4097}) {
      for (bool log : {false, true}) {
        INFO("rung " << kernels::cuda::row_kernel_name(rung) << " cols " << cols << " log " << log);
        check_softmax(37, cols, DType::f32, log, [&](void* x, void* y) {
          kernels::cuda::softmax_lab(stream(), rung, 37, cols, static_cast<const float*>(x),
                                     static_cast<float*>(y), log);
        });
      }
    }
  }
}

TEST_CASE("kernel lab: every layer norm rung matches the CPU", "[gpu][lab][layer_norm]") {
  manual_seed(42);
  for (RowKernel rung : kernels::cuda::kAllRowKernels) {
    for (int64_t cols : {1, 31, 33, 100, 1000, 4097}) {
      for (bool affine : {true, false}) {
        INFO("rung " << kernels::cuda::row_kernel_name(rung) << " cols " << cols << " affine " << affine);
        check_layer_norm(
            37, cols, DType::f32, affine, [&](void* x, void* w, void* b, void* y, void* m, void* r) {
              kernels::cuda::layer_norm_lab(stream(), rung, 37, cols, static_cast<const float*>(x),
                                            static_cast<const float*>(w), static_cast<const float*>(b), 1e-5,
                                            static_cast<float*>(y), static_cast<float*>(m),
                                            static_cast<float*>(r));
            });
      }
    }
  }
}

// Rows longer than the registers hold (a block of 1024 threads x 8 packs: 32768 f32, 16384 f64,
// 65536 f16/bf16) take the online design even in production.
int64_t too_long_for_registers(DType dt) {
  return dt == DType::f64 ? 16387 : dt == DType::f32 ? 32771 : 65541;
}

TEST_CASE("kernel lab: the production softmax's designs match the CPU in every dtype",
          "[gpu][lab][softmax]") {
  manual_seed(43);
  for (DType dt : kFloatDtypes) {
    for (int64_t cols : {int64_t{1}, int64_t{33}, int64_t{1000}, int64_t{4097}, too_long_for_registers(dt)}) {
      const int64_t rows = cols > 10000 ? 5 : 37;
      for (bool online : {false, true}) {
        INFO("dtype " << dt << " cols " << cols << " online " << online);
        check_softmax(rows, cols, dt, cols % 2 == 1, [&](void* x, void* y) {
          kernels::cuda::softmax_rows_forward(stream(), dt, rows, cols, x, y, cols % 2 == 1, online);
        });
      }
    }
  }
}

TEST_CASE("kernel lab: the production layer norm's designs match the CPU in every dtype",
          "[gpu][lab][layer_norm]") {
  manual_seed(44);
  for (DType dt : kFloatDtypes) {
    for (int64_t cols :
         {int64_t{0}, int64_t{1}, int64_t{33}, int64_t{1000}, int64_t{4097}, too_long_for_registers(dt)}) {
      const int64_t rows = cols > 10000 ? 5 : 37;
      for (bool online : {false, true}) {
        INFO("dtype " << dt << " cols " << cols << " online " << online);
        check_layer_norm(rows, cols, dt, cols % 2 == 1,
                         [&](void* x, void* w, void* b, void* y, void* m, void* r) {
                           kernels::cuda::layer_norm_rows_forward(stream(), dt, x, w, b, rows, cols, 1e-5, y,
                                                                  m, r, online);
                         });
      }
    }
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
