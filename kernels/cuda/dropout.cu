// Dropout on the GPU with the counter-based Philox generator (base/philox.h).
// Semantics: kernels/cpu/dropout.h.
//
// Same mask as the CPU, bit for bit. Element i is kept iff
// philox_dropout_uniform(seed, i, call_offset) >= float(p): word i % 4 of Philox block i / 4,
// whose 24 top bits scaled by an exact power of two give the same float on CPU and GPU (the
// rounds are the same __host__ __device__ function, integer arithmetic only). The scale
// 1/(1 - p) is computed on the host in double and applied in the compute type (float for
// halves and f32, double for f64), as on the CPU.
//
// Decomposition: the pack loop of vectorized.cuh. A thread takes a pack of
// V = 16 / sizeof(T) consecutive elements (4 f32, 8 bf16/f16, 2 f64): x as one
// 16-byte load, y as one 16-byte store, the V mask bytes as one V-byte store
// (backward: gy and the mask loaded the same way), so a warp request moves
// 512 bytes of x or y and 64-256 bytes of mask instead of 64-256 and 32. The
// (< V) elements before the first aligned pack and after the last go one by
// one. The pack computes each Philox block it covers once: all four words of a
// block are used (one block per aligned f32 pack, two per bf16/f16 pack). No
// generator state is shared and the result does not depend on the launch shape.
//
// Cost per element: forward reads x and writes y (sizeof(T) each) and the
// 1-byte mask: 9 bytes for f32, so 16M elements move 151 MB, ~30 us at an
// H200's ~4.8 TB/s (the tracer: 16 sectors per request for x and y, 4 for the
// f32 mask, all 100% used: DRAM bound; the predicted time is in docs/kernels.md). Ten Philox rounds
// (~70 integer instructions: two 32x32->64-bit multiplies, two 3-input xors and
// two key adds per round) now serve four elements, ~18 per element: at roughly
// 15-20 T integer instructions per second ~15-20 us for the same 16M elements,
// under the memory time (an estimate: the tracer sees memory, not arithmetic).
// Drawing word 0 of a block per element, as this kernel did before, cost four
// times that and made the forward integer-bound. Backward reads gy and the mask
// and writes gx, draws no random numbers, and is bandwidth bound.
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "base/philox.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/vectorized.cuh"

namespace mg::kernels::cuda {
namespace {

// A pack of V elements: x as one 16-byte load, y as one 16-byte store, the V mask bytes as one
// V-byte store. Element i's draw is word i % 4 of Philox block i / 4, as on the CPU: a pack
// computes each block it covers once (one for an aligned f32 pack, two for bf16/f16).
template <class T>
__global__ void forward_kernel(PackPlan plan, const T* x, T* y, bool* mask, int64_t count, float threshold,
                               double scale, uint64_t seed, uint64_t call_offset) {
  using A = acc_t<T>;
  const A s = static_cast<A>(scale);
  auto keep = [&](int64_t i) {
    return philox_dropout_uniform(seed, static_cast<uint64_t>(i), call_offset) >= threshold;
  };
  constexpr int V = pack_width<T>();
  run_elements<V>(
      count, plan,
      [&](int64_t i) {
        const bool k = keep(i);
        mask[i] = k;
        store(y + i, k ? A(load(x + i)) * s : A(0));
      },
      [&](int64_t i) {
        const Pack<T, V> xp = load_pack<V>(x + i);
        Pack<T, V> yp;
        Pack<bool, V> mp;
        uint64_t group = static_cast<uint64_t>(i) / 4;
        PhiloxBlock block = philox4x32_10(seed, group, call_offset);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          const uint64_t e = static_cast<uint64_t>(i + j);
          if (e / 4 != group) {
            group = e / 4;
            block = philox4x32_10(seed, group, call_offset);
          }
          mp.v[j] = philox_word_uniform(block.word[e % 4]) >= threshold;
          store(&yp.v[j], mp.v[j] ? A(load(&xp.v[j])) * s : A(0));
        }
        store_pack(y + i, yp);
        store_pack(mask + i, mp);
      });
}

template <class T>
__global__ void backward_kernel(PackPlan plan, const T* gy, const bool* mask, T* gx, int64_t count,
                                double scale) {
  using A = acc_t<T>;
  const A s = static_cast<A>(scale);
  constexpr int V = pack_width<T>();
  run_elements<V>(
      count, plan, [&](int64_t i) { store(gx + i, mask[i] ? A(load(gy + i)) * s : A(0)); },
      [&](int64_t i) {
        const Pack<T, V> gp = load_pack<V>(gy + i);
        const Pack<bool, V> mp = load_pack<V>(mask + i);
        Pack<T, V> o;
#pragma unroll
        for (int j = 0; j < V; ++j) store(&o.v[j], mp.v[j] ? A(load(&gp.v[j])) * s : A(0));
        store_pack(gx + i, o);
      });
}

// The pack plan for flat arrays of `count` elements: a 1-d view per operand (data and mask).
template <int N>
PackPlan plan_flat(const void* const (&data)[N], const DType (&dtypes)[N], int64_t count, int vec) {
  StridedView v[N];
  const StridedView* views[N];
  for (int k = 0; k < N; ++k) {
    v[k].data = const_cast<void*>(data[k]);
    v[k].dtype = dtypes[k];
    v[k].ndim = 1;
    v[k].shape[0] = count;
    v[k].strides[0] = 1;
    views[k] = &v[k];
  }
  bool contiguous = false;
  return plan_packs<N>(make_offset_calc<N>(views, &contiguous), views, count, vec);
}

// 1 / (1 - p), or 0 when p == 1 (every element is dropped, nothing to scale).
double keep_scale(double p) { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }

void check_args(const char* what, int64_t count, double p) {
  MG_CHECK(count >= 0, what, " (CUDA): negative count ", count);
  MG_CHECK(p >= 0.0 && p <= 1.0, what, " (CUDA): p must be in [0, 1], got ", p);
}

}  // namespace

void dropout_forward(cudaStream_t stream, DType dtype, const void* x, void* y, bool* mask, int64_t count,
                     double p, uint64_t seed, uint64_t call_offset) {
  check_args("dropout_forward", count, p);
  visit_float(dtype, "dropout_forward", [&](auto t) {
    using T = typename decltype(t)::type;
    if (count == 0) return;
    constexpr int V = pack_width<T>();
    const PackPlan plan = plan_flat<3>({y, x, mask}, {dtype, dtype, DType::boolean}, count, V);
    launch_kernel<forward_kernel<T>>(grid_of(count, plan, V), kThreads, 0, stream, plan,
                                     static_cast<const T*>(x), static_cast<T*>(y), mask, count,
                                     static_cast<float>(p), keep_scale(p), seed, call_offset);
  });
}

void dropout_backward(cudaStream_t stream, DType dtype, const void* grad_y, const bool* mask, void* grad_x,
                      int64_t count, double p) {
  check_args("dropout_backward", count, p);
  visit_float(dtype, "dropout_backward", [&](auto t) {
    using T = typename decltype(t)::type;
    if (count == 0) return;
    constexpr int V = pack_width<T>();
    const PackPlan plan = plan_flat<3>({grad_x, grad_y, mask}, {dtype, dtype, DType::boolean}, count, V);
    launch_kernel<backward_kernel<T>>(grid_of(count, plan, V), kThreads, 0, stream, plan,
                                      static_cast<const T*>(grad_y), mask, static_cast<T*>(grad_x), count,
                                      keep_scale(p));
  });
}

}  // namespace mg::kernels::cuda
