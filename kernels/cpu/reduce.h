// Reductions (sum, mean, max, min, argmax, argmin, var, prod) on the CPU.
//
// Any set of ADJACENT dims of a contiguous tensor can be seen as the middle
// axis of a 3-d shape [outer, reduce, inner]: `outer` is the product of the
// sizes before them, `inner` the product of the sizes after them, and element
// (o, r, i) sits at (o * reduce + r) * inner + i. The kernel therefore needs
// no transpose; only when the reduced dims are not adjacent (sum over dims 0
// and 2 of a 3-d tensor) does the caller permute them together and make the
// result contiguous first. The output is contiguous [outer, inner].
#pragma once

#include <cstdint>

#include "base/dtype.h"
#include "kernels/kernel_args.h"

namespace mg::kernels::cpu {

// output[o, i] = op over r of input[o, r, i].
//
// dtypes:
//   Sum, Prod   any input (bool/i32/i64 accumulate in int64, f32/f16/bf16 in
//               float blocks summed in double, f64 in double); the result is
//               converted to out_dtype, which the caller chooses (PyTorch sums
//               bool/i32 into i64).
//   Mean, Var   floating input and output. Var divides by max(0, reduce -
//               correction): correction 1 is the unbiased estimate, 0 the
//               biased one. Two passes: the mean, then squared deviations.
//   Max, Min    any input, out_dtype == in_dtype. NaN propagates.
//   Argmax/min  any input, out_dtype == i64. The first index wins ties; a NaN
//               counts as larger/smaller than everything (the first NaN's
//               index is returned), like PyTorch.
// reduce == 0: Sum -> 0, Prod -> 1, Mean/Var -> NaN, Max/Min/Argmax/Argmin ->
// mg::Error (no identity).
void reduce(ReduceOp op, const ReduceShape& shape, const void* input, DType in_dtype, void* output,
            DType out_dtype, int64_t correction = 1);

}  // namespace mg::kernels::cpu
