// Optimizer steps on the GPU: SGD (momentum, dampening, nesterov, weight decay),
// Adam and AdamW (amsgrad). Update rules and their order of operations:
// kernels/cpu/optim.h. Two entry points per rule, sharing one per-element
// update function (so their arithmetic is the same instructions):
//   *_step        one tensor, one launch;
//   *_step_multi  every tensor of a parameter group, one launch (what
//                 Optimizer::step uses on CUDA).
//
// Per-tensor decomposition. A grid-stride loop over 16-byte packs: a thread
// loads V = 16 / sizeof(T) consecutive elements (4 f32, 2 f64) of p, g and each
// state buffer the rule touches with one 16-byte vector load per operand,
// updates the V elements in registers, one after another, with the same element
// function as always (sgd_update / adam_update), and stores each operand back
// with one 16-byte store. Packs need every touched operand equally far from a
// 16-byte boundary (the host's pack_head checks the pointers; buffers from the
// allocator all start aligned): the `head` (< V) elements before the first
// boundary and the < V after the last pack are updated one by one, and operands
// at different distances take the element path for the whole tensor (one
// element per thread, 4- or 8-byte accesses, as before packs). Per-step scalars
// (bias corrections, step size) are computed once on the host in double and
// passed in, rounded to T, exactly as the CPU kernel does.
//
// Multi-tensor decomposition (the apex / PyTorch _foreach / llm.c idea). The
// host cuts every tensor of the list into chunks of `chunk` elements and builds
// two small tables in one buffer:
//   tensors[t]  pointers to p, g and the state buffers of tensor t, its size,
//               its pack head, and its own scalars (Adam's step size and bias
//               correction depend on the tensor's step count; SGD's first_step);
//   blocks[b]   (tensor t, chunk c): block b updates the packs of tensor t that
//               START in [c * chunk, (c + 1) * chunk) (the last may end up to
//               V - 1 elements into the next chunk, which skips them) and the
//               loose elements of that range, in a block-stride loop.
// One cudaMemcpyAsync puts the buffer on the device, then one launch of
// sum_t ceil(n_t / chunk) blocks updates everything; a block looks up its row
// of `blocks` (8 bytes) and its tensor's row (48-64 bytes). Empty tensors get
// no blocks. The chunk is per launch: the largest of 16384, 8192, ..., 1024
// elements that still gives ~1024 blocks (a wave of 256-thread blocks on a
// 132-SM GPU), else 1024 (one f32 pack per thread): a fixed 16384 gave the
// 270K-parameter MLP below 21 blocks, 21 of 132 SMs busy. The table
// costs 8 bytes per chunk plus ~64 per tensor: noise next to the parameters.
// A list of one tensor skips the table and takes the per-tensor launch.
//
// Cost. Bytes per element (s = sizeof(T)): SGD 3s (no momentum) to 5s, Adam and
// AdamW 7s (9s with amsgrad); ~10 FLOPs and one sqrt per element: bandwidth
// bound. An f32 model of N parameters moves 28N bytes per Adam step: ~6 us
// per million parameters on an H200 at ~4.8 TB/s. What limits it is bytes in
// flight: with 4-byte lanes a warp request carries 128 bytes (4 sectors) and a
// small grid cannot cover HBM latency; 16-byte lanes carry 512 (16 sectors, all
// of each sector used), and the loads of a pack (4 operands for Adam) are one
// round trip. The emulator's H200 model (docs/performance-model.md; predictions,
// not measurements) calls one AdamW step of the bench_kernels step zoo's MLP
// (269K parameters, 6 tensors) launch-bound (latency-bound before packs and
// the adaptive chunk) and TinyGPT's (471K) DRAM-bound, with DRAM bytes equal
// to the ideal 28N; docs/kernels.md has the predicted times. The table loads (every
// warp reads its block's two rows, a broadcast) are ~2% of the sectors. A
// kernel launch costs ~3-5 us of host time and leaves the GPU idle between
// small kernels, so per-tensor launches make a model with 200 parameter
// tensors (a small transformer: most are biases and norm weights of a few
// hundred elements) spend ~1 ms launching what the memory system does in
// ~0.1 ms (estimates from typical launch costs, not measured here). The
// multi-tensor launch makes that cost per step instead of per tensor (one copy
// of the table, one launch).
//
// Results equal the CPU's bit for bit (f32 and f64): the element functions
// round every operation explicitly (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn
// and their double twins). Plain a*b + c would be contracted by nvcc into one
// FMA (--fmad=true is the default), rounding once where the CPU rounds twice:
// ~1 ulp per step, which cancellation can blow up past a test's tolerance
// (e.g. m = beta1*m + (1-beta1)*g ~ 0 in a 1-element tensor), and which could
// even differ between two kernels inlining the same function. The CPU twin is
// built without contraction (ISO C++17, baseline x86-64), and IEEE division
// and square root are correctly rounded on both sides. The pack and element
// paths and the multi-tensor launch all apply the same element function to the
// same scalars, so they match each other bit for bit;
// tests/gpu/test_cuda_optim_multi.cpp checks that (under the emulator; not yet
// on a GPU).
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/vectorized.cuh"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

