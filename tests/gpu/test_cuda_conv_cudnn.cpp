// conv2d through cuDNN (kernels/cuda/conv_cudnn.h) against the CPU and against the CUDA
// im2col + GEMM path:
//   - selecting the backend (set_conv_backend, the guard, parsing MG_CUDA_CONV's values);
//   - cuDNN's forward (with and without bias), backward-data and backward-filter (overwriting
//     and accumulating) called directly on poisoned outputs, for 9 geometries (1x1, 3x3 pad 1,
//     stride 2, 5x5, dilation 2, mixed non-square, odd sizes, batch 1 and 7, C_in != C_out) in
//     f32, f16 and bf16, against an f64 CPU reference computed from the same rounded inputs;
//   - the conv2d op with autograd under each backend: outputs and all three gradients equal
//     each other and the CPU, and the algorithm-cache counters prove which path ran;
//   - what cuDNN does not take (f64) falls back to im2col; bad calls throw;
//   - the algorithm cache searches once per problem and direction;
//   - misaligned views, a non-default stream, two host threads;
//   - a steady-state CNN training step makes no cudaMalloc and no algorithm search.
// Runs only with a GPU (gpu_main.cpp exits 77 otherwise).
//
// Tolerances (relative 2-norm error, gpu_compare.h's rel_error), against an f64 reference from
// the same inputs, so they bound the GPU side's own error:
//   f32  5e-5: float accumulation of at most C*kh*kw = 576 products (~1e-7 expected), with room
//        for cuDNN's Winograd/FFT algorithms, whose transforms add error (~1e-6..1e-5). TF32
//        (inputs rounded to 10 mantissa bits, ~4e-4 here) would fail it: f32 must use FMA math.
//   f16  4e-3 and bf16 2e-2: one rounding of the result (rms ~2^-11/sqrt(3) = 2.8e-4 for f16,
//        ~2^-8/sqrt(3) = 2.3e-3 for bf16), with room for half-precision Winograd transforms.
// A wrong index, layout or missing element gives errors of order 1 (or NaN from the poison).
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/cuda_allocator.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "core/grad_mode.h"
#include "kernels/cuda/conv_cudnn.h"
#include "nn/zoo.h"
#include "optim/sgd.h"
#include "tests/gpu/gpu_compare.h"

// The tag of the test cases that need cuDNN: hidden ("[.") in a build without it, see require_cudnn().
#if defined(MG_HAS_CUDNN)
#define MG_NEEDS_CUDNN "[needs-cudnn]"
#else
#define MG_NEEDS_CUDNN "[.needs-cudnn]"
#endif

namespace mg {
namespace {
using namespace gpu_test;
using Catch::Matchers::Contains;
using kernels::Conv2dGeometry;
namespace kc = kernels::cuda;

const DType kCudnnDtypes[] = {DType::f32, DType::f16, DType::bf16};

double conv_tolerance(DType dt) {
  switch (dt) {
    case DType::f32: return 5e-5;
    case DType::f16: return 4e-3;
    case DType::bf16: return 2e-2;
    default: return 1e-12;  // f64
  }
}

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, k, kh, kw, sh, sw, ph, pw, dh, dw;

