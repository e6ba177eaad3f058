// Max / average pooling against naive loops over an explicitly padded input,
// max-pool backward against a scatter through an independently found argmax,
// and avg-pool backward as the adjoint of the (linear) forward pass.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/pool.h"
#include "tests/kernels/kernel_test_values.h"

using namespace mg;
using namespace mg::kernels;
using namespace mg::kernels::cpu;
using namespace mg::kernel_test;

namespace {

Pool2dGeometry pool_geometry(int64_t planes, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                             int64_t sw, int64_t ph = 0, int64_t pw = 0) {
  Pool2dGeometry g;
  g.planes = planes;
  g.height = h;
  g.width = w;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.pad_h = ph;
  g.pad_w = pw;
  return g;
}

std::string describe(const Pool2dGeometry& g) {
  return str_cat("planes=", g.planes, " H=", g.height, " W=", g.width, " kernel=", g.kernel_h, "x",
                 g.kernel_w, " stride=", g.stride_h, "x", g.stride_w, " pad=", g.pad_h, "x", g.pad_w);
}

std::vector<Pool2dGeometry> pool_test_geometries() {
  return {
      pool_geometry(3, 8, 8, 2, 2, 2, 2),           // the classic 2x2/2
      pool_geometry(2, 7, 9, 3, 3, 1, 1, 1, 1),     // overlapping windows, padded
      pool_geometry(2, 9, 7, 3, 3, 2, 2, 1, 1),     // strided and padded, odd sizes
      pool_geometry(1, 6, 10, 2, 3, 1, 2, 1, 1),    // asymmetric, pad == kernel/2
      pool_geometry(2, 11, 11, 4, 4, 3, 3, 2, 2),   // even kernel with pad == kernel/2
      pool_geometry(4, 5, 5, 1, 1, 1, 1),           // identity
      pool_geometry(1, 5, 6, 5, 6, 1, 1),           // one window covering the plane
      pool_geometry(3, 1, 1, 3, 3, 1, 1, 1, 1),     // single pixel plane
      pool_geometry(40, 32, 32, 3, 3, 2, 2, 1, 1),  // large enough to take the threaded path
  };
}

// The input of one plane, padded with `fill` on every side, in double.
std::vector<double> padded_plane(const Pool2dGeometry& g, const std::vector<double>& x, int64_t plane,
                                 double fill) {
  const int64_t ph = g.height + 2 * g.pad_h, pw = g.width + 2 * g.pad_w;
  std::vector<double> out(static_cast<size_t>(ph * pw), fill);
  for (int64_t h = 0; h < g.height; ++h) {
    for (int64_t w = 0; w < g.width; ++w) {
      out[(h + g.pad_h) * pw + (w + g.pad_w)] = x[(plane * g.height + h) * g.width + w];
    }
  }
  return out;
}

struct MaxResult {
  std::vector<double> values;
  std::vector<int64_t> argmax;
};

// Max pooling over a -inf-padded copy: first strict maximum wins, a NaN wins
// over everything (a later NaN over an earlier one), as in PyTorch.
MaxResult naive_max_pool(const Pool2dGeometry& g, const std::vector<double>& x) {
  const int64_t out_h = g.out_h(), out_w = g.out_w(), pw = g.width + 2 * g.pad_w;
  MaxResult r;
  for (int64_t p = 0; p < g.planes; ++p) {
    const std::vector<double> padded = padded_plane(g, x, p, -std::numeric_limits<double>::infinity());
    for (int64_t oh = 0; oh < out_h; ++oh) {
      for (int64_t ow = 0; ow < out_w; ++ow) {
        double best = -std::numeric_limits<double>::infinity();
        int64_t best_index = -1;
        for (int64_t i = 0; i < g.kernel_h; ++i) {
          for (int64_t j = 0; j < g.kernel_w; ++j) {
            const int64_t h = oh * g.stride_h + i, w = ow * g.stride_w + j;  // in the padded plane
            const bool real = h >= g.pad_h && h < g.pad_h + g.height && w >= g.pad_w && w < g.pad_w + g.width;
            const double v = padded[h * pw + w];
            const int64_t index = (h - g.pad_h) * g.width + (w - g.pad_w);
            if (real && best_index < 0) best_index = index;  // the answer when all are -inf
            if (v > best || std::isnan(v)) {
              best = v;
              best_index = index;
            }
          }
        }
        r.values.push_back(best);
        r.argmax.push_back(best_index);
      }
    }
  }
  return r;
}

std::vector<double> naive_avg_pool(const Pool2dGeometry& g, const std::vector<double>& x,
                                   bool count_include_pad) {
  const int64_t out_h = g.out_h(), out_w = g.out_w(), pw = g.width + 2 * g.pad_w;
  std::vector<double> out;
  for (int64_t p = 0; p < g.planes; ++p) {
    const std::vector<double> padded = padded_plane(g, x, p, 0.0);
    for (int64_t oh = 0; oh < out_h; ++oh) {
      for (int64_t ow = 0; ow < out_w; ++ow) {
        double sum = 0.0;
        int64_t real = 0;
        for (int64_t i = 0; i < g.kernel_h; ++i) {
          for (int64_t j = 0; j < g.kernel_w; ++j) {
            const int64_t h = oh * g.stride_h + i, w = ow * g.stride_w + j;
            sum += padded[h * pw + w];
            real += (h >= g.pad_h && h < g.pad_h + g.height && w >= g.pad_w && w < g.pad_w + g.width) ? 1 : 0;
          }
        }
        out.push_back(sum / static_cast<double>(count_include_pad ? g.kernel_h * g.kernel_w : real));
      }
    }
  }
  return out;
}

// Relative tolerance of one rounding to T (values here are O(1)).
double rounding_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f64: return 1e-14;
    case DType::f32: return 1e-6;
    case DType::f16: return 1.0 / 1024;
    default: return 1.0 / 128;
  }
}

}  // namespace

