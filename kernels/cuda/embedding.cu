// Gathers and scatter-adds of rows on the GPU: embedding forward/backward
// (kernels/cpu/embedding.h) and index_select / index_add (kernels/cpu/index.h).
// An embedding lookup is an index_select of whole rows of a
// [num_embeddings, dim] table, so both use the same two kernels.
//
// Decomposition. The input is seen as [outer, size, inner] and an index picks
// a run of `inner` consecutive elements.
//   Gather: one thread per output WORD (o, i, j) in a grid-stride loop:
//     out[(o*count + i)*inner + j] = in[(o*size + indices[i])*inner + j], with
//     inner and j counted in words: the widest of 16, 8 and 4 bytes (else the
//     element) that divides a run's bytes and both base addresses, so every run
//     starts on a word boundary. Rows of 4k f32 (8k halves, 2k f64) at aligned
//     bases copy 16 bytes a thread: one 16-byte vector load and store, 16
//     sectors a warp request. Neighbouring threads copy neighbouring words:
//     coalesced reads and writes. The copy moves raw bytes, one kernel per word
//     size (1, 2, 4, 8, 16 bytes), so index_select serves every dtype.
//   Scatter-add: a warp per tile of 32 * 4 consecutive grad_out elements, lane
//     l adding elements l, l + 32, l + 64, l + 96 into their rows with atomic
//     adds (f32/f64: the hardware's atomicAdd; f16/bf16: a compare-and-swap
//     loop on the aligned 32-bit word that holds the value). Every access is a
//     coalesced warp request (f32: 4-byte lanes, 4 sectors, all bytes used); a lane
//     reads its run's index once and again only where its next element starts
//     another run, so along an embedding row one index load (a broadcast, one
//     sector) serves 4 grad_out loads, and the 4 loads go out together before
//     the 4 atomics. Atomics stay 4 bytes a lane (16-byte vector atomics would
//     need sm_90's float4 atomicAdd, and strided scalar ones waste sectors).
//     The order of the additions to a row that several positions share
//     depends on timing, so those rows may differ in the last bits from run to
//     run and from the CPU (which sums in position order, in float for halves,
//     and rounds once; here halves round after every addition).
//   Index check, two ways. The ops' embedding forward (embedding_forward_deferred)
//     checks in the gather itself: a position whose index is out of range gets
//     zeros and offers itself to a device word (atomicMin), and a one-thread
//     kernel then stores that position's value beside it. The op queues a copy
//     of the two words to pinned memory without waiting
//     (core/cuda_device_checks.h, as for cross-entropy's targets), and the next
//     host synchronisation (the loss read) throws the error naming position and
//     value. The op's backward reuses the forward's indices and does no check
//     of its own (embedding_backward_unchecked); its scatter skips an
//     out-of-range index, so a bad one never writes out of bounds either. The
//     kernel entry points embedding_forward/_backward and index_select/index_add
//     check first instead, with a small kernel and one copy back (a stream
//     synchronisation per call), and throw the CPU's error before anything is
//     written.
//
// Cost. Gather: read and write outer*count*inner elements, no FLOPs: bandwidth
// bound (a [4096, 768] f32 lookup moves 25 MB, ~6 us at HBM speed; the deferred
// check adds a compare per word, a 16-byte memset, a one-thread kernel and
// a 16-byte copy back, and no wait; the waiting entry points add ~10 us for the
// synchronisation). Each word also reads its position's 8-byte index, the same
// for the warp along a row: one sector per request beside the row's 16 (sector
// efficiency 0.96 with 16-byte words, 0.85 with 4-byte ones). Scatter-add: read
// grad_out once and do one atomic per element; atomics to distinct addresses
// run near bandwidth, but many positions naming the same row (a frequent token)
// serialise on it. At the bench_kernels TinyGPT shapes ([256, 128] f32, 512
// positions) both are launch-bound in the emulator's H200 model (docs/kernels.md
// has the predicted times).
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"

