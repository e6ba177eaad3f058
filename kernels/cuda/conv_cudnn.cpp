// Conv2d through cuDNN (the interface and the numerics: kernels/cuda/conv_cudnn.h).
//
// Host code only: every kernel here is cuDNN's. Per call:
//   1. Describe the problem: x, y as NCHW tensor descriptors, w as a filter descriptor, and a
//      convolution descriptor (padding, stride, dilation, cross-correlation, float compute).
//   2. Take this thread's cuDNN handle for the current GPU and point it at the current stream.
//   3. Look the problem up in the algorithm cache. On a miss, ask cuDNN's heuristics
//      (cudnnGet*Algorithm_v7: no execution, no memory) for its ranking, keep the entries that
//      can run with our math type, append the most general algorithm as a last resort, and cache
//      that list. Every later call with the same problem skips this step.
//   4. Try the list in order: allocate the algorithm's workspace from the caching allocator,
//      set the math type, run. An algorithm whose workspace does not fit or which cuDNN
//      refuses at run time is skipped (PyTorch does the same); the first that runs moves to
//      the front of the cached list.
//
// Why heuristics and not cudnnFind (which times every algorithm)? Find runs each algorithm,
// needs scratch outputs (it would overwrite an accumulating dw) and the largest workspace any
// algorithm wants, and its choice varies from run to run with timing noise. The heuristics
// are PyTorch's default too (torch.backends.cudnn.benchmark = False); for the common 3x3 and
// 1x1 shapes they pick the implicit-GEMM kernels Find would.
//
// Cost. cuDNN's kernels do 2*N*K*C*kh*kw*OH*OW FLOPs per direction (fewer with Winograd or
// FFT) and read/write each tensor about once, against im2col's extra kh*kw-times-larger column
// buffer. The host side costs a few microseconds per call (descriptors, a map lookup under a
// mutex, one allocator round trip for the workspace).
//
// Handles. cudnnCreate is slow (it loads kernels) and a handle must not be used by two threads
// at once, so each (thread, GPU) gets one, borrowed from a process-wide pool and given back
// when the thread exits (threads that come and go reuse them instead of leaking).
#include "kernels/cuda/conv_cudnn.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <string>

#include "base/error.h"

#if defined(MG_HAS_CUDNN)
#include <cudnn.h>

#include <array>
#include <map>
#include <vector>

#include "base/cuda_check.cuh"
#include "kernels/cuda/handle_pool.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/workspace.h"
#endif

namespace mg::kernels::cuda {

// ---- selection ---------------------------------------------------------------------------------
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_backend{kUnset};
std::mutex g_backend_mutex;

std::string no_cudnn(const std::string& what) {
  return str_cat(what,
                 ": this build has no cuDNN (configure found none; see the 'multigrad: cuDNN' line of "
                 "the cmake output), so CUDA conv2d runs as im2col + GEMM");
}

ConvBackend backend_from_environment() {
  const char* env = std::getenv("MG_CUDA_CONV");
  if (env == nullptr || *env == '\0') return built_with_cudnn() ? ConvBackend::cudnn : ConvBackend::im2col;
  const std::string value = env;
  MG_CHECK(value == "cudnn" || value == "im2col", "MG_CUDA_CONV=", value,
           ": unknown conv2d backend (choices: cudnn, im2col)");
  const ConvBackend backend = value == "cudnn" ? ConvBackend::cudnn : ConvBackend::im2col;
  MG_CHECK(backend != ConvBackend::cudnn || built_with_cudnn(), no_cudnn("MG_CUDA_CONV=cudnn"));
  return backend;
}

}  // namespace

const char* conv_backend_name(ConvBackend backend) {
  return backend == ConvBackend::cudnn ? "cudnn" : "im2col";
}

ConvBackend parse_conv_backend(const std::string& name) {
  if (name == "cudnn") return ConvBackend::cudnn;
  if (name == "im2col") return ConvBackend::im2col;
  throw Error(str_cat("unknown conv2d backend '", name, "' (choices: cudnn, im2col)"));
}

bool built_with_cudnn() {
#if defined(MG_HAS_CUDNN)
  return true;
#else
  return false;
#endif
}

