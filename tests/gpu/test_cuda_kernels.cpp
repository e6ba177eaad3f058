// Every CUDA kernel against its CPU twin (kernels/cuda/kernels.h vs kernels/cpu/*.h):
// the same random inputs go to both, the GPU output is poisoned first (NaN or a
// sentinel) so unwritten elements fail, and the results must agree within the
// dtype's tolerance (gpu_compare.h). Runs only with a GPU (gpu_main.cpp exits
// 77 otherwise); in a build without CUDA this file has no test cases.
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/cuda_device_checks.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/kernels.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using kernels::BinaryOp;
using kernels::ReduceOp;
using kernels::UnaryOp;

// Runs `gpu_call` with cuda:0 current and waits for it, so errors surface here.
template <class F>
void on_gpu(F&& gpu_call) {
  cuda::DeviceGuard guard(0);
  gpu_call();
  cuda::synchronize(cuda::current_stream(0));
}

TEST_CASE("cuda unary and unary_backward match the CPU", "[gpu][elementwise]") {
  manual_seed(1);
  const UnaryOp float_ops[] = {UnaryOp::Neg,        UnaryOp::Exp,      UnaryOp::Log,       UnaryOp::Sqrt,
                               UnaryOp::Rsqrt,      UnaryOp::Abs,      UnaryOp::Tanh,      UnaryOp::Sigmoid,
                               UnaryOp::Relu,       UnaryOp::GeluTanh, UnaryOp::PowScalar, UnaryOp::Square,
                               UnaryOp::Reciprocal, UnaryOp::Sign};
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    for (bool transposed : {false, true}) {
      // Positive inputs keep log/sqrt/rsqrt finite; a transposed view exercises the strided path.
      Tensor x = abs(random_cpu({37, 53}, dt)).add_(0.25);
      if (transposed) x = x.t();
      const Tensor xg = x.to(gpu());
      for (UnaryOp op : float_ops) {
        INFO("op " << kernels::unary_op_name(op) << " dtype " << dt << " transposed " << transposed);
        const double p = 1.7;
        Tensor ref = empty(x.shape(), TensorOptions{dt});
        kernels::cpu::unary(op, x.view_for_kernel(), ref.view_for_kernel(), p);
        Tensor out = poisoned(x.shape(), dt, gpu());
        on_gpu([&] {
          kernels::cuda::unary(mg::cuda::current_kernel_stream(), op, xg.view_for_kernel(),
                               out.view_for_kernel(), p);
        });
        MG_REQUIRE_CLOSE(out, ref, tolerance(dt));

        const Tensor g = random_cpu(x.shape(), dt), gg = g.to(gpu()), refg = ref.to(gpu());
        Tensor ref_in = empty(x.shape(), TensorOptions{dt});
        kernels::cpu::unary_backward(op, g.view_for_kernel(), x.view_for_kernel(), ref.view_for_kernel(),
                                     ref_in.view_for_kernel(), p);
        Tensor grad_in = poisoned(x.shape(), dt, gpu());
        on_gpu([&] {
          kernels::cuda::unary_backward(mg::cuda::current_kernel_stream(), op, gg.view_for_kernel(),
                                        xg.view_for_kernel(), refg.view_for_kernel(),
                                        grad_in.view_for_kernel(), p);
        });
        MG_REQUIRE_CLOSE(grad_in, ref_in, 4 * tolerance(dt));
      }
    }
  }
  // Integer dtypes for the ops that accept them: exact.
  for (DType dt : {DType::i32, DType::i64}) {
    const Tensor x = mul(random_cpu({1000}, DType::f32), 50.0).to(dt), xg = x.to(gpu());
    for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Relu, UnaryOp::Square, UnaryOp::Sign}) {
      INFO("op " << kernels::unary_op_name(op) << " dtype " << dt);
      Tensor ref = empty(x.shape(), TensorOptions{dt});
      kernels::cpu::unary(op, x.view_for_kernel(), ref.view_for_kernel());
      Tensor out = poisoned(x.shape(), dt, gpu());
      on_gpu([&] {
        kernels::cuda::unary(mg::cuda::current_kernel_stream(), op, xg.view_for_kernel(),
                             out.view_for_kernel());
      });
      CHECK(out.to_vector<int64_t>() == ref.to_vector<int64_t>());
    }
  }
}