  Conv2dOptions options() const {
    Conv2dOptions o;
    o.stride_h = sh, o.stride_w = sw, o.pad_h = ph, o.pad_w = pw, o.dilation_h = dh, o.dilation_w = dw;
    return o;
  }
  Conv2dGeometry geometry() const {
    Conv2dGeometry g;
    g.channels = c, g.height = h, g.width = w, g.kernel_h = kh, g.kernel_w = kw;
    g.stride_h = sh, g.stride_w = sw, g.pad_h = ph, g.pad_w = pw, g.dilation_h = dh, g.dilation_w = dw;
    return g;
  }
  Shape x_shape() const { return {n, c, h, w}; }
  Shape w_shape() const { return {k, c, kh, kw}; }
  Shape y_shape() const { return {n, k, geometry().out_h(), geometry().out_w()}; }
};

//   name                                         n   c   h   w   k kh kw sh sw ph pw dh dw
const ConvCase kCases[] = {
    {"1x1, C_in 8 -> C_out 16", 2, 8, 7, 9, 16, 1, 1, 1, 1, 0, 0, 1, 1},
    {"3x3 pad 1, batch 7, odd H/W", 7, 3, 11, 13, 5, 3, 3, 1, 1, 1, 1, 1, 1},
    {"3x3 stride 2 pad 1, batch 1", 1, 4, 9, 8, 6, 3, 3, 2, 2, 1, 1, 1, 1},
    {"5x5 pad 2", 3, 5, 12, 10, 4, 5, 5, 1, 1, 2, 2, 1, 1},
    {"3x3 dilation 2 pad 2", 2, 6, 13, 11, 3, 3, 3, 1, 1, 2, 2, 2, 2},
    {"3x2 stride (2,1) pad (1,0) dilation (1,2), batch 7", 7, 2, 17, 5, 8, 3, 2, 2, 1, 1, 0, 1, 2},
    {"FashionCNN conv1: 1 -> 32, 28x28, 3x3 pad 1", 4, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1, 1},
    {"64 -> 32 channels, 16x16, 3x3 pad 1", 4, 64, 16, 16, 32, 3, 3, 1, 1, 1, 1, 1, 1},
    {"1x1 stride 2 (ResNet shortcut), 16 -> 24", 3, 16, 9, 9, 24, 1, 1, 2, 2, 0, 0, 1, 1},
};

// Every search or hit of the algorithm cache: each cuDNN convolution call adds exactly one.
int64_t cudnn_calls() {
  const kc::ConvAlgoCacheStats s = kc::conv_algo_cache_stats();
  return s.searches + s.hits;
}

// Leaves the caching allocator holding freed NaN-filled blocks of these sizes, so the op's
// outputs (allocated next, same sizes, same stream) most likely start as NaN: an element the
// op forgets to write then fails the comparison, as with the explicitly poisoned outputs.
void poison_allocator_cache(const std::vector<Shape>& shapes, DType dt) {
  std::vector<Tensor> held;
  for (const Shape& s : shapes) held.push_back(poisoned(s, dt, gpu()));
  cuda::synchronize(cuda::current_stream(0));
}

// The f64 CPU reference of one case: y (with bias), y without bias, and the gradients of
// sum(y * dy) with respect to x, w and b.
struct Reference {
  Tensor y, y_no_bias, dx, dw, db;
};
Reference cpu_reference(const ConvCase& cs, const Tensor& x, const Tensor& w, const Tensor& b,
                        const Tensor& dy) {
  Tensor x64 = x.to(DType::f64), w64 = w.to(DType::f64), b64 = b.to(DType::f64);
  x64.set_requires_grad(true);
  w64.set_requires_grad(true);
  b64.set_requires_grad(true);
  Reference r;
  r.y = conv2d(x64, w64, b64, cs.options());
  sum(mul(r.y, dy.to(DType::f64))).backward();
  r.dx = x64.grad(), r.dw = w64.grad(), r.db = b64.grad();
  r.y = r.y.detach();
  {
    NoGradGuard no_grad;
    r.y_no_bias = conv2d(x64.detach(), w64.detach(), Tensor(), cs.options());
  }
  return r;
}

TEST_CASE("the conv2d backend is selectable: cudnn by default when built with it, else im2col",
          "[gpu][conv][cudnn]") {
#if defined(MG_HAS_CUDNN)
  CHECK(kc::built_with_cudnn());
#else
  CHECK_FALSE(kc::built_with_cudnn());
#endif
  CHECK(kc::parse_conv_backend("cudnn") == kc::ConvBackend::cudnn);
  CHECK(kc::parse_conv_backend("im2col") == kc::ConvBackend::im2col);
  CHECK_THROWS_WITH(kc::parse_conv_backend("winograd"),
                    Contains("unknown conv2d backend 'winograd'") && Contains("choices: cudnn, im2col"));
  CHECK(std::string(kc::conv_backend_name(kc::ConvBackend::cudnn)) == "cudnn");
  CHECK(std::string(kc::conv_backend_name(kc::ConvBackend::im2col)) == "im2col");

  const char* env = std::getenv("MG_CUDA_CONV");
  const kc::ConvBackend expected = env != nullptr && *env != '\0' ? kc::parse_conv_backend(env)
                                   : kc::built_with_cudnn()       ? kc::ConvBackend::cudnn
                                                                  : kc::ConvBackend::im2col;
  CHECK(kc::conv_backend() == expected);
  {
    kc::ConvBackendGuard guard(kc::ConvBackend::im2col);
    CHECK(kc::conv_backend() == kc::ConvBackend::im2col);
  }
  CHECK(kc::conv_backend() == expected);
  if (kc::built_with_cudnn()) {
    kc::ConvBackendGuard guard(kc::ConvBackend::cudnn);
    CHECK(kc::conv_backend() == kc::ConvBackend::cudnn);
  } else {
    CHECK_THROWS_WITH(kc::set_conv_backend(kc::ConvBackend::cudnn), Contains("this build has no cuDNN"));
    CHECK(kc::conv_backend() == kc::ConvBackend::im2col);
    Conv2dGeometry g = kCases[0].geometry();
    CHECK_FALSE(kc::cudnn_conv2d_supported(g, 2, 16, DType::f32));
    CHECK_THROWS_WITH(kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                               g, DType::f32, 2, 16, nullptr, nullptr, nullptr, nullptr),
                      Contains("this build has no cuDNN"));
  }
}

