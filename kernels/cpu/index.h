// Gather and scatter-add of slices along one dim: the kernels behind
// index_select and its backward (index_add).
//
// The input is contiguous and viewed as [outer, size, inner]; each selected
// index copies `inner` consecutive elements (one memcpy-sized run), so the work
// is outer * count * inner elements read and written.
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// out[o, i, :] = input[o, indices[i], :]; throws naming the position and value of a bad index.
void index_select(DType dtype, const IndexShape& shape, const void* input, const int64_t* indices,
                  int64_t count, void* out);
// grad_input[o, indices[i], :] += grad_out[o, i, :]; grad_input must be zeroed by the caller.
void index_add(DType dtype, const IndexShape& shape, const void* grad_out, const int64_t* indices,
               int64_t count, void* grad_input);

}  // namespace mg::kernels::cpu
