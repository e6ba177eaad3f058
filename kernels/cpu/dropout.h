// Dropout (CPU) driven by the counter-based Philox generator (base/philox.h).
//
// Element i is kept iff philox_dropout_uniform(seed, i, call_offset) >= float(p)
// (word i % 4 of Philox block i / 4: one block serves four elements): the
// mask is a pure function of (seed, call_offset, i), so the CUDA kernel, any
// thread count, and a later recomputation all produce the same mask bit for
// bit. The comparison is float against float(p), exactly as a GPU kernel that
// receives p as a float argument would do it.
#pragma once

#include <cstdint>

#include "base/dtype.h"

namespace mg::kernels::cpu {

// y[i] = keep ? x[i] / (1 - p) : 0 and mask[i] = keep, for i < count.
// p must lie in [0, 1]; p == 1 drops everything (no division by zero).
void dropout_forward(DType dtype, const void* x, void* y, bool* mask, int64_t count, double p, uint64_t seed,
                     uint64_t call_offset);

// grad_x[i] = mask[i] ? grad_y[i] / (1 - p) : 0.
void dropout_backward(DType dtype, const void* grad_y, const bool* mask, void* grad_x, int64_t count,
                      double p);

}  // namespace mg::kernels::cpu
