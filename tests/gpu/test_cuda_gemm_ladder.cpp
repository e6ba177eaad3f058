// The hand-written GEMM ladder (kernels/cuda/gemm_ladder.cu) against cuBLAS and the CPU, and the
// option that puts a ladder step behind Tensor matmul.
//
// Every step runs on the same inputs as cuBLAS (gemm_cublas) and the CPU (f64 gemm on the same
// values: the exact answer to the precision that matters here). Inputs are uploaded with every
// trans_a/trans_b layout, with tight and padded leading dimensions, with 16-byte-aligned and
// misaligned pointers (so both the vectorised fast paths and the per-element fallbacks run), with
// batches whose A or B has batch stride 0, and with alpha = 1/beta = 0 and alpha = 0.5/beta = 0 or 1.
// The padding around every operand is NaN, so a kernel that reads outside a matrix gets NaN into
// its result; C's padding is NaN and must still be NaN afterwards (nothing written outside the
// m x n matrices), and with beta = 0 C's matrices start as NaN too (every element must be written,
// and C must not be read).
//
// Tolerances, as ||out - ref|| / ||ref||:
//   f32: each output is a k-term sum with one rounding per term; the errors add like a random walk,
//     so the relative error of the sum is about u * sqrt(k) (u = 2^-24 = 6e-8). 1e-6 * sqrt(k) + 1e-6
//     is ~16x that: a wrong or missing term in even a few percent of the elements exceeds it.
//   bf16 / f16: inputs are exact in both precisions and the accumulation is f32, so the error is
//     the final rounding to 16 bits: at most 2^-9 (bf16) / 2^-11 (f16) relative per element, about
//     a third of that in norm. 1e-2 (bf16) and 2e-3 (f16) leave ~10x room.
// Runs only with a GPU (gpu_main.cpp exits 77 otherwise); in a build without CUDA this file has no
// test cases.
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cuda/gemm_ladder.h"
#include "kernels/cuda/kernels.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using kernels::GemmArgs;
using kernels::cuda::GemmKernel;

template <class F>
void on_gpu(F&& gpu_call) {
  cuda::DeviceGuard guard(0);
  gpu_call();
  cuda::synchronize(cuda::current_stream(0));
}

// Restores the process-wide choices a test changes.
struct LadderStateGuard {
  GemmKernel kernel = kernels::cuda::matmul_kernel();
  bool tf32 = kernels::cuda::allow_tf32();
  ~LadderStateGuard() {
    kernels::cuda::set_matmul_kernel(kernel);
    kernels::cuda::set_allow_tf32(tf32);
    kernels::cuda::set_tensor_core_tile_n(0);  // tests only ever force it
  }
};

double tolerance_for(DType dt, int64_t k) {
  if (dt == DType::f32) return 1e-6 * std::sqrt(static_cast<double>(k)) + 1e-6;
  return dt == DType::bf16 ? 1e-2 : 2e-3;
}

// The steps that take `dt`.
std::vector<GemmKernel> steps_for(DType dt) {
  if (dt == DType::f32) return {GemmKernel::naive, GemmKernel::smem_tiled, GemmKernel::register_tiled};
  return {GemmKernel::mma_tiled, GemmKernel::tensor_core};
}

// A batch of matrices in one flat device buffer, NaN everywhere but in the matrices.
struct DeviceMatrices {
  Tensor flat;  // owns the memory (on the GPU)
  void* ptr = nullptr;
  int64_t ld = 0, batch_stride = 0;
  int64_t offset = 0, rows = 0, cols = 0, count = 0;  // where the matrices are inside `flat`
};

