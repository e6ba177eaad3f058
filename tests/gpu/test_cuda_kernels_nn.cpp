// The neural-network kernels on CUDA against their CPU twins: im2col/col2im,
// max/avg pooling, layer norm, embedding, index_select/index_add and dropout
// (kernels/cuda/{conv,pool,layer_norm,embedding,dropout}.cu vs kernels/cpu/),
// then whole models: a FashionCNN forward + backward, a TinyGPT forward +
// backward, and MLP training steps with AdamW, each on cuda:0 vs the CPU.
//
// As in test_cuda_kernels.cpp, GPU outputs are poisoned first (NaN, or a
// sentinel for integers) so an element the kernel never writes fails, and
// results are compared by ||out - ref|| / ||ref|| (gpu_compare.h). Kernels that
// only move data, or add in the CPU's order, must match exactly (tolerance 0).
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cmath>
#include <string>
#include <vector>

#include "core/cuda_device_checks.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/index.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/pool.h"
#include "kernels/cuda/kernels.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using kernels::Conv2dGeometry;
using kernels::IndexShape;
using kernels::Pool2dGeometry;

const DType kFloatDtypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};

// Runs `gpu_call` with cuda:0 current and waits for it, so errors surface here.
template <class F>
void on_gpu(F&& gpu_call) {
  cuda::DeviceGuard guard(0);
  gpu_call();
  cuda::synchronize(cuda::current_stream(0));
}

// ---- im2col / col2im ---------------------------------------------------------------------------
Conv2dGeometry conv_geometry(int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
  Conv2dGeometry g;
  g.channels = c, g.height = h, g.width = w, g.kernel_h = kh, g.kernel_w = kw;
  g.stride_h = sh, g.stride_w = sw, g.pad_h = ph, g.pad_w = pw, g.dilation_h = dh, g.dilation_w = dw;
  return g;
}

TEST_CASE("cuda im2col and col2im match the CPU exactly", "[gpu][conv]") {
  manual_seed(21);
  const std::vector<std::pair<Conv2dGeometry, int64_t>> cases = {
      {conv_geometry(4, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1), 3},  // 3x3 "same", a batch of 3
      {conv_geometry(3, 9, 7, 3, 2, 2, 1, 1, 1, 1, 2), 2},  // strided, padded, dilated
      {conv_geometry(5, 6, 6, 1, 1, 2, 2, 0, 0, 1, 1), 1},  // 1x1 stride 2 (a ResNet shortcut)
      {conv_geometry(2, 5, 5, 5, 5, 1, 1, 0, 0, 1, 1), 2},  // kernel covers the image: one output pixel
  };
  for (const auto& [g, images] : cases) {
    for (DType dt : kFloatDtypes) {
      INFO("C=" << g.channels << " H=" << g.height << " W=" << g.width << " k=" << g.kernel_h << "x"
                << g.kernel_w << " images=" << images << " dtype " << dt);
      const Shape image_shape{images, g.channels, g.height, g.width};
      const Shape column_shape{g.column_rows(), images * g.column_cols()};
      const Tensor x = random_cpu(image_shape, dt), xg = x.to(gpu());
      Tensor ref = empty(column_shape, TensorOptions{dt});
      kernels::cpu::im2col(g, dt, x.data_ptr(), ref.data_ptr(), images);
      Tensor cols = poisoned(column_shape, dt, gpu());
      on_gpu([&] {
        kernels::cuda::im2col(mg::cuda::current_kernel_stream(), g, dt, xg.data_ptr(), cols.data_ptr(),
                              images);
      });
      CHECK(rel_error(cols, ref) == 0.0);  // a copy: exact

      // col2im accumulates into the image: start both from the same random image.
      const Tensor c = random_cpu(column_shape, dt), cg = c.to(gpu());
      Tensor ref_image = random_cpu(image_shape, dt);
      Tensor image = ref_image.to(gpu());
      kernels::cpu::col2im(g, dt, c.data_ptr(), ref_image.data_ptr(), images);
      on_gpu([&] {
        kernels::cuda::col2im(mg::cuda::current_kernel_stream(), g, dt, cg.data_ptr(), image.data_ptr(),
                              images);
      });
      CHECK(rel_error(image, ref_image) == 0.0);  // the same additions in the same order
    }
  }
  // A bad geometry is refused before anything is launched, with the CPU's message.
  const Conv2dGeometry bad = conv_geometry(1, 2, 2, 5, 5, 1, 1, 0, 0, 1, 1);
  Tensor dummy = empty({25}, TensorOptions{DType::f32, gpu()});
  CHECK_THROWS_WITH(kernels::cuda::im2col(mg::cuda::current_kernel_stream(), bad, DType::f32,
                                          dummy.data_ptr(), dummy.data_ptr()),
                    Catch::Contains("smaller than the dilated kernel"));
}

// ---- pooling ---------------------------------------------------------------------------------
Pool2dGeometry pool_geometry(int64_t planes, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                             int64_t sw, int64_t ph, int64_t pw) {
  Pool2dGeometry g;
  g.planes = planes, g.height = h, g.width = w, g.kernel_h = kh, g.kernel_w = kw;
  g.stride_h = sh, g.stride_w = sw, g.pad_h = ph, g.pad_w = pw;
  return g;
}

// `t` copied to cuda:0, `offset` elements into a larger buffer: a view whose address is
// misaligned for any vector access when the offset is odd.
Tensor gpu_at(const Tensor& t, int64_t offset) {
  Tensor base = poisoned({t.numel() + offset}, t.dtype(), gpu());
  Tensor view = base.narrow(0, offset, t.numel()).view(t.shape());
  view.copy_(t);
  return view;
}
// A poisoned cuda:0 output `offset` elements into a larger buffer.
Tensor poisoned_at(const Shape& shape, DType dtype, int64_t offset) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return poisoned({n + offset}, dtype, gpu()).narrow(0, offset, n).view(shape);
}

// Each element's sign bit (-0.0 and +0.0 differ), read on the host.
std::vector<bool> sign_bits(const Tensor& t) {
  std::vector<bool> bits;
  for (double v : t.to_vector<double>()) bits.push_back(std::signbit(v));
  return bits;
}