TEST_CASE("cuda binary ops with broadcasting and strides match the CPU", "[gpu][elementwise]") {
  manual_seed(2);
  const Shape out_shape{4, 6, 5};
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i64, DType::i32}) {
    // a: a transposed [4, 5, 6] view; b: [6, 1] broadcast over dims 0 and 2.
    Tensor a = random_cpu({4, 5, 6}, DType::f32, 3.0).to(dt).transpose(1, 2);
    Tensor b = random_cpu({6, 1}, DType::f32, 3.0, 0.5).to(dt);
    if (is_integral(dt)) b = add(abs(b), 1.0).to(dt);  // nonzero, small positive exponents for Pow
    const Tensor av = a.expand(out_shape), bv = b.expand(out_shape);
    const Tensor ag = a.to(gpu()).expand(out_shape), bg = b.to(gpu()).expand(out_shape);
    for (BinaryOp op :
         {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Maximum, BinaryOp::Minimum,
          BinaryOp::Pow, BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt, BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge,
          BinaryOp::LogicalAnd, BinaryOp::LogicalOr}) {
      if (op == BinaryOp::Div && !is_floating(dt)) continue;
      if (op == BinaryOp::Pow && !is_floating(dt)) continue;  // covered below with small values
      INFO("op " << kernels::binary_op_name(op) << " dtype " << dt);
      const DType out_dt = kernels::binary_op_returns_bool(op) ? DType::boolean : dt;
      const Tensor x = op == BinaryOp::Pow ? abs(av).to(dt) : av;
      const Tensor xg = op == BinaryOp::Pow ? abs(ag).to(dt) : ag;
      Tensor ref = empty(out_shape, TensorOptions{out_dt});
      kernels::cpu::binary(op, x.view_for_kernel(), bv.view_for_kernel(), ref.view_for_kernel());
      Tensor out = poisoned(out_shape, out_dt, gpu());
      if (out_dt == DType::boolean) out.copy_(eq(ref, 0.0).to(gpu()));  // poison: the complement of ref
      on_gpu([&] {
        kernels::cuda::binary(mg::cuda::current_kernel_stream(), op, xg.view_for_kernel(),
                              bg.view_for_kernel(), out.view_for_kernel());
      });
      if (out_dt == DType::boolean || !is_floating(dt)) {
        CHECK(out.to_vector<double>() == ref.to_vector<double>());
      } else {
        MG_REQUIRE_CLOSE(out, ref, tolerance(dt));
      }
      // The same op with a scalar right operand.
      const double s = is_floating(dt) ? 0.75 : 3.0;
      Tensor ref_s = empty(out_shape, TensorOptions{out_dt});
      kernels::cpu::binary_scalar(op, x.view_for_kernel(), s, ref_s.view_for_kernel());
      Tensor out_s = poisoned(out_shape, out_dt, gpu());
      if (out_dt == DType::boolean) out_s.copy_(eq(ref_s, 0.0).to(gpu()));
      on_gpu([&] {
        kernels::cuda::binary_scalar(mg::cuda::current_kernel_stream(), op, xg.view_for_kernel(), s,
                                     out_s.view_for_kernel());
      });
      if (out_dt == DType::boolean || !is_floating(dt)) {
        CHECK(out_s.to_vector<double>() == ref_s.to_vector<double>());
      } else {
        MG_REQUIRE_CLOSE(out_s, ref_s, tolerance(dt));
      }
    }
  }
  // Integer pow (wrapping, negative exponents) and an integer tensor compared with a fractional scalar.
  const Tensor base = tensor<int64_t>({-3, -1, 0, 1, 2, 5, 7}),
               expo = tensor<int64_t>({3, -2, 4, -5, 10, 0, 2});
  Tensor ref = empty({7}, TensorOptions{DType::i64}), out = poisoned({7}, DType::i64, gpu());
  kernels::cpu::binary(BinaryOp::Pow, base.view_for_kernel(), expo.view_for_kernel(), ref.view_for_kernel());
  const Tensor bg = base.to(gpu()), eg = expo.to(gpu());
  on_gpu([&] {
    kernels::cuda::binary(mg::cuda::current_kernel_stream(), BinaryOp::Pow, bg.view_for_kernel(),
                          eg.view_for_kernel(), out.view_for_kernel());
  });
  CHECK(out.to_vector<int64_t>() == ref.to_vector<int64_t>());
  Tensor lt_ref = empty({7}, TensorOptions{DType::boolean}), lt_out = poisoned({7}, DType::boolean, gpu());
  kernels::cpu::binary_scalar(BinaryOp::Lt, base.view_for_kernel(), 1.5, lt_ref.view_for_kernel());
  on_gpu([&] {
    kernels::cuda::binary_scalar(mg::cuda::current_kernel_stream(), BinaryOp::Lt, bg.view_for_kernel(), 1.5,
                                 lt_out.view_for_kernel());
  });
  CHECK(lt_out.to_vector<int>() == lt_ref.to_vector<int>());
}