// Uploads `logical` ([count, r, c], CPU) stored as is or transposed ([count, c, r]), with `pad`
// extra elements per row and the first matrix `offset` elements into the buffer. `batch_stride_zero`
// reports a batch stride of 0 (the caller then passes a single matrix for every batch entry).
DeviceMatrices upload(const Tensor& logical, bool transposed, int64_t pad, int64_t offset,
                      bool batch_stride_zero = false) {
  DeviceMatrices d;
  d.count = logical.size(0);
  d.rows = transposed ? logical.size(2) : logical.size(1);
  d.cols = transposed ? logical.size(1) : logical.size(2);
  d.ld = d.cols + pad;
  d.offset = offset;
  const int64_t stride = d.rows * d.ld;
  Tensor flat = full({offset + d.count * stride + pad}, NAN, TensorOptions{logical.dtype()});
  Tensor matrices =
      flat.narrow(0, offset, d.count * stride).view({d.count, d.rows, d.ld}).narrow(2, 0, d.cols);
  matrices.copy_(transposed ? logical.transpose(1, 2) : logical);
  d.flat = flat.to(gpu());
  d.ptr = static_cast<char*>(d.flat.data_ptr()) + offset * static_cast<int64_t>(dtype_size(logical.dtype()));
  d.batch_stride = batch_stride_zero ? 0 : stride;
  return d;
}

// The [count, rows, cols] matrices of `d`, back on the CPU; and a check that everything else in the
// buffer is still NaN.
Tensor download(const DeviceMatrices& d) {
  const Tensor flat = d.flat.to(Device::cpu());
  const int64_t stride = d.rows * d.ld;
  return flat.narrow(0, d.offset, d.count * stride).view({d.count, d.rows, d.ld}).narrow(2, 0, d.cols);
}
int64_t written_outside(const DeviceMatrices& d) {
  const std::vector<double> v = d.flat.to(Device::cpu()).to_vector<double>();
  int64_t bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(v.size()); ++i) {
    const int64_t rel = i - d.offset;
    const bool inside = rel >= 0 && rel < d.count * d.rows * d.ld && (rel % d.ld) < d.cols;
    if (!inside && !std::isnan(v[i])) ++bad;
  }
  return bad;
}

// C = alpha A B + beta C0 in f64 on the CPU: A [batch_a, m, k], B [batch_b, k, n] (batch_a/b is 1 or
// batch), C0 [batch, m, n].
Tensor reference_gemm(const Tensor& a, const Tensor& b, const Tensor& c0, double alpha, double beta) {
  const Tensor a64 = a.to(DType::f64).contiguous(), b64 = b.to(DType::f64).contiguous();
  Tensor c = c0.to(DType::f64).contiguous();
  GemmArgs g;
  g.dtype = DType::f64;
  g.batch = c.size(0), g.m = c.size(1), g.n = c.size(2), g.k = a.size(2);
  g.a = a64.data_ptr(), g.lda = g.k, g.batch_stride_a = a.size(0) == 1 ? 0 : g.m * g.k;
  g.b = b64.data_ptr(), g.ldb = g.n, g.batch_stride_b = b.size(0) == 1 ? 0 : g.k * g.n;
  g.c = c.data_ptr(), g.ldc = g.n, g.batch_stride_c = g.m * g.n;
  g.alpha = alpha, g.beta = beta;
  kernels::cpu::gemm(g);
  return c;
}

struct Config {
  const char* name;
  int64_t batch;
  bool broadcast_a, broadcast_b;
  double alpha, beta;
  int64_t pad;     // extra elements per row of A, B and C
  int64_t offset;  // first element of A, B and C this many elements into their buffers
};

// tight: the plain case; aligned pad: non-tight leading dims that keep the fast paths (8 elements
// is 32 bytes of f32, 16 bytes of bf16); odd pad + offset 1: every operand misaligned, so the steps
// take their per-element paths everywhere; pad 4: where n is 4 more than a multiple of 8 (n = 300
// below), ld is a multiple of 8 with n not, so C's 16-byte stores meet a chunk that crosses the edge.
const Config kConfigs[] = {
    {"tight, alpha 1, beta 0", 1, false, false, 1.0, 0.0, 0, 0},
    {"aligned padded ld, batch 3 with B broadcast, alpha 0.5, beta 0", 3, false, true, 0.5, 0.0, 8, 0},
    {"odd ld, misaligned pointers, batch 2 with A broadcast, alpha 0.5, beta 1", 2, true, false, 0.5, 1.0, 3,
     1},
    {"aligned padded ld, batch 2, alpha 0.5, beta 1", 2, false, false, 0.5, 1.0, 8, 0},
    {"pad 4, alpha 1, beta 1", 1, false, false, 1.0, 1.0, 4, 0},
};

