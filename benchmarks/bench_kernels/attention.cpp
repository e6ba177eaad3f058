// bench_kernels family "attention" (order 18): the attention ladder of the kernel lab
// (kernels/cuda/attention_ladder.cu: naive, row, flash_cuda_cores, flash_tensor_cores) and the
// backward on CUDA cores and on tensor cores, bf16, causal, at the shape [B 8, H 12, T, D 64]:
//
//   T = 1024: every rung, and the backward
//   T = 4096: the two flash rungs and the backward (the naive rung's scores would be 6.4 GB, and
//             the row rung reads K and V once per query row: seconds a call)
//   --check:  [B 1, H 2, T 100 and 200, D 64], every rung and the backward
//
// FLOPs are the useful ones, FlashAttention's convention: forward 4 D x (visible scores), causal
// about half of 4 Tq Tk D; backward 2.5x the forward (its 5 products; both backwards compute 7,
// see attention.cu and attention_tensor_core_backward.cu). achieved = FLOPs
// / median seconds; ceiling = cuBLAS's bf16 rate on the same products written as GEMMs (per head S = Q K^T,
// [T, 64] x [64, T], batched over B H: the composed path's first GEMM), measured in the same run; ratio =
// achieved / ceiling. max_rel_error: the forward's O against the CPU kernel (kernels/cpu/attention.h) on the
// same bf16 values in f32 where T <= 1024, else against the CUDA-core flash rung; the backward's dQ, dK, dV
// against the CPU backward.
//
// --profile: each call traced once (the first blocks; a block is a query tile of one head, so the
// first 132 blocks cover every tile of the first heads) and predicted on a GPU: the ladder's DRAM
// bytes against the ideal (O(T^2) -> O(T D)), sectors per request, shared wavefronts, and the
// share of the tensor-core roofline. Nothing is checked then.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/half.h"
#include "bench_kernels.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/kernel_lab.h"
#include "kernels/cuda/kernels.h"