// Max (values, argmax, backward) and avg (both count_include_pad, forward and backward) pooling
// of `g` in `dt` against the CPU, exactly; the input and grad_input `offset` elements into their
// buffers (an odd offset keeps the 2x2 kernels off their pair path).
void check_pooling(const Pool2dGeometry& g, DType dt, int64_t offset) {
  INFO("planes=" << g.planes << " H=" << g.height << " W=" << g.width << " k=" << g.kernel_h << "x"
                 << g.kernel_w << " s=" << g.stride_h << "x" << g.stride_w << " dtype " << dt << " offset "
                 << offset);
  const Shape in_shape{g.planes, g.height, g.width}, out_shape{g.planes, g.out_h(), g.out_w()};
  // Small integers: many ties, which must resolve to the same (first) element as on the CPU.
  Tensor x = random_cpu(in_shape, DType::f64, 2.0).to(DType::i64).to(dt);
  x.view({-1}).narrow(0, 7, 1).fill_(NAN);  // a NaN wins its window(s)
  if (x.numel() > 40) x.view({-1}).narrow(0, 40, 1).fill_(-INFINITY);
  const Tensor xg = gpu_at(x, offset);

  Tensor ref = empty(out_shape, TensorOptions{dt}), ref_index = empty(out_shape, TensorOptions{DType::i64});
  kernels::cpu::max_pool2d_forward(g, dt, x.data_ptr(), ref.data_ptr(), ref_index.data<int64_t>());
  Tensor out = poisoned(out_shape, dt, gpu()), index = poisoned(out_shape, DType::i64, gpu());
  on_gpu([&] {
    kernels::cuda::max_pool2d_forward(mg::cuda::current_kernel_stream(), g, dt, xg.data_ptr(), out.data_ptr(),
                                      index.data<int64_t>());
  });
  CHECK(rel_error(out, ref) == 0.0);
  CHECK(index.to_vector<int64_t>() == ref_index.to_vector<int64_t>());

  Tensor gy = random_cpu(out_shape, dt);
  gy.view({-1}).narrow(0, 0, 1).fill_(-0.0);  // -0.0 stays -0.0 only where the CPU keeps it
  const Tensor gyg = gy.to(gpu());
  Tensor ref_gx = empty(in_shape, TensorOptions{dt});
  kernels::cpu::max_pool2d_backward(g, dt, gy.data_ptr(), ref_index.data<int64_t>(), ref_gx.data_ptr());
  Tensor gx = poisoned_at(in_shape, dt, offset);
  on_gpu([&] {
    kernels::cuda::max_pool2d_backward(mg::cuda::current_kernel_stream(), g, dt, gyg.data_ptr(),
                                       index.data<int64_t>(), gx.data_ptr());
  });
  CHECK(rel_error(gx, ref_gx) == 0.0);  // gathered in the CPU's order
  CHECK(sign_bits(gx) == sign_bits(ref_gx));

  const Tensor xa = random_cpu(in_shape, dt), xag = gpu_at(xa, offset);
  for (bool include_pad : {true, false}) {
    INFO("count_include_pad " << include_pad);
    Tensor ref_avg = empty(out_shape, TensorOptions{dt});
    kernels::cpu::avg_pool2d_forward(g, dt, xa.data_ptr(), ref_avg.data_ptr(), include_pad);
    Tensor avg = poisoned(out_shape, dt, gpu());
    on_gpu([&] {
      kernels::cuda::avg_pool2d_forward(mg::cuda::current_kernel_stream(), g, dt, xag.data_ptr(),
                                        avg.data_ptr(), include_pad);
    });
    CHECK(rel_error(avg, ref_avg) == 0.0);
    Tensor ref_avg_gx = empty(in_shape, TensorOptions{dt});
    kernels::cpu::avg_pool2d_backward(g, dt, gy.data_ptr(), ref_avg_gx.data_ptr(), include_pad);
    Tensor avg_gx = poisoned_at(in_shape, dt, offset);
    on_gpu([&] {
      kernels::cuda::avg_pool2d_backward(mg::cuda::current_kernel_stream(), g, dt, gyg.data_ptr(),
                                         avg_gx.data_ptr(), include_pad);
    });
    CHECK(rel_error(avg_gx, ref_avg_gx) == 0.0);
    CHECK(sign_bits(avg_gx) == sign_bits(ref_avg_gx));
  }
}

TEST_CASE("cuda max and avg pooling match the CPU, ties and NaN included", "[gpu][pool]") {
  manual_seed(22);
  const Pool2dGeometry cases[] = {
      pool_geometry(6, 8, 8, 2, 2, 2, 2, 0, 0),  // the CNN "maxpool 2"
      pool_geometry(5, 7, 9, 3, 3, 2, 2, 1, 1),  // padded, odd sizes
      pool_geometry(4, 6, 5, 3, 2, 1, 1, 1, 1),  // overlapping windows (stride < kernel)
      pool_geometry(3, 9, 9, 3, 3, 3, 3, 0, 0),  // 9x9 -> 3x3, an input row left over at no edge
  };
  for (const Pool2dGeometry& g : cases)
    for (DType dt : kFloatDtypes) check_pooling(g, dt, 0);
}