struct Shape3 {
  int64_t m, n, k;
};
// 1x1x1; odd sizes (edges everywhere, k not a multiple of any tile depth); exactly one 128-tile;
// one past a tile in m and n with k = 2*32 + 1; multiples of 8 that are not of 128 (the fast paths
// at partial tiles); odd m and k with n past one 256-wide tile; and a larger one of many full tiles.
// The tensor-core step runs each with both of its block tiles, 128 x 128 and 128 x 256. Under the CPU
// emulation (cuda_emu/) the larger one is smaller (a 1024x768x512 product takes the emulator minutes per
// step): still 4 x 3 full 128-tiles with partial edges, and k deeper than the tensor-core pipeline's four
// stages.
// There it also runs only the tight configuration: the batched ones took half of the test's time,
// and batches, broadcasts, padding, alpha and beta are covered at the six smaller shapes (200 x 264
// x 136 has several full tiles in each direction).
#if defined(MG_CUDA_EMULATE)
constexpr Shape3 kLargeShape = {520, 392, 136};
constexpr bool kLargeShapeBatched = false;
#else
constexpr Shape3 kLargeShape = {1024, 768, 512};
constexpr bool kLargeShapeBatched = true;
#endif
const Shape3 kShapes[] = {{1, 1, 1},       {37, 53, 71},  {128, 128, 128}, {257, 129, 65},
                          {200, 264, 136}, {45, 300, 77}, kLargeShape};