TEST_CASE("pool2d: output sizes", "[kernels][pool]") {
  CHECK(pool_geometry(1, 28, 28, 2, 2, 2, 2).out_h() == 14);
  CHECK(pool_geometry(1, 7, 7, 2, 2, 2, 2).out_h() == 3);  // floor mode drops the last row
  CHECK(pool_geometry(1, 7, 7, 3, 3, 2, 2, 1, 1).out_w() == 4);
}

TEST_CASE("max_pool2d forward matches naive loops", "[kernels][pool]") {
  uint32_t seed = 1;
  for (const Pool2dGeometry& g : pool_test_geometries()) {
    for (DType dtype : kFloatingDtypes) {
      INFO(dtype_name(dtype) << " " << describe(g));
      visit_floating(dtype, "test", [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::mt19937 rng(seed++);
        const std::vector<T> x = random_buffer<T>(g.planes * g.height * g.width, rng);
        const size_t outputs = static_cast<size_t>(g.planes * g.out_h() * g.out_w());
        std::vector<T> y(outputs);
        std::vector<int64_t> argmax(outputs, -7);
        max_pool2d_forward(g, dtype_of<T>(), x.data(), y.data(), argmax.data());

        const MaxResult want = naive_max_pool(g, to_double(x));
        for (size_t o = 0; o < outputs; ++o) {
          CHECK(as_double(y[o]) == want.values[o]);  // a max is a copy: exact
          CHECK(argmax[o] == want.argmax[o]);
        }
      });
    }
  }
}

TEST_CASE("max_pool2d: NaN propagates, all -inf picks the first element", "[kernels][pool]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  // One 2x4 plane, 2x2 windows with stride 2: window 0 holds two NaNs, window 1 only -inf.
  const float x[] = {1.0f, nan,  -inf, -inf,  //
                     nan,  5.0f, -inf, -inf};
  const Pool2dGeometry g = pool_geometry(1, 2, 4, 2, 2, 2, 2);
  float y[2];
  int64_t argmax[2];
  max_pool2d_forward(g, DType::f32, x, y, argmax);
  CHECK(std::isnan(y[0]));
  CHECK(argmax[0] == 4);  // the last NaN in scan order, as PyTorch's `val > max || isnan(val)` picks
  CHECK(y[1] == -inf);
  CHECK(argmax[1] == 2);

  // Padding is -inf, never a winner: a window over [padding, -1] gives -1.
  const float row[] = {-1.0f, -2.0f};
  const Pool2dGeometry padded = pool_geometry(1, 1, 2, 1, 2, 1, 2, 0, 1);
  float out[2];
  int64_t idx[2];
  max_pool2d_forward(padded, DType::f32, row, out, idx);
  CHECK(out[0] == -1.0f);
  CHECK(idx[0] == 0);
  CHECK(out[1] == -2.0f);
  CHECK(idx[1] == 1);
}

