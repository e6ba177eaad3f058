// The cuBLAS entry points multigrad calls, emulated on the host (build mode -DMG_CUDA=EMULATE).
//
// What is emulated. Handles (cublasCreate/Destroy, Set/GetStream, SetWorkspace, Set/GetMathMode),
// the status strings, and GEMM: cublasGemmEx and cublasGemmStridedBatchedEx, column-major as
// cuBLAS documents them: C = alpha op(A) op(B) + beta C with op = N, T or C (C is T for real
// data), leading dimensions in elements, batch strides in elements (0 reuses one matrix, negative
// strides are allowed). Types, with the compute types that take them:
//   CUBLAS_COMPUTE_32F, _32F_PEDANTIC, _32F_EMULATED_16BFX9: A = B = C = R_32F, or A = B = R_16F
//       or R_16BF with C of the same type or R_32F. Inputs become float, products accumulate in
//       float, the result is rounded to C's type (round to nearest even). With the handle's math
//       mode CUBLAS_TF32_TENSOR_OP_MATH, 32F compute of f32 data rounds the inputs to TF32.
//   CUBLAS_COMPUTE_32F_FAST_TF32 / _FAST_16BF / _FAST_16F: A = B = C = R_32F; the inputs are
//       rounded to TF32 (10 mantissa bits, to nearest, as cvt.rna.tf32), bf16 or f16 first, the
//       way the tensor-core kernels these allow would see them.
//   CUBLAS_COMPUTE_64F, _64F_PEDANTIC, _64F_EMULATED_FIXEDPOINT: A = B = C = R_64F, double sums.
// Anything else (16F or 32I compute, int8, complex) returns CUBLAS_STATUS_NOT_SUPPORTED.
// alpha and beta are host scalars (CUBLAS_POINTER_MODE_HOST, the only mode here) of the compute
// type's scale type, float or double, read at the call. beta == 0 never reads C (it may hold NaN);
// alpha == 0 or k == 0 never reads A or B (then C = beta C).
//
// What is checked, on the caller's thread, before anything is queued, with cuBLAS's own codes:
//   CUBLAS_STATUS_NOT_INITIALIZED  a null handle or one not (or no longer) made by cublasCreate;
//   CUBLAS_STATUS_INVALID_VALUE    m, n, k or batchCount < 0; transa/transb not N, T or C;
//                                  lda < max(1, rows of A as stored), ldb likewise, ldc < max(1, m);
//                                  null alpha or beta; a matrix that is not device memory over the
//                                  extent the call touches (an emulation check: cuBLAS would fault);
//                                  cublasSetWorkspace with host memory or a pointer not 256-aligned;
//   CUBLAS_STATUS_NOT_SUPPORTED    a type / compute-type combination above does not list, or an
//                                  unknown algo;
//   CUBLAS_STATUS_EXECUTION_FAILED the handle's stream no longer exists, or belongs to another
//                                  device than the one current at cublasCreate (the launch fails).
// Every failure of a GEMM or of cublasSetWorkspace also prints one line "cuda_emu: <function>:
// <why>" to stderr: cuBLAS itself says nothing, but the user needs to know.
//
// Execution. The product runs in mg_emu::enqueue on the handle's stream, in order with the rest
// of that stream's work, reading and writing the (host-backed) device memory directly. Per batch
// entry: op(A) is converted and packed into a contiguous m x k panel of the accumulation type
// (kept in the handle's workspace when cublasSetWorkspace gave one large enough, the way cuBLAS
// keeps its split-K partials there, so a workspace shared by two streams at once shows up as
// wrong numbers), then C is produced four columns at a time: pack those columns of op(B), and
// for each p add op(B)[p, j] * A[:, p] down the four accumulator columns (one pass over the
// panel feeds four columns; the inner loop is contiguous and vectorises). No threads of its own.
//
// As in cuBLAS, cublasSetStream resets the workspace to the library's default (so a workspace
// must be set again after every cublasSetStream), and cublasDestroy does not free or touch what
// is still queued (queued work holds copies of everything it needs). cublasGetStatusName gives the
// enumerator's name, cublasGetStatusString cuBLAS's one-line description of it.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "cuda_emu/axpy.h"
#include "cuda_emu/elements.h"
#include "cuda_emu/runtime_internal.h"
#include "cuda_emu/trace.h"