// The cuDNN-only test cases (tag MG_NEEDS_CUDNN) in a build without cuDNN: there they are hidden
// from the plain run, and ctest runs them on their own (test_cuda_conv_cudnn_needs_cudnn,
// tests/CMakeLists.txt), where this makes the run a visible skip (exit 77) -- or, under
// MG_REQUIRE_GPU=1 (./scripts/test's emulation run, scripts/gpu-check), a failure: a check that
// was required cannot pass by not running.
void require_cudnn() {
  if (kc::built_with_cudnn()) return;
  const char* require = std::getenv("MG_REQUIRE_GPU");
  if (require != nullptr && *require != '\0' && std::strcmp(require, "0") != 0)
    FAIL(
        "MG_REQUIRE_GPU is set and this multigrad was built without cuDNN: the cuDNN conv2d path is "
        "untested");
  std::printf("SKIPPED: this multigrad was built without cuDNN: the cuDNN conv2d tests did not run\n");
  std::fflush(stdout);
  std::_Exit(77);  // ctest's SKIP_RETURN_CODE (Catch2 v2 has no SKIP)
}

TEST_CASE("cuDNN conv2d forward, backward-data and backward-filter match an f64 CPU reference",
          "[gpu][conv][cudnn]" MG_NEEDS_CUDNN) {
  require_cudnn();
  manual_seed(41);
  std::printf(
      "cuDNN conv2d vs f64 CPU, relative errors (fwd, fwd+bias, bwd-data, bwd-filter, accumulate):\n");
  for (const ConvCase& cs : kCases) {
    for (DType dt : kCudnnDtypes) {
      INFO(cs.name << ", " << dt);
      const Conv2dGeometry g = cs.geometry();
      const Tensor x = random_cpu(cs.x_shape(), dt), w = random_cpu(cs.w_shape(), dt);
      const Tensor b = random_cpu({cs.k}, dt), dy = random_cpu(cs.y_shape(), dt);
      const Tensor base = random_cpu(cs.w_shape(), dt);  // what backward-filter accumulates onto
      const Reference ref = cpu_reference(cs, x, w, b, dy);
      const Tensor xg = x.to(gpu()), wg = w.to(gpu()), bg = b.to(gpu()), dyg = dy.to(gpu());
      Tensor y = poisoned(cs.y_shape(), dt, gpu()), y_bias = poisoned(cs.y_shape(), dt, gpu());
      Tensor dx = poisoned(cs.x_shape(), dt, gpu()), dw = poisoned(cs.w_shape(), dt, gpu());
      Tensor dw_acc = base.to(gpu());
      std::string algorithms;
      {
        cuda::DeviceGuard guard(0);
        kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g, dt, cs.n,
                                 cs.k, xg.data_ptr(), wg.data_ptr(), nullptr, y.data_ptr());
        kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g, dt, cs.n,
                                 cs.k, xg.data_ptr(), wg.data_ptr(), bg.data_ptr(), y_bias.data_ptr());
        kc::cudnn_conv2d_backward_data(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g, dt,
                                       cs.n, cs.k, dyg.data_ptr(), wg.data_ptr(), dx.data_ptr());
        kc::cudnn_conv2d_backward_filter(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g,
                                         dt, cs.n, cs.k, xg.data_ptr(), dyg.data_ptr(), dw.data_ptr(), false);
        kc::cudnn_conv2d_backward_filter(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g,
                                         dt, cs.n, cs.k, xg.data_ptr(), dyg.data_ptr(), dw_acc.data_ptr(),
                                         true);
        cuda::synchronize(cuda::current_stream(0));
        algorithms = kc::cudnn_conv2d_algorithms(g, cs.n, cs.k, dt);
      }
      INFO("cuDNN algorithms: " << algorithms);
      const double tol = conv_tolerance(dt);
      const Tensor dw_expected = add(base.to(DType::f64), ref.dw);
      const double e_fwd = rel_error(y, ref.y_no_bias), e_bias = rel_error(y_bias, ref.y);
      const double e_data = rel_error(dx, ref.dx), e_filter = rel_error(dw, ref.dw);
      const double e_acc = rel_error(dw_acc, dw_expected);
      std::printf("  %-52s %-4s %.1e %.1e %.1e %.1e %.1e  [%s]\n", cs.name, dtype_name(dt), e_fwd, e_bias,
                  e_data, e_filter, e_acc, algorithms.c_str());
      MG_REQUIRE_CLOSE(y, ref.y_no_bias, tol);
      MG_REQUIRE_CLOSE(y_bias, ref.y, tol);
      MG_REQUIRE_CLOSE(dx, ref.dx, tol);
      MG_REQUIRE_CLOSE(dw, ref.dw, tol);
      MG_REQUIRE_CLOSE(dw_acc, dw_expected, tol);
    }
  }
  std::fflush(stdout);
}

