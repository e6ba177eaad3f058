// GEMM on the CPU: OpenBLAS when available, a cache-blocked loop beside it.
//
// Why blocking. C = A*B does 2*m*n*k flops on only (m*k + k*n + m*n) elements,
// so every element of A and B is used n (resp. m) times. A naive triple loop
// throws that reuse away: for large matrices each multiply-add streams a fresh
// element of B from DRAM (~1 flop per 4 bytes; a core can do ~30 flops in the
// time DRAM delivers 4 bytes). Blocking cuts the problem into tiles that fit in
// cache and finishes all the work on a tile before moving on:
//
//   for each batch entry and kBlockM-row block of C      (i0; one task each)
//     for each kBlockN-wide column panel of C            (j0)
//       for each kBlockK-deep slice of the k dimension   (p0)
//         pack op(A)[i0:+kBlockM, p0:+kBlockK] -> a_pack   (64 x 256,   64 KiB of float)
//         pack op(B)[p0:+kBlockK, j0:+kBlockN] -> b_pack   (256 x 256, 256 KiB, lives in L2)
//         acc[kBlockM x kBlockN] += a_pack * b_pack      (the micro-kernel, 64 KiB)
//       C[i0:, j0:] = alpha * acc + beta * C             (C is read once and written once)
//
// Each element of b_pack is then loaded from cache kBlockM times per pack
// instead of from DRAM once per multiply-add; B is re-packed once per row block
// (m/64 times in all), which costs k*n*m/64 copies against 2*m*n*k flops.
//
// Packing does three jobs at once: it makes both operands contiguous whatever
// trans_a/trans_b and lda/ldb are (so the micro-kernel has one shape), it
// widens f16/bf16 to float exactly once per element per tile instead of once
// per multiply, and it lays the tile out densely so it stays in cache.
//
// The micro-kernel walks four rows of C at a time: each value of b_pack it
// loads feeds four multiply-adds (one per row), and the inner j loop runs over
// contiguous floats so the compiler vectorises it (-O3). Per 4 x kBlockN x
// kBlockK step that is ~1 load of B per 4 FMAs instead of 1 per FMA.
//
// Parallelism: the (batch entry, kBlockM row block) pairs are independent --
// each owns distinct rows of C -- so they are split across OpenMP threads,
// each with its own packing buffers. Without OpenMP the same loop runs serially.
//
// This reaches a useful fraction of what OpenBLAS does but not all of it: the
// library adds register-tiled assembly micro-kernels per CPU generation. That
// gap is what benchmarks/ measures.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <climits>
#include <type_traits>
#include <vector>

#include "base/error.h"

#ifdef MG_HAS_OPENBLAS
#include <cblas.h>
#endif