namespace mg::kernels::cuda {
namespace {

// ---- index check ---------------------------------------------------------------------------
__global__ void first_bad_index_kernel(const int64_t* indices, int64_t count, int64_t limit,
                                       unsigned long long* first_bad) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t v = indices[i];
    if (v < 0 || v >= limit) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

// Returns the first position whose index lies outside [0, limit), or -1 when
// all are valid, together with that index. Waits for the stream.
struct BadIndex {
  int64_t position = -1, value = 0;
};
BadIndex find_bad_index(cudaStream_t stream, ScratchAllocator& scratch, const int64_t* indices, int64_t count,
                        int64_t limit) {
  BadIndex bad;
  if (count == 0) return bad;
  Workspace slot(scratch, sizeof(unsigned long long));
  unsigned long long* first = static_cast<unsigned long long*>(slot.get());
  const unsigned long long none = static_cast<unsigned long long>(count);
  MG_CUDA_CHECK(cudaMemcpyAsync(first, &none, sizeof(none), cudaMemcpyHostToDevice, stream));
  launch_kernel<first_bad_index_kernel>(grid_for(count), kThreads, 0, stream, indices, count, limit, first);
  unsigned long long position = none;
  MG_CUDA_CHECK(cudaMemcpyAsync(&position, first, sizeof(position), cudaMemcpyDeviceToHost, stream));
  MG_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (position == none) return bad;
  bad.position = static_cast<int64_t>(position);
  MG_CUDA_CHECK(
      cudaMemcpyAsync(&bad.value, indices + bad.position, sizeof(int64_t), cudaMemcpyDeviceToHost, stream));
  MG_CUDA_CHECK(cudaStreamSynchronize(stream));
  return bad;
}

// ---- gather ------------------------------------------------------------------------------
// W is the word (see gather_word) and s.inner counts words. With `first_bad` (embedding's deferred
// check) the gather checks its own indices: a position whose index lies outside [0, s.size) gets
// zeros, never a read out of bounds, and is offered to *first_bad (atomicMin, by the thread of the
// position's first word), which embedding_check_finish_kernel then pairs with its value. Without,
// the indices were checked before the launch.
template <class W>
__global__ void gather_kernel(IndexShape s, const W* input, const int64_t* indices, int64_t count, W* out,
                              unsigned long long* first_bad) {
  const int64_t total = s.outer * count * s.inner;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = e % s.inner, i = (e / s.inner) % count, o = e / (s.inner * count);
    const int64_t index = indices[i];
    if (first_bad != nullptr && (index < 0 || index >= s.size)) {
      out[e] = W{};  // zero bits
      if (o == 0 && j == 0) atomicMin(first_bad, static_cast<unsigned long long>(i));
      continue;
    }
    out[e] = input[(o * s.size + index) * s.inner + j];
  }
}

// After a checking gather: the bad index's value next to its position, for the deferred error
// message (the indices may be gone by the time the host reads the words).
__global__ void embedding_check_finish_kernel(unsigned long long* words, const int64_t* indices,
                                              int64_t count) {
  if (words[0] < static_cast<unsigned long long>(count))
    words[1] = static_cast<unsigned long long>(indices[words[0]]);
}

// The widest word (16, 8 or 4 bytes, else the element) that divides a run's bytes and both base
// addresses, so that every run of both tensors starts on a word boundary: a run of `inner`
// elements is then inner * size / word words, each copied whole (16 bytes: a 16-byte vector load
// and store per thread, 16 sectors a warp request).
int gather_word(size_t element, int64_t run_bytes, const void* input, const void* out) {
  const uintptr_t in = reinterpret_cast<uintptr_t>(input), o = reinterpret_cast<uintptr_t>(out);
  size_t word = 16;
  while (word > element && (run_bytes % int64_t(word) != 0 || in % word != 0 || o % word != 0)) word /= 2;
  return static_cast<int>(word > element ? word : element);
}

void gather(DType dtype, const IndexShape& s, const void* input, const int64_t* indices, int64_t count,
            void* out, cudaStream_t stream, unsigned long long* first_bad = nullptr) {
  const int64_t total = s.outer * count * s.inner;
  if (total == 0) return;
  const size_t element = dtype_size(dtype);
  const int64_t run_bytes = s.inner * int64_t(element);
  const int word = gather_word(element, run_bytes, input, out);
  const IndexShape words{s.outer, s.size, run_bytes / word};  // runs of whole words
  const int64_t total_words = s.outer * count * words.inner;
  auto launch = [&](auto w) {
    using W = typename decltype(w)::type;
    launch_kernel<gather_kernel<W>>(grid_for(total_words), kThreads, 0, stream, words,
                                    static_cast<const W*>(input), indices, count, static_cast<W*>(out),
                                    first_bad);
  };
  switch (word) {
    case 1: launch(tag<raw_t<1>>{}); break;
    case 2: launch(tag<raw_t<2>>{}); break;
    case 4: launch(tag<raw_t<4>>{}); break;
    case 8: launch(tag<raw_t<8>>{}); break;
    case 16: launch(tag<raw_t<16>>{}); break;
    default: throw Error(str_cat("gather (CUDA): unsupported element size ", dtype_size(dtype)));
  }
}

// ---- scatter-add -------------------------------------------------------------------------
__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }

