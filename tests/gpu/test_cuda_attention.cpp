// The fused attention on CUDA (kernels/cuda/attention.cu, attention_tensor_core.cu) against the
// CPU's fused kernel (kernels/cpu/attention.cpp, itself checked against the composed path in
// tests/nn/test_attention_fused.cpp): outputs and gradients through the op, over the edge cases
// (T not a multiple of any tile, T = 1, Tq != Tk with and without the causal mask, odd and large D,
// a row that sees no key, the head split of a [B, T, 3C] projection read in place, an operand not
// 16-byte aligned); both forward kernels (CUDA cores, tensor cores) and both backwards for bf16
// and f16; and dropout, whose mask both devices draw from Philox (read back bit for bit through
// V = I, and compared between the devices' outputs).
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cmath>
#include <vector>

#include "base/philox.h"
#include "core/attention.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/kernels.h"
#include "nn/zoo.h"
#include "tests/gpu/gpu_compare.h"
#include "tests/gradcheck.h"

namespace mg {
namespace {
using namespace gpu_test;

using testing::leaf;

struct Case {
  int64_t B, H, Tq, Tk, D;
  bool causal;
};

// The op on cuda:0 and on the CPU from the same values of `dtype`: output and the gradients of
// sum(out * w), compared at `tol` (the backward sums longer: 4x).
void check_op_against_cpu(const Case& c, DType dtype, double dropout_p, double tol, uint64_t seed) {
  INFO("B=" << c.B << " H=" << c.H << " Tq=" << c.Tq << " Tk=" << c.Tk << " D=" << c.D
            << " causal=" << c.causal << " dtype=" << dtype_name(dtype) << " dropout=" << dropout_p);
  manual_seed(seed);
  const Tensor q0 = random_cpu({c.B, c.H, c.Tq, c.D}, dtype), k0 = random_cpu({c.B, c.H, c.Tk, c.D}, dtype),
               v0 = random_cpu({c.B, c.H, c.Tk, c.D}, dtype), w = random_cpu({c.B, c.H, c.Tq, c.D}, dtype);
  const AttentionOptions opt{c.causal, dropout_p, std::nullopt};
  Tensor qc = leaf(q0), kc = leaf(k0), vc = leaf(v0);
  Tensor qg = leaf(q0.to(gpu())), kg = leaf(k0.to(gpu())), vg = leaf(v0.to(gpu()));

  manual_seed(seed + 1);  // the same generator state: the same dropout mask
  Tensor out_cpu = scaled_dot_product_attention(qc, kc, vc, opt);
  manual_seed(seed + 1);
  Tensor out_gpu = scaled_dot_product_attention(qg, kg, vg, opt);
  REQUIRE(out_gpu.device() == gpu());
  MG_REQUIRE_CLOSE(out_gpu.to(Device::cpu()), out_cpu, tol);

  sum(mul(out_cpu, w)).backward();
  sum(mul(out_gpu, w.to(gpu()))).backward();
  MG_REQUIRE_CLOSE(vg.grad().to(Device::cpu()), vc.grad(), 4 * tol);
  if (c.Tk == 1 || (c.causal && c.Tq == 1)) {
    // Every query sees exactly one key: P = 1 whatever q and k are, so their exact gradients are 0
    // and both devices return rounding noise (dS = P (dP - delta), two equal sums): compare at the
    // inputs' scale (O(1)).
    CHECK(max(abs(qg.grad())).to(Device::cpu()).item<double>() < 1e-5);
    CHECK(max(abs(kg.grad())).to(Device::cpu()).item<double>() < 1e-5);
    return;
  }
  MG_REQUIRE_CLOSE(kg.grad().to(Device::cpu()), kc.grad(), 4 * tol);
  MG_REQUIRE_CLOSE(qg.grad().to(Device::cpu()), qc.grad(), 4 * tol);
}

TEST_CASE("cuda fused attention matches the CPU's, forward and backward, f32 and f64", "[gpu][attention]") {
  const std::vector<Case> cases = {
      {2, 3, 37, 37, 24, true},    // T not a multiple of 16 or 32, B and H > 1
      {1, 2, 37, 37, 24, false},   //
      {1, 1, 1, 1, 64, true},      // T = 1
      {1, 2, 20, 45, 32, false},   // Tq < Tk
      {1, 2, 20, 45, 32, true},    // top-left causal: row i sees keys 0..i
      {1, 1, 45, 20, 16, true},    // Tq > Tk: rows past Tk see all keys
      {1, 1, 33, 33, 5, true},     // an odd D
      {1, 1, 18, 40, 256, false},  // the largest D, 8 dims a lane
  };
  uint64_t seed = 100;
  for (const Case& c : cases) check_op_against_cpu(c, DType::f32, 0.0, 5 * tolerance(DType::f32), seed++);
  check_op_against_cpu({1, 2, 29, 29, 40, true}, DType::f64, 0.0, 10 * tolerance(DType::f64), seed++);
}

TEST_CASE("cuda fused attention: a row that sees no key gives zeros, not NaN", "[gpu][attention]") {
  const Tensor q = random_cpu({1, 2, 5, 16}).to(gpu()),
               kv = zeros({1, 2, 0, 16}, TensorOptions{DType::f32, gpu()});
  for (bool causal : {false, true}) {
    const Tensor out = scaled_dot_product_attention(q, kv, kv, AttentionOptions{causal, 0.0, std::nullopt});
    REQUIRE(out.shape() == Shape{1, 2, 5, 16});
    CHECK(max(abs(out)).to(Device::cpu()).item<double>() == 0.0);
  }
}

TEST_CASE("cuda fused attention draws the CPU's dropout mask", "[gpu][attention]") {
  // A wrong keep anywhere changes an output row by O(1), far above 5 f32 tolerances.
  check_op_against_cpu({2, 2, 40, 40, 32, true}, DType::f32, 0.3, 5 * tolerance(DType::f32), 300);
  check_op_against_cpu({1, 2, 17, 50, 24, false}, DType::f32, 0.5, 5 * tolerance(DType::f32), 301);
}

TEST_CASE("cuda fused attention reads the head split of a [B, T, 3C] projection in place",
          "[gpu][attention]") {
  const int64_t B = 2, T = 35, H = 2, D = 64, C = H * D;
  manual_seed(7);
  const Tensor qkv = random_cpu({B, T, 3 * C});
  auto heads = [&](const Tensor& x, int part) {  // [B, H, T, D], row stride 3C: a view, no copy
    return x.narrow(2, part * C, C).reshape({B, T, H, D}).transpose(1, 2);
  };
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor x = qkv.to(dtype);
    const Tensor xg = x.to(gpu());
    const AttentionOptions opt{true, 0.0, std::nullopt};
    const Tensor ref = scaled_dot_product_attention(heads(x, 0), heads(x, 1), heads(x, 2), opt);
    const Tensor out = scaled_dot_product_attention(heads(xg, 0), heads(xg, 1), heads(xg, 2), opt);
    MG_REQUIRE_CLOSE(out.to(Device::cpu()).to(DType::f32), ref.to(DType::f32), 2 * tolerance(dtype));
  }
}

// ---- the two forward kernels, called directly ----

struct Operands {
  Tensor q, k, v;  // on the GPU
};

// Runs kernels::cuda::attention_forward with the chosen kernel; returns O in f32 on the CPU.
Tensor gpu_forward(const Operands& x, const kernels::AttentionProblem& p,
                   kernels::cuda::AttentionKernel kernel) {
  const DType dtype = x.q.dtype();
  Tensor o = poisoned({p.B, p.H, p.Tq, p.D}, dtype, gpu());
  Tensor lse = poisoned({p.B, p.H, p.Tq}, kernels::attention_stats_dtype(dtype), gpu());
  auto strides = [](const Tensor& t) {
    return kernels::AttentionStrides{t.stride(0), t.stride(1), t.stride(2)};
  };
  {
    cuda::DeviceGuard guard(0);
    kernels::cuda::attention_forward(cuda::kernel_stream(0), dtype, p, x.q.data_ptr(), strides(x.q),
                                     x.k.data_ptr(), strides(x.k), x.v.data_ptr(), strides(x.v), o.data_ptr(),
                                     lse.data_ptr(), kernel);
    cuda::synchronize(cuda::current_stream(0));
  }
  return o.to(Device::cpu()).to(DType::f32);
}

// The CPU kernel on the same 16-bit values widened to f32: the exact attention of those inputs.
Tensor cpu_reference(const Operands& x, const AttentionOptions& opt) {
  auto f32 = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::f32); };
  return scaled_dot_product_attention(f32(x.q), f32(x.k), f32(x.v), opt);
}

