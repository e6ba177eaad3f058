// Autocast: mixed precision without touching the model code.
//
// Inside an AutocastGuard, the ops that dominate the FLOPs and tolerate 16-bit
// inputs (matmul, linear, conv2d) cast their floating inputs to the autocast
// dtype (bf16 or f16) and run there with fp32 accumulation, while the ops that
// need range or precision (softmax, log_softmax, cross_entropy, layer_norm,
// sum/mean/var) cast 16-bit inputs up to f32. Everything else runs in whatever
// dtype its inputs have. The casts are ordinary autograd ops, so gradients flow
// back to the f32 parameters in f32: the "master weights" stay f32.
//
// Thread-local, like grad mode: DataParallel's replica threads each set their own.
#pragma once

#include "base/dtype.h"

namespace mg {

struct AutocastState {
  bool enabled = false;
  DType dtype = DType::bf16;
};

AutocastState autocast_state();

class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype = DType::bf16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

class Tensor;
// For the low-precision ops: `t` cast to the autocast dtype when autocast is on
// and `t` is a floating tensor of another dtype; otherwise `t` unchanged.
Tensor autocast_to_low_precision(const Tensor& t);
// For the precision-sensitive ops: a 16-bit `t` cast to f32 when autocast is on.
Tensor autocast_to_full_precision(const Tensor& t);

}  // namespace mg