// conv2d + autograd on cuda:0 under `backend`: the output and the gradients of sum(y * r).
struct OpResult {
  Tensor y, dx, dw, db;
  int64_t cudnn_calls = 0;  // cuDNN convolution calls it made (forward + backward)
};
OpResult run_op(kc::ConvBackend backend, const ConvCase& cs, const Tensor& x, const Tensor& w,
                const Tensor& b, const Tensor& r) {
  kc::ConvBackendGuard guard(backend);
  Tensor xg = x.to(gpu()), wg = w.to(gpu()), bg = b.to(gpu());
  xg.set_requires_grad(true);
  wg.set_requires_grad(true);
  bg.set_requires_grad(true);
  const Tensor rg = r.to(gpu());
  const DType dt = x.dtype();
  poison_allocator_cache({cs.y_shape(), cs.y_shape(), cs.x_shape(), cs.w_shape()}, dt);
  const int64_t calls_before = cudnn_calls();
  OpResult out;
  out.y = conv2d(xg, wg, bg, cs.options());
  sum(mul(out.y, rg)).backward();
  out.cudnn_calls = cudnn_calls() - calls_before;
  out.y = out.y.detach();
  out.dx = xg.grad(), out.dw = wg.grad(), out.db = bg.grad();
  REQUIRE(out.dx.defined());
  REQUIRE(out.dw.defined());
  REQUIRE(out.db.defined());
  CHECK(out.y.device() == gpu());
  CHECK(out.dx.device() == gpu());
  return out;
}

TEST_CASE("conv2d with autograd: the cuDNN and im2col backends agree with each other and the CPU",
          "[gpu][conv][cudnn]" MG_NEEDS_CUDNN) {
  require_cudnn();
  manual_seed(42);
  for (const ConvCase& cs : kCases) {
    for (DType dt : kCudnnDtypes) {
      INFO(cs.name << ", " << dt);
      const Tensor x = random_cpu(cs.x_shape(), dt), w = random_cpu(cs.w_shape(), dt);
      const Tensor b = random_cpu({cs.k}, dt), r = random_cpu(cs.y_shape(), dt);
      const Reference ref = cpu_reference(cs, x, w, b, r);
      const OpResult via_cudnn = run_op(kc::ConvBackend::cudnn, cs, x, w, b, r);
      const OpResult via_im2col = run_op(kc::ConvBackend::im2col, cs, x, w, b, r);
      // The paths that ran: forward, backward-data and backward-filter through cuDNN; none with im2col.
      CHECK(via_cudnn.cudnn_calls == 3);
      CHECK(via_im2col.cudnn_calls == 0);
      const double tol = conv_tolerance(dt);
      for (const OpResult* res : {&via_cudnn, &via_im2col}) {
        INFO((res == &via_cudnn ? "cudnn" : "im2col") << " vs the f64 CPU reference");
        MG_REQUIRE_CLOSE(res->y, ref.y, tol);
        MG_REQUIRE_CLOSE(res->dx, ref.dx, tol);
        MG_REQUIRE_CLOSE(res->dw, ref.dw, tol);
        MG_REQUIRE_CLOSE(res->db, ref.db, tol);
      }
      INFO("cudnn vs im2col");
      MG_REQUIRE_CLOSE(via_cudnn.y, via_im2col.y, 2 * tol);
      MG_REQUIRE_CLOSE(via_cudnn.dx, via_im2col.dx, 2 * tol);
      MG_REQUIRE_CLOSE(via_cudnn.dw, via_im2col.dw, 2 * tol);
      MG_REQUIRE_CLOSE(via_cudnn.db, via_im2col.db, 2 * tol);
    }
  }
}