// The opaque handle type cublas_api.h forward-declares.
struct cublasContext {
  int device = 0;                 // current at cublasCreate
  cudaStream_t stream = nullptr;  // cublasSetStream; nullptr: the legacy default stream
  void* workspace = nullptr;      // cublasSetWorkspace; reset by cublasSetStream
  size_t workspace_bytes = 0;
  cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

using mg_emu::axpy1;
using mg_emu::axpy4;
using mg_emu::bf16_to_float;
using mg_emu::Elem;
using mg_emu::elem_bytes;
using mg_emu::float_to_bf16;
using mg_emu::float_to_half;
using mg_emu::half_to_float;
using mg_emu::load;
using mg_emu::store;
using mg_emu::to_tf32;

namespace {

// ---- live handles ------------------------------------------------------------------------------
std::mutex g_handles_mutex;
std::unordered_set<const cublasContext*>& live_handles() {
  static auto* handles = new std::unordered_set<const cublasContext*>();  // guarded by the mutex
  return *handles;
}

bool is_live(cublasHandle_t h) {
  if (h == nullptr) return false;
  std::lock_guard<std::mutex> lock(g_handles_mutex);
  return live_handles().count(h) != 0;
}

cublasStatus_t fail(const char* fn, cublasStatus_t status, const std::string& why) {
  std::fprintf(stderr, "cuda_emu: %s: %s\n", fn, why.c_str());
  return status;
}

// ---- element types and rounding ----------------------------------------------------------------

bool elem_of(cudaDataType t, Elem* e) {
  switch (t) {
    case CUDA_R_32F: *e = Elem::f32; return true;
    case CUDA_R_64F: *e = Elem::f64; return true;
    case CUDA_R_16F: *e = Elem::f16; return true;
    case CUDA_R_16BF: *e = Elem::bf16; return true;
    default: return false;
  }
}

// How the 32F compute types may see their f32 inputs.
enum class InputRounding { none, tf32, bf16, f16 };

float round_input(float v, InputRounding r) {
  switch (r) {
    case InputRounding::none: return v;
    case InputRounding::tf32: return to_tf32(v);
    case InputRounding::bf16: return bf16_to_float(float_to_bf16(v));
    case InputRounding::f16: return half_to_float(float_to_half(v));
  }
  return v;
}

// Element i of an array of type e, as the accumulation type.

// ---- the product -------------------------------------------------------------------------------
struct Operand {
  const void* data = nullptr;
  bool trans = false;  // op is T (or C: the same for real data)
  int ld = 1;
  long long stride = 0;  // between batch entries, in elements
};

// Everything the queued work needs, by value (the caller's handle may be gone when it runs).
struct Gemm {
  int m = 0, n = 0, k = 0, batch = 0;
  Elem in = Elem::f32, out = Elem::f32;
  Operand a, b;
  void* c = nullptr;
  int ldc = 1;
  long long stride_c = 0;
  bool f64 = false;  // double accumulation (64F compute), else float
  InputRounding rounding = InputRounding::none;
  double alpha = 1, beta = 0;  // exact copies of the float or double scalars
  void* workspace = nullptr;   // the handle's workspace at the call, or null
  size_t workspace_bytes = 0;
};

// out[i + p m] = op(A)[i, p] of batch entry `e`, converted (and rounded) to Acc.
template <class Acc>
void pack_a(const Gemm& g, long long e, Acc* out) {
  const void* a = g.a.data;
  const long long base = e * g.a.stride;
  for (int p = 0; p < g.k; ++p) {
    Acc* col = out + static_cast<size_t>(p) * g.m;
    for (int i = 0; i < g.m; ++i) {
      const long long at = g.a.trans ? base + p + static_cast<long long>(i) * g.a.ld
                                     : base + i + static_cast<long long>(p) * g.a.ld;
      col[i] = load<Acc>(g.in, a, at);
    }
  }
  if (g.rounding != InputRounding::none)
    for (size_t i = 0, n = static_cast<size_t>(g.m) * g.k; i < n; ++i)
      out[i] = Acc(round_input(float(out[i]), g.rounding));
}

// out[p + jj k] = op(B)[p, j0 + jj] of batch entry `e` for jj < cols.
template <class Acc>
void pack_b(const Gemm& g, long long e, int j0, int cols, Acc* out) {
  const long long base = e * g.b.stride;
  for (int jj = 0; jj < cols; ++jj) {
    const long long j = j0 + jj;
    for (int p = 0; p < g.k; ++p) {
      const long long at = g.b.trans ? base + j + static_cast<long long>(p) * g.b.ld : base + p + j * g.b.ld;
      Acc v = load<Acc>(g.in, g.b.data, at);
      if (g.rounding != InputRounding::none) v = Acc(round_input(float(v), g.rounding));
      out[p + static_cast<size_t>(jj) * g.k] = v;
    }
  }
}

// C[:, j0 .. j0+cols) of batch entry e = alpha acc + beta C (C unread when beta == 0).
template <class Acc>
void write_columns(const Gemm& g, long long e, int j0, int cols, const Acc* acc) {
  const Acc alpha = Acc(g.alpha), beta = Acc(g.beta);
  for (int jj = 0; jj < cols; ++jj) {
    const long long col = e * g.stride_c + static_cast<long long>(j0 + jj) * g.ldc;
    const Acc* src = acc + static_cast<size_t>(jj) * g.m;
    for (int i = 0; i < g.m; ++i) {
      Acc v = alpha * src[i];
      if (g.beta != 0) v += beta * load<Acc>(g.out, g.c, col + i);
      store<Acc>(g.out, g.c, col + i, v);
    }
  }
}

// C = beta C for every batch entry (alpha == 0 or k == 0: A and B are not read).
template <class Acc>
void scale_c(const Gemm& g) {
  const Acc beta = Acc(g.beta);
  for (long long e = 0; e < g.batch; ++e)
    for (int j = 0; j < g.n; ++j) {
      const long long col = e * g.stride_c + static_cast<long long>(j) * g.ldc;
      for (int i = 0; i < g.m; ++i)
        store<Acc>(g.out, g.c, col + i, g.beta == 0 ? Acc(0) : beta * load<Acc>(g.out, g.c, col + i));
    }
}

template <class Acc>
void run_gemm(const Gemm& g) {
  if (g.alpha == 0 || g.k == 0) return scale_c<Acc>(g);
  const size_t panel = static_cast<size_t>(g.m) * g.k;
  std::vector<Acc> own_panel;
  Acc* a = nullptr;
  if (g.workspace != nullptr && g.workspace_bytes >= panel * sizeof(Acc)) {
    a = static_cast<Acc*>(g.workspace);
  } else {
    own_panel.resize(panel);
    a = own_panel.data();
  }
  std::vector<Acc> b(static_cast<size_t>(g.k) * 4), acc(static_cast<size_t>(g.m) * 4);
  for (long long e = 0; e < g.batch; ++e) {
    if (e == 0 || g.a.stride != 0) pack_a<Acc>(g, e, a);  // a batch stride of 0: one A for all
    for (int j0 = 0; j0 < g.n; j0 += 4) {
      const int cols = g.n - j0 < 4 ? g.n - j0 : 4;
      pack_b<Acc>(g, e, j0, cols, b.data());
      std::fill(acc.begin(), acc.end(), Acc(0));
      Acc* c0 = acc.data();
      for (int p = 0; p < g.k; ++p) {
        const Acc* col = a + static_cast<size_t>(p) * g.m;
        if (cols == 4) {
          axpy4<Acc>(g.m, col, b[p], b[p + g.k], b[p + 2 * size_t(g.k)], b[p + 3 * size_t(g.k)], c0, c0 + g.m,
                     c0 + 2 * size_t(g.m), c0 + 3 * size_t(g.m));
        } else {
          for (int jj = 0; jj < cols; ++jj)
            axpy1<Acc>(g.m, col, b[p + size_t(jj) * g.k], c0 + size_t(jj) * g.m);
        }
      }
      write_columns<Acc>(g, e, j0, cols, acc.data());
    }
  }
}

// ---- argument checks ---------------------------------------------------------------------------
bool valid_op(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

bool known_algo(cublasGemmAlgo_t algo) {
  const int a = static_cast<int>(algo);
  return (a >= CUBLAS_GEMM_DEFAULT && a <= CUBLAS_GEMM_ALGO23) ||
         (a >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && a <= CUBLAS_GEMM_ALGO15_TENSOR_OP) ||
         a == CUBLAS_GEMM_AUTOTUNE;
}

const char* type_name(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    default: return "a type this emulation does not take";
  }
}

// Fills g.in/out/f64/rounding for a supported combination; else the reason in *why.
bool choose_types(cudaDataType at, cudaDataType bt, cudaDataType ct, cublasComputeType_t compute,
                  cublasMath_t math, Gemm* g, std::string* why) {
  Elem a, b, c;
  *why = std::string("Atype ") + type_name(at) + ", Btype " + type_name(bt) + ", Ctype " + type_name(ct) +
         " with compute type " + std::to_string(int(compute)) +
         " is not a combination cuBLAS (as emulated) takes";
  if (!elem_of(at, &a) || !elem_of(bt, &b) || !elem_of(ct, &c) || a != b) return false;
  g->in = a, g->out = c;
  switch (compute) {
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
      if (a == Elem::f64 || (a == Elem::f32 && c != Elem::f32) || (c != a && c != Elem::f32)) return false;
      g->f64 = false;
      if (compute == CUBLAS_COMPUTE_32F && a == Elem::f32 && (math & 0xf) == CUBLAS_TF32_TENSOR_OP_MATH)
        g->rounding = InputRounding::tf32;
      return true;
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_16F:
      if (a != Elem::f32 || c != Elem::f32) return false;
      g->f64 = false;
      g->rounding = compute == CUBLAS_COMPUTE_32F_FAST_TF32   ? InputRounding::tf32
                    : compute == CUBLAS_COMPUTE_32F_FAST_16BF ? InputRounding::bf16
                                                              : InputRounding::f16;
      return true;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT:
      if (a != Elem::f64 || c != Elem::f64) return false;
      g->f64 = true;
      return true;
    default:
      *why = "compute type " + std::to_string(int(compute)) + " (16F, 32I or unknown) is not emulated";
      return false;
  }
}

// The bytes `batch` matrices of rows x cols (leading dimension ld, batch stride `stride`, all in
// elements) occupy, from *first (relative to the first matrix, negative for a negative stride);
// false when that overflows.
bool batched_extent(long long rows, long long cols, long long ld, long long stride, long long batch,
                    size_t elem, long long* first, size_t* bytes) {
  const double span = double(cols - 1) * double(ld) + double(rows);
  const double reach = double(batch - 1) * double(stride);
  const double lo = reach < 0 ? reach : 0, hi = (reach > 0 ? reach : 0) + span;
  if ((hi - lo) * double(elem) > 9e18) return false;
  *first = static_cast<long long>(lo) * static_cast<long long>(elem);
  *bytes = static_cast<size_t>(static_cast<long long>(hi - lo)) * elem;
  return true;
}

// Whether every element the call touches of this operand is device memory; else the reason.
bool on_device(const char* name, const void* p, long long rows, long long cols, long long ld,
               long long stride, long long batch, size_t elem, std::string* why) {
  long long first = 0;
  size_t bytes = 0;
  const bool sized = batched_extent(rows, cols, ld, stride, batch, elem, &first, &bytes);
  if (sized && p != nullptr && mg_emu::is_device_range(static_cast<const char*>(p) + first, bytes))
    return true;
  char text[320];
  std::snprintf(text, sizeof text,
                "matrix %s (%p: %lld x %lld, leading dimension %lld, batch stride %lld, batch count %lld, "
                "%zu-byte elements) is not device memory over the %s bytes the call touches",
                name, p, rows, cols, ld, stride, batch, elem,
                sized ? std::to_string(bytes).c_str() : "2^63+");
  *why = text;
  return false;
}

cublasStatus_t gemm(const char* fn, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                    int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype, int lda,
                    long long strideA, const void* B, cudaDataType Btype, int ldb, long long strideB,
                    const void* beta, void* C, cudaDataType Ctype, int ldc, long long strideC, int batch,
                    cublasComputeType_t compute, cublasGemmAlgo_t algo) {
  if (!is_live(handle))
    return fail(fn, CUBLAS_STATUS_NOT_INITIALIZED,
                "the handle is null or not one cublasCreate made (destroyed?)");
  if (!valid_op(transa) || !valid_op(transb))
    return fail(fn, CUBLAS_STATUS_INVALID_VALUE,
                "transa/transb must be CUBLAS_OP_N, CUBLAS_OP_T or CUBLAS_OP_C");
  if (m < 0 || n < 0 || k < 0 || batch < 0)
    return fail(fn, CUBLAS_STATUS_INVALID_VALUE,
                "negative size: m=" + std::to_string(m) + ", n=" + std::to_string(n) +
                    ", k=" + std::to_string(k) + ", batchCount=" + std::to_string(batch));
  const bool ta = transa != CUBLAS_OP_N, tb = transb != CUBLAS_OP_N;
  const int a_rows = ta ? k : m, b_rows = tb ? n : k;
  auto at_least_1 = [](int v) { return v > 1 ? v : 1; };
  if (lda < at_least_1(a_rows) || ldb < at_least_1(b_rows) || ldc < at_least_1(m))
    return fail(fn, CUBLAS_STATUS_INVALID_VALUE,
                "leading dimension too small: lda=" + std::to_string(lda) + " (needs >= max(1, " +
                    std::to_string(a_rows) + ")), ldb=" + std::to_string(ldb) + " (needs >= max(1, " +
                    std::to_string(b_rows) + ")), ldc=" + std::to_string(ldc) + " (needs >= max(1, " +
                    std::to_string(m) + "))");
  if (!known_algo(algo))
    return fail(fn, CUBLAS_STATUS_NOT_SUPPORTED, "unknown algo " + std::to_string(int(algo)));
  Gemm g;
  std::string why;
  if (!choose_types(Atype, Btype, Ctype, compute, handle->math, &g, &why))
    return fail(fn, CUBLAS_STATUS_NOT_SUPPORTED, why);
  if (alpha == nullptr || beta == nullptr)
    return fail(fn, CUBLAS_STATUS_INVALID_VALUE, "alpha or beta is a null pointer");
  // Host scalars of the scale type, read now (the caller may reuse them once the call returns).
  g.alpha = g.f64 ? *static_cast<const double*>(alpha) : double(*static_cast<const float*>(alpha));
  g.beta = g.f64 ? *static_cast<const double*>(beta) : double(*static_cast<const float*>(beta));
  if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;

  const int device = mg_emu::stream_device(handle->stream);
  if (device < 0)
    return fail(fn, CUBLAS_STATUS_EXECUTION_FAILED, "the handle's stream does not exist (destroyed?)");
  if (device != handle->device)
    return fail(fn, CUBLAS_STATUS_EXECUTION_FAILED,
                "the handle was created on device " + std::to_string(handle->device) +
                    " but its stream runs on device " + std::to_string(device));
  const size_t in_bytes = elem_bytes(g.in);
  if (!on_device("C", C, m, n, ldc, strideC, batch, elem_bytes(g.out), &why))
    return fail(fn, CUBLAS_STATUS_INVALID_VALUE, why);
  if (k > 0 && g.alpha != 0) {
    if (!on_device("A", A, a_rows, ta ? m : k, lda, strideA, batch, in_bytes, &why) ||
        !on_device("B", B, b_rows, tb ? k : n, ldb, strideB, batch, in_bytes, &why))
      return fail(fn, CUBLAS_STATUS_INVALID_VALUE, why);
  }
  g.m = m, g.n = n, g.k = k, g.batch = batch;
  g.a = Operand{A, ta, lda, strideA};
  g.b = Operand{B, tb, ldb, strideB};
  g.c = C, g.ldc = ldc, g.stride_c = strideC;
  g.workspace = handle->workspace, g.workspace_bytes = handle->workspace_bytes;
  // The profiler (cuda_emu/profiler.h) prices this call at its roofline: 2mnk FLOPs per batch
  // entry, on tensor cores for 16-bit inputs or TF32, each operand moved once.
  mg_emu::trace_library_call(
      fn, 2.0 * m * n * double(k) * batch,
      g.in == Elem::bf16 || g.in == Elem::f16 || g.rounding == InputRounding::tf32,
      double(batch) * (double(in_bytes) * (double(m) * k + double(k) * n) +
                       double(elem_bytes(g.out)) * double(m) * n * (g.beta != 0 ? 2 : 1)));
  mg_emu::enqueue(handle->stream, fn, [g] {
    if (g.f64)
      run_gemm<double>(g);
    else
      run_gemm<float>(g);
  });
  return CUBLAS_STATUS_SUCCESS;
}

bool valid_math_mode(cublasMath_t mode) {
  const int base =
      static_cast<int>(mode) & ~static_cast<int>(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
  return base == CUBLAS_DEFAULT_MATH || base == CUBLAS_TENSOR_OP_MATH || base == CUBLAS_PEDANTIC_MATH ||
         base == CUBLAS_TF32_TENSOR_OP_MATH || base == CUBLAS_FP32_EMULATED_BF16X9_MATH ||
         base == CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH;
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto* h = new cublasContext();
  h->device = mg_emu::current_device();
  {
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    live_handles().insert(h);
  }
  *handle = h;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  {
    std::lock_guard<std::mutex> lock(g_handles_mutex);
    if (handle == nullptr || live_handles().erase(handle) == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  }
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (!is_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = streamId;
  handle->workspace = nullptr;  // cuBLAS: "unconditionally resets the workspace to the default pool"
  handle->workspace_bytes = 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  if (!is_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (streamId == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t workspaceSizeInBytes) {
  const char* fn = "cublasSetWorkspace";
  if (!is_live(handle))
    return fail(fn, CUBLAS_STATUS_NOT_INITIALIZED,
                "the handle is null or not one cublasCreate made (destroyed?)");
  if (workspace != nullptr && reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return fail(fn, CUBLAS_STATUS_INVALID_VALUE, "the workspace pointer is not aligned to 256 bytes");
  if (workspace != nullptr && workspaceSizeInBytes > 0 &&
      !mg_emu::is_device_range(workspace, workspaceSizeInBytes))
    return fail(fn, CUBLAS_STATUS_INVALID_VALUE,
                "the workspace (" + std::to_string(workspaceSizeInBytes) + " bytes) is not device memory");
  handle->workspace = workspaceSizeInBytes > 0 ? workspace : nullptr;
  handle->workspace_bytes = workspace != nullptr ? workspaceSizeInBytes : 0;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasGetMathMode(cublasHandle_t handle, cublasMath_t* mode) {
  if (!is_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (mode == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *mode = handle->math;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  if (!is_live(handle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!valid_math_mode(mode)) return CUBLAS_STATUS_INVALID_VALUE;
  handle->math = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "an error was detected when checking the current licensing";
  }
  return "unknown error";
}

cublasStatus_t CUBLASWINAPI cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k, const void* alpha,
                                         const void* A, cudaDataType Atype, int lda, const void* B,
                                         cudaDataType Btype, int ldb, const void* beta, void* C,
                                         cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                         cublasGemmAlgo_t algo) {
  return gemm("cublasGemmEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0,
              beta, C, Ctype, ldc, 0, 1, computeType, algo);
}

cublasStatus_t CUBLASWINAPI cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
    cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype,
    int ldc, long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  return gemm("cublasGemmStridedBatchedEx", handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B,
              Btype, ldb, strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo);
}

}  // extern "C"
