// Packs: V consecutive elements moved by one 16-byte (or narrower) vector load or store, and the
// loops that hand a kernel's elements out as packs plus a scalar head and tail. Shared by the
// elementwise kernels (elementwise.cu), dropout (dropout.cu) and the strided copies
// (transpose.cu); kernels/cuda/elementwise.cu's opening comment says why packs matter and when
// the host takes the pack path.
//
// The split of work: the host decides (plan_packs) whether every operand can be read and written
// as aligned packs and how many elements (`head`) must be peeled off first; the kernel runs
// run_elements / run_packs with two bodies, packed(start) for a pack of V elements at `start`
// and element(i) for one element, which also serves the head, the tail and every launch the
// host did not plan packs for.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/common.cuh"

namespace mg::kernels::cuda {

// Visits every element index of an n-element iteration: `body(i)` is called once
// per index; on the contiguous path each thread does 4 indices one grid apart.
template <class Body>
__device__ __forceinline__ void for_each_index(int64_t n, Body body) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
#pragma unroll
    for (int u = 0; u < 4; ++u) body(i + u * stride);
  }
  for (; i < n; i += stride) body(i);
}

// ---- packs: V elements moved by one 16-byte (or narrower) load/store ------------------------------

template <class T, int V>
struct Pack {
  T v[V];
};

// Elements per pack: 16 bytes of the widest dtype the kernel touches.
template <class T>
constexpr int pack_width() {
  return static_cast<int>(16 / sizeof(T));
}

// p must be aligned to V * sizeof(T) bytes (the host's plan_packs checked it).
template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  using Raw = raw_t<static_cast<int>(sizeof(T)) * V>;
  const Raw raw = *reinterpret_cast<const Raw*>(p);
  Pack<T, V> out;
  memcpy(&out, &raw, sizeof(Raw));
  return out;
}
template <int V, class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& pack) {
  using Raw = raw_t<static_cast<int>(sizeof(T)) * V>;
  Raw raw;
  memcpy(&raw, &pack, sizeof(Raw));
  *reinterpret_cast<Raw*>(p) = raw;
}
// An operand with inner stride 1 is loaded as a pack; one with inner stride 0
// has the same element all along the pack: one scalar load, copied V times.
template <int V, class T>
__device__ __forceinline__ Pack<T, V> load_pack_or_splat(const T* p, bool unit) {
  if (unit) return load_pack<V>(p);
  const T x = *p;
  Pack<T, V> out;
#pragma unroll
  for (int j = 0; j < V; ++j) out.v[j] = x;
  return out;
}

// What the host decided about the pack path (plan_packs below).
struct PackPlan {
  int64_t head = -1;  // elements done one by one before the first pack; -1: no pack path
  unsigned unit = 0;  // bit k: operand k steps by 1 along the inner dim (else by 0)
};

// A kernel's loop over its n elements. Without a pack plan, element(i) runs for
// every i (for_each_index). With one, packed(start) runs for each pack, whose
// starts are head + p * V, in a grid-stride loop (one pack per thread per
// iteration: V elements are enough independent work, and not unrolling keeps
// the code small); then the `head` elements before the first pack and the < V
// after the last go to element(i) through the same for_each_index, so the
// per-element code is compiled once either way. kPacks = false compiles the
// pack branch out (for instantiations nobody needs it for).
template <int V, bool kPacks = true, class Element, class Packed>
__device__ __forceinline__ void run_elements(int64_t n, const PackPlan& plan, Element element,
                                             Packed packed) {
  int64_t count = n, head = n, body_end = n;
  if (kPacks && plan.head >= 0) {
    const int64_t packs = (n - plan.head) / V;
    head = plan.head;
    body_end = head + packs * V;
    count = head + (n - body_end);
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
#pragma unroll 1
    for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride)
      packed(head + p * V);
  }
  for_each_index(count, [&](int64_t i) { element(i < head ? i : body_end + (i - head)); });
}