namespace mg::kernels::cpu {

namespace {

constexpr int64_t kBlockM = 64;                 // rows of C per task (and of a_pack)
constexpr int64_t kBlockN = 256;                // columns of C per panel (and of b_pack)
constexpr int64_t kBlockK = 256;                // depth of one packed slice
constexpr int64_t kMinParallelFlops = 1 << 18;  // below this, waking threads costs more than it saves

// The packed tiles are dense row-major arrays. Their row strides are the tile
// sizes, min(kBlock*, problem size), so a small GEMM gets small buffers.
struct TileStrides {
  int64_t a;  // a_pack: rows x depth, row stride a (>= depth)
  int64_t b;  // b_pack: depth x cols, row stride b (>= cols); acc uses it too
};

// op(A)[i0 : i0+rows, p0 : p0+depth] -> dst (row stride `stride`), widened to Acc.
template <class T, class Acc>
void pack_a(const T* a, int64_t lda, bool trans, int64_t i0, int64_t p0, int64_t rows, int64_t depth,
            Acc* dst, int64_t stride) {
  for (int64_t i = 0; i < rows; ++i) {
    Acc* out = dst + i * stride;
    if (!trans) {  // A is m x k: the row is contiguous
      const T* src = a + (i0 + i) * lda + p0;
      for (int64_t p = 0; p < depth; ++p) out[p] = static_cast<Acc>(src[p]);
    } else {  // A is stored k x m: op(A)[i][p] = A[p][i], a strided column
      const T* src = a + p0 * lda + (i0 + i);
      for (int64_t p = 0; p < depth; ++p) out[p] = static_cast<Acc>(src[p * lda]);
    }
  }
}

// op(B)[p0 : p0+depth, j0 : j0+cols] -> dst (row stride `stride`), widened to Acc.
template <class T, class Acc>
void pack_b(const T* b, int64_t ldb, bool trans, int64_t p0, int64_t j0, int64_t depth, int64_t cols,
            Acc* dst, int64_t stride) {
  for (int64_t p = 0; p < depth; ++p) {
    Acc* out = dst + p * stride;
    if (!trans) {  // B is k x n: the row is contiguous
      const T* src = b + (p0 + p) * ldb + j0;
      for (int64_t j = 0; j < cols; ++j) out[j] = static_cast<Acc>(src[j]);
    } else {  // B is stored n x k: op(B)[p][j] = B[j][p]
      const T* src = b + j0 * ldb + (p0 + p);
      for (int64_t j = 0; j < cols; ++j) out[j] = static_cast<Acc>(src[j * ldb]);
    }
  }
}

// acc[rows x cols] += a_pack[rows x depth] * b_pack[depth x cols].
template <class Acc>
void micro_kernel(const Acc* a_pack, const Acc* b_pack, Acc* acc, int64_t rows, int64_t depth, int64_t cols,
                  TileStrides stride) {
  int64_t i = 0;
  for (; i + 4 <= rows; i += 4) {  // four rows of C share every load of B
    const Acc* a0 = a_pack + (i + 0) * stride.a;
    const Acc* a1 = a_pack + (i + 1) * stride.a;
    const Acc* a2 = a_pack + (i + 2) * stride.a;
    const Acc* a3 = a_pack + (i + 3) * stride.a;
    Acc* c0 = acc + (i + 0) * stride.b;
    Acc* c1 = acc + (i + 1) * stride.b;
    Acc* c2 = acc + (i + 2) * stride.b;
    Acc* c3 = acc + (i + 3) * stride.b;
    for (int64_t p = 0; p < depth; ++p) {
      const Acc* bp = b_pack + p * stride.b;
      const Acc x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
      for (int64_t j = 0; j < cols; ++j) {
        const Acc bj = bp[j];
        c0[j] += x0 * bj;
        c1[j] += x1 * bj;
        c2[j] += x2 * bj;
        c3[j] += x3 * bj;
      }
    }
  }
  for (; i < rows; ++i) {  // the last 0-3 rows, one at a time
    const Acc* ai = a_pack + i * stride.a;
    Acc* ci = acc + i * stride.b;
    for (int64_t p = 0; p < depth; ++p) {
      const Acc* bp = b_pack + p * stride.b;
      const Acc x = ai[p];
      for (int64_t j = 0; j < cols; ++j) ci[j] += x * bp[j];
    }
  }
}

template <class T>
void gemm_blocked_typed(const GemmArgs& g) {
  using Acc = acc_t<T>;
  const T* a_base = static_cast<const T*>(g.a);
  const T* b_base = static_cast<const T*>(g.b);
  T* c_base = static_cast<T*>(g.c);
  const Acc alpha = static_cast<Acc>(g.alpha);
  const Acc beta = static_cast<Acc>(g.beta);
  // alpha == 0 means C = beta*C without touching A and B (BLAS semantics: a NaN in A must not leak).
  const int64_t depth_total = alpha == Acc(0) ? 0 : g.k;
  const int64_t row_blocks = (g.m + kBlockM - 1) / kBlockM;
  const int64_t tasks = g.batch * row_blocks;
  const TileStrides stride{std::min(kBlockK, std::max<int64_t>(depth_total, 1)), std::min(kBlockN, g.n)};
  const int64_t tile_m = std::min(kBlockM, g.m);
  const bool worth_threads = tasks > 1 && 2.0 * g.m * g.n * depth_total * g.batch >= kMinParallelFlops;
  (void)worth_threads;  // only read by the OpenMP pragma

#ifdef _OPENMP
#pragma omp parallel if (worth_threads)
#endif
  {
    // Per-thread tiles (at most ~384 KiB of float), reused across the thread's tasks.
    std::vector<Acc> a_pack(tile_m * stride.a), b_pack(stride.a * stride.b), acc(tile_m * stride.b);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t batch_index = task / row_blocks;
      const int64_t i0 = (task % row_blocks) * kBlockM;
      const int64_t rows = std::min(kBlockM, g.m - i0);
      const T* a = a_base + batch_index * g.batch_stride_a;
      const T* b = b_base + batch_index * g.batch_stride_b;
      T* c = c_base + batch_index * g.batch_stride_c;

      for (int64_t j0 = 0; j0 < g.n; j0 += kBlockN) {
        const int64_t cols = std::min(kBlockN, g.n - j0);
        std::fill(acc.begin(), acc.end(), Acc(0));
        for (int64_t p0 = 0; p0 < depth_total; p0 += kBlockK) {
          const int64_t depth = std::min(kBlockK, depth_total - p0);
          pack_a(a, g.lda, g.trans_a, i0, p0, rows, depth, a_pack.data(), stride.a);
          pack_b(b, g.ldb, g.trans_b, p0, j0, depth, cols, b_pack.data(), stride.b);
          micro_kernel(a_pack.data(), b_pack.data(), acc.data(), rows, depth, cols, stride);
        }
        // Write back. beta == 0 must not read C: it may be uninitialised (NaN * 0 = NaN).
        for (int64_t i = 0; i < rows; ++i) {
          T* c_row = c + (i0 + i) * g.ldc + j0;
          const Acc* acc_row = acc.data() + i * stride.b;
          if (beta == Acc(0)) {
            for (int64_t j = 0; j < cols; ++j) c_row[j] = static_cast<T>(alpha * acc_row[j]);
          } else {
            for (int64_t j = 0; j < cols; ++j) {
              c_row[j] = static_cast<T>(alpha * acc_row[j] + beta * static_cast<Acc>(c_row[j]));
            }
          }
        }
      }
    }
  }
}

template <class T>
void gemm_reference_typed(const GemmArgs& g) {
  const T* a_base = static_cast<const T*>(g.a);
  const T* b_base = static_cast<const T*>(g.b);
  T* c_base = static_cast<T*>(g.c);
  for (int64_t batch_index = 0; batch_index < g.batch; ++batch_index) {
    const T* a = a_base + batch_index * g.batch_stride_a;
    const T* b = b_base + batch_index * g.batch_stride_b;
    T* c = c_base + batch_index * g.batch_stride_c;
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double sum = 0.0;
        const int64_t depth = g.alpha == 0.0 ? 0 : g.k;  // alpha == 0: A and B are not read
        for (int64_t p = 0; p < depth; ++p) {
          const T a_ip = g.trans_a ? a[p * g.lda + i] : a[i * g.lda + p];
          const T b_pj = g.trans_b ? b[j * g.ldb + p] : b[p * g.ldb + j];
          sum += static_cast<double>(static_cast<acc_t<T>>(a_ip)) *
                 static_cast<double>(static_cast<acc_t<T>>(b_pj));
        }
        T& out = c[i * g.ldc + j];
        double value = g.alpha * sum;
        if (g.beta != 0.0) value += g.beta * static_cast<double>(static_cast<acc_t<T>>(out));
        out = static_cast<T>(static_cast<acc_t<T>>(value));
      }
    }
  }
}