TEST_CASE("cuda attention: the tensor-core forward matches the CUDA-core one and the CPU",
          "[gpu][attention]") {
  using kernels::cuda::AttentionKernel;
  const std::vector<Case> cases = {
      {1, 2, 64, 64, 64, false},   // one whole tile
      {1, 2, 100, 100, 64, true},  // the diagonal tile, and a ragged last tile
      {2, 1, 30, 130, 64, false},  // Tq < Tk across three key tiles
      {1, 1, 130, 30, 128, true},  // Tq > Tk, D = 128
      {1, 1, 1, 1, 128, false},    // T = 1
  };
  uint64_t seed = 500;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const Case& c : cases) {
      INFO("B=" << c.B << " H=" << c.H << " Tq=" << c.Tq << " Tk=" << c.Tk << " D=" << c.D
                << " causal=" << c.causal << " dtype=" << dtype_name(dtype));
      manual_seed(seed++);
      const Operands x{random_cpu({c.B, c.H, c.Tq, c.D}, dtype).to(gpu()),
                       random_cpu({c.B, c.H, c.Tk, c.D}, dtype).to(gpu()),
                       random_cpu({c.B, c.H, c.Tk, c.D}, dtype).to(gpu())};
      kernels::AttentionProblem p;
      p.B = c.B, p.H = c.H, p.Tq = c.Tq, p.Tk = c.Tk, p.D = c.D, p.causal = c.causal;
      p.scale = 1.0 / std::sqrt(double(c.D));
      const Tensor ref = cpu_reference(x, AttentionOptions{c.causal, 0.0, std::nullopt});
      const Tensor tc = gpu_forward(x, p, AttentionKernel::tensor_cores);
      const Tensor simt = gpu_forward(x, p, AttentionKernel::cuda_cores);
      // The tensor cores round P to 16 bits before PV (the CUDA-core kernel keeps it in f32): one
      // more rounding of the inputs' size, so twice the dtype's tolerance.
      MG_REQUIRE_CLOSE(tc, ref, 2 * tolerance(dtype));
      MG_REQUIRE_CLOSE(simt, ref, tolerance(dtype));
    }
  }
}

