// StridedView: what a kernel sees of a tensor. A raw pointer (already offset to
// the first element), a dtype, and up to kMaxDims sizes and element strides.
// Kernels include this header, never tensor.h, so each kernel file can be read,
// tested and benchmarked on its own.
#pragma once

#include <array>
#include <cstdint>

#include "base/dtype.h"

namespace mg {

constexpr int kMaxDims = 8;

struct StridedView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements, may be 0 (broadcast)

  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int i = ndim - 1; i >= 0; --i) {
      if (shape[i] != 1 && strides[i] != expected) return false;
      expected *= shape[i];
    }
    return true;
  }
  template <class T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
};

// Walks the elements of an n-d shape in row-major order, keeping a running
// element offset for each of N strided operands. This is the CPU kernels'
// generic (non-contiguous, broadcasting) path: one add per operand per element,
// with a carry into outer dims only when an inner dim wraps.
template <int N>
struct StridedIndexer {
  int ndim;
  std::array<int64_t, kMaxDims> shape;
  std::array<std::array<int64_t, kMaxDims>, N> strides;
  std::array<int64_t, kMaxDims> index{};
  std::array<int64_t, N> offset{};

  StridedIndexer(const StridedView& iteration_shape, const std::array<const StridedView*, N>& operands)
      : ndim(iteration_shape.ndim), shape(iteration_shape.shape) {
    for (int k = 0; k < N; ++k) strides[k] = operands[k]->strides;
  }
  // Positions the walk at linear element `linear` (lets threads start mid-way).
  void seek(int64_t linear) {
    offset.fill(0);
    for (int d = ndim - 1; d >= 0; --d) {
      index[d] = shape[d] == 0 ? 0 : linear % shape[d];
      linear = shape[d] == 0 ? 0 : linear / shape[d];
      for (int k = 0; k < N; ++k) offset[k] += index[d] * strides[k][d];
    }
  }
  void next() {
    for (int d = ndim - 1; d >= 0; --d) {
      ++index[d];
      for (int k = 0; k < N; ++k) offset[k] += strides[k][d];
      if (index[d] < shape[d]) return;
      for (int k = 0; k < N; ++k) offset[k] -= strides[k][d] * shape[d];
      index[d] = 0;
    }
  }
};

}  // namespace mg