// The 2x2, stride-2 pair paths (window rows moved as 2-element pairs; the backward writing each
// output's window) and where they must not apply. Rows of up to 32 outputs take the row-pair path
// (a warp per 32 / out_w row pairs, shuffles), longer ones a thread per output; an odd height
// leaves an input row in no window (zeros), an odd width, padding or a misaligned buffer take the
// general path. Plane counts leave a warp's last row pairs past the end.
TEST_CASE("cuda 2x2 pooling's pair paths match the CPU exactly", "[gpu][pool]") {
  manual_seed(23);
  const Pool2dGeometry cases[] = {
      pool_geometry(3, 7, 8, 2, 2, 2, 2, 0, 0),    // odd height; out_w 4: 8 row pairs a warp
      pool_geometry(9, 6, 10, 2, 2, 2, 2, 0, 0),   // out_w 5: 6 row pairs a warp, 27 in all
      pool_geometry(4, 5, 7, 2, 2, 2, 2, 0, 0),    // odd width: the general path
      pool_geometry(5, 2, 2, 2, 2, 2, 2, 0, 0),    // one window a plane: 32 row pairs a warp
      pool_geometry(2, 28, 28, 2, 2, 2, 2, 0, 0),  // the CNN's first pool (out_w 14)
      pool_geometry(3, 14, 14, 2, 2, 2, 2, 0, 0),  // and its second (out_w 7)
      pool_geometry(3, 5, 64, 2, 2, 2, 2, 0, 0),   // out_w 32: one row pair a warp; odd height
      pool_geometry(2, 5, 70, 2, 2, 2, 2, 0, 0),   // out_w 35: a thread per output; odd height
      pool_geometry(3, 6, 6, 2, 2, 2, 2, 1, 1),    // padded: the general path
  };
  for (const Pool2dGeometry& g : cases)
    for (DType dt : kFloatDtypes)
      for (int64_t offset : {0, 1}) check_pooling(g, dt, offset);
}

// ---- layer norm ------------------------------------------------------------------------------
TEST_CASE("cuda layer norm forward and backward match the CPU", "[gpu][layer_norm]") {
  manual_seed(23);
  for (int64_t cols : {1, 10, 300, 1000}) {
    for (DType dt : kFloatDtypes) {
      for (bool affine : {true, false}) {
        INFO("cols " << cols << " dtype " << dt << " affine " << affine);
        const int64_t rows = 37;
        const DType st = dt == DType::f64 ? DType::f64 : DType::f32;
        // |mean| >> std exercises the corrected two-pass variance.
        const Tensor x = random_cpu({rows, cols}, dt, 1.0, 3.0), xg = x.to(gpu());
        const Tensor w = random_cpu({cols}, dt, 0.5, 1.0), b = random_cpu({cols}, dt);
        const Tensor wg = w.to(gpu()), bg = b.to(gpu());
        const void* wp = affine ? w.data_ptr() : nullptr;
        const void* bp = affine ? b.data_ptr() : nullptr;
        const void* wgp = affine ? wg.data_ptr() : nullptr;
        const void* bgp = affine ? bg.data_ptr() : nullptr;

        Tensor ref = empty({rows, cols}, TensorOptions{dt});
        Tensor ref_mean = empty({rows}, TensorOptions{st}), ref_rstd = empty({rows}, TensorOptions{st});
        kernels::cpu::layer_norm_forward(dt, x.data_ptr(), wp, bp, rows, cols, 1e-5, ref.data_ptr(),
                                         ref_mean.data_ptr(), ref_rstd.data_ptr());
        Tensor y = poisoned({rows, cols}, dt, gpu());
        Tensor mean = poisoned({rows}, st, gpu()), rstd = poisoned({rows}, st, gpu());
        on_gpu([&] {
          kernels::cuda::layer_norm_forward(mg::cuda::current_kernel_stream(), dt, xg.data_ptr(), wgp, bgp,
                                            rows, cols, 1e-5, y.data_ptr(), mean.data_ptr(), rstd.data_ptr());
        });
        MG_REQUIRE_CLOSE(y, ref, 2 * tolerance(dt));
        MG_REQUIRE_CLOSE(mean, ref_mean, tolerance(st));
        MG_REQUIRE_CLOSE(rstd, ref_rstd, 2 * tolerance(st));

        const Tensor gy = random_cpu({rows, cols}, dt), gyg = gy.to(gpu());
        Tensor ref_gx = empty({rows, cols}, TensorOptions{dt});
        Tensor ref_gw = empty({cols}, TensorOptions{dt}), ref_gb = empty({cols}, TensorOptions{dt});
        kernels::cpu::layer_norm_backward(dt, gy.data_ptr(), x.data_ptr(), ref_mean.data_ptr(),
                                          ref_rstd.data_ptr(), wp, rows, cols, ref_gx.data_ptr(),
                                          ref_gw.data_ptr(), ref_gb.data_ptr());
        // The GPU backward reads the CPU's statistics, so only the backward is compared here.
        const Tensor mean_in = ref_mean.to(gpu()), rstd_in = ref_rstd.to(gpu());
        Tensor gx = poisoned({rows, cols}, dt, gpu());
        Tensor gw = poisoned({cols}, dt, gpu()), gb = poisoned({cols}, dt, gpu());
        on_gpu([&] {
          kernels::cuda::layer_norm_backward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                             dt, gyg.data_ptr(), xg.data_ptr(), mean_in.data_ptr(),
                                             rstd_in.data_ptr(), wgp, rows, cols, gx.data_ptr(),
                                             gw.data_ptr(), gb.data_ptr());
        });
        // cols == 1: x - mean is rounding noise and gx ~ 0, so compare absolutely there.
        if (cols > 1) MG_REQUIRE_CLOSE(gx, ref_gx, 8 * tolerance(dt));
        MG_REQUIRE_CLOSE(gw, ref_gw, cols > 1 ? 4 * tolerance(dt) : 1e-2);
        MG_REQUIRE_CLOSE(gb, ref_gb, 4 * tolerance(dt));
      }
    }
  }
}