ConvBackend conv_backend() {
  const int now = g_backend.load(std::memory_order_acquire);
  if (now != kUnset) return static_cast<ConvBackend>(now);
  std::lock_guard<std::mutex> lock(g_backend_mutex);
  if (g_backend.load() == kUnset) g_backend.store(static_cast<int>(backend_from_environment()));
  return static_cast<ConvBackend>(g_backend.load());
}

void set_conv_backend(ConvBackend backend) {
  MG_CHECK(backend != ConvBackend::cudnn || built_with_cudnn(),
           no_cudnn("set_conv_backend(ConvBackend::cudnn)"));
  std::lock_guard<std::mutex> lock(g_backend_mutex);
  g_backend.store(static_cast<int>(backend), std::memory_order_release);
}

bool cudnn_conv2d_supported(const Conv2dGeometry& g, int64_t batch, int64_t out_channels, DType dtype) {
  if (!built_with_cudnn()) return false;
  if (dtype != DType::f32 && dtype != DType::f16 && dtype != DType::bf16) return false;
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  if (batch <= 0 || out_channels <= 0 || out_h <= 0 || out_w <= 0 || g.channels <= 0) return false;
  // cuDNN's legacy API indexes with 32-bit ints: every size and every tensor's element count.
  const int64_t largest =
      std::max({batch, out_channels, g.channels, g.height, g.width, g.kernel_h, g.kernel_w, g.pad_h, g.pad_w,
                g.stride_h, g.stride_w, g.dilation_h, g.dilation_w});
  if (largest > kMax) return false;
  const double x = double(batch) * double(g.channels) * double(g.height) * double(g.width);
  const double y = double(batch) * double(out_channels) * double(out_h) * double(out_w);
  const double w = double(out_channels) * double(g.channels) * double(g.kernel_h) * double(g.kernel_w);
  return x <= double(kMax) && y <= double(kMax) && w <= double(kMax);
}

// ---- statistics (also in builds without cuDNN, where they stay zero) ----------------------------
namespace {
std::mutex g_cache_mutex;
ConvAlgoCacheStats g_cache_stats;
}  // namespace

#if defined(MG_HAS_CUDNN)

namespace {

// ---- errors ------------------------------------------------------------------------------------
// "kernels/cuda/conv_cudnn.cpp" rather than the build machine's absolute path.
const char* short_path(const char* file) {
  const std::string f(file);
  const size_t at = f.rfind("/kernels/");
  return at == std::string::npos ? file : file + at + 1;
}

// The failing function's name (the expression up to its first parenthesis), cuDNN's name for
// the status and, since cuDNN 9, its message about the last failure.
std::string cudnn_failure(cudnnStatus_t status, const char* expr, const char* file, int line) {
  std::string call(expr);
  call = call.substr(0, call.find('('));
  std::string message =
      str_cat(short_path(file), ":", line, ": ", call, " failed: ", cudnnGetErrorString(status));
#if CUDNN_MAJOR >= 9
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0] != '\0') message += str_cat(" (", detail, ")");
#endif
  return message;
}

void cudnn_check(cudnnStatus_t status, const char* expr, const char* file, int line) {
  if (status != CUDNN_STATUS_SUCCESS) throw Error(cudnn_failure(status, expr, file, line));
}
#define MG_CUDNN_CHECK(expr) cudnn_check((expr), #expr, __FILE__, __LINE__)

// Where cuDNN itself fails, the way around it.
constexpr const char* kUseIm2colHint =
    " (MG_CUDA_CONV=im2col or set_conv_backend(ConvBackend::im2col) runs conv2d without cuDNN)";

// ---- handles: one per (host thread, physical GPU), pooled ---------------------------------------
cudnnHandle_t create_cudnn_handle() {
  cudnnHandle_t h = nullptr;
  const cudnnStatus_t status = cudnnCreate(&h);
  if (status != CUDNN_STATUS_SUCCESS)
    throw Error(cudnn_failure(status, "cudnnCreate", __FILE__, __LINE__) + kUseIm2colHint);
  return h;
}