// ---- the per-element updates (shared by every launch shape and by the pack and element paths) ----

template <class T>
struct SgdScalars {
  T wd, momentum, one_minus_dampening, neg_lr;
  bool use_momentum, use_wd, nesterov;
};

// Correctly rounded operations that nvcc never fuses into an FMA (see the top of this file): the
// update rules below are the CPU's expressions, one rounding each.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

// One element, in registers: p and the momentum buffer are updated in place (buf is neither read
// on the first step nor touched without momentum).
template <class T>
__device__ __forceinline__ void sgd_update(T& p, T g, T& buf, bool first_step, const SgdScalars<T>& k) {
  T d = g;
  if (k.use_wd) d = add_rn(d, mul_rn(k.wd, p));  // d + wd * p
  if (k.use_momentum) {
    // buf * momentum + (1 - dampening) * d
    const T b = first_step ? d : add_rn(mul_rn(buf, k.momentum), mul_rn(k.one_minus_dampening, d));
    buf = b;
    d = k.nesterov ? add_rn(d, mul_rn(k.momentum, b)) : b;  // d + momentum * b
  }
  p = add_rn(p, mul_rn(k.neg_lr, d));  // p + (-lr) * d
}

// Scalars shared by every tensor of a group; the two that depend on the step count are per tensor
// (AdamStepScalars).
template <class T>
struct AdamScalars {
  T beta1, one_minus_beta1, beta2, one_minus_beta2, eps, l2, decay;
  bool use_l2, use_decay, amsgrad;
};
template <class T>
struct AdamStepScalars {
  T neg_step_size, bias_correction2_sqrt;
};

// One element, in registers: p, m, v and (with amsgrad) vmax updated in place.
template <class T>
__device__ __forceinline__ void adam_update(T& p, T g, T& m, T& v, T& vmax, const AdamScalars<T>& k,
                                            const AdamStepScalars<T>& s) {
  T pi = p;
  if (k.use_decay) pi = mul_rn(pi, k.decay);
  T gi = g;
  if (k.use_l2) gi = add_rn(gi, mul_rn(k.l2, pi));                               // g + l2 * p
  const T mi = add_rn(mul_rn(m, k.beta1), mul_rn(k.one_minus_beta1, gi));        // m*b1 + (1-b1)*g
  T vi = add_rn(mul_rn(v, k.beta2), mul_rn(k.one_minus_beta2, mul_rn(gi, gi)));  // v*b2 + (1-b2)*g*g
  m = mi;
  v = vi;
  if (k.amsgrad) {
    const T old = vmax;
    vi = (old != old || old >= vi) ? old : vi;  // NaN-propagating max, as torch.maximum
    vmax = vi;
  }
  const T denom = add_rn(div_rn(sqrt_rn(vi), s.bias_correction2_sqrt), k.eps);  // sqrt(v)/bc2 + eps
  p = add_rn(pi, mul_rn(s.neg_step_size, div_rn(mi, denom)));                   // p + (-step) * (m/denom)
}

