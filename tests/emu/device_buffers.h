// Device buffers for the emulator's own tests: allocate, copy in, copy back (REQUIREd to work).
#pragma once

#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

template <class T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess);
  return static_cast<T*>(p);
}
template <class T>
std::vector<T> to_host(const T* d, size_t n) {
  std::vector<T> h(n);
  REQUIRE(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return h;
}
template <class T>
T* to_device(const std::vector<T>& h) {
  T* d = device_alloc<T>(h.size());
  REQUIRE(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  return d;
}