TEST_CASE("every GEMM ladder step matches cuBLAS and the CPU", "[gpu][gemm][ladder]") {
  LadderStateGuard state;
  kernels::cuda::set_allow_tf32(false);  // the f32 cuBLAS reference in full f32
  manual_seed(31);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    for (const Shape3& s : kShapes) {
      for (const Config& cfg : kConfigs) {
        // The misaligned configuration's per-element paths are covered by the smaller shapes (which
        // have interior tiles too); skipping it at the large shape keeps the test quick under
        // compute-sanitizer.
        if ((cfg.offset != 0 || cfg.pad == 4) && s.m == kLargeShape.m) continue;
        if (!kLargeShapeBatched && cfg.batch > 1 && s.m == kLargeShape.m) continue;
        const int64_t batch_a = cfg.broadcast_a ? 1 : cfg.batch, batch_b = cfg.broadcast_b ? 1 : cfg.batch;
        const Tensor a = random_cpu({batch_a, s.m, s.k}, dt), b = random_cpu({batch_b, s.k, s.n}, dt);
        const Tensor c0 = cfg.beta != 0.0 ? random_cpu({cfg.batch, s.m, s.n}, dt)
                                          : full({cfg.batch, s.m, s.n}, NAN, TensorOptions{dt});
        const Tensor ref =
            reference_gemm(a, b, cfg.beta != 0.0 ? c0 : zeros({cfg.batch, s.m, s.n}), cfg.alpha, cfg.beta);
        const double tol = tolerance_for(dt, s.k);
        for (int ta = 0; ta < 2; ++ta) {
          for (int tb = 0; tb < 2; ++tb) {
            INFO("dtype " << dt << ", m x n x k " << s.m << "x" << s.n << "x" << s.k << ", " << cfg.name
                          << ", trans_a " << ta << ", trans_b " << tb);
            const DeviceMatrices da = upload(a, ta, cfg.pad, cfg.offset, cfg.broadcast_a);
            const DeviceMatrices db = upload(b, tb, cfg.pad, cfg.offset, cfg.broadcast_b);
            GemmArgs g;
            g.dtype = dt;
            g.trans_a = ta, g.trans_b = tb;
            g.m = s.m, g.n = s.n, g.k = s.k, g.batch = cfg.batch;
            g.a = da.ptr, g.lda = da.ld, g.batch_stride_a = da.batch_stride;
            g.b = db.ptr, g.ldb = db.ld, g.batch_stride_b = db.batch_stride;
            g.alpha = cfg.alpha, g.beta = cfg.beta;
            auto run = [&](GemmKernel kernel) {
              INFO("run by " << kernels::cuda::gemm_kernel_name(kernel));
              DeviceMatrices dc = upload(c0, false, cfg.pad, cfg.offset);
              g.c = dc.ptr, g.ldc = dc.ld, g.batch_stride_c = dc.batch_stride;
              on_gpu([&] {
                kernels::cuda::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                           kernel, g);
              });
              CHECK(written_outside(dc) == 0);
              return download(dc);
            };
            const Tensor by_cublas = run(GemmKernel::cublas);
            MG_REQUIRE_CLOSE(by_cublas, ref, tol);
            for (GemmKernel kernel : steps_for(dt)) {
              // The tensor-core step with each of its block tiles (the f32 steps have one).
              for (int tile_n :
                   kernel == GemmKernel::tensor_core ? std::vector<int>{128, 256} : std::vector<int>{0}) {
                INFO("kernel " << kernels::cuda::gemm_kernel_name(kernel) << ", tile n " << tile_n);
                kernels::cuda::set_tensor_core_tile_n(tile_n);
                const Tensor out = run(kernel);
                kernels::cuda::set_tensor_core_tile_n(0);
                MG_REQUIRE_CLOSE(out, ref, tol);
                MG_REQUIRE_CLOSE(out, by_cublas, 2 * tol);
              }
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the GEMM ladder: alpha == 0 and k == 0 read neither A nor B; empty sizes; huge batches",
          "[gpu][gemm][ladder]") {
  manual_seed(32);
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
    const int64_t m = 37, n = 21, k = 19, batch = 2;
    const Tensor c0 = random_cpu({batch, m, n}, dt);
    // A and B are all NaN: with alpha == 0 (or k == 0) not one of them may be read.
    const DeviceMatrices da = upload(full({batch, m, k}, NAN, TensorOptions{dt}), false, 0, 0);
    const DeviceMatrices db = upload(full({batch, k, n}, NAN, TensorOptions{dt}), false, 0, 0);
    std::vector<GemmKernel> kernels = steps_for(dt);
    kernels.push_back(GemmKernel::cublas);  // BLAS semantics there too: C = beta C, beta != 0 included
    for (GemmKernel kernel : kernels) {
      for (bool zero_k : {false, true}) {
        for (double beta : {0.0, 0.5}) {
          INFO("dtype " << dt << " kernel " << kernels::cuda::gemm_kernel_name(kernel)
                        << (zero_k ? " k == 0" : " alpha == 0") << " beta " << beta);
          DeviceMatrices dc =
              upload(beta != 0.0 ? c0 : full({batch, m, n}, NAN, TensorOptions{dt}), false, 2, 0);
          GemmArgs g;
          g.dtype = dt;
          g.m = m, g.n = n, g.k = zero_k ? 0 : k, g.batch = batch;
          g.a = da.ptr, g.lda = k, g.batch_stride_a = da.batch_stride;
          g.b = db.ptr, g.ldb = n, g.batch_stride_b = db.batch_stride;
          g.c = dc.ptr, g.ldc = dc.ld, g.batch_stride_c = dc.batch_stride;
          g.alpha = zero_k ? 1.0 : 0.0, g.beta = beta;
          on_gpu([&] {
            kernels::cuda::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), kernel,
                                       g);
          });
          const Tensor expected = beta != 0.0 ? mul(c0.to(DType::f64), beta) : zeros({batch, m, n});
          MG_REQUIRE_CLOSE(download(dc), expected, tolerance_for(dt, 1));
          CHECK(written_outside(dc) == 0);
        }
      }
      // m, n or batch == 0: nothing to do, nothing launched, no error (null pointers are fine).
      GemmArgs empty_args;
      empty_args.dtype = dt;
      empty_args.m = 0, empty_args.n = 5, empty_args.k = 3, empty_args.lda = 3, empty_args.ldb = 5,
      empty_args.ldc = 5;
      CHECK_NOTHROW(on_gpu([&] {
        kernels::cuda::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), kernel,
                                   empty_args);
      }));
      empty_args.m = 4, empty_args.batch = 0;
      CHECK_NOTHROW(on_gpu([&] {
        kernels::cuda::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), kernel,
                                   empty_args);
      }));
    }
  }
  // More batch entries than a grid's z dimension holds (65535): launched in chunks. Every step's host
  // code chunks through the one for_each_batch_chunk (gemm_ladder_internal.cuh). Under the emulator
  // only the naive step runs it (0.3 s): 65537 blocks of the tensor-core step's 128-wide tile took
  // 35 s of the suite's time for no code path the naive step does not take; on a GPU every step does.