// ---- the operands of one tensor, as elements or as 16-byte packs ----

template <class T>
constexpr int kPack = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte pack: 4 f32, 2 f64

template <class T>
struct SgdOperands {
  T* p;
  const T* g;
  T* buf;  // null without momentum
  bool first_step;

  __device__ __forceinline__ void element(int64_t i, const SgdScalars<T>& k) const {
    T pi = p[i], b{};
    if (k.use_momentum && !first_step) b = buf[i];
    sgd_update(pi, g[i], b, first_step, k);
    if (k.use_momentum) buf[i] = b;
    p[i] = pi;
  }
  // Elements [i, i + kPack<T>), every operand 16-byte aligned there: one vector load or store each.
  __device__ __forceinline__ void pack(int64_t i, const SgdScalars<T>& k) const {
    constexpr int V = kPack<T>;
    Pack<T, V> pp = load_pack<V>(p + i), bp{};
    const Pack<T, V> gp = load_pack<V>(g + i);
    if (k.use_momentum && !first_step) bp = load_pack<V>(buf + i);
#pragma unroll
    for (int j = 0; j < V; ++j) sgd_update(pp.v[j], gp.v[j], bp.v[j], first_step, k);
    if (k.use_momentum) store_pack<V>(buf + i, bp);
    store_pack<V>(p + i, pp);
  }
};

template <class T>
struct AdamOperands {
  T* p;
  const T* g;
  T *m, *v;
  T* vmax;  // null without amsgrad
  AdamStepScalars<T> s;

  __device__ __forceinline__ void element(int64_t i, const AdamScalars<T>& k) const {
    T pi = p[i], mi = m[i], vi = v[i], vmaxi{};
    if (k.amsgrad) vmaxi = vmax[i];
    adam_update(pi, g[i], mi, vi, vmaxi, k, s);
    m[i] = mi;
    v[i] = vi;
    if (k.amsgrad) vmax[i] = vmaxi;
    p[i] = pi;
  }
  __device__ __forceinline__ void pack(int64_t i, const AdamScalars<T>& k) const {
    constexpr int V = kPack<T>;
    Pack<T, V> pp = load_pack<V>(p + i), mp = load_pack<V>(m + i), vp = load_pack<V>(v + i), xp{};
    const Pack<T, V> gp = load_pack<V>(g + i);
    if (k.amsgrad) xp = load_pack<V>(vmax + i);
#pragma unroll
    for (int j = 0; j < V; ++j) adam_update(pp.v[j], gp.v[j], mp.v[j], vp.v[j], xp.v[j], k, s);
    store_pack<V>(m + i, mp);
    store_pack<V>(v + i, vp);
    if (k.amsgrad) store_pack<V>(vmax + i, xp);
    store_pack<V>(p + i, pp);
  }
};

// Elements [begin, end) of an n-element tensor whose packs start at head + q * V, q = 0, 1, ...
// while a whole pack fits (head < 0: no packs, every element alone). The packs that START in
// [begin, end) go to `ops.pack` (a pack may end past `end`: the next range then skips those
// elements), and the elements of [begin, end) no pack covers (before the first pack, after the
// last) to `ops.element`, spread over the threads first, first + stride, ... that share the range.
template <int V, class Ops, class K>
__device__ __forceinline__ void update_range(const Ops& ops, const K& k, int64_t n, int64_t head,
                                             int64_t begin, int64_t end, int64_t first, int64_t stride) {
  int64_t loose_end = end, body_end = end;  // loose: [begin, loose_end) and [body_end, end)
  if (head >= 0) {
    const int64_t packs = (n - head) / V;
    body_end = max(begin, head + packs * V);
    loose_end = min(end, head);
    // Packs q whose start head + q*V lies in [begin, end).
    const int64_t q0 = begin > head ? (begin - head + V - 1) / V : 0;
    const int64_t q1 = min(packs, end > head ? (end - head + V - 1) / V : int64_t(0));
#pragma unroll 1
    for (int64_t q = q0 + first; q < q1; q += stride) ops.pack(head + q * V, k);
  }
  for (int64_t i = begin + first; i < loose_end; i += stride) ops.element(i, k);
  for (int64_t i = body_end + first; i < end; i += stride) ops.element(i, k);
}