// Shapes whose weight/bias gradient splits the rows into slices (kernels/cuda/layer_norm.cu: pass 1 over
// column tiles x row slices, pass 2 adding each column's partials in order): 16-byte vector loads
// ([2048, 96], [300, 40] with an uneven last slice, [2048, 768]: GPT-2 small's width), a width that is no
// multiple of the vector ([513, 37]: one column per thread), and a few rows more than one slice
// ([130, 768]). The reference is the CPU kernel in f64 on the same values and statistics: at [8192, 768]
// the CPU's f32 column sums (one sequential float sum per column) are themselves up to 6e-6 off, close
// to the tolerance, while the sliced GPU sums are within 1e-6. gw and gb must match element by element,
// and (in f32) a second run (only the bias, then only the weight) the first bit for bit.
TEST_CASE("cuda layer norm backward splits the rows, matches the CPU, and is reproducible",
          "[gpu][layer_norm][split]") {
  manual_seed(26);
  const std::pair<int64_t, int64_t> shapes[] = {{2048, 96}, {300, 40}, {513, 37}, {130, 768}, {2048, 768}};
  const auto f64 = TensorOptions{DType::f64};
  for (const auto& [rows, cols] : shapes) {
    const bool big = rows * cols > 1000000;  // f32 only: the emulator runs grad_x's rows x 256 threads slowly
    for (DType dt : kFloatDtypes) {
      if (big && dt != DType::f32) continue;
      const bool rerun = !big && dt == DType::f32;  // the bitwise check: one dtype is enough
      INFO("rows " << rows << " cols " << cols << " dtype " << dt);
      const DType st = dt == DType::f64 ? DType::f64 : DType::f32;
      const Tensor x = random_cpu({rows, cols}, dt, 1.0, 3.0), xg = x.to(gpu());
      const Tensor w = random_cpu({cols}, dt, 0.5, 1.0), wg = w.to(gpu());
      const Tensor gy = random_cpu({rows, cols}, dt), gyg = gy.to(gpu());
      Tensor y = empty({rows, cols}, TensorOptions{dt});
      Tensor mean = empty({rows}, TensorOptions{st}), rstd = empty({rows}, TensorOptions{st});
      kernels::cpu::layer_norm_forward(dt, x.data_ptr(), w.data_ptr(), nullptr, rows, cols, 1e-5,
                                       y.data_ptr(), mean.data_ptr(), rstd.data_ptr());
      const Tensor x64 = x.to(DType::f64), gy64 = gy.to(DType::f64), w64 = w.to(DType::f64);
      const Tensor mean64 = mean.to(DType::f64), rstd64 = rstd.to(DType::f64);
      Tensor ref_gx = empty({rows, cols}, f64), ref_gw = empty({cols}, f64), ref_gb = empty({cols}, f64);
      kernels::cpu::layer_norm_backward(DType::f64, gy64.data_ptr(), x64.data_ptr(), mean64.data_ptr(),
                                        rstd64.data_ptr(), w64.data_ptr(), rows, cols, ref_gx.data_ptr(),
                                        ref_gw.data_ptr(), ref_gb.data_ptr());
      const Tensor mean_g = mean.to(gpu()), rstd_g = rstd.to(gpu());
      Tensor gx = poisoned({rows, cols}, dt, gpu());
      Tensor gw = poisoned({cols}, dt, gpu()), gb = poisoned({cols}, dt, gpu());
      Tensor gw2 = poisoned({cols}, dt, gpu()), gb2 = poisoned({cols}, dt, gpu());
      const auto backward = [&](void* grad_weight, void* grad_bias) {
        kernels::cuda::layer_norm_backward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt,
                                           gyg.data_ptr(), xg.data_ptr(), mean_g.data_ptr(),
                                           rstd_g.data_ptr(), wg.data_ptr(), rows, cols, gx.data_ptr(),
                                           grad_weight, grad_bias);
      };
      on_gpu([&] {
        backward(gw.data_ptr(), gb.data_ptr());
        if (rerun) {
          backward(nullptr, gb2.data_ptr());
          backward(gw2.data_ptr(), nullptr);
        }
      });
      // The tolerances of "cuda layer norm forward and backward match the CPU" above.
      MG_REQUIRE_CLOSE(gx, ref_gx, 8 * tolerance(dt));
      MG_REQUIRE_EACH_CLOSE(gw, ref_gw, 4 * tolerance(dt));
      MG_REQUIRE_EACH_CLOSE(gb, ref_gb, 4 * tolerance(dt));
      if (rerun) {
        CHECK(gw2.to_vector<double>() == gw.to_vector<double>());
        CHECK(gb2.to_vector<double>() == gb.to_vector<double>());
      }
    }
  }
}

// ---- embedding, index_select, index_add ------------------------------------------------------
Tensor index_tensor(int64_t count, int64_t limit, int64_t step) {
  std::vector<int64_t> v(count);
  for (int64_t i = 0; i < count; ++i) v[i] = (i * step + i / 3) % limit;  // repeats, in no order
  return tensor<int64_t>(v);
}

TEST_CASE("cuda embedding forward and backward match the CPU, and refuse bad indices", "[gpu][embedding]") {
  manual_seed(24);
  const int64_t num = 50, dim = 33, count = 200;
  const Tensor idx = index_tensor(count, num, 7), idxg = idx.to(gpu());
  for (DType dt : kFloatDtypes) {
    for (int64_t padding_idx : {int64_t(-1), int64_t(3)}) {
      INFO("dtype " << dt << " padding_idx " << padding_idx);
      const Tensor w = random_cpu({num, dim}, dt), wg = w.to(gpu());
      Tensor ref = empty({count, dim}, TensorOptions{dt});
      kernels::cpu::embedding_forward(dt, w.data_ptr(), num, dim, idx.data<int64_t>(), count, ref.data_ptr());
      Tensor out = poisoned({count, dim}, dt, gpu());
      on_gpu([&] {
        kernels::cuda::embedding_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt,
                                         wg.data_ptr(), num, dim, idxg.data<int64_t>(), count,
                                         out.data_ptr());
      });
      CHECK(rel_error(out, ref) == 0.0);

      const Tensor gy = random_cpu({count, dim}, dt), gyg = gy.to(gpu());
      Tensor ref_gw = empty({num, dim}, TensorOptions{dt});
      kernels::cpu::embedding_backward(dt, gy.data_ptr(), idx.data<int64_t>(), count, dim, num, padding_idx,
                                       ref_gw.data_ptr());
      Tensor gw = poisoned({num, dim}, dt, gpu());
      on_gpu([&] {
        kernels::cuda::embedding_backward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt,
                                          gyg.data_ptr(), idxg.data<int64_t>(), count, dim, num, padding_idx,
                                          gw.data_ptr());
      });
      // Atomic adds in any order; halves round after each of the ~4 additions per row.
      MG_REQUIRE_CLOSE(gw, ref_gw, 4 * tolerance(dt));
      if (padding_idx >= 0) CHECK(sum(abs(gw.narrow(0, padding_idx, 1))).item<double>() == 0.0);
    }
  }
  // A bad index: the CPU's message (position and value), and nothing launched after the check.
  const Tensor bad = tensor<int64_t>({1, 4, 50, 2}).to(gpu());
  const Tensor w = random_cpu({num, dim}, DType::f32).to(gpu());
  Tensor out = poisoned({4, dim}, DType::f32, gpu());
  try {
    on_gpu([&] {
      kernels::cuda::embedding_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                       DType::f32, w.data_ptr(), num, dim, bad.data<int64_t>(), 4,
                                       out.data_ptr());
    });
    FAIL("embedding_forward accepted index 50 for 50 embeddings");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("index 50 at position 2") != std::string::npos);
  }
  CHECK(std::isnan(out.to_vector<float>()[0]));  // nothing was written
}