// A 16-bit float has no atomicAdd here (without cuda_fp16.h): swap the whole
// aligned 32-bit word, changing only our half of it, until no one else got in between.
template <class H>
__device__ void atomic_add(H* p, float v) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  unsigned int* word = reinterpret_cast<unsigned int*>(address & ~uintptr_t(3));
  const bool high = (address & 2) != 0;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    const H current{static_cast<uint16_t>(high ? assumed >> 16 : assumed & 0xffffu)};
    H sum;
    store(&sum, to_float(current) + v);
    const unsigned int replaced =
        high ? (assumed & 0xffffu) | (unsigned(sum.bits) << 16) : (assumed & 0xffff0000u) | sum.bits;
    old = atomicCAS(word, assumed, replaced);
  } while (old != assumed);
}

// A loop with a constant trip count unrolled whole: nvcc's `#pragma unroll`, and under the CUDA
// emulation g++'s, so that the emulator's access tracer sees kScatterPerLane different load
// instructions (in flight together, one round trip), as the GPU would.
#if defined(__CUDACC__)
#define MG_SCATTER_UNROLL _Pragma("unroll")
#else
#define MG_SCATTER_UNROLL _Pragma("GCC unroll 4")
#endif

// Elements of grad_out per lane: a warp adds a tile of 32 * kScatterPerLane consecutive elements,
// lane l the elements l, l + 32, l + 64, ... of it (each access a coalesced warp request).
constexpr int kScatterPerLane = 4;

// Where run `row` (= o*count + i) of grad_out goes in grad_input: (o*size + indices[i])*inner, or
// -1 when it adds nothing (see scatter_add_kernel).
__device__ __forceinline__ int64_t scatter_destination(const IndexShape& s, const int64_t* indices,
                                                       int64_t count, int64_t skip, int64_t row) {
  const int64_t o = row / count, index = indices[row - o * count];
  if (index == skip || index < 0 || index >= s.size) return -1;
  return (o * s.size + index) * s.inner;
}

// grad_input[(o*size + indices[i])*inner + j] += grad_out[e]; positions whose
// index equals `skip` (embedding's padding_idx, or -1) add nothing, and neither do (defensively)
// indices outside [0, size), which a check before, or the forward's deferred one, reports.
// A lane reads the index of its run once and again only where its next element starts another
// run: for runs of >= 32 * kScatterPerLane elements (an embedding row) that is one index load (a
// broadcast: one sector) per kScatterPerLane coalesced grad_out loads. The loads of a tile are
// issued together, then its atomics.
template <class T>
__global__ void scatter_add_kernel(IndexShape s, const T* grad_out, const int64_t* indices, int64_t count,
                                   int64_t skip, T* grad_input) {
  using A = acc_t<T>;
  constexpr int U = kScatterPerLane;
  const int64_t total = s.outer * count * s.inner;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t tile = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; tile * (32 * U) < total;
       tile += warps) {
    const int64_t first = tile * (32 * U) + lane;
    if (first >= total) continue;
    int64_t row = first / s.inner, j = first - row * s.inner;
    int64_t dest = scatter_destination(s, indices, count, skip, row);
    T* target[U];
    A value[U];
    MG_SCATTER_UNROLL
    for (int u = 0; u < U; ++u) {
      const int64_t e = first + 32 * u;
      target[u] = nullptr;
      value[u] = A(0);
      if (e < total) {
        if (j >= s.inner) {  // the run ended: the next one (or a later one, for runs under 32 elements)
          row += j / s.inner;
          j %= s.inner;
          dest = scatter_destination(s, indices, count, skip, row);
        }
        if (dest >= 0) {
          target[u] = grad_input + dest + j;
          value[u] = load(grad_out + e);
        }
      }
      j += 32;
    }
    MG_SCATTER_UNROLL
    for (int u = 0; u < U; ++u)
      if (target[u] != nullptr) atomic_add(target[u], value[u]);
  }
}