// ---- one tensor ----

template <class T>
__global__ void sgd_kernel(int64_t n, int64_t head, SgdOperands<T> ops, SgdScalars<T> k) {
  update_range<kPack<T>>(ops, k, n, head, 0, n, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                         int64_t(gridDim.x) * blockDim.x);
}

template <class T>
__global__ void adam_kernel(int64_t n, int64_t head, AdamOperands<T> ops, AdamScalars<T> k) {
  update_range<kPack<T>>(ops, k, n, head, 0, n, int64_t(blockIdx.x) * blockDim.x + threadIdx.x,
                         int64_t(gridDim.x) * blockDim.x);
}

// ---- many tensors: the tables (see the top of this file) ----

// Elements per block (a chunk): the largest of these that still gives the launch kTargetBlocks
// blocks, else the smallest. Multiples of 256 threads x 4 f32 elements (one f32 pack per thread).
constexpr int64_t kMaxChunk = 16384, kMinChunk = 1024;
constexpr int64_t kTargetBlocks = 1024;  // ~a wave of 256-thread blocks on a 132-SM GPU (8 per SM)

template <class Ops>
struct TensorRow {
  Ops ops;
  int64_t n;
  int64_t head;  // elements before the first 16-byte pack; -1: no packs
};
struct BlockRow {
  int32_t tensor;
  int32_t chunk;
};

template <class T>
__global__ void sgd_multi_kernel(const TensorRow<SgdOperands<T>>* tensors, const BlockRow* blocks,
                                 int64_t chunk, SgdScalars<T> k) {
  const BlockRow b = blocks[blockIdx.x];
  const TensorRow<SgdOperands<T>> t = tensors[b.tensor];
  const int64_t begin = int64_t(b.chunk) * chunk;
  update_range<kPack<T>>(t.ops, k, t.n, t.head, begin, min(begin + chunk, t.n), threadIdx.x, blockDim.x);
}

template <class T>
__global__ void adam_multi_kernel(const TensorRow<AdamOperands<T>>* tensors, const BlockRow* blocks,
                                  int64_t chunk, AdamScalars<T> k) {
  const BlockRow b = blocks[blockIdx.x];
  const TensorRow<AdamOperands<T>> t = tensors[b.tensor];
  const int64_t begin = int64_t(b.chunk) * chunk;
  update_range<kPack<T>>(t.ops, k, t.n, t.head, begin, min(begin + chunk, t.n), threadIdx.x, blockDim.x);
}

// Where the 16-byte packs of an n-element tensor start: every operand in `pointers` (nulls are
// operands the rule does not touch) must be T-aligned and equally far from a 16-byte boundary;
// the elements before the first boundary (`head`, < kPack<T>) go one by one. -1: no pack path
// (operands misaligned relative to each other: every element alone, as before packs).
template <class T>
int64_t pack_head(int64_t n, std::initializer_list<const void*> pointers) {
  constexpr uintptr_t V = kPack<T>, size = sizeof(T);
  int64_t misalign = -1;
  for (const void* pointer : pointers) {
    if (pointer == nullptr) continue;
    const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
    if (address % size != 0) return -1;
    const int64_t e = static_cast<int64_t>(address % 16 / size);
    if (misalign >= 0 && e != misalign) return -1;
    misalign = e;
  }
  if (misalign < 0) return -1;
  return std::min<int64_t>((int64_t(V) - misalign) % int64_t(V), n);
}

template <class T>
int64_t sgd_head(int64_t n, const SgdOperands<T>& o, const SgdScalars<T>& k) {
  return pack_head<T>(n, {o.p, o.g, k.use_momentum ? o.buf : nullptr});
}
template <class T>
int64_t adam_head(int64_t n, const AdamOperands<T>& o, const AdamScalars<T>& k) {
  return pack_head<T>(n, {o.p, o.g, o.m, o.v, k.amsgrad ? o.vmax : nullptr});
}