// The physical GPU the runtime has current (the caller's DeviceGuard set it).
int current_physical_device() {
  int device = 0;
  MG_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

// This thread's handle for the current GPU.
cudnnHandle_t current_handle() {
  return pooled_handle<cudnnHandle_t, create_cudnn_handle>(current_physical_device());
}

// ---- the problem and its descriptors ------------------------------------------------------------
enum class Direction { forward = 0, backward_data = 1, backward_filter = 2 };
const char* direction_name(Direction d) {
  switch (d) {
    case Direction::forward: return "fwd";
    case Direction::backward_data: return "bwd-data";
    case Direction::backward_filter: return "bwd-filter";
  }
  return "?";
}

struct Problem {
  DType dtype = DType::f32;
  int n, c, h, w, k, kh, kw, pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w, out_h, out_w;
};

Problem make_problem(const char* what, const Conv2dGeometry& g, int64_t batch, int64_t out_channels,
                     DType dtype) {
  check_conv2d_geometry(g);
  MG_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16, what,
           ": cuDNN conv2d takes f32, f16 or bf16, got ", dtype, " (f64 convolutions run as im2col + GEMM)");
  MG_CHECK(cudnn_conv2d_supported(g, batch, out_channels, dtype), what, ": batch ", batch, ", ", g.channels,
           " -> ", out_channels, " channels, ", g.height, "x", g.width, " image, ", g.kernel_h, "x",
           g.kernel_w,
           " kernel: a size or a tensor's element count is beyond cuDNN's 32-bit indexing (or not positive)");
  auto i = [](int64_t v) { return static_cast<int>(v); };
  return Problem{dtype,           i(batch),        i(g.channels), i(g.height), i(g.width),    i(out_channels),
                 i(g.kernel_h),   i(g.kernel_w),   i(g.pad_h),    i(g.pad_w),  i(g.stride_h), i(g.stride_w),
                 i(g.dilation_h), i(g.dilation_w), i(g.out_h()),  i(g.out_w())};
}

cudnnDataType_t cudnn_dtype(DType dtype) {
  switch (dtype) {
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

// The math type asked for in the convolution descriptor. f32: FMA only (no TF32). f16: tensor
// cores. bf16: cuDNN's default, which uses tensor cores for bf16 (as PyTorch sets them).
cudnnMathType_t requested_math(DType dtype) {
  switch (dtype) {
    case DType::f16: return CUDNN_TENSOR_OP_MATH;
    case DType::bf16: return CUDNN_DEFAULT_MATH;
    default: return CUDNN_FMA_MATH;
  }
}

class TensorDescriptor {
 public:
  TensorDescriptor(cudnnDataType_t type, int n, int c, int h, int w) {
    MG_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_));
    try {
      MG_CUDNN_CHECK(cudnnSetTensor4dDescriptor(d_, CUDNN_TENSOR_NCHW, type, n, c, h, w));
    } catch (...) {
      cudnnDestroyTensorDescriptor(d_);
      throw;
    }
  }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(d_); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return d_; }

 private:
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDescriptor {
 public:
  FilterDescriptor(cudnnDataType_t type, int k, int c, int kh, int kw) {
    MG_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_));
    try {
      MG_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d_, type, CUDNN_TENSOR_NCHW, k, c, kh, kw));
    } catch (...) {
      cudnnDestroyFilterDescriptor(d_);
      throw;
    }
  }
  ~FilterDescriptor() { cudnnDestroyFilterDescriptor(d_); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  cudnnFilterDescriptor_t get() const { return d_; }

 private:
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvolutionDescriptor {
 public:
  explicit ConvolutionDescriptor(const Problem& p) {
    MG_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_));
    try {
      // Our conv2d is a cross-correlation (the kernel is not flipped), accumulated in float.
      MG_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d_, p.pad_h, p.pad_w, p.stride_h, p.stride_w,
                                                     p.dilation_h, p.dilation_w, CUDNN_CROSS_CORRELATION,
                                                     CUDNN_DATA_FLOAT));
      set_math(requested_math(p.dtype));
    } catch (...) {
      cudnnDestroyConvolutionDescriptor(d_);
      throw;
    }
  }
  ~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(d_); }
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  void set_math(cudnnMathType_t math) { MG_CUDNN_CHECK(cudnnSetConvolutionMathType(d_, math)); }
  cudnnConvolutionDescriptor_t get() const { return d_; }

 private:
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