// The op's deferred index check (as cross_entropy's target check): the gather checks its own
// indices without the host waiting, a bad one gets zeros (nothing read out of bounds), and the
// error -- naming the op, the position and the value -- comes at the next synchronisation, once.
TEST_CASE("cuda embedding op: a bad index is reported at the next synchronisation", "[gpu][embedding]") {
  manual_seed(26);
  const int64_t num = 50, dim = 33;
  const Tensor w_cpu = random_cpu({num, dim}, DType::f32);
  const Tensor w = w_cpu.to(gpu()).set_requires_grad(true);
  const Tensor bad = tensor<int64_t>({1, 4, 50, 2, -3}).to(gpu());
  CHECK(cuda::pending_device_checks() == 0);
  Tensor out;
  REQUIRE_NOTHROW(out = embedding(w, bad));  // no wait, no throw at the call
  CHECK(cuda::pending_device_checks() == 1);
  REQUIRE_NOTHROW(sum(out).backward());  // the backward skips the bad positions
  try {
    sum(out).item<float>();
    FAIL("no error for index 50 with 50 embeddings");
  } catch (const Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    CHECK(msg.find("embedding") != std::string::npos);
    CHECK(msg.find("index 50 at position 2") != std::string::npos);  // the first bad position
    CHECK(msg.find("next synchronisation") != std::string::npos);
  }
  CHECK(cuda::pending_device_checks() == 0);
  // Reported once; the good rows were gathered, the bad ones are zeros.
  const std::vector<float> o = out.detach().to(Device::cpu()).to_vector<float>();
  const std::vector<float> ref = w_cpu.to_vector<float>();
  for (int64_t j = 0; j < dim; ++j) {
    CHECK(o[0 * dim + j] == ref[1 * dim + j]);
    CHECK(o[3 * dim + j] == ref[2 * dim + j]);
    CHECK(o[2 * dim + j] == 0.0f);
    CHECK(o[4 * dim + j] == 0.0f);
  }
  // The gradient: ones on rows 1, 4 and 2, nothing from the bad positions.
  const std::vector<float> g = w.grad().to(Device::cpu()).to_vector<float>();
  double total = 0;
  for (float x : g) total += x;
  CHECK(total == 3.0 * dim);
  CHECK(g[4 * dim] == 1.0f);
  // A valid lookup afterwards: no error.
  CHECK_NOTHROW(sum(embedding(w.detach(), tensor<int64_t>({0, 49}).to(gpu()))).item<float>());
}

// The gather copies whole words -- 16 bytes where a row's bytes and both bases allow, else 8, 4 or
// the element -- and the scatter-add reads each run's index once per tile of a warp: every row
// length around those widths (and the 128-element tile), every float dtype, the weight and the
// output `offset` elements into their buffers; then the deferred check with 16-byte words.
TEST_CASE("cuda embedding: whole-word gathers and tiled scatters for every row length", "[gpu][embedding]") {
  manual_seed(27);
  const int64_t num = 23, count = 41;
  const Tensor idx = index_tensor(count, num, 5), idxg = idx.to(gpu());
  for (DType dt : kFloatDtypes) {
    for (int64_t dim : {1, 2, 3, 4, 6, 8, 12, 16, 100, 128, 129, 260}) {
      for (int64_t offset : {0, 1, 2}) {
        INFO("dtype " << dt << " dim " << dim << " offset " << offset);
        const Tensor w = random_cpu({num, dim}, dt), wg = gpu_at(w, offset);
        Tensor ref = empty({count, dim}, TensorOptions{dt});
        kernels::cpu::embedding_forward(dt, w.data_ptr(), num, dim, idx.data<int64_t>(), count,
                                        ref.data_ptr());
        Tensor out = poisoned_at({count, dim}, dt, offset);
        on_gpu([&] {
          kernels::cuda::embedding_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt,
                                           wg.data_ptr(), num, dim, idxg.data<int64_t>(), count,
                                           out.data_ptr());
        });
        CHECK(out.to_vector<double>() == ref.to_vector<double>());

        const Tensor gy = random_cpu({count, dim}, dt), gyg = gpu_at(gy, offset);
        Tensor ref_gw = empty({num, dim}, TensorOptions{dt});
        kernels::cpu::embedding_backward(dt, gy.data_ptr(), idx.data<int64_t>(), count, dim, num, 3,
                                         ref_gw.data_ptr());
        Tensor gw = poisoned_at({num, dim}, dt, offset);
        on_gpu([&] {
          kernels::cuda::embedding_backward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                            dt, gyg.data_ptr(), idxg.data<int64_t>(), count, dim, num, 3,
                                            gw.data_ptr());
        });
        MG_REQUIRE_CLOSE(gw, ref_gw, 4 * tolerance(dt));
        CHECK(sum(abs(gw.narrow(0, 3, 1))).item<double>() == 0.0);  // padding_idx 3
      }
    }
  }
  // The deferred check with 16-byte words (dim 64 f32 = 256-byte rows): bad positions get zeros,
  // the good ones their rows, and the words name the first bad position and its value.
  const int64_t dim = 64;
  const Tensor w = random_cpu({num, dim}, DType::f32), wg = w.to(gpu());
  const Tensor bad = tensor<int64_t>({5, 22, 23, 0, -7, 23}), badg = bad.to(gpu());
  Tensor out = poisoned({6, dim}, DType::f32, gpu());
  Tensor words = empty({kernels::cuda::kEmbeddingCheckWords}, TensorOptions{DType::i64, gpu()});
  on_gpu([&] {
    kernels::cuda::embedding_forward_deferred(mg::cuda::current_kernel_stream(), DType::f32, wg.data_ptr(),
                                              num, dim, badg.data<int64_t>(), 6, out.data_ptr(),
                                              words.data_ptr());
  });
  const std::vector<int64_t> host_words = words.to_vector<int64_t>();
  CHECK(host_words == std::vector<int64_t>{2, 23});
  CHECK(kernels::cuda::embedding_index_error(host_words.data(), 6, num).find("index 23 at position 2") !=
        std::string::npos);
  const std::vector<float> o = out.to_vector<float>(), ref = w.to_vector<float>();
  for (int64_t j = 0; j < dim; ++j) {
    CHECK(o[0 * dim + j] == ref[5 * dim + j]);
    CHECK(o[1 * dim + j] == ref[22 * dim + j]);
    CHECK(o[3 * dim + j] == ref[0 * dim + j]);
    CHECK(o[2 * dim + j] == 0.0f);
    CHECK(o[4 * dim + j] == 0.0f);
    CHECK(o[5 * dim + j] == 0.0f);
  }
}

