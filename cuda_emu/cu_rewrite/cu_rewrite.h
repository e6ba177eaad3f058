// The source rewrite that lets the host compiler take plain CUDA (the emulation build).
//
// g++ knows neither `kernel<<<grid, block, shared, stream>>>(args)` nor what `__shared__ float
// tile[32][33];` means: one array per block. HIPIFY solves the same problem for AMD by rewriting the
// source; so does this, on the preprocessed text of a .cu file (every header already included,
// macros expanded), just before the host compiler sees it. Two rewrites, each on one line, so every
// line keeps its number and the compiler's messages and __builtin_LINE() name the user's lines:
//
//   k<T><<<g, b, s, st>>>(x, y);          ::mg_emu::cuda_launch(k<T>, "k<T>", __PRETTY_FUNCTION__,
//                                                               g, b, s, st)(x, y);
//
//   __shared__ float tile[32][33];        auto& tile = ::mg_emu::block_shared<float[32][33], 16>(
//                                                          []{}, __builtin_FILE(), __builtin_LINE());
//   extern __shared__ float s[];          auto const s = ::mg_emu::dynamic_shared<float[]>();
//
// cuda_emu/cuda_syntax.h defines what they call: the launch (the same checks and errors as every
// launch), the per-block static arrays (poisoned at each block's start, counted against the
// shared-memory limit, and traced as shared memory by the profiler) and the dynamic one. The
// lambda `[]{}` gives each declaration a type of its own, as a __shared__ variable is one per
// declaration (and per template instantiation).
//
// A __shared__ declared at namespace scope becomes an accessor function, and the name's later
// uses in the file become calls of it. What is not rewritten, and why, is in docs/cuda-emulation.md.
#pragma once

#include <string>

namespace mg_emu::rewrite {

struct Result {
  std::string text;   // the rewritten source; line numbers unchanged
  std::string error;  // "" or what could not be rewritten (file:line: why)
  int launches = 0;   // <<<>>> launches rewritten
  int shared = 0;     // __shared__ declarations rewritten
};

// Rewrites preprocessed (or plain) CUDA C++ source. `name` is used in error messages only.
Result rewrite_cuda(const std::string& source, const std::string& name);

}  // namespace mg_emu::rewrite