TEST_CASE("cuda attention: the tensor-core forward reads unaligned operands and draws the dropout mask",
          "[gpu][attention]") {
  using kernels::cuda::AttentionKernel;
  manual_seed(77);
  const int64_t B = 1, H = 2, T = 70, D = 64;
  // Views one element into a buffer: not 16-byte aligned, so the loads go element by element.
  auto unaligned = [&](const Tensor& t) {
    const Tensor flat = random_cpu({t.numel() + 1}, DType::bf16).to(gpu());
    flat.narrow(0, 1, t.numel()).copy_(t.reshape({t.numel()}));
    return flat.narrow(0, 1, t.numel()).reshape(t.shape());
  };
  const Operands aligned{random_cpu({B, H, T, D}, DType::bf16).to(gpu()),
                         random_cpu({B, H, T, D}, DType::bf16).to(gpu()),
                         random_cpu({B, H, T, D}, DType::bf16).to(gpu())};
  const Operands shifted{unaligned(aligned.q), unaligned(aligned.k), unaligned(aligned.v)};
  kernels::AttentionProblem p;
  p.B = B, p.H = H, p.Tq = T, p.Tk = T, p.D = D, p.causal = true, p.scale = 0.125;
  MG_REQUIRE_CLOSE(gpu_forward(shifted, p, AttentionKernel::tensor_cores),
                   gpu_forward(aligned, p, AttentionKernel::tensor_cores), 0.0);

  // Dropout: the same generator state on the CPU (f32 from the same bf16 values) and here.
  p.dropout_p = 0.25;
  manual_seed(78);
  const GeneratorState call = next_random_call();
  p.seed = call.seed, p.offset = call.offset;
  manual_seed(78);
  const Tensor ref = cpu_reference(aligned, AttentionOptions{true, 0.25, 0.125});
  MG_REQUIRE_CLOSE(gpu_forward(aligned, p, AttentionKernel::tensor_cores), ref, 2 * tolerance(DType::bf16));
  MG_REQUIRE_CLOSE(gpu_forward(aligned, p, AttentionKernel::cuda_cores), ref, tolerance(DType::bf16));
}

