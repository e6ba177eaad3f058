// Embedding forward (gather) and backward (scatter-add) on CPU.
//
// Forward: count independent row copies of embedding_dim * sizeof(T) bytes,
// split across threads. Pure data movement: read and write count * dim
// elements, no flops. The indices are validated first, serially, so a bad
// index throws before any thread starts and before anything is written.
//
// Backward: many positions may name the same row (repeated tokens), so a naive
// parallel scatter-add would race, and an atomic one would make the float sum
// depend on thread timing. Instead we group positions by row with a counting
// sort (O(count + num_embeddings) integers: a histogram, its prefix sum, then a
// stable fill), after which each row of grad_weight is produced by exactly one
// task, summing its positions in ascending order in the compute type (float
// for halves, so repeated rows do not lose bits to 16-bit rounding) and
// storing once. The same sort-then-reduce idea is how GPU embedding backward
// avoids atomics. Traffic: read grad_out once, write grad_weight once.
#include "kernels/cpu/embedding.h"

#include <cstring>
#include <vector>

namespace mg::kernels::cpu {

namespace {

[[maybe_unused]] constexpr int64_t kEmbeddingMinParallelWork = 1 << 15;

void validate_indices(const char* what, const int64_t* indices, int64_t count, int64_t num_embeddings) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = indices[i];
    MG_CHECK(index >= 0 && index < num_embeddings, what, ": index ", index, " at position ", i,
             " is out of range [0, ", num_embeddings, ")");
  }
}

template <class T>
void gather_rows(const T* weight, int64_t dim, const int64_t* indices, int64_t count, T* out) {
#if defined(_OPENMP)
#pragma omp parallel for schedule(static) if (count * dim >= kEmbeddingMinParallelWork)
#endif
  for (int64_t i = 0; i < count; ++i)
    std::memcpy(out + i * dim, weight + indices[i] * dim, static_cast<size_t>(dim) * sizeof(T));
}

template <class T>
void scatter_add_rows(const T* grad_out, const int64_t* indices, int64_t count, int64_t dim,
                      int64_t num_embeddings, int64_t padding_idx, T* grad_weight) {
  using Acc = acc_t<T>;
  // Counting sort of positions by index: positions of row e end up in
  // order[start[e] .. start[e + 1]), in ascending position order.
  std::vector<int64_t> start(static_cast<size_t>(num_embeddings) + 1, 0);
  for (int64_t i = 0; i < count; ++i) ++start[indices[i] + 1];
  for (int64_t e = 0; e < num_embeddings; ++e) start[e + 1] += start[e];
  std::vector<int64_t> order(static_cast<size_t>(count));
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < count; ++i) order[fill[indices[i]]++] = i;

#if defined(_OPENMP)
#pragma omp parallel if (count * dim >= kEmbeddingMinParallelWork)
#endif
  {
    std::vector<Acc> sum(static_cast<size_t>(dim));  // one accumulator row per thread
#if defined(_OPENMP)
#pragma omp for schedule(dynamic, 64)
#endif
    for (int64_t e = 0; e < num_embeddings; ++e) {
      T* gw = grad_weight + e * dim;
      if (e == padding_idx || start[e] == start[e + 1]) {  // no gradient: plain zeros
        for (int64_t d = 0; d < dim; ++d) gw[d] = static_cast<T>(Acc(0));
        continue;
      }
      for (int64_t d = 0; d < dim; ++d) sum[d] = 0;
      for (int64_t k = start[e]; k < start[e + 1]; ++k) {
        const T* g = grad_out + order[k] * dim;
        for (int64_t d = 0; d < dim; ++d) sum[d] += static_cast<Acc>(g[d]);
      }
      for (int64_t d = 0; d < dim; ++d) gw[d] = static_cast<T>(sum[d]);
    }
  }
}

}  // namespace

void embedding_forward(DType dtype, const void* weight, int64_t num_embeddings, int64_t embedding_dim,
                       const int64_t* indices, int64_t count, void* out) {
  const char* what = "embedding_forward";
  MG_CHECK(num_embeddings >= 0 && embedding_dim >= 0 && count >= 0, what,
           ": negative extent (num_embeddings ", num_embeddings, ", embedding_dim ", embedding_dim,
           ", count ", count, ")");
  validate_indices(what, indices, count, num_embeddings);
  visit_floating(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_rows(static_cast<const T*>(weight), embedding_dim, indices, count, static_cast<T*>(out));
  });
}

void embedding_backward(DType dtype, const void* grad_out, const int64_t* indices, int64_t count,
                        int64_t embedding_dim, int64_t num_embeddings, int64_t padding_idx,
                        void* grad_weight) {
  const char* what = "embedding_backward";
  MG_CHECK(num_embeddings >= 0 && embedding_dim >= 0 && count >= 0, what,
           ": negative extent (num_embeddings ", num_embeddings, ", embedding_dim ", embedding_dim,
           ", count ", count, ")");
  MG_CHECK(padding_idx >= -1 && padding_idx < num_embeddings, what, ": padding_idx ", padding_idx,
           " is out of range [-1, ", num_embeddings, ")");
  validate_indices(what, indices, count, num_embeddings);
  visit_floating(dtype, what, [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_add_rows(static_cast<const T*>(grad_out), indices, count, embedding_dim, num_embeddings,
                     padding_idx, static_cast<T*>(grad_weight));
  });
}

}  // namespace mg::kernels::cpu
