// Layer norm over the last axis on the GPU: x is [rows, cols]. Semantics
// (and the saved statistics: mean and rstd per row, f64 for f64 inputs and
// f32 otherwise): kernels/cpu/layer_norm.h.
//
// Decomposition.
//   Forward: one thread block per row (the smallest power of two >= cols,
//     clamped to 32..256 threads: row_block in common.cuh). Threads stride over the row in coalesced sweeps,
//     as the CPU does: (1) the sum, for a rough mean; (2) the deviations from it and their squares (their sum
//     corrects the mean's rounding, their squares give the variance -- no E[x^2] - E[x]^2 cancellation); (3)
//     the normalised, scaled and shifted write. Each sum is a warp-shuffle + shared-memory block reduction
//     (common.cuh). Thread 0 writes mean and rstd.
//   Backward grad_x: one block per row, two sweeps: the row sums of
//     g = gy * weight and g * xhat, then gx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
//   Backward grad_weight / grad_bias: column sums over all rows. A block of
//     32 x 8 threads owns 32 adjacent columns; its 8 rows of threads split the
//     rows (coalesced 32-wide reads of each row), then add their partial sums
//     in shared memory. Every column is written by one thread: no atomics,
//     deterministic.
//
// Cost. Forward reads the row three times (the second and third mostly from
// L1/L2 for rows up to tens of KB) and writes it once, ~8 FLOPs per element:
// ~2 n s bytes of HBM traffic, bandwidth bound for long rows; short rows are
// bound by the block reductions' latency, hidden by many rows in flight.
// Backward reads gy and x twice for grad_x and once more for the column sums.
// The column sums use only ceil(cols/32) blocks: for narrow rows (cols <= a
// few thousand) they do not fill the GPU, and a split over row ranges with a
// second pass would be the next step.
//
// Arithmetic in float for f32/f16/bf16 and double for f64, like the CPU; the
// summation order differs (tree instead of sequential), so results agree to
// rounding, not bit for bit.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace mg::kernels::cuda {
namespace {

template <class T>
__global__ void forward_kernel(const T* x, const T* weight, const T* bias, int64_t rows, int64_t cols,
                               double eps, T* y, acc_t<T>* mean_out, acc_t<T>* rstd_out) {
  using S = acc_t<T>;
  const S inv_cols = cols > 0 ? S(1) / S(cols) : S(0);  // 0 columns: mean 0, as on the CPU
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * cols;
    T* yr = y + r * cols;
    S sum = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += S(load(xr + c));
    const S rough_mean = block_sum(sum) * inv_cols;
    S deviations = 0, squares = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const S d = S(load(xr + c)) - rough_mean;
      deviations += d;
      squares += d * d;
    }
    const S correction = block_sum(deviations) * inv_cols;
    squares = block_sum(squares);
    const S mean = rough_mean + correction;
    const S var = max(S(0), squares * inv_cols - correction * correction);
    const S rstd = S(1) / sqrt(var + S(eps));
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      S v = (S(load(xr + c)) - mean) * rstd;
      if (weight) v *= S(load(weight + c));
      if (bias) v += S(load(bias + c));
      store(yr + c, v);
    }
    if (threadIdx.x == 0) {
      mean_out[r] = mean;
      rstd_out[r] = rstd;
    }
  }
}

template <class T>
__global__ void grad_x_kernel(const T* gy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                              const T* weight, int64_t rows, int64_t cols, T* gx) {
  using S = acc_t<T>;
  const S inv_cols = S(1) / S(cols);
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* gyr = gy + r * cols;
    const T* xr = x + r * cols;
    T* gxr = gx + r * cols;
    const S mu = mean[r], rs = rstd[r];
    S sum_g = 0, sum_g_xhat = 0;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const S g = weight ? S(load(gyr + c)) * S(load(weight + c)) : S(load(gyr + c));
      sum_g += g;
      sum_g_xhat += g * (S(load(xr + c)) - mu) * rs;
    }
    const S mean_g = block_sum(sum_g) * inv_cols;
    const S mean_g_xhat = block_sum(sum_g_xhat) * inv_cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const S g = weight ? S(load(gyr + c)) * S(load(weight + c)) : S(load(gyr + c));
      const S xhat = (S(load(xr + c)) - mu) * rs;
      store(gxr + c, rs * (g - mean_g - xhat * mean_g_xhat));
    }
  }
}