#if defined(MG_CUDA_EMULATE)
  for (DType dt : {DType::f32}) {
#else
  for (DType dt : {DType::f32, DType::bf16}) {
#endif
    const int64_t batch = 65537, m = 2, n = 3, k = 5;
    const Tensor a = random_cpu({batch, m, k}, dt), b = random_cpu({1, k, n}, dt);
    const Tensor c0 = random_cpu({batch, m, n}, dt);
    const Tensor ref = reference_gemm(a, b, c0, 1.0, 1.0);
    const DeviceMatrices da = upload(a, false, 0, 0), db = upload(b, true, 0, 0, true);
#if defined(MG_CUDA_EMULATE)
    const std::vector<GemmKernel> huge_batch_steps = {GemmKernel::naive};
#else
    const std::vector<GemmKernel> huge_batch_steps = steps_for(dt);
#endif
    for (GemmKernel kernel : huge_batch_steps) {
      INFO("dtype " << dt << " kernel " << kernels::cuda::gemm_kernel_name(kernel) << " batch " << batch);
      DeviceMatrices dc = upload(c0, false, 0, 0);
      GemmArgs g;
      g.dtype = dt;
      g.trans_b = true;
      g.m = m, g.n = n, g.k = k, g.batch = batch;
      g.a = da.ptr, g.lda = da.ld, g.batch_stride_a = da.batch_stride;
      g.b = db.ptr, g.ldb = db.ld, g.batch_stride_b = 0;
      g.c = dc.ptr, g.ldc = dc.ld, g.batch_stride_c = dc.batch_stride;
      g.alpha = 1.0, g.beta = 1.0;
      on_gpu([&] {
        kernels::cuda::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), kernel, g);
      });
      MG_REQUIRE_CLOSE(download(dc), ref, tolerance_for(dt, k));
    }
  }
}

TEST_CASE("the GEMM ladder refuses dtypes its steps do not take, naming the choices", "[gpu][gemm][ladder]") {
  GemmArgs g;
  g.m = g.n = g.k = 4, g.lda = g.ldb = g.ldc = 4;
  Tensor buffer = zeros({64}, TensorOptions{DType::f64, gpu()});
  g.a = g.b = g.c = buffer.data_ptr();
  const std::pair<GemmKernel, DType> refused[] = {
      {GemmKernel::naive, DType::f64},          {GemmKernel::smem_tiled, DType::bf16},
      {GemmKernel::register_tiled, DType::f16}, {GemmKernel::mma_tiled, DType::f32},
      {GemmKernel::tensor_core, DType::f32},    {GemmKernel::tensor_core, DType::f64}};
  for (const auto& entry : refused) {
    const GemmKernel kernel = entry.first;
    const DType dt = entry.second;
    INFO("kernel " << kernels::cuda::gemm_kernel_name(kernel) << " dtype " << dt);
    CHECK_FALSE(kernels::cuda::gemm_kernel_supports(kernel, dt));
    g.dtype = dt;
    try {
      on_gpu([&] {
        kernels::cuda::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), kernel, g);
      });
      FAIL("gemm_ladder accepted an unsupported dtype");
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find(kernels::cuda::gemm_kernel_name(kernel)) != std::string::npos);
      CHECK(msg.find(dtype_name(dt)) != std::string::npos);
    }
  }
  // The tensor-core tile override takes 0 (automatic), 128 or 256 only.
  CHECK_THROWS_AS(kernels::cuda::set_tensor_core_tile_n(64), Error);
  CHECK_NOTHROW(kernels::cuda::set_tensor_core_tile_n(0));
  // Names round-trip; an unknown one lists the choices.
  for (GemmKernel kernel : kernels::cuda::kAllGemmKernels)
    CHECK(kernels::cuda::parse_gemm_kernel(kernels::cuda::gemm_kernel_name(kernel)) == kernel);
  try {
    kernels::cuda::parse_gemm_kernel("cutlass", "MG_CUDA_MATMUL");
    FAIL("parse_gemm_kernel accepted 'cutlass'");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("MG_CUDA_MATMUL") != std::string::npos);
    CHECK(msg.find("'cutlass'") != std::string::npos);
    CHECK(msg.find("cublas, naive, smem_tiled, register_tiled, mma_tiled, tensor_core") != std::string::npos);
  }
}