TEST_CASE("cuda attention: each forward kernel's dropout mask is Philox's, bit for bit", "[gpu][attention]") {
  // With V the identity (Tk = D keys, v_j = e_j), O[i][j] = P~[i][j], zero exactly where the kernel
  // dropped score (i, j): without a mask and with small scores every P is about 1/64, far from 0.
  using kernels::cuda::AttentionKernel;
  const int64_t B = 1, H = 2, T = 64, D = 64;
  std::vector<float> identity(static_cast<size_t>(B * H * T * D), 0.f);
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t j = 0; j < T; ++j) identity[static_cast<size_t>((bh * T + j) * D + j)] = 1.f;
  kernels::AttentionProblem p;
  p.B = B, p.H = H, p.Tq = T, p.Tk = T, p.D = D, p.scale = 0.125, p.dropout_p = 0.3, p.seed = 1234,
  p.offset = 56;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (AttentionKernel kernel : {AttentionKernel::cuda_cores, AttentionKernel::tensor_cores}) {
      if (kernel == AttentionKernel::tensor_cores && dtype != DType::bf16) continue;
      INFO("dtype " << dtype_name(dtype)
                    << (kernel == AttentionKernel::tensor_cores ? " tensor cores" : " CUDA cores"));
      manual_seed(5);
      const Operands x{random_cpu({B, H, T, D}, dtype, 0.1).to(gpu()),
                       random_cpu({B, H, T, D}, dtype, 0.1).to(gpu()),
                       tensor<float>(identity, {B, H, T, D}).to(dtype).to(gpu())};
      const std::vector<float> o = gpu_forward(x, p, kernel).to_vector<float>();
      int64_t wrong = 0, kept = 0;
      for (int64_t e = 0; e < B * H * T * T; ++e) {  // e = (bh T + i) T + j, and O is [bh, i, d = j]
        const bool keep = philox_dropout_uniform(p.seed, static_cast<uint64_t>(e), p.offset) >= 0.3f;
        kept += keep;
        wrong += (o[static_cast<size_t>(e)] != 0.f) != keep;
      }
      CHECK(wrong == 0);
      CHECK(kept > B * H * T * T / 2);  // about 70 % kept: the mask is not trivially all or nothing
    }
  }
}

// dQ, dK, dV of kernels::cuda::attention_backward with the chosen kernels, from the automatic
// forward's O and LSE on the same inputs; each in f32 on the CPU.
std::vector<Tensor> gpu_backward(const Operands& x, const Tensor& dout, const kernels::AttentionProblem& p,
                                 kernels::cuda::AttentionKernel kernel) {
  const DType dtype = x.q.dtype();
  Tensor o = poisoned({p.B, p.H, p.Tq, p.D}, dtype, gpu());
  Tensor lse = poisoned({p.B, p.H, p.Tq}, DType::f32, gpu()),
         delta = poisoned({p.B, p.H, p.Tq}, DType::f32, gpu());
  Tensor dq = poisoned({p.B, p.H, p.Tq, p.D}, dtype, gpu()),
         dk = poisoned({p.B, p.H, p.Tk, p.D}, dtype, gpu()),
         dv = poisoned({p.B, p.H, p.Tk, p.D}, dtype, gpu());
  auto strides = [](const Tensor& t) {
    return kernels::AttentionStrides{t.stride(0), t.stride(1), t.stride(2)};
  };
  {
    cuda::DeviceGuard guard(0);
    const cudaStream_t stream = cuda::kernel_stream(0);
    kernels::cuda::attention_forward(stream, dtype, p, x.q.data_ptr(), strides(x.q), x.k.data_ptr(),
                                     strides(x.k), x.v.data_ptr(), strides(x.v), o.data_ptr(),
                                     lse.data_ptr());
    kernels::cuda::attention_backward(stream, dtype, p, x.q.data_ptr(), strides(x.q), x.k.data_ptr(),
                                      strides(x.k), x.v.data_ptr(), strides(x.v), o.data_ptr(),
                                      lse.data_ptr(), dout.data_ptr(), strides(dout), delta.data_ptr(),
                                      dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), kernel);
    cuda::synchronize(cuda::current_stream(0));
  }
  auto host = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::f32); };
  return {host(dq), host(dk), host(dv)};
}