TEST_CASE("conv2d needing only one gradient asks cuDNN for only that one",
          "[gpu][conv][cudnn]" MG_NEEDS_CUDNN) {
  require_cudnn();
  manual_seed(43);
  kc::ConvBackendGuard guard(kc::ConvBackend::cudnn);
  const ConvCase& cs = kCases[1];
  const Tensor x = random_cpu(cs.x_shape()), w = random_cpu(cs.w_shape()), r = random_cpu(cs.y_shape());
  const Reference ref = cpu_reference(cs, x, w, zeros({cs.k}), r);
  for (bool grad_x : {true, false}) {
    INFO("gradient with respect to " << (grad_x ? "x" : "w") << " only");
    Tensor xg = x.to(gpu()), wg = w.to(gpu());
    (grad_x ? xg : wg).set_requires_grad(true);
    const int64_t before = cudnn_calls();
    const Tensor y = conv2d(xg, wg, Tensor(), cs.options());
    sum(mul(y, r.to(gpu()))).backward();
    CHECK(cudnn_calls() - before == 2);  // forward + one backward
    if (grad_x) {
      CHECK_FALSE(wg.grad().defined());
      MG_REQUIRE_CLOSE(xg.grad(), ref.dx, conv_tolerance(DType::f32));
    } else {
      CHECK_FALSE(xg.grad().defined());
      MG_REQUIRE_CLOSE(wg.grad(), ref.dw, conv_tolerance(DType::f32));
    }
  }
}

TEST_CASE("what cuDNN does not take runs as im2col; bad cuDNN calls throw", "[gpu][conv][cudnn]") {
  manual_seed(44);
  const ConvCase& cs = kCases[2];
  const Conv2dGeometry g = cs.geometry();
  CHECK_FALSE(kc::cudnn_conv2d_supported(g, cs.n, cs.k, DType::f64));
  CHECK_FALSE(kc::cudnn_conv2d_supported(g, int64_t(1) << 32, cs.k, DType::f32));  // a size beyond 32 bits
  CHECK_FALSE(kc::cudnn_conv2d_supported(g, int64_t(1) << 20, 4096, DType::f32));  // y: 2^36 elements
  CHECK(kc::cudnn_conv2d_supported(g, cs.n, cs.k, DType::bf16) == kc::built_with_cudnn());
  // f64 with the cudnn backend selected: computed by im2col, exactly like the CPU's f64.
  if (kc::built_with_cudnn()) {
    kc::ConvBackendGuard guard(kc::ConvBackend::cudnn);
    const Tensor x = random_cpu(cs.x_shape(), DType::f64), w = random_cpu(cs.w_shape(), DType::f64);
    const int64_t before = cudnn_calls();
    const Tensor y = conv2d(x.to(gpu()), w.to(gpu()), Tensor(), cs.options());
    CHECK(cudnn_calls() == before);
    MG_REQUIRE_CLOSE(y, conv2d(x, w, Tensor(), cs.options()), 1e-12);
    // Called directly, cuDNN refuses f64 and says what to use instead.
    const Tensor yg = poisoned(cs.y_shape(), DType::f64, gpu());
    cuda::DeviceGuard device(0);
    const Tensor xg = x.to(gpu()), wg = w.to(gpu());
    CHECK_THROWS_WITH(kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                               g, DType::f64, cs.n, cs.k, xg.data_ptr(), wg.data_ptr(),
                                               nullptr, yg.data_ptr()),
                      Contains("f64") && Contains("im2col"));
    // A kernel larger than the padded image: the geometry check names it.
    Conv2dGeometry too_big = g;
    too_big.kernel_h = too_big.kernel_w = 25;
    CHECK_THROWS_AS(kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                             too_big, DType::f32, cs.n, cs.k, xg.data_ptr(), wg.data_ptr(),
                                             nullptr, yg.data_ptr()),
                    Error);
    CHECK_THROWS_WITH(
        kc::cudnn_conv2d_backward_data(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g,
                                       DType::f32, cs.n, cs.k, nullptr, wg.data_ptr(), yg.data_ptr()),
        Contains("null buffer"));
  }
}