TEST_CASE("cuda axpby, where, clamp, fill, arange match the CPU", "[gpu][elementwise]") {
  manual_seed(3);
  for (DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    INFO("dtype " << dt);
    const Tensor a = random_cpu({33, 17}, dt), b = random_cpu({17, 33}, dt).t();
    const Tensor ag = a.to(gpu()), bg = b.to(gpu());
    Tensor ref = empty(a.shape(), TensorOptions{dt}), out = poisoned(a.shape(), dt, gpu());
    kernels::cpu::axpby(a.view_for_kernel(), -0.3, b.view_for_kernel(), ref.view_for_kernel());
    on_gpu([&] {
      kernels::cuda::axpby(mg::cuda::current_kernel_stream(), ag.view_for_kernel(), -0.3,
                           bg.view_for_kernel(), out.view_for_kernel());
    });
    MG_REQUIRE_CLOSE(out, ref, tolerance(dt));

    const Tensor cond = gt(random_cpu({33, 1}), 0.0).expand(a.shape());
    const Tensor cg = cond.to(gpu()).expand(a.shape());
    Tensor wref = empty(a.shape(), TensorOptions{dt}), wout = poisoned(a.shape(), dt, gpu());
    kernels::cpu::where(cond.view_for_kernel(), a.view_for_kernel(), b.view_for_kernel(),
                        wref.view_for_kernel());
    on_gpu([&] {
      kernels::cuda::where(mg::cuda::current_kernel_stream(), cg.view_for_kernel(), ag.view_for_kernel(),
                           bg.view_for_kernel(), wout.view_for_kernel());
    });
    CHECK(rel_error(wout, wref) == 0.0);

    Tensor cref = empty(a.shape(), TensorOptions{dt}), cout_ = poisoned(a.shape(), dt, gpu());
    kernels::cpu::clamp(b.view_for_kernel(), cref.view_for_kernel(), -0.5, 0.7);
    on_gpu([&] {
      kernels::cuda::clamp(mg::cuda::current_kernel_stream(), bg.view_for_kernel(), cout_.view_for_kernel(),
                           -0.5, 0.7);
    });
    CHECK(rel_error(cout_, cref) == 0.0);
  }
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    INFO("fill/arange dtype " << dt);
    Tensor ref = empty({5, 7}, TensorOptions{dt});
    kernels::cpu::fill(ref.view_for_kernel(), 2.7);
    Tensor out = empty({7, 5}, TensorOptions{dt, gpu()}).t();  // a strided destination
    on_gpu([&] { kernels::cuda::fill(mg::cuda::current_kernel_stream(), out.view_for_kernel(), 2.7); });
    CHECK(out.to_vector<double>() == ref.to_vector<double>());
    if (dt == DType::boolean) continue;
    Tensor aref = empty({100}, TensorOptions{dt}), aout = poisoned({100}, dt, gpu());
    kernels::cpu::arange(aref.view_for_kernel(), -3.0, 0.25);
    on_gpu([&] {
      kernels::cuda::arange(mg::cuda::current_kernel_stream(), aout.view_for_kernel(), -3.0, 0.25);
    });
    CHECK(aout.to_vector<double>() == aref.to_vector<double>());
  }
}

// `src` (on the CPU) copied into `to` by the CUDA kernel, and by the CPU kernel for reference.
std::pair<Tensor, Tensor> copied_both_ways(const Tensor& src, DType to) {
  const Tensor src_g = src.to(gpu());
  Tensor ref = empty(src.shape(), TensorOptions{to});
  kernels::cpu::copy(src.view_for_kernel(), ref.view_for_kernel());
  Tensor out = poisoned(src.shape(), to, gpu());
  on_gpu([&] {
    kernels::cuda::copy(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(), out.view_for_kernel());
  });
  return {out, ref};
}

TEST_CASE("cuda copy converts between all dtype pairs like the CPU", "[gpu][copy]") {
  manual_seed(4);
  const DType all[] = {DType::f32, DType::f64, DType::f16,    DType::bf16,
                       DType::i32, DType::i64, DType::boolean};
  for (DType from : all) {
    // Values with fractions, negatives and zeros; a transposed source.
    Tensor src = mul(random_cpu({9, 12}, DType::f64), 40.0);
    src = where(lt(abs(src), 10.0), zeros_like(src), src).to(from).t();
    for (DType to : all) {
      INFO("copy " << from << " -> " << to);
      const auto [out, ref] = copied_both_ways(src, to);
      CHECK(out.to_vector<double>() == ref.to_vector<double>());
    }
  }
}

TEST_CASE("cuda copy of NaN, infinities and huge floats into integers saturates like the CPU",
          "[gpu][copy]") {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> v = {std::nan(""), inf, -inf, 1e300, -1e300, 3e9, -3e9, 2147483647.5, -2.75};
  for (DType from : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    const Tensor src = tensor<double>(v, TensorOptions{from});
    for (DType to : {DType::i32, DType::i64}) {
      INFO("copy " << from << " -> " << to);
      const auto [out, ref] = copied_both_ways(src, to);
      CHECK(out.to_vector<double>() == ref.to_vector<double>());
      CHECK(out.to(DType::i64).to_vector<int64_t>()[0] == 0);  // NaN -> 0, not whatever the cast gives
    }
  }
}

TEST_CASE("cuda integer add, sub and mul wrap on overflow like the CPU", "[gpu][elementwise]") {
  const int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
  const std::vector<int64_t> x = {big, small, big, 3037000500, -7, 0};
  const std::vector<int64_t> y = {1, 1, big, 3037000500, 5, small};
  for (DType dt : {DType::i64, DType::i32}) {
    const Tensor a = tensor<int64_t>(x).to(dt), b = tensor<int64_t>(y).to(dt);
    const Tensor a_gpu = a.to(gpu()), b_gpu = b.to(gpu());
    for (BinaryOp op : {BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul}) {
      INFO("dtype " << dt << " op " << static_cast<int>(op));
      Tensor ref = empty({6}, TensorOptions{dt}), out = empty({6}, TensorOptions{dt, gpu()});
      kernels::cpu::binary(op, a.view_for_kernel(), b.view_for_kernel(), ref.view_for_kernel());
      on_gpu([&] {
        kernels::cuda::binary(mg::cuda::current_kernel_stream(), op, a_gpu.view_for_kernel(),
                              b_gpu.view_for_kernel(), out.view_for_kernel());
      });
      CHECK(out.to(Device::cpu()).to_vector<int64_t>() == ref.to_vector<int64_t>());
    }
  }
  // The CPU's answers are the two's-complement ones: INT64_MAX + 1 is INT64_MIN.
  Tensor sum = empty({6}, TensorOptions{DType::i64});
  kernels::cpu::binary(BinaryOp::Add, tensor<int64_t>(x).view_for_kernel(),
                       tensor<int64_t>(y).view_for_kernel(), sum.view_for_kernel());
  CHECK(sum.to_vector<int64_t>()[0] == small);
}

