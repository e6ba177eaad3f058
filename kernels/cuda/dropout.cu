// Dropout on the GPU with the counter-based Philox generator (core/base/philox.h).
// Semantics: kernels/cpu/dropout.h.
//
// Same mask as the CPU, bit for bit. Element i is kept iff
// philox_uniform(seed, i, call_offset) >= float(p). philox_uniform is the same
// __host__ __device__ function on both sides: integer rounds, then 24 random
// bits scaled by an exact power of two, so the float it returns -- and hence
// the comparison -- is identical on CPU and GPU. The scale 1/(1 - p) is
// computed on the host in double and applied in the compute type (float for
// halves and f32, double for f64), as on the CPU.
//
// Decomposition: one thread per element in a grid-stride loop; each thread
// runs Philox for its own counter, so no generator state is shared and the
// result does not depend on the launch shape.
//
// Cost per element: forward reads x and writes y (sizeof(T) each) and the
// 1-byte mask: 9 bytes for f32, so 16M elements move 151 MB, ~30 us at an
// H200's ~4.8 TB/s. It also runs ten Philox rounds, ~70 integer instructions
// (two 32x32->64-bit multiplies, two 3-input xors and two key adds per round).
// At roughly 15-20 T integer instructions per second that is ~60-80 us for
// the same 16M elements, so the forward is probably bound by integer
// throughput, not by memory (an estimate: nothing here has run on a GPU). The
// cause is the counter convention: each element uses one 32-bit word of its
// 128-bit Philox block and throws three away. Drawing 4 elements from one
// block would cut the arithmetic 4x, but it would change the masks on the CPU
// too. Backward reads gy and the mask and writes gx, draws no random numbers,
// and is bandwidth bound.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "core/base/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace mg::kernels::cuda {
namespace {

template <class T>
__global__ void forward_kernel(const T* x, T* y, bool* mask, int64_t count, float threshold, double scale,
                               uint64_t seed, uint64_t call_offset) {
  using A = acc_t<T>;
  const A s = static_cast<A>(scale);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const bool keep = philox_uniform(seed, static_cast<uint64_t>(i), call_offset) >= threshold;
    mask[i] = keep;
    store(y + i, keep ? A(load(x + i)) * s : A(0));
  }
}

template <class T>
__global__ void backward_kernel(const T* gy, const bool* mask, T* gx, int64_t count, double scale) {
  using A = acc_t<T>;
  const A s = static_cast<A>(scale);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x)
    store(gx + i, mask[i] ? A(load(gy + i)) * s : A(0));
}

// 1 / (1 - p), or 0 when p == 1 (every element is dropped, nothing to scale).
double keep_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

void check_args(const char* what, int64_t count, double p) {
  check(count >= 0, what, " (CUDA): negative count ", count);
  check(p >= 0.0 && p <= 1.0, what, " (CUDA): p must be in [0, 1], got ", p);
}

}  // namespace

void dropout_forward(cudaStream_t stream, DType dtype, const void* x, void* y, bool* mask, int64_t count,
                     double p, uint64_t seed, uint64_t call_offset) {
  check_args("dropout_forward", count, p);
  visit_float(dtype, "dropout_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    if (count == 0) return;
    launch_kernel<forward_kernel<T>>(grid_for(count), kThreads, 0, stream, static_cast<const T*>(x),
                                     static_cast<T*>(y), mask, count, static_cast<float>(p), keep_scale(p),
                                     seed, call_offset);
  });
}

void dropout_backward(cudaStream_t stream, DType dtype, const void* grad_y, const bool* mask, void* grad_x,
                      int64_t count, double p) {
  check_args("dropout_backward", count, p);
  visit_float(dtype, "dropout_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    if (count == 0) return;
    launch_kernel<backward_kernel<T>>(grid_for(count), kThreads, 0, stream, static_cast<const T*>(grad_y),
                                      mask, static_cast<T*>(grad_x), count, keep_scale(p));
  });
}

}  // namespace mg::kernels::cuda