void scatter_add(DType dtype, const char* what, const IndexShape& s, const void* grad_out,
                 const int64_t* indices, int64_t count, int64_t skip, void* grad_input, cudaStream_t stream) {
  const int64_t total = s.outer * count * s.inner;
  visit_float(dtype, what, [&](auto t) {
    using T = typename decltype(t)::type;
    if (total == 0) return;
    launch_kernel<scatter_add_kernel<T>>(grid_for(total, kScatterPerLane), kThreads, 0, stream, s,
                                         static_cast<const T*>(grad_out), indices, count, skip,
                                         static_cast<T*>(grad_input));
  });
}

void check_extents(const char* what, int64_t num_embeddings, int64_t embedding_dim, int64_t count) {
  MG_CHECK(num_embeddings >= 0 && embedding_dim >= 0 && count >= 0, what,
           " (CUDA): negative extent (num_embeddings ", num_embeddings, ", embedding_dim ", embedding_dim,
           ", count ", count, ")");
}

void check_embedding_backward_args(DType dtype, int64_t num_embeddings, int64_t embedding_dim, int64_t count,
                                   int64_t padding_idx) {
  const char* what = "embedding_backward";
  check_extents(what, num_embeddings, embedding_dim, count);
  MG_CHECK(padding_idx >= -1 && padding_idx < num_embeddings, what, " (CUDA): padding_idx ", padding_idx,
           " is out of range [-1, ", num_embeddings, ")");
  MG_CHECK(is_floating(dtype), what, " (CUDA): expected a floating dtype (f32, f64, f16, bf16), got ", dtype);
}

void check_embedding_indices(cudaStream_t stream, ScratchAllocator& scratch, const char* what,
                             const int64_t* indices, int64_t count, int64_t num_embeddings) {
  const BadIndex bad = find_bad_index(stream, scratch, indices, count, num_embeddings);
  MG_CHECK(bad.position < 0, what, ": index ", bad.value, " at position ", bad.position,
           " is out of range [0, ", num_embeddings, ")");
}

void check_select_indices(cudaStream_t stream, ScratchAllocator& scratch, const IndexShape& s,
                          const int64_t* indices, int64_t count) {
  const BadIndex bad = find_bad_index(stream, scratch, indices, count, s.size);
  MG_CHECK(bad.position < 0, "index_select: index ", bad.value, " at position ", bad.position,
           " is out of range for a dimension of size ", s.size);
}

}  // namespace

void embedding_forward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* weight,
                       int64_t num_embeddings, int64_t embedding_dim, const int64_t* indices, int64_t count,
                       void* out) {
  const char* what = "embedding_forward";
  check_extents(what, num_embeddings, embedding_dim, count);
  MG_CHECK(is_floating(dtype), what, " (CUDA): expected a floating dtype (f32, f64, f16, bf16), got ", dtype);
  check_embedding_indices(stream, scratch, what, indices, count, num_embeddings);
  gather(dtype, IndexShape{1, num_embeddings, embedding_dim}, weight, indices, count, out, stream);
}