TEST_CASE("cuda reductions match the CPU", "[gpu][reduce]") {
  manual_seed(5);
  // The last two split their long reduced axis over many blocks (a full sum(), the split reduce).
  const kernels::ReduceShape shapes[] = {{7, 1000, 1}, {3, 129, 40},   {1, 5000, 3}, {64, 1, 1},
                                         {2, 0, 3},    {1, 300001, 1}, {2, 40000, 3}};
  const ReduceOp ops[] = {ReduceOp::Sum,    ReduceOp::Mean,   ReduceOp::Max, ReduceOp::Min,
                          ReduceOp::Argmax, ReduceOp::Argmin, ReduceOp::Var, ReduceOp::Prod};
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::i64, DType::i32, DType::boolean}) {
    for (const auto& s : shapes) {
      const Shape in_shape{s.outer, s.reduce, s.inner};
      Tensor x = random_cpu(in_shape, DType::f64, 1.0);
      if (!is_floating(dt)) x = mul(x, 20.0);
      x = x.to(dt);
      // Prod of 5000 numbers overflows: use values near 1 for it (and for long reductions, nearer).
      const Tensor x_prod =
          is_floating(dt)
              ? add(mul(random_cpu(in_shape, DType::f64), s.reduce > 10000 ? 0.001 : 0.01), 1.0).to(dt)
              : x;
      for (ReduceOp op : ops) {
        const bool arg = op == ReduceOp::Argmax || op == ReduceOp::Argmin;
        if ((op == ReduceOp::Mean || op == ReduceOp::Var) && !is_floating(dt)) continue;
        if (s.reduce == 0 && (arg || op == ReduceOp::Max || op == ReduceOp::Min)) continue;
        if (op == ReduceOp::Prod && !is_floating(dt)) continue;
        const Tensor in = op == ReduceOp::Prod ? x_prod : x;
        const Tensor in_g = in.to(gpu());
        const DType out_dt =
            arg ? DType::i64
                : ((op == ReduceOp::Sum || op == ReduceOp::Prod) && !is_floating(dt) ? DType::i64 : dt);
        INFO("op " << kernels::reduce_op_name(op) << " dtype " << dt << " shape [" << s.outer << ", "
                   << s.reduce << ", " << s.inner << "]");
        Tensor ref = empty({s.outer, s.inner}, TensorOptions{out_dt});
        kernels::cpu::reduce(op, s, in.data_ptr(), dt, ref.data_ptr(), out_dt, 1);
        Tensor out = poisoned({s.outer, s.inner}, out_dt, gpu());
        on_gpu([&] {
          kernels::cuda::reduce(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), op, s,
                                in_g.data_ptr(), dt, out.data_ptr(), out_dt, 1);
        });
        if (arg || !is_floating(out_dt) || op == ReduceOp::Max || op == ReduceOp::Min) {
          CHECK(out.to_vector<double>() == ref.to_vector<double>());
        } else {
          // Sums of ~5000 terms: summation order differs (tree vs blocked), so allow more.
          MG_REQUIRE_CLOSE(out, ref, dt == DType::bf16 ? 2e-2 : 50 * tolerance(dt));
        }
      }
    }
  }
  // NaN handling: max propagates NaN, argmax returns the first NaN's index.
  const Tensor nan_x = tensor<float>({1.0f, NAN, 3.0f, NAN}, {1, 4, 1}), nan_g = nan_x.to(gpu());
  Tensor idx = poisoned({1, 1}, DType::i64, gpu());
  on_gpu([&] {
    kernels::cuda::reduce(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), ReduceOp::Argmax,
                          {1, 4, 1}, nan_g.data_ptr(), DType::f32, idx.data_ptr(), DType::i64);
  });
  CHECK(idx.item<int64_t>() == 1);
}