// index_select and index_add with an outer dim and runs of whole 16- and 8-byte words.
TEST_CASE("cuda index_select and index_add with word-sized runs match the CPU", "[gpu][index]") {
  manual_seed(28);
  for (int64_t inner : {2, 4, 8, 64}) {
    const IndexShape shape{3, 11, inner};
    const int64_t count = 9;
    const Tensor idx = index_tensor(count, shape.size, 4), idxg = idx.to(gpu());
    for (DType dt :
         {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
      INFO("inner " << inner << " dtype " << dt);
      const Tensor x = random_cpu({shape.outer, shape.size, shape.inner}, DType::f32, 10.0).to(dt),
                   xg = x.to(gpu());
      const Shape out_shape{shape.outer, count, shape.inner};
      Tensor ref = empty(out_shape, TensorOptions{dt});
      kernels::cpu::index_select(dt, shape, x.data_ptr(), idx.data<int64_t>(), count, ref.data_ptr());
      Tensor out = poisoned(out_shape, dt, gpu());
      if (dt == DType::boolean) out.copy_(eq(ref, 0.0).to(gpu()));  // poison: the complement of ref
      on_gpu([&] {
        kernels::cuda::index_select(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt, shape,
                                    xg.data_ptr(), idxg.data<int64_t>(), count, out.data_ptr());
      });
      CHECK(out.to_vector<double>() == ref.to_vector<double>());
      if (!is_floating(dt)) continue;
      const Tensor gy = random_cpu(out_shape, dt), gyg = gy.to(gpu());
      Tensor ref_gx = zeros({shape.outer, shape.size, shape.inner}, TensorOptions{dt});
      kernels::cpu::index_add(dt, shape, gy.data_ptr(), idx.data<int64_t>(), count, ref_gx.data_ptr());
      Tensor gx = zeros({shape.outer, shape.size, shape.inner}, TensorOptions{dt, gpu()});
      on_gpu([&] {
        kernels::cuda::index_add(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt, shape,
                                 gyg.data_ptr(), idxg.data<int64_t>(), count, gx.data_ptr());
      });
      MG_REQUIRE_CLOSE(gx, ref_gx, 2 * tolerance(dt));
    }
  }
}

TEST_CASE("cuda index_select (every dtype) and index_add match the CPU", "[gpu][index]") {
  manual_seed(25);
  const IndexShape shape{6, 11, 5};  // [outer, size, inner]
  const int64_t count = 17;
  const Tensor idx = index_tensor(count, shape.size, 4), idxg = idx.to(gpu());
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::boolean}) {
    INFO("dtype " << dt);
    const Tensor x = random_cpu({shape.outer, shape.size, shape.inner}, DType::f32, 10.0).to(dt),
                 xg = x.to(gpu());
    const Shape out_shape{shape.outer, count, shape.inner};
    Tensor ref = empty(out_shape, TensorOptions{dt});
    kernels::cpu::index_select(dt, shape, x.data_ptr(), idx.data<int64_t>(), count, ref.data_ptr());
    Tensor out = poisoned(out_shape, dt, gpu());
    if (dt == DType::boolean) out.copy_(eq(ref, 0.0).to(gpu()));  // poison: the complement of ref
    on_gpu([&] {
      kernels::cuda::index_select(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt, shape,
                                  xg.data_ptr(), idxg.data<int64_t>(), count, out.data_ptr());
    });
    CHECK(out.to_vector<double>() == ref.to_vector<double>());
    if (!is_floating(dt)) continue;

    const Tensor gy = random_cpu(out_shape, dt), gyg = gy.to(gpu());
    Tensor ref_gx = zeros({shape.outer, shape.size, shape.inner}, TensorOptions{dt});
    kernels::cpu::index_add(dt, shape, gy.data_ptr(), idx.data<int64_t>(), count, ref_gx.data_ptr());
    Tensor gx = zeros({shape.outer, shape.size, shape.inner}, TensorOptions{dt, gpu()});
    on_gpu([&] {
      kernels::cuda::index_add(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), dt, shape,
                               gyg.data_ptr(), idxg.data<int64_t>(), count, gx.data_ptr());
    });
    MG_REQUIRE_CLOSE(gx, ref_gx, 2 * tolerance(dt));
  }
  const Tensor bad = tensor<int64_t>({0, -1}).to(gpu());
  const Tensor x = zeros({shape.outer, shape.size, shape.inner}, TensorOptions{DType::f32, gpu()});
  Tensor out = empty({shape.outer, 2, shape.inner}, TensorOptions{DType::f32, gpu()});
  CHECK_THROWS_WITH(on_gpu([&] {
                      kernels::cuda::index_select(mg::cuda::current_kernel_stream(),
                                                  mg::cuda::current_scratch(), DType::f32, shape,
                                                  x.data_ptr(), bad.data<int64_t>(), 2, out.data_ptr());
                    }),
                    Catch::Contains("index -1 at position 1"));
}

