// CPU GEMM kernels (gemm, gemm_blocked) against gemm_reference, the double-
// accumulating triple loop. Each case stores A, B and C with padded leading
// dimensions whose padding holds NaN: a kernel that reads past a row shows up
// as NaN in C, and one that writes past a row destroys the NaN sentinel in C.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/gemm.h"
#include "tests/kernels/kernel_test_values.h"

using namespace mg;
using namespace mg::kernels;
using namespace mg::kernels::cpu;
using namespace mg::kernel_test;

namespace {

using GemmFn = void (*)(const GemmArgs&);

struct Problem {
  bool trans_a = false, trans_b = false;
  int64_t m = 1, n = 1, k = 1;
  int64_t batch = 1;
  bool broadcast_a = false, broadcast_b = false;  // batch stride 0
  int64_t pad = 0;                                // extra elements at the end of every stored row
  double alpha = 1.0, beta = 0.0;
};

std::string describe(const Problem& p, DType dtype) {
  return str_cat(dtype_name(dtype), " m=", p.m, " n=", p.n, " k=", p.k, " trans_a=", p.trans_a,
                 " trans_b=", p.trans_b, " batch=", p.batch, " broadcast_a=", p.broadcast_a,
                 " broadcast_b=", p.broadcast_b, " pad=", p.pad, " alpha=", p.alpha, " beta=", p.beta);
}

// Tolerances: |got - ref| <= rel * |ref| + abs_per_term * (k + 1) * (|alpha| + |beta|).
// rel covers the final rounding to T (both sides round, so up to ~1 ulp apart),
// abs_per_term the float (or double) accumulation error of the kernel.
struct Tolerance {
  double rel, abs_per_term;
};

Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f64: return {1e-14, 1e-14};
    case DType::f32: return {1e-6, 1e-6};
    case DType::f16: return {1.0 / 512, 1e-6};
    case DType::bf16: return {1.0 / 64, 1e-6};
    default: return {0, 0};
  }
}

// A matrix stored `rows` x `cols` with leading dimension cols + pad, `count`
// copies back to back; values uniform in [-1, 1] (rounded to T), padding NaN.
template <class T>
std::vector<T> make_matrices(int64_t count, int64_t rows, int64_t cols, int64_t pad, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  const int64_t ld = cols + pad;
  std::vector<T> out(static_cast<size_t>(std::max<int64_t>(count * rows * ld, 1)),
                     static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
  for (int64_t b = 0; b < count; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) out[(b * rows + r) * ld + c] = static_cast<T>(uniform(rng));
    }
  }
  return out;
}

// Runs `fn` and gemm_reference on the same problem and returns the number of
// elements of C that disagree (and prints the first few through Catch's INFO).
template <class T>
int64_t count_mismatches(const Problem& p, GemmFn fn, uint32_t seed) {
  std::mt19937 rng(seed);
  const DType dtype = dtype_of<T>();
  const int64_t a_rows = p.trans_a ? p.k : p.m, a_cols = p.trans_a ? p.m : p.k;
  const int64_t b_rows = p.trans_b ? p.n : p.k, b_cols = p.trans_b ? p.k : p.n;
  std::vector<T> a = make_matrices<T>(p.broadcast_a ? 1 : p.batch, a_rows, a_cols, p.pad, rng);
  std::vector<T> b = make_matrices<T>(p.broadcast_b ? 1 : p.batch, b_rows, b_cols, p.pad, rng);
  std::vector<T> c = make_matrices<T>(p.batch, p.m, p.n, p.pad, rng);
  if (p.beta == 0.0) {  // C must not be read at all: fill it with NaN garbage
    for (T& v : c) v = static_cast<T>(std::numeric_limits<float>::quiet_NaN());
  }
  std::vector<T> c_ref = c;

  GemmArgs args;
  args.dtype = dtype;
  args.trans_a = p.trans_a;
  args.trans_b = p.trans_b;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.a = a.data();
  args.lda = a_cols + p.pad;
  args.batch_stride_a = p.broadcast_a ? 0 : a_rows * args.lda;
  args.b = b.data();
  args.ldb = b_cols + p.pad;
  args.batch_stride_b = p.broadcast_b ? 0 : b_rows * args.ldb;
  args.c = c.data();
  args.ldc = p.n + p.pad;
  args.batch_stride_c = p.m * args.ldc;
  args.batch = p.batch;
  args.alpha = p.alpha;
  args.beta = p.beta;

  fn(args);
  args.c = c_ref.data();
  gemm_reference(args);

  const Tolerance tol = tolerance_for(dtype);
  const double abs_tol =
      tol.abs_per_term * static_cast<double>(p.k + 1) * (std::abs(p.alpha) + std::abs(p.beta));
  int64_t mismatches = 0;
  for (int64_t bi = 0; bi < p.batch; ++bi) {
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t j = 0; j < args.ldc; ++j) {
        const size_t at = static_cast<size_t>((bi * p.m + i) * args.ldc + j);
        const double got = static_cast<double>(static_cast<acc_t<T>>(c[at]));
        const double want = static_cast<double>(static_cast<acc_t<T>>(c_ref[at]));
        bool ok;
        if (j >= p.n) {
          ok = std::isnan(got);  // padding of C must be left alone
        } else {
          ok = std::abs(got - want) <= tol.rel * std::abs(want) + abs_tol;  // false for NaN
        }
        if (!ok) {
          if (mismatches < 3) {
            UNSCOPED_INFO("C[" << bi << "][" << i << "][" << j << "] = " << got << ", reference " << want);
          }
          ++mismatches;
        }
      }
    }
  }
  return mismatches;
}