// Everything cuDNN needs to know about one problem.
struct Descriptors {
  explicit Descriptors(const Problem& p)
      : x(cudnn_dtype(p.dtype), p.n, p.c, p.h, p.w),
        y(cudnn_dtype(p.dtype), p.n, p.k, p.out_h, p.out_w),
        w(cudnn_dtype(p.dtype), p.k, p.c, p.kh, p.kw),
        conv(p) {}
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
};

// ---- the algorithm cache -------------------------------------------------------------------------
struct Candidate {
  int algo = 0;  // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;  // bytes
};

const char* algorithm_name(Direction d, int algo) {
  static const char* const fwd[] = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
      "WINOGRAD",      "WINOGRAD_NONFUSED"};
  static const char* const bwd_data[] = {"ALGO_0",     "ALGO_1",   "FFT",
                                         "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  static const char* const bwd_filter[] = {
      "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  switch (d) {
    case Direction::forward: return algo >= 0 && algo < 8 ? fwd[algo] : "?";
    case Direction::backward_data: return algo >= 0 && algo < 6 ? bwd_data[algo] : "?";
    case Direction::backward_filter: return algo >= 0 && algo < 7 ? bwd_filter[algo] : "?";
  }
  return "?";
}

// The physical GPU, the direction and every number of the problem.
using CacheKey = std::array<int, 17>;
CacheKey cache_key(Direction d, const Problem& p) {
  return CacheKey{current_physical_device(),
                  static_cast<int>(d),
                  static_cast<int>(p.dtype),
                  p.n,
                  p.c,
                  p.h,
                  p.w,
                  p.k,
                  p.kh,
                  p.kw,
                  p.pad_h,
                  p.pad_w,
                  p.stride_h,
                  p.stride_w,
                  p.dilation_h,
                  p.dilation_w,
                  static_cast<int>(requested_math(p.dtype))};
}

std::map<CacheKey, std::vector<Candidate>>& algo_cache() {
  static auto* cache = new std::map<CacheKey, std::vector<Candidate>>();  // guarded by g_cache_mutex
  return *cache;
}

// The workspace `algo` needs with math type `math` (set on the descriptor), or false when cuDNN
// says the algorithm cannot take the problem.
bool workspace_size(Direction d, cudnnHandle_t h, Descriptors& desc, int algo, cudnnMathType_t math,
                    size_t* bytes) {
  if (cudnnSetConvolutionMathType(desc.conv.get(), math) != CUDNN_STATUS_SUCCESS) return false;
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
  switch (d) {
    case Direction::forward:
      status = cudnnGetConvolutionForwardWorkspaceSize(h, desc.x.get(), desc.w.get(), desc.conv.get(),
                                                       desc.y.get(),
                                                       static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
      break;
    case Direction::backward_data:
      status = cudnnGetConvolutionBackwardDataWorkspaceSize(
          h, desc.w.get(), desc.y.get(), desc.conv.get(), desc.x.get(),
          static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
      break;
    case Direction::backward_filter:
      status = cudnnGetConvolutionBackwardFilterWorkspaceSize(
          h, desc.x.get(), desc.y.get(), desc.conv.get(), desc.w.get(),
          static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
      break;
  }
  return status == CUDNN_STATUS_SUCCESS;
}

// cuDNN's ranking (best first) of the algorithms it can run, with the math type of each.
template <class Perf>
void collect(const Perf* perf, int count, std::vector<std::pair<int, cudnnMathType_t>>* out) {
  for (int i = 0; i < count; ++i)
    if (perf[i].status == CUDNN_STATUS_SUCCESS)
      out->emplace_back(static_cast<int>(perf[i].algo), perf[i].mathType);
}

std::vector<std::pair<int, cudnnMathType_t>> heuristic_ranking(Direction d, cudnnHandle_t h,
                                                               Descriptors& desc) {
  std::vector<std::pair<int, cudnnMathType_t>> ranked;
  int returned = 0;
  switch (d) {
    case Direction::forward: {
      std::array<cudnnConvolutionFwdAlgoPerf_t, CUDNN_CONVOLUTION_FWD_ALGO_COUNT> perf{};
      MG_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, desc.x.get(), desc.w.get(), desc.conv.get(),
                                                            desc.y.get(), int(perf.size()), &returned,
                                                            perf.data()));
      collect(perf.data(), returned, &ranked);
      break;
    }
    case Direction::backward_data: {
      std::array<cudnnConvolutionBwdDataAlgoPerf_t, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT> perf{};
      MG_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, desc.w.get(), desc.y.get(),
                                                                 desc.conv.get(), desc.x.get(),
                                                                 int(perf.size()), &returned, perf.data()));
      collect(perf.data(), returned, &ranked);
      break;
    }
    case Direction::backward_filter: {
      std::array<cudnnConvolutionBwdFilterAlgoPerf_t, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT> perf{};
      MG_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, desc.x.get(), desc.y.get(),
                                                                   desc.conv.get(), desc.w.get(),
                                                                   int(perf.size()), &returned, perf.data()));
      collect(perf.data(), returned, &ranked);
      break;
    }
  }
  return ranked;
}