TEST_CASE("the cuDNN algorithm cache searches once per problem and direction",
          "[gpu][conv][cudnn]" MG_NEEDS_CUDNN) {
  require_cudnn();
  manual_seed(45);
  kc::clear_conv_algo_cache();
  kc::ConvAlgoCacheStats s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 0);
  CHECK(s.hits == 0);
  CHECK(s.entries == 0);
  const ConvCase& cs = kCases[3];
  const Conv2dGeometry g = cs.geometry();
  const Tensor x = random_cpu(cs.x_shape()).to(gpu()), w = random_cpu(cs.w_shape()).to(gpu());
  Tensor y = empty(cs.y_shape(), TensorOptions{DType::f32, gpu()});
  Tensor dx = empty(cs.x_shape(), TensorOptions{DType::f32, gpu()});
  cuda::DeviceGuard guard(0);
  auto forward = [&](int64_t batch) {
    kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g, DType::f32,
                             batch, cs.k, x.data_ptr(), w.data_ptr(), nullptr, y.data_ptr());
  };
  forward(cs.n);
  s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 1);
  CHECK(s.hits == 0);
  CHECK(s.entries == 1);
  forward(cs.n);  // the same problem: served from the cache, no new search
  forward(cs.n);
  s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 1);
  CHECK(s.hits == 2);
  CHECK(s.entries == 1);
  // Another direction of the same sizes is another problem.
  kc::cudnn_conv2d_backward_data(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g,
                                 DType::f32, cs.n, cs.k, y.data_ptr(), w.data_ptr(), dx.data_ptr());
  s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 2);
  CHECK(s.entries == 2);
  // So is another batch size (a last, shorter batch) and another dtype.
  forward(1);
  s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 3);
  CHECK(s.entries == 3);
  const Tensor xh = x.to(DType::f16), wh = w.to(DType::f16);
  Tensor yh = empty(cs.y_shape(), TensorOptions{DType::f16, gpu()});
  kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g, DType::f16,
                           cs.n, cs.k, xh.data_ptr(), wh.data_ptr(), nullptr, yh.data_ptr());
  kc::cudnn_conv2d_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), g, DType::f16,
                           cs.n, cs.k, xh.data_ptr(), wh.data_ptr(), nullptr, yh.data_ptr());
  s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 4);
  CHECK(s.hits == 3);
  CHECK(s.entries == 4);
  // The algorithm names, for logs and benchmarks (searching the two directions not seen yet).
  const std::string names = kc::cudnn_conv2d_algorithms(g, cs.n, cs.k, DType::f32);
  INFO(names);
  CHECK(names.rfind("fwd ", 0) == 0);
  CHECK(names.find(", bwd-data ") != std::string::npos);
  CHECK(names.find(", bwd-filter ") != std::string::npos);
  CHECK(names.find('?') == std::string::npos);
  s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 5);  // only bwd-filter was new
  kc::clear_conv_algo_cache();
  s = kc::conv_algo_cache_stats();
  CHECK(s.searches == 0);
  CHECK(s.entries == 0);
  cuda::synchronize(cuda::current_stream(0));
}

