// The attention ladder of the kernel lab (kernels/cuda/kernel_lab.h), in the manner of llm.c's
// dev/cuda/attention_forward.cu: four ways to compute the same forward, O = softmax(Q K^T scale,
// causal) V and LSE per row, each a step toward the production kernels. Semantics:
// kernels/cpu/attention.h (no dropout here). Inputs contiguous [B, H, T, D], f32 or bf16 (f32
// arithmetic throughout). For one head of Tq x Tk scores, D wide, in f32 (s = 4 bytes):
//
// 1. naive (three kernels, the scores in DRAM): attention_scores, one thread per score (q_i . k_j,
//    scaled, masked) writes S [Tq, Tk]; attention_softmax, one thread per row, reads S three times
//    (max, sum, normalise) and writes P over it; attention_pv, one thread per output element, reads
//    a row of P and a column of V. DRAM: S written, read 3x, P written, read by PV: 6 s Tq Tk bytes,
//    O(T^2), against 2 s (Tq + 2 Tk) D ideal; the softmax's lanes each walk their own row, 32
//    sectors per request.
// 2. row (one block per query row, the scores in shared memory): the block computes its row of
//    scores into shared memory, the softmax there (block reductions), then its row of O = P V. S
//    never reaches DRAM, but every block reads all of K and V: 2 s Tq Tk D bytes from L2, O(T^2 D),
//    and one row of scores must fit in shared memory (Tk <= 12,000 at 48 KiB).
// 3. flash_cuda_cores: the production CUDA-core kernel (attention.cu, flash_forward_simt): a block
//    owns 16 query rows and streams K and V in 32-key tiles through shared memory with the online
//    softmax: K and V are read once per 16 rows, 2 s Tk D Tq / 16 bytes from L2, and the FMAs run
//    on CUDA cores (the FP32 pipe: 67 TFLOP/s on an H200, 1/15 of the bf16 tensor cores).
// 4. flash_tensor_cores: the production tensor-core kernel (attention_tensor_core.cu): 64 query
//    rows a block, 64-key tiles by cp.async in two stages, S and PV by mma.sync (bf16 only).
//
// FLOPs, any rung: 4 Tq Tk D (causal: about half, counting only the visible scores). What each rung
// buys, measured by the emulator's tracer and predicted on an H200: docs/kernels.md and
// docs/attention.md ("The ladder"); benchmarks/bench_kernels/attention.cpp runs it.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "kernels/cuda/attention_internal.cuh"
#include "kernels/cuda/kernel_lab.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/online_softmax.cuh"

namespace mg::kernels::cuda {
namespace {

using namespace attention_internal;

constexpr int kLabThreads = 256;

__device__ __forceinline__ bool visible(const Params& p, int64_t i, int64_t j) { return !p.causal || j <= i; }

// ---- rung 1: naive ----------------------------------------------------------------------------
// S[bh, i, j] = q_i . k_j * scale, or -inf where masked. One thread per score.
template <class T>
__global__ void attention_scores(const Params p, const T* q, const T* k, float* s) {
  const int64_t n = p.B * p.H * p.Tq * p.Tk;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % p.Tk, row = e / p.Tk, i = row % p.Tq, bh = row / p.Tq;
    const T* qi = q + row * p.D;
    const T* kj = k + (bh * p.Tk + j) * p.D;
    float dot = 0.f;
    for (int d = 0; d < p.D; ++d) dot += load(qi + d) * load(kj + d);
    s[e] = visible(p, i, j) ? dot * float(p.scale) : -INFINITY;
  }
}

// P = softmax of each row of S, in place, and LSE. One thread per row.
__global__ void attention_softmax(const Params p, float* s, float* lse) {
  const int64_t rows = p.B * p.H * p.Tq;
  for (int64_t row = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; row < rows;
       row += int64_t(gridDim.x) * blockDim.x) {
    float* x = s + row * p.Tk;
    float m = -INFINITY;
    for (int64_t j = 0; j < p.Tk; ++j) m = fmaxf(m, x[j]);
    float sum = 0.f;
    for (int64_t j = 0; j < p.Tk; ++j) sum += m == -INFINITY ? 0.f : expf(x[j] - m);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int64_t j = 0; j < p.Tk; ++j) x[j] = m == -INFINITY ? 0.f : expf(x[j] - m) * inv;
    lse[row] = sum > 0.f ? m + logf(sum) : -INFINITY;
  }
}

// O[bh, i, d] = sum_j P[bh, i, j] v[bh, j, d]. One thread per output element.
template <class T>
__global__ void attention_pv(const Params p, const float* s, const T* v, T* o) {
  const int64_t n = p.B * p.H * p.Tq * p.D;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = e % p.D, row = e / p.D, bh = row / p.Tq;
    const float* pi = s + row * p.Tk;
    const T* vb = v + bh * p.Tk * p.D + d;
    float acc = 0.f;
    for (int64_t j = 0; j < p.Tk; ++j) acc += pi[j] * load(vb + j * p.D);
    store(o + e, acc);
  }
}

