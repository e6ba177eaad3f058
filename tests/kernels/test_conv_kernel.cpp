// im2col / col2im: im2col followed by a GEMM must equal a direct 7-loop
// convolution, and col2im must be im2col's adjoint: <im2col(x), y> == <x, col2im(y)>.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/conv2d.h"
#include "tests/kernels/kernel_test_values.h"

#ifdef _OPENMP
#include <omp.h>
#endif

using namespace mg;
using namespace mg::kernels;
using namespace mg::kernels::cpu;
using namespace mg::kernel_test;

namespace {

Conv2dGeometry geometry(int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh = 1,
                        int64_t sw = 1, int64_t ph = 0, int64_t pw = 0, int64_t dh = 1, int64_t dw = 1) {
  Conv2dGeometry g;
  g.channels = c;
  g.height = h;
  g.width = w;
  g.kernel_h = kh;
  g.kernel_w = kw;
  g.stride_h = sh;
  g.stride_w = sw;
  g.pad_h = ph;
  g.pad_w = pw;
  g.dilation_h = dh;
  g.dilation_w = dw;
  return g;
}

std::string describe(const Conv2dGeometry& g) {
  return str_cat("C=", g.channels, " H=", g.height, " W=", g.width, " kernel=", g.kernel_h, "x", g.kernel_w,
                 " stride=", g.stride_h, "x", g.stride_w, " pad=", g.pad_h, "x", g.pad_w,
                 " dilation=", g.dilation_h, "x", g.dilation_w);
}

// Stride, padding and dilation variants, including padding wider than the
// kernel, a 1x1 kernel, asymmetric settings and a kernel as large as the input.
std::vector<Conv2dGeometry> test_geometries() {
  return {
      geometry(3, 7, 9, 3, 3),                      // plain valid 3x3
      geometry(2, 8, 8, 3, 3, 1, 1, 1, 1),          // "same" padding
      geometry(2, 7, 6, 5, 5, 1, 1, 2, 2),          // "same", 5x5 (the one-copy im2col path)
      geometry(1, 6, 9, 3, 3, 1, 1, 2, 2, 2, 2),    // "same" through dilation 2
      geometry(1, 2, 5, 5, 3, 1, 1, 3, 1),          // as wide as the input, taller padding
      geometry(3, 9, 7, 3, 3, 2, 2, 1, 1),          // strided, padded
      geometry(2, 10, 11, 3, 2, 2, 1, 1, 0, 2, 1),  // asymmetric everything
      geometry(4, 6, 5, 1, 1),                      // 1x1 kernel
      geometry(2, 6, 6, 1, 1, 2, 3),                // strided 1x1
      geometry(1, 12, 13, 5, 5, 3, 3, 2, 2, 2, 2),  // dilated, strided, padded
      geometry(2, 3, 4, 2, 3, 1, 1, 4, 5),          // padding wider than the kernel
      geometry(3, 5, 5, 5, 5),                      // kernel covers the whole image
      geometry(1, 1, 1, 3, 3, 1, 1, 1, 1),          // single pixel, all-padding neighbours
      geometry(2, 9, 9, 2, 2, 3, 3, 0, 0, 3, 3),    // dilation equal to stride
      geometry(16, 32, 32, 3, 3, 1, 1, 1, 1),       // large enough to take the threaded path
  };
}

// y[co, oh, ow] = sum_{c, i, j} w[co, c, i, j] * x[c, oh*sh - ph + i*dh, ow*sw - pw + j*dw], in double.
template <class T>
std::vector<double> direct_conv(const Conv2dGeometry& g, const std::vector<T>& x, const std::vector<T>& w,
                                int64_t out_channels) {
  const int64_t out_h = g.out_h(), out_w = g.out_w();
  std::vector<double> y(static_cast<size_t>(out_channels * out_h * out_w), 0.0);
  for (int64_t co = 0; co < out_channels; ++co) {
    for (int64_t oh = 0; oh < out_h; ++oh) {
      for (int64_t ow = 0; ow < out_w; ++ow) {
        double sum = 0.0;
        for (int64_t c = 0; c < g.channels; ++c) {
          for (int64_t i = 0; i < g.kernel_h; ++i) {
            for (int64_t j = 0; j < g.kernel_w; ++j) {
              const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
              const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
              if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
              const double wv = as_double(w[((co * g.channels + c) * g.kernel_h + i) * g.kernel_w + j]);
              sum += wv * as_double(x[(c * g.height + ih) * g.width + iw]);
            }
          }
        }
        y[(co * out_h + oh) * out_w + ow] = sum;
      }
    }
  }
  return y;
}

template <class T>
void check_im2col_matches_direct_conv(const Conv2dGeometry& g, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t out_channels = 3;
  const int64_t rows = g.column_rows(), cols = g.column_cols();
  std::vector<T> x = random_buffer<T>(g.channels * g.height * g.width, rng);
  std::vector<T> w = random_buffer<T>(out_channels * rows, rng);
  // NaN garbage: im2col must write every entry, padding included.
  std::vector<T> columns(static_cast<size_t>(rows * cols),
                         static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
  im2col(g, dtype_of<T>(), x.data(), columns.data());

  const std::vector<double> want = direct_conv(g, x, w, out_channels);
  int64_t mismatches = 0;
  for (int64_t co = 0; co < out_channels; ++co) {
    for (int64_t p = 0; p < cols; ++p) {
      double got = 0.0, magnitude = 0.0;  // y = W[Cout, C*kh*kw] x columns
      for (int64_t r = 0; r < rows; ++r) {
        const double term = as_double(w[co * rows + r]) * as_double(columns[r * cols + p]);
        got += term;
        magnitude += std::abs(term);
      }
      const double expected = want[co * cols + p];
      if (!(std::abs(got - expected) <= 1e-12 * (magnitude + 1.0))) {
        if (mismatches < 3)
          UNSCOPED_INFO("y[" << co << "][" << p << "] = " << got << ", direct " << expected);
        ++mismatches;
      }
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("im2col: output sizes", "[kernels][conv]") {
  CHECK(geometry(1, 28, 28, 3, 3, 1, 1, 1, 1).out_h() == 28);
  CHECK(geometry(1, 28, 28, 3, 3, 2, 2, 1, 1).out_h() == 14);
  CHECK(geometry(1, 28, 28, 5, 5).out_w() == 24);
  CHECK(geometry(1, 10, 10, 3, 3, 1, 1, 0, 0, 2, 2).out_h() == 6);  // dilated kernel spans 5
  CHECK(geometry(1, 7, 7, 3, 3, 2, 2).out_h() == 3);                // floor((7 - 3) / 2) + 1
}

TEST_CASE("im2col: a 2x2 example by hand", "[kernels][conv]") {
  // One 3x3 channel, 2x2 kernel, stride 1, no padding: 4 columns of 4 taps.
  const float image[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  float columns[16];
  im2col(geometry(1, 3, 3, 2, 2), DType::f32, image, columns);
  const float expected[] = {1, 2, 4, 5,   // tap (0, 0) at each of the 4 output positions
                            2, 3, 5, 6,   // tap (0, 1)
                            4, 5, 7, 8,   // tap (1, 0)
                            5, 6, 8, 9};  // tap (1, 1)
  for (int e = 0; e < 16; ++e) CHECK(columns[e] == expected[e]);
}

TEST_CASE("im2col + GEMM equals a direct convolution", "[kernels][conv]") {
  uint32_t seed = 1;
  for (const Conv2dGeometry& g : test_geometries()) {
    for (DType dtype : kFloatingDtypes) {
      INFO(dtype_name(dtype) << " " << describe(g));
      visit_floating(dtype, "test", [&](auto tag) {
        using T = typename decltype(tag)::type;
        check_im2col_matches_direct_conv<T>(g, seed++);
      });
    }
  }
}

TEST_CASE("col2im is the adjoint of im2col", "[kernels][conv]") {
  uint32_t seed = 50;
  for (const Conv2dGeometry& g : test_geometries()) {
    INFO(describe(g));
    std::mt19937 rng(seed++);
    const int64_t image_size = g.channels * g.height * g.width;
    const int64_t column_size = g.column_rows() * g.column_cols();
    const std::vector<double> x = random_buffer<double>(image_size, rng);
    const std::vector<double> y = random_buffer<double>(column_size, rng);

    std::vector<double> im2col_x(static_cast<size_t>(column_size));
    im2col(g, DType::f64, x.data(), im2col_x.data());
    std::vector<double> col2im_y(static_cast<size_t>(image_size), 0.0);
    col2im(g, DType::f64, y.data(), col2im_y.data());

    const double lhs = dot(im2col_x, y), rhs = dot(x, col2im_y);
    CHECK(std::abs(lhs - rhs) <= 1e-12 * static_cast<double>(column_size));
  }
}

TEST_CASE("col2im accumulates into the image", "[kernels][conv]") {
  const Conv2dGeometry g = geometry(2, 6, 7, 3, 3, 1, 2, 1, 1, 1, 1);
  std::mt19937 rng(7);
  const int64_t image_size = g.channels * g.height * g.width;
  const std::vector<double> y = random_buffer<double>(g.column_rows() * g.column_cols(), rng);
  const std::vector<double> start = random_buffer<double>(image_size, rng);

  std::vector<double> from_zero(static_cast<size_t>(image_size), 0.0);
  col2im(g, DType::f64, y.data(), from_zero.data());
  std::vector<double> from_start = start;
  col2im(g, DType::f64, y.data(), from_start.data());
  for (int64_t e = 0; e < image_size; ++e)
    CHECK(from_start[e] == Approx(start[e] + from_zero[e]).margin(1e-12));
}

TEST_CASE("col2im in every dtype agrees with f64", "[kernels][conv]") {
  uint32_t seed = 80;
  for (const Conv2dGeometry& g : test_geometries()) {
    for (DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      INFO(dtype_name(dtype) << " " << describe(g));
      visit_floating(dtype, "test", [&](auto tag) {
        using T = typename decltype(tag)::type;
        std::mt19937 rng(seed++);
        const int64_t image_size = g.channels * g.height * g.width;
        const std::vector<T> y = random_buffer<T>(g.column_rows() * g.column_cols(), rng);
        std::vector<double> y64(y.size());
        for (size_t e = 0; e < y.size(); ++e) y64[e] = as_double(y[e]);

        std::vector<T> image(static_cast<size_t>(image_size), static_cast<T>(0.0f));
        col2im(g, dtype_of<T>(), y.data(), image.data());
        std::vector<double> want(static_cast<size_t>(image_size), 0.0);
        col2im(g, DType::f64, y64.data(), want.data());

        // Halves are summed in float and rounded once: within one half-precision rounding.
        const double rel = dtype_of<T>() == DType::f32   ? 1e-6
                           : dtype_of<T>() == DType::f16 ? 1.0 / 1024
                                                         : 1.0 / 128;
        const double taps = static_cast<double>(g.kernel_h * g.kernel_w);
        for (int64_t e = 0; e < image_size; ++e) {
          CHECK(std::abs(as_double(image[e]) - want[e]) <= rel * std::abs(want[e]) + 1e-6 * taps);
        }
      });
    }
  }
}

TEST_CASE("im2col / col2im reject bad geometry and dtypes", "[kernels][conv]") {
  std::vector<float> image(64), columns(1024);
  CHECK_THROWS_WITH(im2col(geometry(1, 2, 2, 3, 3), DType::f32, image.data(), columns.data()),
                    Catch::Contains("smaller than the dilated kernel"));
  CHECK_THROWS_AS(im2col(geometry(1, 4, 4, 3, 3, 0, 1), DType::f32, image.data(), columns.data()), Error);
  CHECK_THROWS_AS(im2col(geometry(1, 4, 4, 3, 3, 1, 1, -1, 0), DType::f32, image.data(), columns.data()),
                  Error);
  CHECK_THROWS_AS(col2im(geometry(1, 4, 4, 3, 3, 1, 1, 0, 0, 0, 1), DType::f32, columns.data(), image.data()),
                  Error);
  CHECK_THROWS_WITH(im2col(geometry(1, 4, 4, 3, 3), DType::i64, image.data(), columns.data()),
                    Catch::Contains("i64"));
  CHECK_THROWS_WITH(col2im(geometry(1, 4, 4, 3, 3), DType::i32, columns.data(), image.data()),
                    Catch::Contains("i32"));
}

// ---- conv2d_forward / conv2d_backward (kernels/cpu/conv2d.h): one image per thread ----------

namespace {

// gx and gw of a batch by brute force, in double: every (image, output position, tap) pair adds
// gy * w into gx and gy * x into gw.
void direct_conv_backward(const Conv2dGeometry& g, int64_t batch, int64_t out_channels,
                          const std::vector<double>& x, const std::vector<double>& w,
                          const std::vector<double>& gy, std::vector<double>& gx, std::vector<double>& gw) {
  const int64_t out_h = g.out_h(), out_w = g.out_w(), image = g.channels * g.height * g.width;
  gx.assign(static_cast<size_t>(batch * image), 0.0);
  gw.assign(static_cast<size_t>(out_channels * g.column_rows()), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t co = 0; co < out_channels; ++co)
      for (int64_t oh = 0; oh < out_h; ++oh)
        for (int64_t ow = 0; ow < out_w; ++ow) {
          const double grad = gy[((b * out_channels + co) * out_h + oh) * out_w + ow];
          for (int64_t c = 0; c < g.channels; ++c)
            for (int64_t i = 0; i < g.kernel_h; ++i)
              for (int64_t j = 0; j < g.kernel_w; ++j) {
                const int64_t ih = oh * g.stride_h - g.pad_h + i * g.dilation_h;
                const int64_t iw = ow * g.stride_w - g.pad_w + j * g.dilation_w;
                if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
                const int64_t xi = b * image + (c * g.height + ih) * g.width + iw;
                const int64_t wi = ((co * g.channels + c) * g.kernel_h + i) * g.kernel_w + j;
                gx[xi] += grad * w[wi];
                gw[wi] += grad * x[xi];
              }
        }
}

int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(n);
#else
  (void)n;
#endif
}

}  // namespace

TEST_CASE("conv2d_forward/backward (one image per thread) equal a direct convolution", "[kernels][conv]") {
  std::mt19937 rng(11);
  const int64_t out_channels = 5;
  const int saved_threads = max_threads();
  for (const Conv2dGeometry& g : test_geometries()) {
    if (g.channels * g.height * g.width > 2048) continue;  // the brute-force reference is O(everything)
    for (int64_t batch : {1, 3, 7}) {
      const int64_t image = g.channels * g.height * g.width, out = out_channels * g.column_cols();
      std::vector<double> x = random_buffer<double>(batch * image, rng);
      std::vector<double> w = random_buffer<double>(out_channels * g.column_rows(), rng);
      std::vector<double> gy = random_buffer<double>(batch * out, rng);
      std::vector<double> want_gx, want_gw;
      direct_conv_backward(g, batch, out_channels, x, w, gy, want_gx, want_gw);
      for (int threads : {1, 2, 3}) {
        INFO(describe(g) << " batch=" << batch << " threads=" << threads);
        set_threads(threads);
        const double nan = std::numeric_limits<double>::quiet_NaN();
        std::vector<double> y(static_cast<size_t>(batch * out), nan);  // every entry must be written
        conv2d_forward(g, DType::f64, batch, out_channels, x.data(), w.data(), y.data());
        for (int64_t b = 0; b < batch; ++b) {
          std::vector<double> xb(x.begin() + b * image, x.begin() + (b + 1) * image);
          const std::vector<double> want = direct_conv(g, xb, w, out_channels);
          for (int64_t e = 0; e < out; ++e) CHECK(std::abs(y[b * out + e] - want[e]) <= 1e-12);
        }
        std::vector<double> gx(static_cast<size_t>(batch * image), nan), gw(want_gw.size(), nan);
        conv2d_backward(g, DType::f64, batch, out_channels, x.data(), w.data(), gy.data(), gx.data(),
                        gw.data());
        for (size_t e = 0; e < gx.size(); ++e) CHECK(std::abs(gx[e] - want_gx[e]) <= 1e-11);
        for (size_t e = 0; e < gw.size(); ++e) CHECK(std::abs(gw[e] - want_gw[e]) <= 1e-11);
        // Only the weight gradient, then only the input gradient: each alone equals the pair.
        std::vector<double> gw_only(want_gw.size(), nan), gx_only(gx.size(), nan);
        conv2d_backward(g, DType::f64, batch, out_channels, x.data(), w.data(), gy.data(), nullptr,
                        gw_only.data());
        conv2d_backward(g, DType::f64, batch, out_channels, x.data(), w.data(), gy.data(), gx_only.data(),
                        nullptr);
        CHECK(gw_only == gw);
        CHECK(gx_only == gx);
      }
    }
  }
  set_threads(saved_threads);
}

TEST_CASE("conv2d_forward/backward take f32 and f64 only", "[kernels][conv]") {
  std::vector<float> buffer(4096);
  CHECK_THROWS_WITH(
      conv2d_forward(geometry(1, 4, 4, 3, 3), DType::bf16, 1, 2, buffer.data(), buffer.data(), buffer.data()),
      Catch::Contains("f32 or f64"));
  CHECK_THROWS_AS(conv2d_backward(geometry(1, 2, 2, 3, 3), DType::f32, 1, 2, buffer.data(), buffer.data(),
                                  buffer.data(), buffer.data(), buffer.data()),
                  Error);
}