// The chunk for a list of tensor sizes (kMaxChunk .. kMinChunk, see above).
int64_t chunk_for(const std::vector<int64_t>& sizes) {
  int64_t chunk = kMaxChunk;
  for (; chunk > kMinChunk; chunk /= 2) {
    int64_t blocks = 0;
    for (int64_t n : sizes) blocks += (n + chunk - 1) / chunk;
    if (blocks >= kTargetBlocks) break;
  }
  return chunk;
}

// Puts `rows` (one per tensor) and the block table for `sizes` into one device
// buffer borrowed from `scratch`, launches `launch(tensors, blocks,
// number_of_blocks, chunk)` on `stream`, and hands the buffer back. Scratch is reused
// in stream order, so giving it back right after the launch is safe: later work
// on this stream that gets the buffer runs after the kernel.
template <class Row, class Launch>
void launch_multi(cudaStream_t stream, ScratchAllocator& scratch, const char* what,
                  const std::vector<Row>& rows, const std::vector<int64_t>& sizes, Launch&& launch) {
  const int64_t chunk = chunk_for(sizes);
  std::vector<BlockRow> blocks;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t chunks = (sizes[t] + chunk - 1) / chunk;
    MG_CHECK(chunks <= INT32_MAX && t <= INT32_MAX, what, " (CUDA): tensor ", t, " has ", sizes[t],
             " elements, more than the block table can address (", int64_t(INT32_MAX) * chunk, ")");
    for (int64_t c = 0; c < chunks; ++c) blocks.push_back(BlockRow{int32_t(t), int32_t(c)});
  }
  if (blocks.empty()) return;  // every tensor is empty
  MG_CHECK(blocks.size() <= size_t(INT32_MAX), what, " (CUDA): ", blocks.size(),
           " blocks exceed the grid limit ", INT32_MAX);
  // One host buffer [rows | blocks] (rows first: their alignment is the larger),
  // copied with one cudaMemcpyAsync. From pageable memory the copy returns once
  // the bytes are staged, so `host` may go out of scope right after.
  const size_t row_bytes = rows.size() * sizeof(Row), block_bytes = blocks.size() * sizeof(BlockRow);
  std::vector<unsigned char> host(row_bytes + block_bytes);
  std::memcpy(host.data(), rows.data(), row_bytes);
  std::memcpy(host.data() + row_bytes, blocks.data(), block_bytes);
  Workspace table(scratch, host.size());
  MG_CUDA_CHECK(cudaMemcpyAsync(table.get(), host.data(), host.size(), cudaMemcpyHostToDevice, stream));
  const auto* device_rows = static_cast<const Row*>(table.get());
  const auto* device_blocks =
      reinterpret_cast<const BlockRow*>(static_cast<unsigned char*>(table.get()) + row_bytes);
  launch(device_rows, device_blocks, static_cast<unsigned>(blocks.size()), chunk);
}

template <class F>
void visit_param(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::f32: return f(tag<float>{});
    case DType::f64: return f(tag<double>{});
    default: break;
  }
  throw Error(str_cat(what, " (CUDA): parameters must be f32 or f64, got ", dtype_name(dtype),
                      " (keep f32 master weights for mixed precision)"));
}

template <class T>
SgdScalars<T> sgd_scalars(const SgdHyper& h) {
  SgdScalars<T> k;
  k.wd = static_cast<T>(h.weight_decay);
  k.momentum = static_cast<T>(h.momentum);
  k.one_minus_dampening = static_cast<T>(1.0 - h.dampening);
  k.neg_lr = static_cast<T>(-h.lr);
  k.use_momentum = h.momentum != 0.0;
  k.use_wd = h.weight_decay != 0.0;
  k.nesterov = h.nesterov;
  return k;
}