TEST_CASE("set_matmul_kernel routes Tensor matmul and linear (and their backward) through the ladder",
          "[gpu][gemm][ladder]") {
  LadderStateGuard state;
  kernels::cuda::set_allow_tf32(false);  // the f32 fallback below is compared at f32 accuracy
  manual_seed(33);
  for (GemmKernel kernel : {GemmKernel::naive, GemmKernel::smem_tiled, GemmKernel::register_tiled,
                            GemmKernel::mma_tiled, GemmKernel::tensor_core}) {
    const DType dt = kernels::cuda::uses_tensor_cores(kernel) ? DType::bf16 : DType::f32;
    INFO("kernel " << kernels::cuda::gemm_kernel_name(kernel) << " dtype " << dt);
    const int64_t batch = 2, m = 65, k = 70, n = 33;
    const Tensor a = random_cpu({batch, m, k}, dt), b = random_cpu({k, n}, dt);
    const Tensor ag = a.to(gpu()), bg = b.to(gpu());

    kernels::cuda::set_matmul_kernel(kernel);
    CHECK(kernels::cuda::matmul_kernel() == kernel);
    const Tensor out = matmul(ag, bg);
    // matmul's GEMM call, made directly with the chosen step: bit for bit the same result proves
    // matmul ran that step (each step is deterministic).
    Tensor direct = poisoned({batch, m, n}, dt, gpu());
    GemmArgs g;
    g.dtype = dt;
    g.m = m, g.n = n, g.k = k, g.batch = batch;
    g.a = ag.data_ptr(), g.lda = k, g.batch_stride_a = m * k;
    g.b = bg.data_ptr(), g.ldb = n, g.batch_stride_b = 0;
    g.c = direct.data_ptr(), g.ldc = n, g.batch_stride_c = m * n;
    on_gpu([&] {
      kernels::cuda::gemm_ladder(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), kernel, g);
    });
    CHECK(out.to(Device::cpu()).to_vector<double>() == direct.to(Device::cpu()).to_vector<double>());
    MG_REQUIRE_CLOSE(out, matmul(a, b), tolerance_for(dt, k));

    // linear (x W^T + b: a transposed B) and its backward (the other trans combinations), against
    // the same on the CPU.
    const Tensor x = random_cpu({m, k}, dt), w = random_cpu({n, k}, dt), bias = random_cpu({n}, dt);
    const Tensor xc = x.detach().set_requires_grad(true), wc = w.detach().set_requires_grad(true);
    Tensor xg = x.to(gpu()).set_requires_grad(true), wg = w.to(gpu()).set_requires_grad(true);
    const Tensor yc = linear(xc, wc, bias), yg = linear(xg, wg, bias.to(gpu()));
    MG_REQUIRE_CLOSE(yg, yc, tolerance_for(dt, k));
    const Tensor seed = random_cpu({m, n}, dt);
    yc.backward(seed);
    yg.backward(seed.to(gpu()));
    MG_REQUIRE_CLOSE(xg.grad(), xc.grad(), tolerance_for(dt, n));
    MG_REQUIRE_CLOSE(wg.grad(), wc.grad(), tolerance_for(dt, m));
  }
  // A step that does not take the dtype falls back to cuBLAS: f64 and bf16 with an f32 step, f32 with
  // tensor_core.
  kernels::cuda::set_matmul_kernel(GemmKernel::register_tiled);
  for (DType dt : {DType::f64, DType::bf16}) {
    INFO("fallback dtype " << dt);
    const Tensor a = random_cpu({40, 30}, dt), b = random_cpu({30, 20}, dt);
    MG_REQUIRE_CLOSE(matmul(a.to(gpu()), b.to(gpu())), matmul(a, b), dt == DType::f64 ? 1e-12 : 1e-2);
  }
  kernels::cuda::set_matmul_kernel(GemmKernel::tensor_core);
  const Tensor a = random_cpu({40, 30}), b = random_cpu({30, 20});
  MG_REQUIRE_CLOSE(matmul(a.to(gpu()), b.to(gpu())), matmul(a, b), tolerance_for(DType::f32, 30));
  kernels::cuda::set_matmul_kernel(GemmKernel::cublas);
  CHECK(kernels::cuda::matmul_kernel() == GemmKernel::cublas);
}