// The most general algorithm of each direction (any padding, stride and dilation): the last
// resort when the heuristics offer nothing usable.
int general_algorithm(Direction d) {
  switch (d) {
    case Direction::forward: return CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    case Direction::backward_data: return CUDNN_CONVOLUTION_BWD_DATA_ALGO_0;
    case Direction::backward_filter: return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0;
  }
  return 0;
}

// Step 3 of the top comment: the candidates for this problem, from the cache or a new search.
std::vector<Candidate> candidates_for(Direction d, const Problem& p, cudnnHandle_t h, Descriptors& desc,
                                      const CacheKey& key) {
  {
    std::lock_guard<std::mutex> lock(g_cache_mutex);
    auto found = algo_cache().find(key);
    if (found != algo_cache().end()) {
      ++g_cache_stats.hits;
      return found->second;
    }
  }
  // Sanity: cuDNN's idea of the output shape is ours (Conv2dGeometry::out_h/out_w).
  int n = 0, k = 0, oh = 0, ow = 0;
  MG_CUDNN_CHECK(
      cudnnGetConvolution2dForwardOutputDim(desc.conv.get(), desc.x.get(), desc.w.get(), &n, &k, &oh, &ow));
  MG_CHECK(n == p.n && k == p.k && oh == p.out_h && ow == p.out_w,
           "cuDNN conv2d: cuDNN computes an output of [", n, ", ", k, ", ", oh, ", ", ow,
           "] where multigrad expects [", p.n, ", ", p.k, ", ", p.out_h, ", ", p.out_w, "]");
  const cudnnMathType_t wanted = requested_math(p.dtype);
  std::vector<Candidate> list;
  auto add = [&](int algo, cudnnMathType_t math) {
    // f32 runs every algorithm with FMA math whatever cuDNN reported, so never with TF32.
    if (p.dtype == DType::f32) math = CUDNN_FMA_MATH;
    for (const Candidate& c : list)
      if (c.algo == algo && c.math == math) return;
    Candidate c{algo, math, 0};
    if (workspace_size(d, h, desc, algo, math, &c.workspace)) list.push_back(c);
  };
  for (const auto& [algo, math] : heuristic_ranking(d, h, desc)) add(algo, math);
  add(general_algorithm(d), wanted);
  desc.conv.set_math(wanted);
  MG_CHECK(!list.empty(), "cuDNN conv2d ", direction_name(d), ": cuDNN offers no algorithm for batch ", p.n,
           ", ", p.c, " -> ", p.k, " channels, ", p.h, "x", p.w, " image, ", p.kh, "x", p.kw, " kernel, ",
           p.dtype);
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  ++g_cache_stats.searches;
  algo_cache()[key] = list;
  return list;
}

// `winner` ran where the candidates before it did not: later calls try it first.
void promote(const CacheKey& key, const Candidate& winner) {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  auto found = algo_cache().find(key);
  if (found == algo_cache().end()) return;
  std::vector<Candidate>& list = found->second;
  for (size_t i = 1; i < list.size(); ++i) {
    if (list[i].algo == winner.algo && list[i].math == winner.math) {
      const Candidate c = list[i];
      list.erase(list.begin() + static_cast<std::ptrdiff_t>(i));
      list.insert(list.begin(), c);
      return;
    }
  }
}