#ifdef MG_HAS_OPENBLAS
bool fits_blas_int(const GemmArgs& g) {
  const int64_t limit = INT_MAX;  // LP64 OpenBLAS takes 32-bit sizes
  return g.m <= limit && g.n <= limit && g.k <= limit && g.lda <= limit && g.ldb <= limit && g.ldc <= limit;
}

// One library call per batch entry. OpenBLAS threads each call internally, so
// the batch loop stays serial (nesting our threads around it would oversubscribe).
template <class T>
void gemm_openblas(const GemmArgs& g) {
  const T* a_base = static_cast<const T*>(g.a);
  const T* b_base = static_cast<const T*>(g.b);
  T* c_base = static_cast<T*>(g.c);
  const CBLAS_TRANSPOSE ta = g.trans_a ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = g.trans_b ? CblasTrans : CblasNoTrans;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda), ldb = static_cast<int>(g.ldb), ldc = static_cast<int>(g.ldc);
  for (int64_t batch_index = 0; batch_index < g.batch; ++batch_index) {
    const T* a = a_base + batch_index * g.batch_stride_a;
    const T* b = b_base + batch_index * g.batch_stride_b;
    T* c = c_base + batch_index * g.batch_stride_c;
    // BLAS, like us, does not read C when beta == 0.
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, static_cast<float>(g.alpha), a, lda, b, ldb,
                  static_cast<float>(g.beta), c, ldc);
    } else {
      cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, g.alpha, a, lda, b, ldb, g.beta, c, ldc);
    }
  }
}
#endif

}  // namespace

void gemm_blocked(const GemmArgs& args) {
  check_gemm_args(args, "gemm_blocked");
  if (args.batch == 0 || args.m == 0 || args.n == 0) return;
  visit_floating(args.dtype, "gemm_blocked", [&](auto tag) {
    using T = typename decltype(tag)::type;
    gemm_blocked_typed<T>(args);
  });
}

void gemm(const GemmArgs& args) {
  check_gemm_args(args, "gemm");
  if (args.batch == 0 || args.m == 0 || args.n == 0) return;
#ifdef MG_HAS_OPENBLAS
  // k == 0 (C = beta*C) is left to the blocked path: BLAS insists on lda >= 1.
  if (args.k > 0 && args.alpha != 0.0 && fits_blas_int(args)) {
    if (args.dtype == DType::f32) return gemm_openblas<float>(args);
    if (args.dtype == DType::f64) return gemm_openblas<double>(args);
  }
#endif
  visit_floating(args.dtype, "gemm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    gemm_blocked_typed<T>(args);
  });
}

void gemm_reference(const GemmArgs& args) {
  check_gemm_args(args, "gemm_reference");
  if (args.batch == 0 || args.m == 0 || args.n == 0) return;
  visit_floating(args.dtype, "gemm_reference", [&](auto tag) {
    using T = typename decltype(tag)::type;
    gemm_reference_typed<T>(args);
  });
}

}  // namespace mg::kernels::cpu