void embedding_backward(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const void* grad_out,
                        const int64_t* indices, int64_t count, int64_t embedding_dim, int64_t num_embeddings,
                        int64_t padding_idx, void* grad_weight) {
  check_embedding_backward_args(dtype, num_embeddings, embedding_dim, count, padding_idx);
  check_embedding_indices(stream, scratch, "embedding_backward", indices, count, num_embeddings);
  embedding_backward_unchecked(stream, dtype, grad_out, indices, count, embedding_dim, num_embeddings,
                               padding_idx, grad_weight);
}

void embedding_forward_deferred(cudaStream_t stream, DType dtype, const void* weight, int64_t num_embeddings,
                                int64_t embedding_dim, const int64_t* indices, int64_t count, void* out,
                                void* check_words) {
  const char* what = "embedding_forward";
  check_extents(what, num_embeddings, embedding_dim, count);
  MG_CHECK(is_floating(dtype), what, " (CUDA): expected a floating dtype (f32, f64, f16, bf16), got ", dtype);
  static_assert(kEmbeddingCheckWords == 2, "the first position with a bad index, its value");
  unsigned long long* words = static_cast<unsigned long long*>(check_words);
  // All ones: no bad position yet (any position is < 2^64 - 1).
  MG_CUDA_CHECK(cudaMemsetAsync(words, 0xff, kEmbeddingCheckWords * sizeof(unsigned long long), stream));
  if (count == 0) return;
  if (embedding_dim == 0) {  // nothing to gather, but the indices are still checked
    launch_kernel<first_bad_index_kernel>(grid_for(count), kThreads, 0, stream, indices, count,
                                          num_embeddings, words);
  } else {
    gather(dtype, IndexShape{1, num_embeddings, embedding_dim}, weight, indices, count, out, stream, words);
  }
  launch_kernel<embedding_check_finish_kernel>(1, 1, 0, stream, words, indices, count);
}

std::string embedding_index_error(const void* host_check_words, int64_t count, int64_t num_embeddings) {
  const auto* w = static_cast<const unsigned long long*>(host_check_words);
  if (w[0] >= static_cast<unsigned long long>(count)) return "";
  return str_cat("embedding: index ", static_cast<int64_t>(w[1]), " at position ", w[0],
                 " is out of range [0, ", num_embeddings,
                 "); found by the CUDA kernel, reported at the next synchronisation (as PyTorch's "
                 "device-side asserts are)");
}

void embedding_backward_unchecked(cudaStream_t stream, DType dtype, const void* grad_out,
                                  const int64_t* indices, int64_t count, int64_t embedding_dim,
                                  int64_t num_embeddings, int64_t padding_idx, void* grad_weight) {
  const char* what = "embedding_backward";
  check_embedding_backward_args(dtype, num_embeddings, embedding_dim, count, padding_idx);
  const size_t bytes = static_cast<size_t>(num_embeddings * embedding_dim) * dtype_size(dtype);
  if (bytes > 0) MG_CUDA_CHECK(cudaMemsetAsync(grad_weight, 0, bytes, stream));  // zero bits: +0.0
  scatter_add(dtype, what, IndexShape{1, num_embeddings, embedding_dim}, grad_out, indices, count,
              padding_idx, grad_weight, stream);
}

void index_select(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const IndexShape& shape,
                  const void* input, const int64_t* indices, int64_t count, void* out) {
  MG_CHECK(shape.outer >= 0 && shape.size >= 0 && shape.inner >= 0 && count >= 0,
           "index_select (CUDA): negative extent");
  check_select_indices(stream, scratch, shape, indices, count);
  gather(dtype, shape, input, indices, count, out, stream);
}

void index_add(cudaStream_t stream, ScratchAllocator& scratch, DType dtype, const IndexShape& shape,
               const void* grad_out, const int64_t* indices, int64_t count, void* grad_input) {
  MG_CHECK(shape.outer >= 0 && shape.size >= 0 && shape.inner >= 0 && count >= 0,
           "index_add (CUDA): negative extent");
  check_select_indices(stream, scratch, shape, indices, count);
  scatter_add(dtype, "index_add", shape, grad_out, indices, count, /*skip=*/-1, grad_input, stream);
}

}  // namespace mg::kernels::cuda