// The buffers of one call. alpha = 1; beta = 0 overwrites the output (cuDNN does not read it
// then), beta = 1 adds to it. Scaling factors are float for float, half and bfloat16 data.
struct Buffers {
  const void* x = nullptr;
  const void* w = nullptr;
  const void* y = nullptr;  // y (forward output) or dy
  void* out = nullptr;      // y, dx or dw
  float beta = 0.0f;
};

cudnnStatus_t execute(Direction d, cudnnHandle_t h, const Descriptors& desc, const Candidate& c,
                      void* workspace, const Buffers& b) {
  const float alpha = 1.0f;
  switch (d) {
    case Direction::forward:
      return cudnnConvolutionForward(h, &alpha, desc.x.get(), b.x, desc.w.get(), b.w, desc.conv.get(),
                                     static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), workspace, c.workspace,
                                     &b.beta, desc.y.get(), b.out);
    case Direction::backward_data:
      return cudnnConvolutionBackwardData(h, &alpha, desc.w.get(), b.w, desc.y.get(), b.y, desc.conv.get(),
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), workspace,
                                          c.workspace, &b.beta, desc.x.get(), b.out);
    case Direction::backward_filter:
      return cudnnConvolutionBackwardFilter(h, &alpha, desc.x.get(), b.x, desc.y.get(), b.y, desc.conv.get(),
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), workspace,
                                            c.workspace, &b.beta, desc.w.get(), b.out);
  }
  return CUDNN_STATUS_BAD_PARAM;
}

// Steps 1-4 of the top comment for one direction.
void run(cudaStream_t stream, ScratchAllocator& scratch, Direction d, const char* what,
         const Conv2dGeometry& g, DType dtype, int64_t batch, int64_t out_channels, const Buffers& buffers) {
  const Problem p = make_problem(what, g, batch, out_channels, dtype);
  MG_CHECK(buffers.out != nullptr && buffers.y != nullptr &&
               (buffers.x != nullptr || d == Direction::backward_data) &&
               (buffers.w != nullptr || d == Direction::backward_filter),
           what, ": null buffer");
  Descriptors desc(p);
  cudnnHandle_t h = current_handle();
  MG_CUDNN_CHECK(cudnnSetStream(h, stream));
  const CacheKey key = cache_key(d, p);
  const std::vector<Candidate> list = candidates_for(d, p, h, desc, key);
  std::string tried;
  for (size_t i = 0; i < list.size(); ++i) {
    const Candidate& c = list[i];
    try {
      Workspace workspace(scratch, c.workspace);
      desc.conv.set_math(c.math);
      const cudnnStatus_t status = execute(d, h, desc, c, workspace.get(), buffers);
      if (status == CUDNN_STATUS_SUCCESS) {
        if (i > 0) promote(key, c);
        return;
      }
      tried +=
          str_cat("\n  ", algorithm_name(d, c.algo), ": ", cudnn_failure(status, what, __FILE__, __LINE__));
    } catch (const Error& e) {  // the workspace did not fit: try an algorithm that needs less
      tried += str_cat("\n  ", algorithm_name(d, c.algo), " (workspace ", c.workspace, " bytes): ", e.what());
    }
  }
  throw Error(str_cat(what, ": no cuDNN algorithm could run batch ", p.n, ", ", p.c, " -> ", p.k,
                      " channels, ", p.h, "x", p.w, " image, ", p.kh, "x", p.kw, " kernel, ", dtype,
                      kUseIm2colHint, ". Tried:", tried));
}

}  // namespace

ConvAlgoCacheStats conv_algo_cache_stats() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  ConvAlgoCacheStats s = g_cache_stats;
  s.entries = static_cast<int64_t>(algo_cache().size());
  return s;
}

void clear_conv_algo_cache() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  algo_cache().clear();
  g_cache_stats = ConvAlgoCacheStats{};
}

