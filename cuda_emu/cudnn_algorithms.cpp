// The emulated cuDNN's algorithms. Forward offers IMPLICIT_PRECOMP_GEMM (then IMPLICIT_GEMM,
// GEMM), backward data and backward filter ALGO_1 (then ALGO_0); those with a workspace keep one
// image's column buffer there. All compute the same numbers; the v7 heuristics list them best
// first, and the others as CUDNN_STATUS_NOT_SUPPORTED.
#include <algorithm>
#include <cstdio>
#include <string>

#include "cuda_emu/cudnn_internal.h"

namespace mg_emu::cudnn {

// The algorithms offered, best first.
std::vector<Algo> offered(Dir d) {
  switch (d) {
    case Dir::forward:
      return {{CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, true, CUDNN_DETERMINISTIC, 1.0f},
              {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, false, CUDNN_DETERMINISTIC, 1.4f},
              {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, true, CUDNN_DETERMINISTIC, 1.8f}};
    case Dir::backward_data:
      return {{CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, true, CUDNN_DETERMINISTIC, 1.0f},
              {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, false, CUDNN_NON_DETERMINISTIC, 1.5f}};
    case Dir::backward_filter:
      return {{CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, true, CUDNN_DETERMINISTIC, 1.0f},
              {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, false, CUDNN_NON_DETERMINISTIC, 1.5f}};
  }
  return {};
}

int algo_count(Dir d) {
  switch (d) {
    case Dir::forward: return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Dir::backward_data: return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case Dir::backward_filter: return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
  return 0;
}

size_t column_bytes(const Problem& p) {
  return static_cast<size_t>(p.crs()) * static_cast<size_t>(p.pixels()) *
         (p.f64 ? sizeof(double) : sizeof(float));
}

// The workspace `algo` needs for p, or a failure for an algorithm not offered / out of range.
cudnnStatus_t workspace_for(const char* fn, Dir d, const Problem& p, int algo, size_t* bytes) {
  if (algo < 0 || algo >= algo_count(d))
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "algorithm " + std::to_string(algo) + " is not in the enumeration");
  for (const Algo& a : offered(d))
    if (a.id == algo) {
      *bytes = a.workspace ? column_bytes(p) : 0;
      return CUDNN_STATUS_SUCCESS;
    }
  return fail(fn, CUDNN_STATUS_NOT_SUPPORTED, "algorithm " + std::to_string(algo) + " is not available here");
}

}  // namespace mg_emu::cudnn