// Column reductions (a bias gradient: sum_to of [rows, cols] to [cols]) and var of a long axis take the
// split reduce (kernels/cuda/reduce.cu: about 4 x 132 blocks in pass 1, then a second pass over the
// slices' partials); var's split path merges per-slice moments with Chan's formula. Each output must
// match the CPU, and a second run must give the same bits (the emulator orders a block's threads
// differently at each launch, so an order-dependent sum would show).
TEST_CASE("cuda split column reductions and var match the CPU element by element, reproducibly",
          "[gpu][reduce][split]") {
  manual_seed(55);
  struct Case {
    kernels::ReduceShape shape;
    double shift;  // added to every value: |mean| >> std tests var's shifted sums
  };
  const Case cases[] = {{{1, 5000, 7}, 0.0},   {{1, 70000, 3}, 0.0}, {{1, 70000, 3}, 1000.0},
                        {{1, 8192, 768}, 0.0}, {{3, 4099, 33}, 0.0}, {{1, 1 << 24, 1}, 0.0},
                        {{2, 100000, 1}, 50.0}};
  const ReduceOp ops[] = {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Var, ReduceOp::Max, ReduceOp::Argmax};
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (const Case& c : cases) {
      const auto& s = c.shape;
      const bool huge = s.outer * s.reduce * s.inner >= (int64_t(1) << 24);
      if (huge && dt != DType::f32) continue;  // 16M elements: f32 only, to keep the emulator quick
      const Tensor x = random_cpu({s.outer, s.reduce, s.inner}, dt, 1.0, c.shift), xg = x.to(gpu());
      for (ReduceOp op : ops) {
        if (huge && op != ReduceOp::Sum && op != ReduceOp::Var) continue;
        if (c.shift != 0.0 && op != ReduceOp::Var && op != ReduceOp::Mean) continue;
        const bool arg = op == ReduceOp::Argmax;
        const DType out_dt = arg ? DType::i64 : dt;
        INFO("op " << kernels::reduce_op_name(op) << " dtype " << dt << " shape [" << s.outer << ", "
                   << s.reduce << ", " << s.inner << "] shift " << c.shift);
        Tensor ref = empty({s.outer, s.inner}, TensorOptions{out_dt});
        kernels::cpu::reduce(op, s, x.data_ptr(), dt, ref.data_ptr(), out_dt, 1);
        Tensor out = poisoned({s.outer, s.inner}, out_dt, gpu()),
               again = poisoned({s.outer, s.inner}, out_dt, gpu());
        for (Tensor* t : {&out, &again}) {
          on_gpu([&] {
            kernels::cuda::reduce(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), op, s,
                                  xg.data_ptr(), dt, t->data_ptr(), out_dt, 1);
          });
        }
        if (arg || op == ReduceOp::Max) {
          CHECK(out.to_vector<double>() == ref.to_vector<double>());
        } else {
          // The tolerance of the reductions test above ("cuda reductions match the CPU").
          MG_REQUIRE_EACH_CLOSE(out, ref, dt == DType::bf16 ? 2e-2 : 50 * tolerance(dt));
        }
        CHECK(out.to_vector<double>() == again.to_vector<double>());
      }
    }
  }
}

TEST_CASE("cuda softmax / log_softmax forward and backward match the CPU", "[gpu][softmax]") {
  manual_seed(6);
  const kernels::SoftmaxShape shapes[] = {{16, 10, 1}, {3, 1000, 1}, {4, 7, 33}, {1, 3000, 2}};
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (const auto& s : shapes) {
      for (bool log : {false, true}) {
        INFO("dtype " << dt << " log " << log << " shape [" << s.outer << ", " << s.dim << ", " << s.inner
                      << "]");
        const Shape shape{s.outer, s.dim, s.inner};
        const Tensor x = random_cpu(shape, dt, 3.0), xg = x.to(gpu());
        Tensor ref = empty(shape, TensorOptions{dt}), out = poisoned(shape, dt, gpu());
        kernels::cpu::softmax_forward(dt, s, x.data_ptr(), ref.data_ptr(), log);
        on_gpu([&] {
          kernels::cuda::softmax_forward(mg::cuda::current_kernel_stream(), dt, s, xg.data_ptr(),
                                         out.data_ptr(), log);
        });
        MG_REQUIRE_CLOSE(out, ref, 4 * tolerance(dt));

        const Tensor gy = random_cpu(shape, dt), gyg = gy.to(gpu()), refg = ref.to(gpu());
        Tensor gref = empty(shape, TensorOptions{dt}), gout = poisoned(shape, dt, gpu());
        kernels::cpu::softmax_backward(dt, s, gy.data_ptr(), ref.data_ptr(), gref.data_ptr(), log);
        on_gpu([&] {
          kernels::cuda::softmax_backward(mg::cuda::current_kernel_stream(), dt, s, gyg.data_ptr(),
                                          refg.data_ptr(), gout.data_ptr(), log);
        });
        MG_REQUIRE_CLOSE(gout, gref, 10 * tolerance(dt));
      }
    }
  }
}