int64_t count_mismatches(DType dtype, const Problem& p, GemmFn fn, uint32_t seed) {
  return visit_floating(dtype, "test", [&](auto tag) {
    using T = typename decltype(tag)::type;
    return count_mismatches<T>(p, fn, seed);
  });
}

struct NamedGemm {
  const char* name;
  GemmFn fn;
};
const NamedGemm kImplementations[] = {{"gemm", &gemm}, {"gemm_blocked", &gemm_blocked}};

}  // namespace

TEST_CASE("gemm: 2x2 example by hand", "[kernels][gemm]") {
  for (const NamedGemm& impl : kImplementations) {
    const float a[] = {1, 2, 3, 4};
    const float b[] = {5, 6, 7, 8};
    float c[4] = {0, 0, 0, 0};
    GemmArgs args;
    args.dtype = DType::f32;
    args.m = args.n = args.k = 2;
    args.a = a;
    args.b = b;
    args.c = c;
    args.lda = args.ldb = args.ldc = 2;
    impl.fn(args);
    INFO(impl.name);
    CHECK(c[0] == 19.0f);
    CHECK(c[1] == 22.0f);
    CHECK(c[2] == 43.0f);
    CHECK(c[3] == 50.0f);
  }
}

TEST_CASE("gemm: every transpose combination and odd size, every dtype", "[kernels][gemm]") {
  const int64_t sizes[] = {1, 7, 33, 65};
  uint32_t seed = 1;
  for (DType dtype : kFloatingDtypes) {
    for (const NamedGemm& impl : kImplementations) {
      for (int trans = 0; trans < 4; ++trans) {
        for (int64_t m : sizes) {
          for (int64_t n : sizes) {
            for (int64_t k : sizes) {
              Problem p;
              p.trans_a = (trans & 1) != 0;
              p.trans_b = (trans & 2) != 0;
              p.m = m;
              p.n = n;
              p.k = k;
              p.pad = (seed % 3 == 0) ? 3 : 0;
              INFO(impl.name << " " << describe(p, dtype));
              REQUIRE(count_mismatches(dtype, p, impl.fn, seed++) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("gemm: sizes that cross the cache blocks", "[kernels][gemm]") {
  // 130 x 300 x 520 crosses the 64-row, 256-column and 256-deep block edges.
  uint32_t seed = 100;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (const NamedGemm& impl : kImplementations) {
      for (int trans = 0; trans < 4; ++trans) {
        Problem p;
        p.trans_a = (trans & 1) != 0;
        p.trans_b = (trans & 2) != 0;
        p.m = 130;
        p.n = 300;
        p.k = 520;
        p.pad = 5;
        p.alpha = 0.75;
        p.beta = 0.5;
        INFO(impl.name << " " << describe(p, dtype));
        REQUIRE(count_mismatches(dtype, p, impl.fn, seed++) == 0);
      }
    }
  }
}

TEST_CASE("gemm: batches, with A or B broadcast over the batch", "[kernels][gemm]") {
  uint32_t seed = 200;
  for (DType dtype : kFloatingDtypes) {
    for (const NamedGemm& impl : kImplementations) {
      for (int broadcast = 0; broadcast < 3; ++broadcast) {
        for (int trans = 0; trans < 4; ++trans) {
          Problem p;
          p.trans_a = (trans & 1) != 0;
          p.trans_b = (trans & 2) != 0;
          p.m = 33;
          p.n = 7;
          p.k = 65;
          p.batch = 5;
          p.broadcast_a = broadcast == 1;
          p.broadcast_b = broadcast == 2;
          p.pad = 2;
          INFO(impl.name << " " << describe(p, dtype));
          REQUIRE(count_mismatches(dtype, p, impl.fn, seed++) == 0);
        }
      }
    }
  }
}

TEST_CASE("gemm: alpha and beta", "[kernels][gemm]") {
  uint32_t seed = 300;
  const double alphas[] = {1.0, -0.5, 2.0};
  const double betas[] = {0.0, 1.0, -1.5};
  for (DType dtype : kFloatingDtypes) {
    for (const NamedGemm& impl : kImplementations) {
      for (double alpha : alphas) {
        for (double beta : betas) {
          Problem p;
          p.m = 65;
          p.n = 33;
          p.k = 7;
          p.batch = 2;
          p.trans_b = true;
          p.alpha = alpha;
          p.beta = beta;
          INFO(impl.name << " " << describe(p, dtype));
          REQUIRE(count_mismatches(dtype, p, impl.fn, seed++) == 0);
        }
      }
    }
  }
}

TEST_CASE("gemm: k == 0 gives beta * C", "[kernels][gemm]") {
  for (const NamedGemm& impl : kImplementations) {
    INFO(impl.name);
    std::vector<float> c = {1, 2, 3, 4, 5, 6};
    GemmArgs args;
    args.dtype = DType::f32;
    args.m = 2;
    args.n = 3;
    args.k = 0;
    args.lda = 0;
    args.ldb = 3;
    args.ldc = 3;
    args.c = c.data();
    args.beta = 2.0;
    impl.fn(args);  // A and B are null: must not be read
    CHECK(c == std::vector<float>{2, 4, 6, 8, 10, 12});

    std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
    args.beta = 0.0;
    impl.fn(args);  // beta == 0: the NaN garbage is overwritten, not multiplied
    CHECK(c == std::vector<float>(6, 0.0f));
  }
}

TEST_CASE("gemm: alpha == 0 does not read A or B", "[kernels][gemm]") {
  for (const NamedGemm& impl : kImplementations) {
    INFO(impl.name);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> a(4, nan), b(4, nan), c = {1, 2, 3, 4};
    GemmArgs args;
    args.dtype = DType::f64;
    args.m = args.n = args.k = 2;
    args.a = a.data();
    args.b = b.data();
    args.c = c.data();
    args.lda = args.ldb = args.ldc = 2;
    args.alpha = 0.0;
    args.beta = -1.0;
    impl.fn(args);
    CHECK(c == std::vector<double>{-1, -2, -3, -4});
  }
}

TEST_CASE("gemm: empty m, n or batch leaves C alone", "[kernels][gemm]") {
  for (const NamedGemm& impl : kImplementations) {
    INFO(impl.name);
    std::vector<float> a(16, 1.0f), b(16, 1.0f), c(16, 7.0f);
    GemmArgs args;
    args.dtype = DType::f32;
    args.m = 4;
    args.n = 4;
    args.k = 4;
    args.a = a.data();
    args.b = b.data();
    args.c = c.data();
    args.lda = args.ldb = args.ldc = 4;
    GemmArgs no_rows = args;
    no_rows.m = 0;
    impl.fn(no_rows);
    GemmArgs no_cols = args;
    no_cols.n = 0;
    impl.fn(no_cols);
    GemmArgs no_batch = args;
    no_batch.batch = 0;
    impl.fn(no_batch);
    CHECK(c == std::vector<float>(16, 7.0f));
  }
}

TEST_CASE("gemm: bad arguments throw mg::Error", "[kernels][gemm]") {
  std::vector<float> a(64), b(64), c(64);
  GemmArgs ok;
  ok.dtype = DType::f32;
  ok.m = 4;
  ok.n = 4;
  ok.k = 4;
  ok.a = a.data();
  ok.b = b.data();
  ok.c = c.data();
  ok.lda = ok.ldb = ok.ldc = 4;
  REQUIRE_NOTHROW(gemm(ok));

  for (const NamedGemm& impl : kImplementations) {
    INFO(impl.name);
    GemmArgs bad = ok;
    bad.m = -1;
    CHECK_THROWS_AS(impl.fn(bad), Error);

    bad = ok;
    bad.lda = 3;
    CHECK_THROWS_WITH(impl.fn(bad), Catch::Contains("lda=3"));

    bad = ok;
    bad.trans_b = true;
    bad.k = 5;
    bad.lda = 5;
    bad.ldb = 4;  // B stored n x k needs ldb >= k = 5
    CHECK_THROWS_WITH(impl.fn(bad), Catch::Contains("ldb=4"));

    bad = ok;
    bad.ldc = 2;
    CHECK_THROWS_AS(impl.fn(bad), Error);

    bad = ok;
    bad.dtype = DType::i32;
    CHECK_THROWS_WITH(impl.fn(bad), Catch::Contains("i32"));

    bad = ok;
    bad.batch = 2;
    bad.batch_stride_c = 0;  // both batch entries would write the same C
    CHECK_THROWS_WITH(impl.fn(bad), Catch::Contains("overlap"));

    bad = ok;
    bad.a = nullptr;
    CHECK_THROWS_AS(impl.fn(bad), Error);
  }
}