TEST_CASE("cuda attention: the tensor-core backward matches the CUDA-core one and the CPU",
          "[gpu][attention]") {
  using kernels::cuda::AttentionKernel;
  struct BackwardCase {
    Case c;
    double dropout_p;
  };
  const std::vector<BackwardCase> cases = {
      {{1, 2, 64, 64, 64, false}, 0.0},   // whole tiles
      {{1, 2, 100, 100, 64, true}, 0.0},  // the diagonal, ragged last tiles
      {{2, 1, 30, 130, 64, false}, 0.0},  // Tq < Tk: one query tile, three key blocks
      {{1, 1, 130, 30, 128, true}, 0.0},  // Tq > Tk, D = 128 (32-row query tiles)
      {{1, 2, 70, 90, 128, false}, 0.0},  //
      {{1, 2, 80, 80, 64, true}, 0.2},    // dropout regenerated from Philox
      {{1, 1, 200, 150, 64, true}, 0.1},  // Tq > Tk over two 128-row blocks of each kernel, dropout
  };
  uint64_t seed = 700;
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (const BackwardCase& bc : cases) {
      const Case& c = bc.c;
      INFO("B=" << c.B << " H=" << c.H << " Tq=" << c.Tq << " Tk=" << c.Tk << " D=" << c.D
                << " causal=" << c.causal << " dropout=" << bc.dropout_p << " dtype=" << dtype_name(dtype));
      manual_seed(seed++);
      const Operands x{random_cpu({c.B, c.H, c.Tq, c.D}, dtype).to(gpu()),
                       random_cpu({c.B, c.H, c.Tk, c.D}, dtype).to(gpu()),
                       random_cpu({c.B, c.H, c.Tk, c.D}, dtype).to(gpu())};
      const Tensor dout = random_cpu({c.B, c.H, c.Tq, c.D}, dtype).to(gpu());
      kernels::AttentionProblem p;
      p.B = c.B, p.H = c.H, p.Tq = c.Tq, p.Tk = c.Tk, p.D = c.D, p.causal = c.causal;
      p.scale = 1.0 / std::sqrt(double(c.D));
      p.dropout_p = bc.dropout_p, p.seed = 99, p.offset = 3;
      // The CPU's backward in f32 on the same 16-bit values, from its own forward.
      auto f32 = [](const Tensor& t) { return t.to(Device::cpu()).to(DType::f32).contiguous(); };
      const Tensor q = f32(x.q), k = f32(x.k), v = f32(x.v), g = f32(dout);
      Tensor o = zeros({c.B, c.H, c.Tq, c.D}), lse = zeros({c.B, c.H, c.Tq}), delta = zeros({c.B, c.H, c.Tq});
      Tensor dq = zeros(q.shape()), dk = zeros(k.shape()), dv = zeros(v.shape());
      const kernels::AttentionStrides sq{q.stride(0), q.stride(1), q.stride(2)},
          skv{k.stride(0), k.stride(1), k.stride(2)};
      kernels::cpu::attention_forward(DType::f32, p, q.data_ptr(), sq, k.data_ptr(), skv, v.data_ptr(), skv,
                                      o.data_ptr(), lse.data_ptr());
      kernels::cpu::attention_backward(DType::f32, p, q.data_ptr(), sq, k.data_ptr(), skv, v.data_ptr(), skv,
                                       o.data_ptr(), lse.data_ptr(), g.data_ptr(), sq, delta.data_ptr(),
                                       dq.data_ptr(), dk.data_ptr(), dv.data_ptr());
      const std::vector<Tensor> tc = gpu_backward(x, dout, p, AttentionKernel::tensor_cores);
      const std::vector<Tensor> simt = gpu_backward(x, dout, p, AttentionKernel::cuda_cores);
      const std::vector<Tensor> ref = {dq, dk, dv};
      for (int i = 0; i < 3; ++i) {
        INFO("gradient "
             << "qkv"[i]);
        // P~ and dS rounded to 16 bits for their products, O to 16 bits before delta: a few roundings
        // of the inputs' size.
        MG_REQUIRE_CLOSE(tc[i], ref[i], 4 * tolerance(dtype));
        MG_REQUIRE_CLOSE(simt[i], ref[i], 2 * tolerance(dtype));
      }
    }
  }
}

TEST_CASE("cuda fused attention backward for bf16 and f16 matches the CPU's", "[gpu][attention]") {
  // The op: the tensor-core forward, then the CUDA-core backward from its O and LSE.
  check_op_against_cpu({1, 2, 70, 70, 64, true}, DType::bf16, 0.0, 2 * tolerance(DType::bf16), 900);
  check_op_against_cpu({1, 1, 40, 90, 128, false}, DType::f16, 0.0, 2 * tolerance(DType::f16), 901);
}