constexpr int kColumnsPerBlock = 32, kRowThreads = 8;
// The shared_array ids (common.cuh) of params_kernel's two static arrays: the weight's and the
// bias's partial sums have one type, so each needs an id of its own to be an array of its own.
constexpr int kWeightPartialsId = 0;
constexpr int kBiasPartialsId = 1;

template <class T>
__global__ void params_kernel(const T* gy, const T* x, const acc_t<T>* mean, const acc_t<T>* rstd,
                              int64_t rows, int64_t cols, T* grad_weight, T* grad_bias) {
  using S = acc_t<T>;
  S(&partial_w)
  [kRowThreads][kColumnsPerBlock] = shared_array<S[kRowThreads][kColumnsPerBlock], kWeightPartialsId>();
  S(&partial_b)
  [kRowThreads][kColumnsPerBlock] = shared_array<S[kRowThreads][kColumnsPerBlock], kBiasPartialsId>();
  const int64_t c = int64_t(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  S sum_w = 0, sum_b = 0;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kRowThreads) {
      const S g = S(load(gy + r * cols + c));
      sum_w += g * (S(load(x + r * cols + c)) - mean[r]) * rstd[r];
      sum_b += g;
    }
  }
  partial_w[threadIdx.y][threadIdx.x] = sum_w;
  partial_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  for (int k = 1; k < kRowThreads; ++k) {
    sum_w += partial_w[k][threadIdx.x];
    sum_b += partial_b[k][threadIdx.x];
  }
  if (grad_weight) store(grad_weight + c, sum_w);
  if (grad_bias) store(grad_bias + c, sum_b);
}

}  // namespace

void layer_norm_forward(cudaStream_t stream, DType dtype, const void* x, const void* weight, const void* bias,
                        int64_t rows, int64_t cols, double eps, void* y, void* mean, void* rstd) {
  check(rows >= 0 && cols >= 0, "layer_norm_forward (CUDA): negative shape [", rows, ", ", cols, "]");
  check(eps >= 0, "layer_norm_forward (CUDA): eps must be >= 0, got ", eps);
  if (rows == 0) return;
  visit_float(dtype, "layer_norm_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    using S = acc_t<T>;
    launch_kernel<forward_kernel<T>>(row_grid(rows), row_block(cols), 0, stream, static_cast<const T*>(x),
                                     static_cast<const T*>(weight), static_cast<const T*>(bias), rows, cols,
                                     eps, static_cast<T*>(y), static_cast<S*>(mean), static_cast<S*>(rstd));
  });
}

void layer_norm_backward(cudaStream_t stream, DType dtype, const void* grad_y, const void* x,
                         const void* mean, const void* rstd, const void* weight, int64_t rows, int64_t cols,
                         void* grad_x, void* grad_weight, void* grad_bias) {
  check(rows >= 0 && cols >= 0, "layer_norm_backward (CUDA): negative shape [", rows, ", ", cols, "]");
  if (cols == 0) return;
  visit_float(dtype, "layer_norm_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    using S = acc_t<T>;
    const T* gy = static_cast<const T*>(grad_y);
    const T* xs = static_cast<const T*>(x);
    const S* mu = static_cast<const S*>(mean);
    const S* rs = static_cast<const S*>(rstd);
    if (rows > 0) {
      launch_kernel<grad_x_kernel<T>>(row_grid(rows), row_block(cols), 0, stream, gy, xs, mu, rs,
                                      static_cast<const T*>(weight), rows, cols, static_cast<T*>(grad_x));
    }
    if (grad_weight || grad_bias) {  // rows == 0 still writes zeros, like the CPU
      const unsigned blocks = static_cast<unsigned>((cols + kColumnsPerBlock - 1) / kColumnsPerBlock);
      launch_kernel<params_kernel<T>>(blocks, dim3(kColumnsPerBlock, kRowThreads), 0, stream, gy, xs, mu, rs,
                                      rows, cols, static_cast<T*>(grad_weight), static_cast<T*>(grad_bias));
    }
  });
}

}  // namespace mg::kernels::cuda