// ---- rung 2: a block per query row, its scores in shared memory ---------------------------------
template <class T>
__global__ void __launch_bounds__(kLabThreads)
    attention_row(const Params p, const T* q, const T* k, const T* v, T* o, float* lse) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* const qs = reinterpret_cast<float*>(smem_raw);  // [D]
  float* const row = qs + p.D;                           // [Tk]
  const int64_t r = blockIdx.x, i = r % p.Tq, bh = r / p.Tq;
  for (int d = threadIdx.x; d < p.D; d += blockDim.x) qs[d] = load(q + r * p.D + d);
  __syncthreads();
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) {
    const T* kj = k + (bh * p.Tk + j) * p.D;
    float dot = 0.f;
    for (int d = 0; d < p.D; ++d) dot += qs[d] * load(kj + d);
    row[j] = visible(p, i, j) ? dot * float(p.scale) : -INFINITY;
    m = fmaxf(m, row[j]);
  }
  m = block_max(m);
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < p.Tk; j += blockDim.x) {
    row[j] = m == -INFINITY ? 0.f : expf(row[j] - m);
    sum += row[j];
  }
  sum = block_sum(sum);  // its barriers also publish row[]
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
  for (int d = threadIdx.x; d < p.D; d += blockDim.x) {
    const T* vd = v + bh * p.Tk * p.D + d;
    float acc = 0.f;
    for (int64_t j = 0; j < p.Tk; ++j) acc += row[j] * load(vd + j * p.D);
    store(o + r * p.D + d, acc * inv);
  }
  if (threadIdx.x == 0) lse[r] = sum > 0.f ? m + logf(sum) : -INFINITY;
}

unsigned lab_grid(int64_t n) {
  const int64_t blocks = (n + kLabThreads - 1) / kLabThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks));
}

template <class T>
void run_lab_rung(cudaStream_t stream, AttentionRung rung, const Params& p, const void* q, const void* k,
                  const void* v, void* o, float* lse, float* scores) {
  const T* qt = static_cast<const T*>(q);
  const T* kt = static_cast<const T*>(k);
  const T* vt = static_cast<const T*>(v);
  T* ot = static_cast<T*>(o);
  if (rung == AttentionRung::naive) {
    MG_CHECK(scores != nullptr, "attention_lab: the naive rung needs a scores workspace of B H Tq Tk floats");
    launch_kernel<attention_scores<T>>(lab_grid(p.B * p.H * p.Tq * p.Tk), kLabThreads, 0, stream, p, qt, kt,
                                       scores);
    launch_kernel<attention_softmax>(lab_grid(p.B * p.H * p.Tq), kLabThreads, 0, stream, p, scores, lse);
    launch_kernel<attention_pv<T>>(lab_grid(p.B * p.H * p.Tq * p.D), kLabThreads, 0, stream, p, scores, vt,
                                   ot);
    return;
  }
  const int64_t rows = p.B * p.H * p.Tq;
  MG_CHECK(rows <= 0x7fffffff, "attention_lab: ", rows, " rows exceed the grid's 2^31 - 1 blocks");
  const int64_t bytes = (p.D + p.Tk) * int64_t(sizeof(float));
  int device = 0, limit = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  MG_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  MG_CHECK(bytes <= limit, "attention_lab: the row rung keeps a row of ", p.Tk, " scores in shared memory (",
           bytes, " bytes); the device allows ", limit);
  if (bytes > 48 * 1024)
    allow_dynamic_smem(reinterpret_cast<const void*>(attention_row<T>), static_cast<int>(bytes));
  launch_kernel<attention_row<T>>(static_cast<unsigned>(rows), kLabThreads, static_cast<size_t>(bytes),
                                  stream, p, qt, kt, vt, ot, lse);
}

}  // namespace

void attention_lab(cudaStream_t stream, AttentionRung rung, DType dtype, const AttentionProblem& p,
                   const void* q, const void* k, const void* v, void* o, float* lse, float* scores) {
  MG_CHECK(dtype == DType::f32 || dtype == DType::bf16, "attention_lab: f32 or bf16, got ",
           dtype_name(dtype));
  MG_CHECK(p.dropout_p == 0.0, "attention_lab: no dropout in the lab");
  MG_CHECK(p.B >= 0 && p.H >= 0 && p.Tq >= 0 && p.Tk >= 0 && p.D > 0, "attention_lab: bad sizes");
  if (p.B * p.H * p.Tq == 0) return;
  const AttentionStrides qs{p.H * p.Tq * p.D, p.Tq * p.D, p.D}, kvs{p.H * p.Tk * p.D, p.Tk * p.D, p.D};
  if (rung == AttentionRung::flash_cuda_cores || rung == AttentionRung::flash_tensor_cores) {
    const AttentionKernel kernel =
        rung == AttentionRung::flash_cuda_cores ? AttentionKernel::cuda_cores : AttentionKernel::tensor_cores;
    return attention_forward(stream, dtype, p, q, qs, k, kvs, v, kvs, o, lse, kernel);
  }
  const Params prm = make_params(p);
  if (dtype == DType::bf16) return run_lab_rung<bf16_t>(stream, rung, prm, q, k, v, o, lse, scores);
  run_lab_rung<float>(stream, rung, prm, q, k, v, o, lse, scores);
}

}  // namespace mg::kernels::cuda