// TinyGPT built with GPTConfig::attention = fused and = composed from the same weights: one training
// step's loss and gradients, with dropout (the same generator state gives the same masks), on the
// CPU and on cuda:0.
TEST_CASE("TinyGPT: the fused and the composed attention agree, CPU and cuda", "[gpu][attention]") {
  nn::GPTConfig config;
  config.vocab_size = 40, config.block_size = 40, config.n_layer = 2, config.n_head = 2, config.n_embd = 32;
  config.dropout = 0.1;
  manual_seed(11);
  const Tensor idx = randint(0, config.vocab_size, {2, 37}), targets = randint(0, config.vocab_size, {2, 37});
  for (Device device : {Device::cpu(), gpu()}) {
    INFO("device " << device);
    std::vector<std::vector<Tensor>> grads;
    std::vector<double> losses;
    for (nn::AttentionImpl impl : {nn::AttentionImpl::fused, nn::AttentionImpl::composed}) {
      config.attention = impl;
      manual_seed(12);  // the same initial weights
      nn::TinyGPT model(config);
      model.to(device);
      model.train();
      manual_seed(13);  // the same dropout masks
      const Tensor logits = model(idx.to(device));
      const Tensor loss =
          nn::cross_entropy(logits.reshape({-1, config.vocab_size}), targets.to(device).reshape({-1}));
      loss.backward();
      losses.push_back(loss.item<double>());
      grads.emplace_back();
      for (const Tensor& prm : model.parameters()) grads.back().push_back(prm.grad().to(Device::cpu()));
    }
    CHECK(std::abs(losses[0] - losses[1]) < 1e-5 * std::abs(losses[1]));
    REQUIRE(grads[0].size() == grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      MG_REQUIRE_CLOSE(grads[0][i], grads[1][i], 20 * tolerance(DType::f32));
  }
}

TEST_CASE("cuda attention over key blocks: forward, merge and backward match the CPU's", "[gpu][attention]") {
  // Two key blocks (the second under the causal mask, as a ring's diagonal block), merged, then
  // each block's share of the gradients, on both devices from the same values.
  const DType dtype = DType::f32;
  const double tol = 5 * tolerance(dtype);
  manual_seed(500);
  const Tensor q = random_cpu({2, 2, 19, 24}, dtype), k = random_cpu({2, 2, 31, 24}, dtype),
               v = random_cpu({2, 2, 31, 24}, dtype), dout = random_cpu({2, 2, 19, 24}, dtype);
  struct Result {
    AttentionBlock merged;
    std::vector<AttentionBlockGrads> grads;
  };
  auto run = [&](const Device& device) {
    const Tensor qd = q.to(device), kd = k.to(device), vd = v.to(device), dd = dout.to(device);
    const Tensor k0 = kd.narrow(2, 0, 12), v0 = vd.narrow(2, 0, 12), k1 = kd.narrow(2, 12, 19),
                 v1 = vd.narrow(2, 12, 19);
    Result r{merge_attention_blocks(attention_block_forward(qd, k0, v0),
                                    attention_block_forward(qd, k1, v1, true)),
             {}};
    r.grads.push_back(attention_block_backward(qd, k0, v0, r.merged, dd));
    r.grads.push_back(attention_block_backward(qd, k1, v1, r.merged, dd, true));
    return r;
  };
  const Result cpu = run(Device::cpu()), cuda = run(gpu());
  REQUIRE(cuda.merged.out.device() == gpu());
  MG_REQUIRE_CLOSE(cuda.merged.out.to(Device::cpu()), cpu.merged.out, tol);
  MG_REQUIRE_CLOSE(cuda.merged.lse.to(Device::cpu()), cpu.merged.lse, tol);
  for (size_t b = 0; b < 2; ++b) {
    MG_REQUIRE_CLOSE(cuda.grads[b].dq.to(Device::cpu()), cpu.grads[b].dq, 4 * tol);
    MG_REQUIRE_CLOSE(cuda.grads[b].dk.to(Device::cpu()), cpu.grads[b].dk, 4 * tol);
    MG_REQUIRE_CLOSE(cuda.grads[b].dv.to(Device::cpu()), cpu.grads[b].dv, 4 * tol);
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
