// What the files of the emulated cuDNN share (cudnn*.cpp only). cudnn.cpp describes the design.
//
//   cudnn.cpp             the API: handles, descriptors, error strings, and the calls
//   cudnn_problem.cpp     the problem resolved from the descriptors, and the last error
//   cudnn_algorithms.cpp  the algorithms offered, their workspaces, the v7 heuristics
//   cudnn_compute.cpp     the three convolutions: checks, queueing, the arithmetic (im2col, GEMM)
#pragma once

#include <cudnn.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda_emu/elements.h"

// The opaque types cudnn.h forward-declares.
struct cudnnContext {
  int device = 0;                 // current at cudnnCreate
  cudaStream_t stream = nullptr;  // nullptr: the legacy default stream
};
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int dims[4] = {0, 0, 0, 0};  // n, c, h, w
  long long strides[4] = {0, 0, 0, 0};
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int dims[4] = {0, 0, 0, 0};  // k, c, r (height), s (width)
  long long strides[4] = {0, 0, 0, 0};
};
struct cudnnConvolutionStruct {
  bool set = false;
  int pad[2] = {0, 0}, stride[2] = {1, 1}, dilation[2] = {1, 1};
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace mg_emu::cudnn {

// ---- object registries and the last error -----------------------------------------------------
template <class T>
struct Registry {
  std::mutex mutex;
  std::unordered_set<const T*> live;
};
template <class T>
Registry<T>& registry() {
  static auto* r = new Registry<T>();
  return *r;
}
template <class T>
bool is_live(const T* p) {
  if (p == nullptr) return false;
  Registry<T>& r = registry<T>();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.live.count(p) != 0;
}
template <class T>
cudnnStatus_t create(T** out) {
  if (out == nullptr) return CUDNN_STATUS_BAD_PARAM;
  T* p = new T();
  Registry<T>& r = registry<T>();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.live.insert(p);
  *out = p;
  return CUDNN_STATUS_SUCCESS;
}
// Null is a no-op for descriptors, as in cuDNN; an unknown pointer (destroyed twice?) is refused.
template <class T>
cudnnStatus_t destroy(T* p) {
  if (p == nullptr) return CUDNN_STATUS_SUCCESS;
  Registry<T>& r = registry<T>();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (r.live.erase(p) == 0) return CUDNN_STATUS_BAD_PARAM;
  }
  delete p;
  return CUDNN_STATUS_SUCCESS;
}

// ---- the last error (cudnn_problem.cpp) ----------------------------------------------------------
extern thread_local std::string t_last_error;
// Leaves "fn: why" for cudnnGetLastErrorString and returns `status`.
cudnnStatus_t fail(const char* fn, cudnnStatus_t status, const std::string& why);

// ---- element types -----------------------------------------------------------------------------
inline bool valid_data_type(cudnnDataType_t t) {
  return int(t) >= CUDNN_DATA_FLOAT && int(t) <= CUDNN_DATA_COMPLEX_FP64;
}

// ---- the problem, resolved from the descriptors (by value: queued work keeps a copy) ----------
struct Problem {
  Elem elem = Elem::f32;
  bool f64 = false, tf32 = false, flip = false;
  int n = 0, c = 0, h = 0, w = 0;  // x (or dx)
  int k = 0, r = 0, s = 0;         // the filter
  int oh = 0, ow = 0;              // y (or dy)
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  long long xs[4] = {}, ys[4] = {}, ws[4] = {};  // element strides of x, y and the filter
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  long long crs() const { return static_cast<long long>(c) * r * s; }
  long long pixels() const { return static_cast<long long>(oh) * ow; }
};

// One spatial output size, or -1 when the dilated filter does not fit the padded input.
int output_size(int in, int pad, int filter, int dilation, int stride);
cudnnStatus_t output_dims(const char* fn, const cudnnConvolutionStruct* cd, const cudnnTensorStruct* xd,
                          const cudnnFilterStruct* wd, int out[4]);
// Checks the descriptors of one convolution (x: the input or dx, y: the output or dy).
cudnnStatus_t resolve(const char* fn, cudnnHandle_t handle, const cudnnTensorStruct* xd,
                      const cudnnFilterStruct* wd, const cudnnConvolutionStruct* cd,
                      const cudnnTensorStruct* yd, Problem* p);

// ---- algorithms (cudnn_algorithms.cpp) -----------------------------------------------------------
enum class Dir { forward, backward_data, backward_filter };

struct Algo {
  int id;
  bool workspace;  // keeps the column buffer in the caller's workspace
  cudnnDeterminism_t determinism;
  float cost;  // relative, for the heuristics' time estimate
};

// The algorithms offered, best first.
std::vector<Algo> offered(Dir d);
int algo_count(Dir d);
size_t column_bytes(const Problem& p);
// The workspace `algo` needs for p, or a failure for an algorithm not offered / out of range.
cudnnStatus_t workspace_for(const char* fn, Dir d, const Problem& p, int algo, size_t* bytes);
// What cudnnGet*Algorithm_v7 reports (a template over the direction's perf struct): the offered algorithms,
// then the rest as not supported.
template <class Perf, class AlgoEnum>
cudnnStatus_t heuristics(const char* fn, Dir d, cudnnStatus_t resolved, const Problem& p, int requested,
                         int* returned, Perf* perf) {
  if (resolved != CUDNN_STATUS_SUCCESS) return resolved;
  if (requested < 1 || returned == nullptr || perf == nullptr)
    return fail(fn, CUDNN_STATUS_BAD_PARAM,
                "requestedAlgoCount < 1, or a null returnedAlgoCount or perfResults");
  const double flops = 2.0 * p.n * p.k * double(p.crs()) * double(p.pixels());
  std::vector<Perf> list;
  std::vector<bool> listed(static_cast<size_t>(algo_count(d)), false);
  for (const Algo& a : offered(d)) {
    Perf e{};
    e.algo = static_cast<AlgoEnum>(a.id);
    e.status = CUDNN_STATUS_SUCCESS;
    e.time = static_cast<float>(flops / 1e9 * a.cost);  // a model: milliseconds at 1 TFLOP/s
    e.memory = a.workspace ? column_bytes(p) : 0;
    e.determinism = a.determinism;
    e.mathType = p.math;
    list.push_back(e);
    listed[static_cast<size_t>(a.id)] = true;
  }
  for (int id = 0; id < algo_count(d); ++id) {
    if (listed[static_cast<size_t>(id)]) continue;
    Perf e{};
    e.algo = static_cast<AlgoEnum>(id);
    e.status = CUDNN_STATUS_NOT_SUPPORTED;
    e.time = -1.0f;
    e.determinism = CUDNN_NON_DETERMINISTIC;
    e.mathType = p.math;
    list.push_back(e);
  }
  const int count = std::min<int>(requested, static_cast<int>(list.size()));
  std::copy(list.begin(), list.begin() + count, perf);
  *returned = count;
  return CUDNN_STATUS_SUCCESS;
}

// ---- the three convolutions (cudnn_compute.cpp) --------------------------------------------------
// The common part of the three convolution calls: check everything, then queue the work.
cudnnStatus_t convolve(const char* fn, Dir d, cudnnHandle_t handle, const void* alpha,
                       const cudnnTensorStruct* xd, const void* x, const cudnnFilterStruct* wd, const void* w,
                       const cudnnConvolutionStruct* cd, int algo, void* workspace, size_t workspace_bytes,
                       const void* beta, const cudnnTensorStruct* yd, const void* y, void* out);

}  // namespace mg_emu::cudnn
