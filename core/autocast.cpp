#include "core/autocast.h"

#include "core/tensor.h"

namespace mg {
namespace {
thread_local AutocastState current_state;
}

AutocastState autocast_state() { return current_state; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : previous_(current_state) {
  MG_CHECK(dtype == DType::bf16 || dtype == DType::f16,
           "AutocastGuard: the autocast dtype must be bf16 or f16, got ", dtype);
  current_state = AutocastState{enabled, dtype};
}

AutocastGuard::~AutocastGuard() { current_state = previous_; }

Tensor autocast_to_low_precision(const Tensor& t) {
  if (!current_state.enabled || !t.defined() || !is_floating(t.dtype()) || t.dtype() == current_state.dtype)
    return t;
  return t.to(current_state.dtype);
}

Tensor autocast_to_full_precision(const Tensor& t) {
  if (!current_state.enabled || !t.defined()) return t;
  if (t.dtype() == DType::f16 || t.dtype() == DType::bf16) return t.to(DType::f32);
  return t;
}

}  // namespace mg
