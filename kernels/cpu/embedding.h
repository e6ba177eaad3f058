// Embedding lookup (CPU): a gather of rows of a [num_embeddings, embedding_dim]
// table by int64 indices, and its backward, a scatter-add of gradient rows.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mg::kernels::cpu {

// out[i, :] = weight[indices[i], :] for i < count. Throws mg::Error naming the
// position and the index when an index lies outside [0, num_embeddings);
// nothing is written in that case.
void embedding_forward(DType dtype, const void* weight, int64_t num_embeddings, int64_t embedding_dim,
                       const int64_t* indices, int64_t count, void* out);

// grad_weight[indices[i], :] += grad_out[i, :], with grad_weight zeroed here
// first. padding_idx >= 0 names a row that receives no gradient (-1: none).
// Deterministic: the result does not depend on the number of threads.
void embedding_backward(DType dtype, const void* grad_out, const int64_t* indices, int64_t count,
                        int64_t embedding_dim, int64_t num_embeddings, int64_t padding_idx,
                        void* grad_weight);

}  // namespace mg::kernels::cpu