namespace mg::bench {
namespace {

namespace kc = kernels::cuda;

void ok(cudaError_t e) { MG_CHECK(e == cudaSuccess, "bench attention: ", cudaGetErrorString(e)); }

struct Buffer {
  void* ptr = nullptr;
  explicit Buffer(size_t bytes) { ok(cudaMalloc(&ptr, std::max<size_t>(bytes, 1))); }
  ~Buffer() { cudaFree(ptr); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// n bf16 values uniform in [-1, 1): the bits on the device, the values (exactly) in f32 on the host.
std::vector<float> fill_bf16(void* device, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.f, 1.f);
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    bits[i] = bf16(uniform(rng)).bits;
    bf16 h;
    h.bits = bits[i];
    values[i] = h;
  }
  ok(cudaMemcpy(device, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
  return values;
}

std::vector<float> bf16_to_host(const void* device, int64_t n) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  ok(cudaMemcpy(bits.data(), device, bits.size() * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    bf16 h;
    h.bits = bits[i];
    out[i] = h;
  }
  return out;
}

struct Problem {
  int64_t B, H, T, D;
  kernels::AttentionProblem args() const {
    kernels::AttentionProblem p;
    p.B = B, p.H = H, p.Tq = T, p.Tk = T, p.D = D, p.causal = true;
    p.scale = 1.0 / std::sqrt(double(D));
    return p;
  }
  int64_t elems() const { return B * H * T * D; }
  double forward_flops() const { return 4.0 * D * double(B * H) * (double(T) * (T + 1) / 2); }  // causal
  std::string shape() const {
    return "B" + std::to_string(B) + " H" + std::to_string(H) + " T" + std::to_string(T) + " D" +
           std::to_string(D);
  }
};

// cuBLAS's rate on S = Q K^T per head ([T, D] x [D, T], bf16 in and out, f32 accumulation), batched.
double cublas_tflops(const Problem& pr, const void* q, const void* k, void* s, cudaStream_t stream,
                     const BenchOptions& o) {
  cublasHandle_t handle = nullptr;
  MG_CHECK(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS, "bench attention: cublasCreate");
  cublasSetStream(handle, stream);
  const float alpha = 1.f, beta = 0.f;
  const int T = static_cast<int>(pr.T), D = static_cast<int>(pr.D);
  // Column-major: S^T [T keys, T queries] = K [T, D] (as D x T, transposed) x Q^T.
  const double seconds = median_seconds(
      [&] {
        cublasGemmStridedBatchedEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, &alpha, k, CUDA_R_16BF, D,
                                   int64_t(T) * D, q, CUDA_R_16BF, D, int64_t(T) * D, &beta, s, CUDA_R_16BF,
                                   T, int64_t(T) * T, static_cast<int>(pr.B * pr.H), CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT);
      },
      o, stream);
  cublasDestroy(handle);
  return 2.0 * T * double(T) * D * double(pr.B * pr.H) / seconds * 1e-12;
}

KernelResult make_row(const std::string& kernel, const Problem& pr, double ceiling) {
  KernelResult r;
  r.family = "attention";
  r.kernel = kernel;
  r.dtype = "bf16";
  r.shape = pr.shape() + " causal";
  r.unit = "TFLOP/s";
  r.reference = "cuBLAS bf16 Q K^T";
  r.ceiling = ceiling;
  r.tolerance = 2e-2;  // P rounded to bf16 before PV (tensor cores), O rounded to bf16
  return r;
}

void run_problem(const Problem& pr, const BenchOptions& o, cudaStream_t stream,
                 std::vector<KernelResult>& rows) {
  const kernels::AttentionProblem p = pr.args();
  const int64_t n = pr.elems(), lse_n = pr.B * pr.H * pr.T;
  const bool small = pr.T <= 1024;
  Buffer q(n * 2), k(n * 2), v(n * 2), o_buf(n * 2), lse(lse_n * 4), g(n * 2), dq(n * 2), dk(n * 2),
      dv(n * 2), delta(lse_n * 4);
  const std::vector<float> qh = fill_bf16(q.ptr, n, 1), kh = fill_bf16(k.ptr, n, 2),
                           vh = fill_bf16(v.ptr, n, 3), gh = fill_bf16(g.ptr, n, 4);
  const bool reference = !o.profile && small;
  std::vector<float> ref_o, ref_lse;
  const kernels::AttentionStrides st{pr.H * pr.T * pr.D, pr.T * pr.D, pr.D};
  if (reference) {
    ref_o.resize(n);
    ref_lse.resize(lse_n);
    kernels::cpu::attention_forward(DType::f32, p, qh.data(), st, kh.data(), st, vh.data(), st, ref_o.data(),
                                    ref_lse.data());
  }
  double ceiling = 0;
  if (!o.profile) {
    Buffer s(size_t(pr.B * pr.H) * pr.T * pr.T * 2);
    ceiling = cublas_tflops(pr, q.ptr, k.ptr, s.ptr, stream, o);
  }
  std::vector<float> flash_simt;  // the large problems' reference
  for (kc::AttentionRung rung : kc::kAllAttentionRungs) {
    const bool flash =
        rung == kc::AttentionRung::flash_cuda_cores || rung == kc::AttentionRung::flash_tensor_cores;
    if (!small && !flash) continue;
    KernelResult r = make_row(std::string("ladder/") + kc::attention_rung_name(rung), pr, ceiling);
    try {
      const bool naive = rung == kc::AttentionRung::naive;
      Buffer scores(naive ? size_t(pr.B * pr.H) * pr.T * pr.T * 4 : 0);
      ok(cudaMemsetAsync(o_buf.ptr, 0xff, n * 2, stream));  // NaN: an unwritten element shows
      BenchOptions rung_options = o;
      if (!flash) rung_options.repeats = std::min(o.repeats, 5);  // O(T^2) traffic: a few calls suffice
      r.seconds = median_seconds(
          [&] {
            kc::attention_lab(mg::cuda::current_kernel_stream(), rung, DType::bf16, p, q.ptr, k.ptr, v.ptr,
                              o_buf.ptr, static_cast<float*>(lse.ptr),
                              naive ? static_cast<float*>(scores.ptr) : nullptr);
          },
          rung_options, stream);
      r.achieved = pr.forward_flops() / r.seconds * 1e-12;
      r.ratio = r.ceiling > 0 ? r.achieved / r.ceiling : 0;
      if (o.profile) {
        const double ideal_bytes = 4.0 * n * 2 + lse_n * 4.0;
        const bool tensor = rung == kc::AttentionRung::flash_tensor_cores;
        r.profile = take_profile(ideal_bytes, tensor ? 0 : pr.forward_flops());
        r.tolerance = -1;
      } else {
        const std::vector<float> out = bf16_to_host(o_buf.ptr, n);
        if (rung == kc::AttentionRung::flash_cuda_cores) flash_simt = out;
        r.max_rel_error = max_rel_error(out, reference ? ref_o : flash_simt);
        r.failed = !(r.max_rel_error <= r.tolerance);
      }
    } catch (const Error& e) {
      r.failed = true;
      r.note = std::string("failed: ") + e.what();
    }
    rows.push_back(r);
  }

  // The backward on CUDA cores and on tensor cores (the production choice for bf16), from the
  // tensor-core forward's O and LSE. The CPU's backward, once, is the reference of both.
  std::vector<float> cdq, cdk, cdv;
  if (reference) {
    std::vector<float> cdelta(lse_n);
    cdq.resize(n), cdk.resize(n), cdv.resize(n);
    kernels::cpu::attention_backward(DType::f32, p, qh.data(), st, kh.data(), st, vh.data(), st, ref_o.data(),
                                     ref_lse.data(), gh.data(), st, cdelta.data(), cdq.data(), cdk.data(),
                                     cdv.data());
  }
  for (kc::AttentionKernel kernel : {kc::AttentionKernel::cuda_cores, kc::AttentionKernel::tensor_cores}) {
    const bool tensor = kernel == kc::AttentionKernel::tensor_cores;
    KernelResult r = make_row(tensor ? "backward/tensor_cores" : "backward/cuda_cores", pr, ceiling);
    try {
      if (!o.profile)  // (traced, only the first blocks would run: the backward's counts do not need O)
        kc::attention_forward(mg::cuda::current_kernel_stream(), DType::bf16, p, q.ptr, st, k.ptr, st, v.ptr,
                              st, o_buf.ptr, lse.ptr);
      r.seconds = median_seconds(
          [&] {
            kc::attention_backward(mg::cuda::current_kernel_stream(), DType::bf16, p, q.ptr, st, k.ptr, st,
                                   v.ptr, st, o_buf.ptr, lse.ptr, g.ptr, st, delta.ptr, dq.ptr, dk.ptr,
                                   dv.ptr, kernel);
          },
          o, stream);
      r.achieved = 2.5 * pr.forward_flops() / r.seconds * 1e-12;
      r.ratio = r.ceiling > 0 ? r.achieved / r.ceiling : 0;
      if (o.profile) {
        // CUDA cores: 7 products of 2 D FLOPs per visible score, 3.5 forwards' worth (4 D each).
        r.profile = take_profile(9.0 * n * 2 + 2.0 * lse_n * 4, tensor ? 0.0 : 3.5 * pr.forward_flops());
        r.tolerance = -1;
      } else if (reference) {
        r.max_rel_error = std::max({max_rel_error(bf16_to_host(dq.ptr, n), cdq),
                                    max_rel_error(bf16_to_host(dk.ptr, n), cdk),
                                    max_rel_error(bf16_to_host(dv.ptr, n), cdv)});
        r.tolerance = 5e-2;  // O rounded to bf16 feeds delta; P~, dS and every gradient rounded to bf16
        r.failed = !(r.max_rel_error <= r.tolerance);
      } else {
        r.tolerance = -1;
      }
    } catch (const Error& e) {
      r.failed = true;
      r.note = std::string("failed: ") + e.what();
    }
    rows.push_back(r);
  }
}

std::vector<KernelResult> bench_attention(const BenchOptions& o, const Ceilings&) {
  mg::cuda::DeviceGuard guard(o.device);
  const cudaStream_t stream = static_cast<cudaStream_t>(mg::cuda::current_stream(o.device).handle);
  const std::vector<Problem> problems = o.check ? std::vector<Problem>{{1, 2, 100, 64}, {1, 2, 200, 64}}
                                                : std::vector<Problem>{{8, 12, 1024, 64}, {8, 12, 4096, 64}};
  std::vector<KernelResult> rows;
  for (const Problem& pr : problems) run_problem(pr, o, stream, rows);
  if (!rows.empty())
    rows.front().note =
        "attention: the kernel lab's ladder (kernels/cuda/attention_ladder.cu) and the production backward, "
        "bf16 "
        "causal; useful FLOPs (backward 2.5x forward) against cuBLAS's bf16 rate on the Q K^T GEMM";
  return rows;
}

const RegisterFamily kRegistered("attention", 18, bench_attention);

}  // namespace
}  // namespace mg::bench