TEST_CASE("cuda fused cross-entropy matches the CPU, and refuses bad targets", "[gpu][cross_entropy]") {
  manual_seed(7);
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (double smoothing : {0.0, 0.1}) {
      const int64_t rows = 300, classes = 37;
      INFO("dtype " << dt << " label_smoothing " << smoothing);
      const Tensor x = random_cpu({rows, classes}, dt, 2.0), xg = x.to(gpu());
      std::vector<int64_t> t(rows);
      for (int64_t i = 0; i < rows; ++i) t[i] = i % 11 == 0 ? -100 : (i * 7) % classes;
      const Tensor targets = tensor<int64_t>(t), tg = targets.to(gpu());
      Tensor ref = empty({rows}, TensorOptions{dt}), out = poisoned({rows}, dt, gpu());
      const int64_t n_cpu = kernels::cpu::cross_entropy_forward(
          dt, x.data_ptr(), targets.data<int64_t>(), rows, classes, -100, smoothing, ref.data_ptr());
      int64_t n_gpu = -1;
      on_gpu([&] {
        n_gpu = kernels::cuda::cross_entropy_forward(
            mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt, xg.data_ptr(),
            tg.data<int64_t>(), rows, classes, -100, smoothing, out.data_ptr());
      });
      CHECK(n_gpu == n_cpu);
      MG_REQUIRE_CLOSE(out, ref, 4 * tolerance(dt));

      const Tensor gl = random_cpu({rows}, dt), glg = gl.to(gpu());
      Tensor gref = empty({rows, classes}, TensorOptions{dt}), gout = poisoned({rows, classes}, dt, gpu());
      kernels::cpu::cross_entropy_backward(dt, x.data_ptr(), targets.data<int64_t>(), rows, classes, -100,
                                           smoothing, gl.data_ptr(), gref.data_ptr());
      on_gpu([&] {
        kernels::cuda::cross_entropy_backward(mg::cuda::current_kernel_stream(), dt, xg.data_ptr(),
                                              tg.data<int64_t>(), rows, classes, -100, smoothing,
                                              glg.data_ptr(), gout.data_ptr());
      });
      MG_REQUIRE_CLOSE(gout, gref, 4 * tolerance(dt));
    }
  }
  // A target outside [0, classes): an error naming the row and the value.
  const Tensor x = random_cpu({4, 5}).to(gpu());
  const Tensor bad = tensor<int64_t>({0, 1, 9, 2}).to(gpu());
  // The op does not wait for the kernel's check: the error comes at the next host
  // synchronisation, here the loss read (as PyTorch's device-side asserts do), once.
  Tensor loss = cross_entropy(x, bad);
  try {
    loss.item<float>();
    FAIL("no error for target 9 with 5 classes");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("target 9") != std::string::npos);
    CHECK(msg.find("row 2") != std::string::npos);
    CHECK(msg.find("next synchronisation") != std::string::npos);
  }
  CHECK(cuda::pending_device_checks() == 0);
  CHECK_NOTHROW(cross_entropy(x, tensor<int64_t>({0, 1, 4, 2}).to(gpu())).item<float>());  // reported once
  // The kernel entry point that returns the count waits, so it throws at the call.
  Tensor out = empty({4}, TensorOptions{DType::f32, gpu()});
  on_gpu([&] {
    CHECK_THROWS_WITH(kernels::cuda::cross_entropy_forward(
                          mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), DType::f32,
                          x.data_ptr(), bad.data<int64_t>(), 4, 5, -100, 0.0, out.data_ptr()),
                      Catch::Contains("target 9 of row 2"));
  });
}

// Rows as 16-byte packs after a loose head (logits and gradients misaligned alike), and element by
// element (misaligned differently: no packs), with and without the forward's stats, against the CPU.
TEST_CASE("cuda cross-entropy over unaligned logits and gradients matches the CPU", "[gpu][cross_entropy]") {
  manual_seed(73);
  const int64_t rows = 6, classes = 1001;
  const double smoothing = 0.1;
  const Tensor x = random_cpu({rows, classes}, DType::f32, 2.0);
  const Tensor targets = tensor<int64_t>({3, -100, 1000, 0, 517, 999}), tg = targets.to(gpu());
  Tensor ref = empty({rows}, TensorOptions{DType::f32});
  kernels::cpu::cross_entropy_forward(DType::f32, x.data_ptr(), targets.data<int64_t>(), rows, classes, -100,
                                      smoothing, ref.data_ptr());
  const Tensor gl = random_cpu({rows}), glg = gl.to(gpu());
  Tensor gref = empty({rows, classes}, TensorOptions{DType::f32});
  kernels::cpu::cross_entropy_backward(DType::f32, x.data_ptr(), targets.data<int64_t>(), rows, classes, -100,
                                       smoothing, gl.data_ptr(), gref.data_ptr());
  const std::vector<float> xs = x.to_vector<float>();
  for (int64_t x_off : {1, 2}) {
    for (int64_t g_off : {1, 3}) {
      INFO("logits " << x_off << " and gradients " << g_off << " elements past a 16-byte boundary");
      std::vector<float> padded(static_cast<size_t>(x_off), 0.0f);
      padded.insert(padded.end(), xs.begin(), xs.end());
      const Tensor xg = tensor<float>(padded).to(gpu());
      const float* xp = static_cast<const float*>(xg.data_ptr()) + x_off;
      Tensor out = poisoned({rows}, DType::f32, gpu()), stats = poisoned({rows, 2}, DType::f32, gpu());
      on_gpu([&] {
        kernels::cuda::cross_entropy_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                             DType::f32, xp, tg.data<int64_t>(), rows, classes, -100,
                                             smoothing, out.data_ptr(), stats.data_ptr());
      });
      MG_REQUIRE_CLOSE(out, ref, 4 * tolerance(DType::f32));
      for (bool with_stats : {true, false}) {
        INFO("backward with the forward's stats: " << with_stats);
        Tensor gout = poisoned({rows * classes + g_off}, DType::f32, gpu());
        on_gpu([&] {
          kernels::cuda::cross_entropy_backward(mg::cuda::current_kernel_stream(), DType::f32, xp,
                                                tg.data<int64_t>(), rows, classes, -100, smoothing,
                                                glg.data_ptr(), static_cast<float*>(gout.data_ptr()) + g_off,
                                                with_stats ? stats.data_ptr() : nullptr);
        });
        const std::vector<float> g = gout.to_vector<float>();
        const Tensor got =
            tensor<float>(std::vector<float>(g.begin() + g_off, g.end())).reshape({rows, classes});
        MG_REQUIRE_CLOSE(got, gref, 4 * tolerance(DType::f32));
      }
    }
  }
}