TEST_CASE("cuDNN conv2d takes misaligned views, runs on the current stream and from several threads",
          "[gpu][conv][cudnn]" MG_NEEDS_CUDNN) {
  require_cudnn();
  manual_seed(46);
  kc::ConvBackendGuard guard(kc::ConvBackend::cudnn);
  const ConvCase& cs = kCases[1];  // 11x13 images: odd element counts
  const double tol = conv_tolerance(DType::f16);
  SECTION("a view starting at an odd element (2-byte aligned f16)") {
    const Tensor big = random_cpu({cs.n + 1, cs.c, cs.h, cs.w}, DType::f16);
    const Tensor x = big.narrow(0, 1, cs.n), w = random_cpu(cs.w_shape(), DType::f16);
    const Tensor xg = big.to(gpu()).narrow(0, 1, cs.n);
    REQUIRE(reinterpret_cast<uintptr_t>(xg.data_ptr()) % 16 != 0);
    const Reference ref =
        cpu_reference(cs, x, w, zeros({cs.k}, TensorOptions{DType::f16}), zeros(cs.y_shape()));
    const Tensor y = conv2d(xg, w.to(gpu()), Tensor(), cs.options());
    MG_REQUIRE_CLOSE(y, ref.y_no_bias, tol);
  }
  SECTION("a non-default stream") {
    const Tensor x = random_cpu(cs.x_shape()), w = random_cpu(cs.w_shape());
    const Tensor expected = conv2d(x.to(DType::f64), w.to(DType::f64), Tensor(), cs.options());
    const cuda::Stream side = cuda::create_stream(0);
    Tensor y;
    {
      const Tensor xg = x.to(gpu()), wg = w.to(gpu());
      cuda::Event ready;
      ready.record(cuda::current_stream(0));
      cuda::StreamGuard on_side(side);
      ready.wait(side);
      y = conv2d(xg, wg, Tensor(), cs.options());
      cuda::record_stream(xg, side);  // used on `side`, allocated on the default stream
      cuda::record_stream(wg, side);
      cuda::synchronize(side);
    }
    MG_REQUIRE_CLOSE(y, expected, conv_tolerance(DType::f32));
  }
  SECTION("two host threads at once (a cuDNN handle each)") {
    const Tensor x = random_cpu(cs.x_shape()), w = random_cpu(cs.w_shape());
    const Tensor expected = conv2d(x.to(DType::f64), w.to(DType::f64), Tensor(), cs.options());
    const Tensor xg = x.to(gpu()), wg = w.to(gpu());
    cuda::synchronize(cuda::current_stream(0));
    std::vector<Tensor> results(2);
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int t = 0; t < 2; ++t) {
      threads.emplace_back([&, t] {
        try {
          for (int i = 0; i < 20; ++i) results[t] = conv2d(xg, wg, Tensor(), cs.options());
          cuda::synchronize(cuda::current_stream(0));
        } catch (const std::exception& e) {
          errors[t] = e.what();
        }
      });
    }
    for (std::thread& th : threads) th.join();
    for (int t = 0; t < 2; ++t) {
      INFO("thread " << t << ": " << errors[t]);
      CHECK(errors[t].empty());
      REQUIRE(results[t].defined());
      MG_REQUIRE_CLOSE(results[t], expected, conv_tolerance(DType::f32));
    }
  }
}

TEST_CASE("a steady-state CNN training step with cuDNN makes no cudaMalloc and no algorithm search",
          "[gpu][conv][cudnn][allocator]" MG_NEEDS_CUDNN) {
  require_cudnn();
  manual_seed(47);
  kc::ConvBackendGuard guard(kc::ConvBackend::cudnn);
  nn::FashionCNN model;
  model.to(gpu());
  model.train();
  optim::SGDOptions options;
  options.lr = 0.01, options.momentum = 0.9;
  optim::SGD opt(model.parameters(), options);
  const Tensor targets = tensor<int64_t>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5}).to(gpu());
  AllocatorStats after_warmup;
  kc::ConvAlgoCacheStats cache_after_warmup;
  std::vector<float> losses;
  for (int step = 1; step <= 6; ++step) {
    const Tensor x = random_cpu({16, 1, 28, 28}).to(gpu());
    opt.zero_grad();
    const Tensor loss = cross_entropy(model.forward(x), targets);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<float>());
    if (step == 2) {
      after_warmup = cuda::memory_stats(0);
      cache_after_warmup = kc::conv_algo_cache_stats();
    }
  }
  const AllocatorStats end = cuda::memory_stats(0);
  const kc::ConvAlgoCacheStats cache_end = kc::conv_algo_cache_stats();
  INFO("cudaMalloc calls after step 2: " << after_warmup.system_allocations
                                         << ", after step 6: " << end.system_allocations);
  CHECK(end.system_allocations == after_warmup.system_allocations);
  CHECK(end.cache_hits > after_warmup.cache_hits);
  CHECK(cache_end.searches == cache_after_warmup.searches);
  CHECK(cache_end.hits > cache_after_warmup.hits);  // the convolutions did run through cuDNN
  for (float l : losses) CHECK(std::isfinite(l));
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