void cudnn_conv2d_forward(cudaStream_t stream, ScratchAllocator& scratch, const Conv2dGeometry& g,
                          DType dtype, int64_t batch, int64_t out_channels, const void* x, const void* w,
                          const void* bias, void* y) {
  Buffers b;
  b.x = x, b.w = w, b.y = y, b.out = y, b.beta = 0.0f;
  run(stream, scratch, Direction::forward, "cudnn_conv2d_forward", g, dtype, batch, out_channels, b);
  if (bias == nullptr) return;
  // y += bias broadcast over [N, K, OH*OW] (stride 0 over N and the pixels), in place, with the
  // framework's own axpby: the kernel that adds the bias on the im2col path, so both round alike.
  const int64_t pixels = g.out_h() * g.out_w();
  StridedView y_view, bias_view;
  y_view.data = y, y_view.dtype = dtype, y_view.ndim = 3;
  y_view.shape = {batch, out_channels, pixels};
  y_view.strides = {out_channels * pixels, pixels, 1};
  bias_view = y_view;
  bias_view.data = const_cast<void*>(bias);
  bias_view.strides = {0, 1, 0};
  axpby(stream, y_view, 1.0, bias_view, y_view);
}

void cudnn_conv2d_backward_data(cudaStream_t stream, ScratchAllocator& scratch, const Conv2dGeometry& g,
                                DType dtype, int64_t batch, int64_t out_channels, const void* dy,
                                const void* w, void* dx) {
  Buffers b;
  b.w = w, b.y = dy, b.out = dx, b.beta = 0.0f;
  run(stream, scratch, Direction::backward_data, "cudnn_conv2d_backward_data", g, dtype, batch, out_channels,
      b);
}

void cudnn_conv2d_backward_filter(cudaStream_t stream, ScratchAllocator& scratch, const Conv2dGeometry& g,
                                  DType dtype, int64_t batch, int64_t out_channels, const void* x,
                                  const void* dy, void* dw, bool accumulate) {
  Buffers b;
  b.x = x, b.y = dy, b.out = dw, b.beta = accumulate ? 1.0f : 0.0f;
  run(stream, scratch, Direction::backward_filter, "cudnn_conv2d_backward_filter", g, dtype, batch,
      out_channels, b);
}

std::string cudnn_conv2d_algorithms(const Conv2dGeometry& g, int64_t batch, int64_t out_channels,
                                    DType dtype) {
  const Problem p = make_problem("cudnn_conv2d_algorithms", g, batch, out_channels, dtype);
  Descriptors desc(p);
  cudnnHandle_t h = current_handle();
  std::string text;
  for (Direction d : {Direction::forward, Direction::backward_data, Direction::backward_filter}) {
    const std::vector<Candidate> list = candidates_for(d, p, h, desc, cache_key(d, p));
    desc.conv.set_math(requested_math(p.dtype));
    text += str_cat(text.empty() ? "" : ", ", direction_name(d), " ", algorithm_name(d, list.front().algo));
  }
  return text;
}

#endif  // MG_HAS_CUDNN

#if !defined(MG_HAS_CUDNN)

ConvAlgoCacheStats conv_algo_cache_stats() {
  std::lock_guard<std::mutex> lock(g_cache_mutex);
  return g_cache_stats;
}
void clear_conv_algo_cache() {}

void cudnn_conv2d_forward(cudaStream_t, ScratchAllocator&, const Conv2dGeometry&, DType, int64_t, int64_t,
                          const void*, const void*, const void*, void*) {
  throw Error(no_cudnn("cudnn_conv2d_forward"));
}
void cudnn_conv2d_backward_data(cudaStream_t, ScratchAllocator&, const Conv2dGeometry&, DType, int64_t,
                                int64_t, const void*, const void*, void*) {
  throw Error(no_cudnn("cudnn_conv2d_backward_data"));
}
void cudnn_conv2d_backward_filter(cudaStream_t, ScratchAllocator&, const Conv2dGeometry&, DType, int64_t,
                                  int64_t, const void*, const void*, void*, bool) {
  throw Error(no_cudnn("cudnn_conv2d_backward_filter"));
}
std::string cudnn_conv2d_algorithms(const Conv2dGeometry&, int64_t, int64_t, DType) {
  throw Error(no_cudnn("cudnn_conv2d_algorithms"));
}

#endif  // !MG_HAS_CUDNN

}  // namespace mg::kernels::cuda