// ---- dropout ---------------------------------------------------------------------------------
TEST_CASE("cuda dropout draws the CPU's mask bit for bit", "[gpu][dropout]") {
  manual_seed(26);
  const int64_t count = 100003;  // not a multiple of any launch size
  for (DType dt : kFloatDtypes) {
    for (double p : {0.1, 0.5, 0.9, 1.0}) {
      INFO("dtype " << dt << " p " << p);
      const uint64_t seed = 0x1234567890abcdefull, offset = 7;
      const Tensor x = random_cpu({count}, dt), xg = x.to(gpu());
      Tensor ref = empty({count}, TensorOptions{dt}),
             ref_mask = empty({count}, TensorOptions{DType::boolean});
      kernels::cpu::dropout_forward(dt, x.data_ptr(), ref.data_ptr(), ref_mask.data<bool>(), count, p, seed,
                                    offset);
      Tensor y = poisoned({count}, dt, gpu());
      Tensor mask = eq(ref_mask, 0.0).to(gpu());  // poison: the complement of the expected mask
      on_gpu([&] {
        kernels::cuda::dropout_forward(mg::cuda::current_kernel_stream(), dt, xg.data_ptr(), y.data_ptr(),
                                       mask.data<bool>(), count, p, seed, offset);
      });
      CHECK(mask.to_vector<bool>() == ref_mask.to_vector<bool>());  // bitwise
      CHECK(rel_error(y, ref) == 0.0);

      const Tensor gy = random_cpu({count}, dt), gyg = gy.to(gpu());
      Tensor ref_gx = empty({count}, TensorOptions{dt});
      kernels::cpu::dropout_backward(dt, gy.data_ptr(), ref_mask.data<bool>(), ref_gx.data_ptr(), count, p);
      Tensor gx = poisoned({count}, dt, gpu());
      on_gpu([&] {
        kernels::cuda::dropout_backward(mg::cuda::current_kernel_stream(), dt, gyg.data_ptr(),
                                        mask.data<bool>(), gx.data_ptr(), count, p);
      });
      CHECK(rel_error(gx, ref_gx) == 0.0);
    }
  }
  // Through the op: the same seed gives the same mask on both devices, and the next call a different one.
  const Tensor x = ones({4096}, TensorOptions{DType::f32});
  manual_seed(99);
  const Tensor a_cpu = dropout(x, 0.5, true), b_cpu = dropout(x, 0.5, true);
  manual_seed(99);
  const Tensor a_gpu = dropout(x.to(gpu()), 0.5, true), b_gpu = dropout(x.to(gpu()), 0.5, true);
  CHECK(a_gpu.device() == gpu());
  CHECK(a_gpu.to_vector<float>() == a_cpu.to_vector<float>());
  CHECK(b_gpu.to_vector<float>() == b_cpu.to_vector<float>());
  CHECK(a_cpu.to_vector<float>() != b_cpu.to_vector<float>());
}

// ---- the ops (dispatch, autograd) ------------------------------------------------------------
// f(inputs) on the CPU and on cuda:0 (inputs copied there), then backward of
// sum(f * r) for a fixed random r: the outputs and every input's gradient must agree.
template <class F>
void check_op(const char* name, const std::vector<Tensor>& cpu_inputs, F f, double tol) {
  INFO("op " << name);
  std::vector<Tensor> cpu_leaves, gpu_leaves;
  for (const Tensor& t : cpu_inputs) {
    const bool grad = is_floating(t.dtype());
    cpu_leaves.push_back(t.detach().set_requires_grad(grad));
    gpu_leaves.push_back(t.to(gpu()).set_requires_grad(grad));
  }
  const Tensor out_cpu = f(cpu_leaves), out_gpu = f(gpu_leaves);
  REQUIRE(out_gpu.device() == gpu());
  MG_REQUIRE_CLOSE(out_gpu, out_cpu, tol);
  const Tensor r = random_cpu(out_cpu.shape(), out_cpu.dtype());
  sum(mul(out_cpu, r)).backward();
  sum(mul(out_gpu, r.to(gpu()))).backward();
  for (size_t i = 0; i < cpu_leaves.size(); ++i) {
    if (!cpu_leaves[i].requires_grad()) continue;
    INFO("gradient of input " << i);
    REQUIRE(gpu_leaves[i].grad().defined());
    MG_REQUIRE_CLOSE(gpu_leaves[i].grad(), cpu_leaves[i].grad(), tol);
  }
}

TEST_CASE("the nn ops run on CUDA with autograd and match the CPU", "[gpu][ops]") {
  manual_seed(27);
  const DType dt = DType::f64;
  const double tol = 1e-12;
  Conv2dOptions strided;
  strided.stride_h = 2, strided.pad_h = 1, strided.pad_w = 2, strided.dilation_w = 2;
  check_op(
      "conv2d", {random_cpu({3, 4, 11, 10}, dt), random_cpu({5, 4, 3, 3}, dt), random_cpu({5}, dt)},
      [&](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], strided); }, tol);
  Pool2dOptions pool{3, 3};
  pool.stride_h = pool.stride_w = 2, pool.pad_h = pool.pad_w = 1;
  check_op(
      "max_pool2d", {random_cpu({2, 3, 9, 8}, dt)},
      [&](const std::vector<Tensor>& t) { return max_pool2d(t[0], pool); }, tol);
  pool.count_include_pad = false;
  check_op(
      "avg_pool2d", {random_cpu({2, 3, 9, 8}, dt)},
      [&](const std::vector<Tensor>& t) { return avg_pool2d(t[0], pool); }, tol);
  check_op(
      "layer_norm", {random_cpu({6, 4, 24}, dt), random_cpu({4, 24}, dt), random_cpu({4, 24}, dt)},
      [](const std::vector<Tensor>& t) {
        return layer_norm(t[0], {4, 24}, t[1], t[2]);
      },
      1e-11);
  check_op(
      "embedding", {random_cpu({12, 7}, dt), index_tensor(30, 12, 5).reshape({5, 6})},
      [](const std::vector<Tensor>& t) { return embedding(t[0], t[1], /*padding_idx=*/2); }, tol);
  check_op(
      "index_select", {random_cpu({4, 9, 3}, dt), index_tensor(13, 9, 2)},
      [](const std::vector<Tensor>& t) { return index_select(t[0], 1, t[1]); }, tol);
  check_op(
      "cat and stack", {random_cpu({2, 3, 4}, dt), random_cpu({2, 5, 4}, dt), random_cpu({2, 3, 4}, dt)},
      [](const std::vector<Tensor>& t) {
        return cat({t[0], t[1], stack({t[0], t[2]}, 1).flatten(1, 2)}, 1);
      },
      tol);
  check_op(
      "split", {random_cpu({7, 10}, dt)},
      [](const std::vector<Tensor>& t) {
        const std::vector<Tensor> parts = split(t[0], 4, 1);
        return add(mul(parts[0], parts[1]), parts[1]);
      },
      tol);
}