TEST_CASE("allow_tf32 lets cuBLAS round f32 GEMM inputs to TF32, and is off by default",
          "[gpu][gemm][tf32]") {
  LadderStateGuard state;
  kernels::cuda::set_matmul_kernel(GemmKernel::cublas);  // TF32 is a cuBLAS setting
  manual_seed(34);
  const int64_t n = 512;
  const Tensor a = random_cpu({n, n}), b = random_cpu({n, n});
  const Tensor ref = matmul(a.to(DType::f64), b.to(DType::f64));
  const Tensor ag = a.to(gpu()), bg = b.to(gpu());
  kernels::cuda::set_allow_tf32(false);
  CHECK_FALSE(kernels::cuda::allow_tf32());
  const double err_f32 = rel_error(matmul(ag, bg), ref);
  INFO("f32 error " << err_f32);
  CHECK(err_f32 <= tolerance_for(DType::f32, n));
  kernels::cuda::set_allow_tf32(true);
  CHECK(kernels::cuda::allow_tf32());
  const double err_tf32 = rel_error(matmul(ag, bg), ref);
  INFO("tf32 error " << err_tf32);
  // TF32 keeps 10 mantissa bits of each input: ~1e-3 relative per product, ~5e-4 in norm.
  CHECK(err_tf32 <= 5e-3);
  if (err_tf32 < 1e-5) WARN("cuBLAS returned f32 accuracy with TF32 allowed: it did not pick a TF32 kernel");
  kernels::cuda::set_allow_tf32(false);
  CHECK(rel_error(matmul(ag, bg), ref) <= tolerance_for(DType::f32, n));
}

// The comparison itself (gpu_compare.h), on the host: a bf16 GEMM output right everywhere but in
// one 8 x 8 tile. One norm over the 1024 x 768 output passes it; the per-tile norms do not, and
// name the tile.
TEST_CASE("MG_REQUIRE_CLOSE sees one wrong 8 x 8 tile in a 1024 x 768 bf16 GEMM output", "[gpu][compare]") {
  manual_seed(35);
  const int64_t m = 1024, n = 768, k = 64;
  const Tensor ref = matmul(random_cpu({m, k}, DType::f64), random_cpu({k, n}, DType::f64));
  const Tensor good = ref.to(DType::bf16);  // what a right kernel returns: the product rounded to bf16
  const double tol = tolerance(DType::bf16);
  CHECK(compare(good, ref).within(tol));
  std::vector<double> values = good.to_vector<double>();
  const int64_t row0 = 520, col0 = 388;  // straddles four 16 x 16 tiles
  SECTION("the tile zeroed (never written)") {
    for (int64_t r = row0; r < row0 + 8; ++r)
      for (int64_t c = col0; c < col0 + 8; ++c) values[static_cast<size_t>(r * n + c)] = 0.0;
  }
  SECTION("the tile holding the rows 8 above it (an off-by-one tile index)") {
    for (int64_t r = row0; r < row0 + 8; ++r)
      for (int64_t c = col0; c < col0 + 8; ++c)
        values[static_cast<size_t>(r * n + c)] = values[static_cast<size_t>((r - 8) * n + c)];
  }
  const Tensor bad = tensor(values, {m, n}).to(DType::bf16);
  CHECK(rel_error(bad, ref) <= tol);  // the whole-tensor norm alone lets it through
  const Comparison c = compare(bad, ref);
  INFO(c.describe(tol));
  CHECK_FALSE(c.within(tol));
  CHECK(c.worst_tile > 10 * tol);
  const int64_t worst_row = static_cast<int64_t>(c.worst_index) / n,
                worst_col = static_cast<int64_t>(c.worst_index) % n;
  CHECK(worst_row >= row0);
  CHECK(worst_row < row0 + 8);
  CHECK(worst_col >= col0);
  CHECK(worst_col < col0 + 8);
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