// A GPT-2 vocabulary: the forward's single online sweep (running max, rescaled sum) and the
// backward's one read with the saved per-row stats, against the CPU's two sweeps. Rows: plain,
// ignored, shifted by 1000 (the max dominates: precision), ascending (a new max at every element
// of every thread: the rescaling path), and one with -inf (masked) logits.
TEST_CASE("cuda cross-entropy over a 50257-class vocabulary matches the CPU", "[gpu][cross_entropy]") {
  manual_seed(71);
  const int64_t rows = 5, classes = 50257;
  std::vector<double> v = random_cpu({rows, classes}, DType::f64, 2.0).to_vector<double>();
  for (int64_t j = 0; j < classes; ++j) {
    v[2 * classes + j] += 1000.0;
    v[3 * classes + j] = -8.0 + 16.0 * static_cast<double>(j) / static_cast<double>(classes);
    if (j % 97 == 5) v[4 * classes + j] = -INFINITY;
  }
  const Tensor x64 = tensor<double>(v).reshape({rows, classes});
  const std::vector<int64_t> t{17, -100, 50256, 40000, 1};
  const Tensor targets = tensor<int64_t>(t), tg = targets.to(gpu());
  for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
    for (double smoothing : {0.0, 0.1}) {
      INFO("dtype " << dt << " label_smoothing " << smoothing);
      const Tensor x = x64.to(dt), xg = x.to(gpu());
      Tensor ref = empty({rows}, TensorOptions{dt}), out = poisoned({rows}, dt, gpu());
      const DType stats_dtype = dt == DType::f64 ? DType::f64 : DType::f32;
      Tensor stats = poisoned({rows, 2}, stats_dtype, gpu());
      const int64_t n_cpu = kernels::cpu::cross_entropy_forward(
          dt, x.data_ptr(), targets.data<int64_t>(), rows, classes, -100, smoothing, ref.data_ptr());
      int64_t n_gpu = -1;
      on_gpu([&] {
        n_gpu = kernels::cuda::cross_entropy_forward(
            mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt, xg.data_ptr(),
            tg.data<int64_t>(), rows, classes, -100, smoothing, out.data_ptr(), stats.data_ptr());
      });
      CHECK(n_gpu == n_cpu);
      MG_REQUIRE_CLOSE(out, ref, 4 * tolerance(dt));
      if (smoothing > 0) CHECK(std::isinf(out.to_vector<double>()[4]));  // the CPU's +inf with -inf logits
      // The stats of a plain row: its max and log(sum(exp(x - max))).
      const Tensor row0 = x.narrow(0, 0, 1).to(DType::f64);
      const double m = max(row0).item<double>();
      const double log_s = std::log(sum(exp(sub(row0, m))).item<double>());
      const std::vector<double> s = stats.to_vector<double>();
      CHECK(s[0] == Approx(m).epsilon(1e-12));
      CHECK(s[1] == Approx(log_s).epsilon(1e-5));

      const Tensor gl = random_cpu({rows}, dt), glg = gl.to(gpu());
      Tensor gref = empty({rows, classes}, TensorOptions{dt});
      kernels::cpu::cross_entropy_backward(dt, x.data_ptr(), targets.data<int64_t>(), rows, classes, -100,
                                           smoothing, gl.data_ptr(), gref.data_ptr());
      for (bool with_stats : {true, false}) {
        INFO("backward with the forward's stats: " << with_stats);
        Tensor gout = poisoned({rows, classes}, dt, gpu());
        on_gpu([&] {
          kernels::cuda::cross_entropy_backward(
              mg::cuda::current_kernel_stream(), dt, xg.data_ptr(), tg.data<int64_t>(), rows, classes, -100,
              smoothing, glg.data_ptr(), gout.data_ptr(), with_stats ? stats.data_ptr() : nullptr);
        });
        MG_REQUIRE_CLOSE(gout, gref, 4 * tolerance(dt));
      }
    }
  }
  // The op with autograd on [3, 50257], every reduction: the loss and the logits' gradient.
  for (Reduction reduction : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    CrossEntropyOptions options;
    options.reduction = reduction;
    options.label_smoothing = 0.05;
    options.ignore_index = 7;
    INFO("reduction " << static_cast<int>(reduction));
    const Tensor x = x64.narrow(0, 0, 3).to(DType::f32);
    const Tensor t3 = tensor<int64_t>({123, 7, 50000});
    Tensor x_cpu = x.detach().set_requires_grad(true), x_gpu = x.to(gpu()).set_requires_grad(true);
    Tensor l_cpu = cross_entropy(x_cpu, t3, options), l_gpu = cross_entropy(x_gpu, t3.to(gpu()), options);
    MG_REQUIRE_CLOSE(l_gpu, l_cpu, 4 * tolerance(DType::f32));
    sum(l_cpu).backward();
    sum(l_gpu).backward();
    REQUIRE(x_gpu.grad().defined());
    MG_REQUIRE_CLOSE(x_gpu.grad(), x_cpu.grad(), 4 * tolerance(DType::f32));
  }
}