// Adam uses l2 = weight_decay, decay = 1; AdamW l2 = 0, decay = 1 - lr * weight_decay.
template <class T>
AdamScalars<T> adam_scalars(const AdamHyper& h, double l2, double decay) {
  AdamScalars<T> k;
  k.beta1 = static_cast<T>(h.beta1);
  k.one_minus_beta1 = static_cast<T>(1.0 - h.beta1);
  k.beta2 = static_cast<T>(h.beta2);
  k.one_minus_beta2 = static_cast<T>(1.0 - h.beta2);
  k.eps = static_cast<T>(h.eps);
  k.l2 = static_cast<T>(l2);
  k.decay = static_cast<T>(decay);
  k.use_l2 = l2 != 0.0;
  k.use_decay = decay != 1.0;
  k.amsgrad = h.amsgrad;
  return k;
}

// The bias-corrected step size and sqrt(1 - beta2^t), in double, rounded to T.
template <class T>
AdamStepScalars<T> adam_step_scalars(const AdamHyper& h, int64_t step) {
  const double t = static_cast<double>(step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  return {static_cast<T>(-(h.lr / bias_correction1)), static_cast<T>(std::sqrt(bias_correction2))};
}

void check_adam_tensor(const char* what, const AdamHyper& h, int64_t step, const void* max_exp_avg_sq,
                       size_t index) {
  MG_CHECK(!h.amsgrad || max_exp_avg_sq != nullptr, what, ": amsgrad needs a max_exp_avg_sq buffer (tensor ",
           index, ")");
  MG_CHECK(step >= 1, what, ": step counts from 1, got ", step, " (tensor ", index, ")");
}

void adam_common(cudaStream_t stream, const char* what, DType dtype, int64_t n, void* param, const void* grad,
                 void* exp_avg, void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h, double l2,
                 double decay) {
  check_adam_tensor(what, h, h.step, max_exp_avg_sq, 0);
  if (n == 0) return;
  visit_param(dtype, what, [&](auto tg) {
    using T = typename decltype(tg)::type;
    const AdamOperands<T> ops{static_cast<T*>(param),          static_cast<const T*>(grad),
                              static_cast<T*>(exp_avg),        static_cast<T*>(exp_avg_sq),
                              static_cast<T*>(max_exp_avg_sq), adam_step_scalars<T>(h, h.step)};
    const AdamScalars<T> k = adam_scalars<T>(h, l2, decay);
    const int64_t head = adam_head(n, ops, k);
    launch_kernel<adam_kernel<T>>(grid_for(n, head >= 0 ? kPack<T> : 1), kThreads, 0, stream, n, head, ops,
                                  k);
  });
}

void adam_multi_common(cudaStream_t stream, ScratchAllocator& scratch, const char* what, DType dtype,
                       const std::vector<AdamTensor>& tensors, const AdamHyper& h, double l2, double decay) {
  for (size_t t = 0; t < tensors.size(); ++t)
    check_adam_tensor(what, h, tensors[t].step, tensors[t].max_exp_avg_sq, t);
  if (tensors.size() == 1) {  // no table to build: the per-tensor launch
    const AdamTensor& t = tensors.front();
    AdamHyper ht = h;
    ht.step = t.step;
    return adam_common(stream, what, dtype, t.n, t.param, t.grad, t.exp_avg, t.exp_avg_sq, t.max_exp_avg_sq,
                       ht, l2, decay);
  }
  visit_param(dtype, what, [&](auto tg) {
    using T = typename decltype(tg)::type;
    using Row = TensorRow<AdamOperands<T>>;
    const AdamScalars<T> k = adam_scalars<T>(h, l2, decay);
    std::vector<Row> rows;
    std::vector<int64_t> sizes;
    for (const AdamTensor& t : tensors) {
      const AdamOperands<T> ops{static_cast<T*>(t.param),          static_cast<const T*>(t.grad),
                                static_cast<T*>(t.exp_avg),        static_cast<T*>(t.exp_avg_sq),
                                static_cast<T*>(t.max_exp_avg_sq), adam_step_scalars<T>(h, t.step)};
      rows.push_back(Row{ops, t.n, adam_head(t.n, ops, k)});
      sizes.push_back(t.n);
    }
    launch_multi(stream, scratch, what, rows, sizes,
                 [&](const Row* r, const BlockRow* b, unsigned grid, int64_t chunk) {
                   launch_kernel<adam_multi_kernel<T>>(grid, kThreads, 0, stream, r, b, chunk, k);
                 });
  });
}

}  // namespace