// ---- whole models ----------------------------------------------------------------------------
// The gradients of `model` (CPU) and `replica` (its clone on cuda:0), parameter by parameter.
void check_gradients(const nn::Module& model, const nn::Module& replica, double tol) {
  const auto cpu_params = model.named_parameters(), gpu_params = replica.named_parameters();
  REQUIRE(cpu_params.size() == gpu_params.size());
  for (size_t i = 0; i < cpu_params.size(); ++i) {
    INFO("parameter " << cpu_params[i].first);
    const Tensor& g_cpu = cpu_params[i].second.grad();
    const Tensor& g_gpu = gpu_params[i].second.grad();
    REQUIRE(g_cpu.defined());
    REQUIRE(g_gpu.defined());
    CHECK(g_gpu.device() == gpu());
    MG_REQUIRE_CLOSE(g_gpu, g_cpu, tol);
  }
}

TEST_CASE("FashionCNN forward and backward on CUDA match the CPU", "[gpu][model]") {
  manual_seed(31);
  for (DType dt : {DType::f64, DType::f32}) {
    INFO("dtype " << dt);
    nn::FashionCNN model;
    model.to(dt);
    model.train();  // BatchNorm batch statistics, and dropout (the same Philox mask on both)
    const std::shared_ptr<nn::Module> replica = model.clone(gpu());
    const Tensor x = random_cpu({8, 1, 28, 28}, dt);
    const Tensor y = tensor<int64_t>({0, 1, 2, 3, 4, 5, 6, 7});
    manual_seed(5);
    const Tensor loss_cpu = cross_entropy(model.forward(x), y);
    manual_seed(5);
    const Tensor loss_gpu = cross_entropy(replica->forward(x.to(gpu())), y.to(gpu()));
    CHECK(loss_gpu.device() == gpu());
    const double tol = dt == DType::f64 ? 1e-10 : 1e-4;
    CHECK(loss_gpu.item<double>() == Approx(loss_cpu.item<double>()).epsilon(tol));
    loss_cpu.backward();
    loss_gpu.backward();
    check_gradients(model, *replica, tol);
  }
}

TEST_CASE("TinyGPT forward and backward on CUDA match the CPU", "[gpu][model]") {
  manual_seed(32);
  nn::GPTConfig config;
  config.vocab_size = 17, config.block_size = 16, config.n_layer = 2, config.n_head = 2, config.n_embd = 32;
  config.dropout = 0.1;
  nn::TinyGPT model(config);
  model.to(DType::f64);
  model.train();
  const std::shared_ptr<nn::Module> replica = model.clone(gpu());
  const Tensor idx = index_tensor(3 * 16, config.vocab_size, 5).reshape({3, 16});
  const Tensor targets = index_tensor(3 * 16, config.vocab_size, 3);
  manual_seed(6);
  const Tensor loss_cpu = cross_entropy(model.forward(idx).reshape({-1, config.vocab_size}), targets);
  manual_seed(6);
  const Tensor loss_gpu =
      cross_entropy(replica->forward(idx.to(gpu())).reshape({-1, config.vocab_size}), targets.to(gpu()));
  CHECK(loss_gpu.item<double>() == Approx(loss_cpu.item<double>()).epsilon(1e-10));
  loss_cpu.backward();
  loss_gpu.backward();
  check_gradients(model, *replica, 1e-9);
}

TEST_CASE("MLP training steps with AdamW on CUDA match the CPU", "[gpu][model][optim]") {
  manual_seed(33);
  for (DType dt : {DType::f32, DType::f64}) {
    INFO("dtype " << dt);
    nn::MLP model(20, {32, 16}, 5);
    model.to(dt);
    const std::shared_ptr<nn::Module> replica = model.clone(gpu());
    optim::AdamWOptions options;
    options.lr = 1e-2;
    options.weight_decay = 0.05;
    options.amsgrad = true;
    optim::AdamW opt_cpu(model.parameters(), options), opt_gpu(replica->parameters(), options);
    const double tol = dt == DType::f64 ? 1e-10 : 1e-4;
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      const Tensor x = random_cpu({16, 20}, dt);
      const Tensor y = index_tensor(16, 5, step + 1);
      opt_cpu.zero_grad();
      opt_gpu.zero_grad();
      const Tensor loss_cpu = cross_entropy(model.forward(x), y);
      const Tensor loss_gpu = cross_entropy(replica->forward(x.to(gpu())), y.to(gpu()));
      CHECK(loss_gpu.item<double>() == Approx(loss_cpu.item<double>()).epsilon(tol));
      loss_cpu.backward();
      loss_gpu.backward();
      opt_cpu.step();
      opt_gpu.step();
    }
    const auto cpu_params = model.named_parameters(), gpu_params = replica->named_parameters();
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      INFO("parameter " << cpu_params[i].first);
      CHECK(gpu_params[i].second.device() == gpu());
      MG_REQUIRE_CLOSE(gpu_params[i].second, cpu_params[i].second, tol);
    }
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