TEST_CASE("cuda optimizer steps match the CPU over several steps", "[gpu][optim]") {
  manual_seed(8);
  const int64_t n = 10007;
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dt);
    Tensor p = random_cpu({n}, dt), p_g = p.to(gpu());
    Tensor m = zeros({n}, TensorOptions{dt}), v = zeros({n}, TensorOptions{dt}),
           vmax = zeros({n}, TensorOptions{dt});
    Tensor m_g = m.to(gpu()), v_g = v.to(gpu()), vmax_g = vmax.to(gpu());
    Tensor buf = empty({n}, TensorOptions{dt}), buf_g = empty({n}, TensorOptions{dt, gpu()});
    kernels::SgdHyper sgd{0.1, 0.9, 0.1, 0.01, true};
    for (int step = 1; step <= 5; ++step) {
      const Tensor g = random_cpu({n}, dt), g_g = g.to(gpu());
      kernels::AdamHyper h;
      h.lr = 1e-2;
      h.weight_decay = 0.05;
      h.amsgrad = true;
      h.step = step;
      kernels::cpu::sgd_step(dt, n, p.data_ptr(), g.data_ptr(), buf.data_ptr(), step == 1, sgd);
      kernels::cpu::adamw_step(dt, n, p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), vmax.data_ptr(),
                               h);
      h.amsgrad = false;
      kernels::cpu::adam_step(dt, n, p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), nullptr, h);
      on_gpu([&] {
        h.amsgrad = true;
        kernels::cuda::sgd_step(mg::cuda::current_kernel_stream(), dt, n, p_g.data_ptr(), g_g.data_ptr(),
                                buf_g.data_ptr(), step == 1, sgd);
        kernels::cuda::adamw_step(mg::cuda::current_kernel_stream(), dt, n, p_g.data_ptr(), g_g.data_ptr(),
                                  m_g.data_ptr(), v_g.data_ptr(), vmax_g.data_ptr(), h);
        h.amsgrad = false;
        kernels::cuda::adam_step(mg::cuda::current_kernel_stream(), dt, n, p_g.data_ptr(), g_g.data_ptr(),
                                 m_g.data_ptr(), v_g.data_ptr(), nullptr, h);
      });
    }
    MG_REQUIRE_CLOSE(p_g, p, dt == DType::f32 ? 1e-5 : 1e-12);
    MG_REQUIRE_CLOSE(m_g, m, dt == DType::f32 ? 1e-5 : 1e-12);
    MG_REQUIRE_CLOSE(v_g, v, dt == DType::f32 ? 1e-5 : 1e-12);
    MG_REQUIRE_CLOSE(buf_g, buf, dt == DType::f32 ? 1e-5 : 1e-12);
  }
}

TEST_CASE("cuBLAS gemm matches the CPU for every transpose, batch broadcast and dtype", "[gpu][gemm]") {
  manual_seed(9);
  const int64_t m = 37, n = 29, k = 53, batch = 3;
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        for (bool broadcast_b : {false, true}) {
          INFO("dtype " << dt << " trans_a " << ta << " trans_b " << tb << " broadcast_b " << broadcast_b);
          const Tensor a = random_cpu(ta ? Shape{batch, k, m} : Shape{batch, m, k}, dt);
          const Tensor b = random_cpu(tb ? Shape{n, k} : Shape{k, n}, dt);
          const Tensor b3 = broadcast_b ? b : random_cpu(tb ? Shape{batch, n, k} : Shape{batch, k, n}, dt);
          kernels::GemmArgs args;
          args.dtype = dt;
          args.trans_a = ta;
          args.trans_b = tb;
          args.m = m, args.n = n, args.k = k, args.batch = batch;
          args.lda = ta ? m : k, args.batch_stride_a = m * k;
          args.ldb = tb ? k : n, args.batch_stride_b = broadcast_b ? 0 : k * n;
          args.ldc = n, args.batch_stride_c = m * n;
          Tensor ref = empty({batch, m, n}, TensorOptions{dt});
          args.a = a.data_ptr(), args.b = b3.data_ptr(), args.c = ref.data_ptr();
          kernels::cpu::gemm_reference(args);
          const Tensor ag = a.to(gpu()), bg = b3.to(gpu());
          Tensor out = poisoned({batch, m, n}, dt, gpu());
          args.a = ag.data_ptr(), args.b = bg.data_ptr(), args.c = out.data_ptr();
          on_gpu([&] {
            kernels::cuda::gemm(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), args);
          });
          MG_REQUIRE_CLOSE(out, ref,
                           dt == DType::f16 ? 2e-3 : (dt == DType::bf16 ? 1e-2 : 20 * tolerance(dt)));
        }
      }
    }
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