void sgd_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad,
              void* momentum_buffer, bool first_step, const SgdHyper& h) {
  MG_CHECK(h.momentum == 0.0 || momentum_buffer != nullptr,
           "sgd_step (CUDA): momentum needs a momentum buffer");
  if (n == 0) return;
  visit_param(dtype, "sgd_step", [&](auto tg) {
    using T = typename decltype(tg)::type;
    const SgdOperands<T> ops{static_cast<T*>(param), static_cast<const T*>(grad),
                             static_cast<T*>(momentum_buffer), first_step};
    const SgdScalars<T> k = sgd_scalars<T>(h);
    const int64_t head = sgd_head(n, ops, k);
    launch_kernel<sgd_kernel<T>>(grid_for(n, head >= 0 ? kPack<T> : 1), kThreads, 0, stream, n, head, ops, k);
  });
}

void adam_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* exp_avg,
               void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h) {
  adam_common(stream, "adam_step", dtype, n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h,
              h.weight_decay, 1.0);
}

void adamw_step(cudaStream_t stream, DType dtype, int64_t n, void* param, const void* grad, void* exp_avg,
                void* exp_avg_sq, void* max_exp_avg_sq, const AdamHyper& h) {
  adam_common(stream, "adamw_step", dtype, n, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, 0.0,
              1.0 - h.lr * h.weight_decay);
}

void sgd_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                    const std::vector<SgdTensor>& tensors, const SgdHyper& h) {
  for (size_t t = 0; t < tensors.size(); ++t)
    MG_CHECK(h.momentum == 0.0 || tensors[t].momentum_buffer != nullptr,
             "sgd_step_multi (CUDA): momentum needs a momentum buffer (tensor ", t, ")");
  if (tensors.size() == 1) {  // no table to build: the per-tensor launch
    const SgdTensor& t = tensors.front();
    // Qualified: SgdHyper would make argument-dependent lookup find cpu::sgd_step as well.
    return cuda::sgd_step(stream, dtype, t.n, t.param, t.grad, t.momentum_buffer, t.first_step, h);
  }
  visit_param(dtype, "sgd_step_multi", [&](auto tg) {
    using T = typename decltype(tg)::type;
    using Row = TensorRow<SgdOperands<T>>;
    const SgdScalars<T> k = sgd_scalars<T>(h);
    std::vector<Row> rows;
    std::vector<int64_t> sizes;
    for (const SgdTensor& t : tensors) {
      const SgdOperands<T> ops{static_cast<T*>(t.param), static_cast<const T*>(t.grad),
                               static_cast<T*>(t.momentum_buffer), t.first_step};
      rows.push_back(Row{ops, t.n, sgd_head(t.n, ops, k)});
      sizes.push_back(t.n);
    }
    launch_multi(stream, scratch, "sgd_step_multi", rows, sizes,
                 [&](const Row* r, const BlockRow* b, unsigned grid, int64_t chunk) {
                   launch_kernel<sgd_multi_kernel<T>>(grid, kThreads, 0, stream, r, b, chunk, k);
                 });
  });
}

void adam_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                     const std::vector<AdamTensor>& tensors, const AdamHyper& h) {
  adam_multi_common(stream, scratch, "adam_step_multi", dtype, tensors, h, h.weight_decay, 1.0);
}

void adamw_step_multi(cudaStream_t stream, ScratchAllocator& scratch, DType dtype,
                      const std::vector<AdamTensor>& tensors, const AdamHyper& h) {
  adam_multi_common(stream, scratch, "adamw_step_multi", dtype, tensors, h, 0.0, 1.0 - h.lr * h.weight_decay);
}

}  // namespace mg::kernels::cuda