TEST_CASE("max_pool2d backward scatters to the argmax", "[kernels][pool]") {
  uint32_t seed = 100;
  for (const Pool2dGeometry& g : pool_test_geometries()) {
    for (DType dtype : kFloatingDtypes) {
      INFO(dtype_name(dtype) << " " << describe(g));
      visit_floating(dtype, "test", [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::mt19937 rng(seed++);
        const int64_t inputs = g.planes * g.height * g.width;
        const int64_t plane_outputs = g.out_h() * g.out_w();
        const std::vector<T> x = random_buffer<T>(inputs, rng);
        const std::vector<T> gy = random_buffer<T>(g.planes * plane_outputs, rng);
        std::vector<T> y(gy.size());
        std::vector<int64_t> argmax(gy.size());
        max_pool2d_forward(g, dtype_of<T>(), x.data(), y.data(), argmax.data());
        // grad_input starts as NaN garbage: the kernel zeroes it.
        std::vector<T> gx(static_cast<size_t>(inputs),
                          static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
        max_pool2d_backward(g, dtype_of<T>(), gy.data(), argmax.data(), gx.data());

        // Expected: scatter through the naive argmax, found without the kernel.
        const MaxResult naive = naive_max_pool(g, to_double(x));
        std::vector<double> want(static_cast<size_t>(inputs), 0.0),
            magnitude(static_cast<size_t>(inputs), 0.0);
        for (size_t o = 0; o < gy.size(); ++o) {
          const int64_t at = static_cast<int64_t>(o) / plane_outputs * g.height * g.width + naive.argmax[o];
          want[at] += as_double(gy[o]);
          magnitude[at] += std::abs(as_double(gy[o]));
        }
        // Several windows may add into one input (and cancel): bound the error by the summed magnitudes.
        const double rel = rounding_tolerance(dtype_of<T>());
        for (int64_t e = 0; e < inputs; ++e) {
          CHECK(std::abs(as_double(gx[e]) - want[e]) <= rel * magnitude[e] + 1e-12);
        }
      });
    }
  }
}

TEST_CASE("max_pool2d backward rejects a corrupt argmax", "[kernels][pool]") {
  const Pool2dGeometry g = pool_geometry(1, 4, 4, 2, 2, 2, 2);
  const float gy[4] = {1, 1, 1, 1};
  const int64_t argmax[4] = {0, 2, 16, 10};  // 16 is outside the 4x4 plane
  float gx[16];
  CHECK_THROWS_WITH(max_pool2d_backward(g, DType::f32, gy, argmax, gx), Catch::Contains("argmax"));
}

TEST_CASE("avg_pool2d forward matches naive loops", "[kernels][pool]") {
  uint32_t seed = 200;
  for (const Pool2dGeometry& g : pool_test_geometries()) {
    for (DType dtype : kFloatingDtypes) {
      for (bool count_include_pad : {true, false}) {
        INFO(dtype_name(dtype) << " " << describe(g) << " count_include_pad=" << count_include_pad);
        visit_floating(dtype, "test", [&](auto tag) {
          using T = typename decltype(tag)::type;
          std::mt19937 rng(seed++);
          const std::vector<T> x = random_buffer<T>(g.planes * g.height * g.width, rng);
          std::vector<T> y(static_cast<size_t>(g.planes * g.out_h() * g.out_w()));
          avg_pool2d_forward(g, dtype_of<T>(), x.data(), y.data(), count_include_pad);

          const std::vector<double> want = naive_avg_pool(g, to_double(x), count_include_pad);
          const double rel = rounding_tolerance(dtype_of<T>());
          for (size_t o = 0; o < y.size(); ++o) {
            CHECK(std::abs(as_double(y[o]) - want[o]) <= rel * std::abs(want[o]) + 1e-6);
          }
        });
      }
    }
  }
}

TEST_CASE("avg_pool2d: count_include_pad changes the divisor at the border", "[kernels][pool]") {
  // 2x2 plane of ones, 3x3 window, padding 1: the corner window sees 4 ones and 5 zeros.
  const float x[] = {1, 1, 1, 1};
  const Pool2dGeometry g = pool_geometry(1, 2, 2, 3, 3, 1, 1, 1, 1);
  float y[4];
  avg_pool2d_forward(g, DType::f32, x, y, true);
  CHECK(y[0] == Approx(4.0 / 9.0));
  avg_pool2d_forward(g, DType::f32, x, y, false);
  CHECK(y[0] == 1.0f);
}

TEST_CASE("avg_pool2d backward is the adjoint of forward", "[kernels][pool]") {
  uint32_t seed = 300;
  for (const Pool2dGeometry& g : pool_test_geometries()) {
    for (bool count_include_pad : {true, false}) {
      INFO(describe(g) << " count_include_pad=" << count_include_pad);
      std::mt19937 rng(seed++);
      const int64_t inputs = g.planes * g.height * g.width;
      const std::vector<double> x = random_buffer<double>(inputs, rng);
      const std::vector<double> gy = random_buffer<double>(g.planes * g.out_h() * g.out_w(), rng);
      std::vector<double> y(gy.size());
      avg_pool2d_forward(g, DType::f64, x.data(), y.data(), count_include_pad);
      std::vector<double> gx(static_cast<size_t>(inputs), std::numeric_limits<double>::quiet_NaN());
      avg_pool2d_backward(g, DType::f64, gy.data(), gx.data(), count_include_pad);
      CHECK(dot(y, gy) == Approx(dot(x, gx)).margin(1e-12));
    }
  }
}

TEST_CASE("avg_pool2d backward in every dtype agrees with f64", "[kernels][pool]") {
  uint32_t seed = 400;
  for (const Pool2dGeometry& g : pool_test_geometries()) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      INFO(dtype_name(dtype) << " " << describe(g));
      visit_floating(dtype, "test", [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::mt19937 rng(seed++);
        const int64_t inputs = g.planes * g.height * g.width;
        const std::vector<T> gy = random_buffer<T>(g.planes * g.out_h() * g.out_w(), rng);
        const std::vector<double> gy64 = to_double(gy);
        std::vector<T> gx(static_cast<size_t>(inputs));
        avg_pool2d_backward(g, dtype_of<T>(), gy.data(), gx.data(), false);
        std::vector<double> want(static_cast<size_t>(inputs));
        avg_pool2d_backward(g, DType::f64, gy64.data(), want.data(), false);
        const double rel = rounding_tolerance(dtype_of<T>());
        for (int64_t e = 0; e < inputs; ++e) {
          CHECK(std::abs(as_double(gx[e]) - want[e]) <= rel * std::abs(want[e]) + 1e-6);
        }
      });
    }
  }
}

TEST_CASE("pool2d rejects bad geometry and dtypes", "[kernels][pool]") {
  std::vector<float> x(64), y(64);
  std::vector<int64_t> argmax(64);
  CHECK_THROWS_WITH(max_pool2d_forward(pool_geometry(1, 8, 8, 3, 3, 1, 1, 2, 2), DType::f32, x.data(),
                                       y.data(), argmax.data()),
                    Catch::Contains("half the kernel"));
  CHECK_THROWS_AS(
      avg_pool2d_forward(pool_geometry(1, 8, 8, 2, 2, 0, 2), DType::f32, x.data(), y.data(), true), Error);
  CHECK_THROWS_AS(
      avg_pool2d_forward(pool_geometry(1, 8, 8, 0, 2, 1, 1), DType::f32, x.data(), y.data(), true), Error);
  CHECK_THROWS_WITH(
      max_pool2d_forward(pool_geometry(1, 4, 4, 2, 2, 2, 2), DType::i32, x.data(), y.data(), argmax.data()),
      Catch::Contains("i32"));
  CHECK_THROWS_WITH(
      avg_pool2d_backward(pool_geometry(1, 4, 4, 2, 2, 2, 2), DType::i64, x.data(), y.data(), false),
      Catch::Contains("i64"));
}