// run_elements for kernels launched only with a pack plan: the < 2V loose
// elements take one thread each of the first block (every grid has >= 256
// threads), so the per-element code is compiled once, not unrolled.
template <int V, class Element, class Packed>
__device__ __forceinline__ void run_packs(int64_t n, const PackPlan& plan, Element element, Packed packed) {
  const int64_t packs = (n - plan.head) / V;
  const int64_t head = plan.head, body_end = head + packs * V;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
#pragma unroll 1
  for (int64_t p = tid; p < packs; p += stride) packed(head + p * V);
  if (tid < head + (n - body_end)) element(tid < head ? tid : body_end + (tid - head));
}

// Where each operand's pack starts (its first element's offset).
template <int N>
__device__ __forceinline__ void pack_offsets(const OffsetCalc<N>& oc, bool contiguous, int64_t i,
                                             int64_t (&off)[N]) {
  if (contiguous) {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = i;
  } else {
    oc.get(i, off);
  }
}

// ---- host side ------------------------------------------------------------------------------
// Raw element type of a given size, for kernels that only move bytes.
template <class F>
void visit_width(size_t bytes, F&& f) {
  switch (bytes) {
    case 1: return f(tag<uint8_t>{});
    case 2: return f(tag<uint16_t>{});
    case 4: return f(tag<uint32_t>{});
    case 8: return f(tag<uint64_t>{});
  }
  throw Error(str_cat("cuda copy: unsupported element size ", bytes));
}

// Whether the pack path applies, for packs of `vec`
// elements: every operand walks the innermost merged dim with stride 1 or 0
// (the output with 1); each stride-1 operand is naturally aligned and, in the
// 1-d case, misaligned from a pack boundary by the same number of elements as
// the others (peeled off as `head`), or, with more dims, starts aligned, has
// outer strides that are multiples of `vec`, and rows of a multiple of `vec`.
template <int N>
PackPlan plan_packs(const OffsetCalc<N>& oc, const StridedView* const (&views)[N], int64_t n, int vec) {
  PackPlan plan;
  const int inner = oc.ndim - 1;
  int64_t misalign = -1;
  for (int k = 0; k < N; ++k) {
    const int64_t s = oc.strides[k][inner];
    if (s == 0 && k > 0) continue;  // read once per pack: any address will do
    if (s != 1) return PackPlan{};
    plan.unit |= 1u << k;
    const uintptr_t size = dtype_size(views[k]->dtype);
    const uintptr_t addr = reinterpret_cast<uintptr_t>(views[k]->data);
    if (addr % size != 0) return PackPlan{};
    const int64_t e = static_cast<int64_t>(addr % (size * static_cast<uintptr_t>(vec)) / size);
    if (oc.ndim == 1) {
      if (misalign >= 0 && e != misalign) return PackPlan{};
      misalign = e;
    } else {
      if (e != 0) return PackPlan{};
      for (int d = 0; d < inner; ++d) {
        if (oc.strides[k][d] % vec != 0) return PackPlan{};
      }
    }
  }
  if (oc.ndim == 1) {
    plan.head = std::min<int64_t>((vec - misalign) % vec, n);
  } else {
    if (oc.shape[inner] % vec != 0) return PackPlan{};
    plan.head = 0;
  }
  return plan;
}

// Threads for a launch: one per pack on the pack path, else one per 4 elements.
inline unsigned grid_of(int64_t n, const PackPlan& plan, int vec) {
  return grid_for(n, plan.head >= 0 ? vec : 4);
}

// transpose.cu: a same-dtype copy that is not one contiguous block of bytes (the tiled transpose,
// the pack path or the general strided move). `oc` is make_offset_calc of {&out, &in}.
void copy_same_dtype(cudaStream_t stream, const StridedView& in, const StridedView& out,
                     const OffsetCalc<2>& oc);

}  // namespace mg::kernels::cuda
