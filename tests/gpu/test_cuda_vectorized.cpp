// The pack path of kernels/cuda/elementwise.cu (16-byte vector loads and stores)
// against the CPU kernels, where it can go wrong: at the edges. Every vectorized
// kernel (unary, binary, binary_scalar, axpby, fill, the casts, the strided
// same-dtype copy) runs on lengths 0, 1, 3, 4, 5, 7, 8, 9, 1023 and 2^20 + 3, on
// views that start 0, 1, 2 or 3 elements past an aligned base (so the first
// pack boundary, the peeled head and the scalar tail all move), with every
// operand at the same offset (the pack path with a head) and at different
// offsets (the scalar fallback). Outputs live inside a larger poisoned buffer:
// the view must match the CPU and every element around it must still hold the
// poison, so a pack that starts one element early or a tail written twice past
// the end fails. 2-d cases cover the multi-dim pack path: row and column
// broadcasting, and row slices whose rows are (or are not) a multiple of the
// pack width. The kernels that took packs later (unary_backward, where, clamp,
// the runtime-switched casts with an integer or bool side, dropout) run on
// lengths around every pack width, the same way, with an operand at another
// offset for their scalar fallback; dropout's mask must stay the CPU's bit for
// bit. Runs only with a GPU (gpu_main.cpp exits 77 otherwise).
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/kernels.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using kernels::BinaryOp;
using kernels::UnaryOp;

const int64_t kLengths[] = {0, 1, 3, 4, 5, 7, 8, 9, 1023, (int64_t{1} << 20) + 3};
constexpr int64_t kMargin = 8;  // poisoned elements after the largest offset (3) + length
const DType kFloating[] = {DType::f32, DType::f64, DType::bf16, DType::f16};

template <class F>
void on_gpu(F&& gpu_call) {
  cuda::DeviceGuard guard(0);
  gpu_call();
  cuda::synchronize(cuda::current_stream(0));
}

// Poison made on the CPU and copied over, so it does not depend on the fill kernel under test.
// bool buffers are poisoned with true.
Tensor poison_buffer(int64_t size, DType dtype) {
  const double value = dtype == DType::boolean ? 1.0 : poison_value(dtype);
  return full({size}, value, TensorOptions{dtype}).to(gpu());
}

bool is_poison(double v, DType dtype) {
  if (dtype == DType::boolean) return v == 1.0;
  return is_floating(dtype) ? std::isnan(v) : v == poison_value(dtype);
}

// Every element of `buffer` outside [offset, offset + length) still holds the poison.
void check_margins(const Tensor& buffer, int64_t offset, int64_t length) {
  const int64_t size = buffer.numel(), end = offset + length;
  const std::vector<double> before = buffer.narrow(0, 0, offset).to_vector<double>();
  const std::vector<double> after = buffer.narrow(0, end, size - end).to_vector<double>();
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < before.size(); ++i) {
    if (is_poison(before[i], buffer.dtype())) continue;
    ++bad;
    if (first < 0) first = static_cast<int64_t>(i);
  }
  for (size_t i = 0; i < after.size(); ++i) {
    if (is_poison(after[i], buffer.dtype())) continue;
    ++bad;
    if (first < 0) first = end + static_cast<int64_t>(i);
  }
  INFO("elements written outside the view: " << bad << ", first at " << first << " (view [" << offset << ", "
                                             << end << ") of " << size << ")");
  CHECK(bad == 0);
}

// A view of `length` elements at `offset` inside `base` (1-d).
Tensor at(const Tensor& base, int64_t offset, int64_t length) { return base.narrow(0, offset, length); }

// Exact for integers and bool, within the dtype's tolerance for floating results.
void check_result(const Tensor& out, const Tensor& ref, double tol) {
  if (!is_floating(ref.dtype())) {
    CHECK(out.to_vector<double>() == ref.to_vector<double>());
  } else {
    MG_REQUIRE_CLOSE(out, ref, tol);
  }
}

// Random CPU data (base + margin elements); integers are scaled so they are not all 0/±1.
Tensor random_base(int64_t length, DType dtype, double scale = 1.0) {
  const Shape shape{length + kMargin};
  if (dtype == DType::boolean) return gt(random_cpu(shape), 0.0);
  if (!is_floating(dtype)) return mul(random_cpu(shape, DType::f64), 50.0 * scale).to(dtype);
  return random_cpu(shape, dtype, scale);
}

TEST_CASE("vectorized: buffers from the allocator are 16-byte aligned", "[gpu][vectorized]") {
  // Every test below counts offsets from an aligned base; make sure that premise holds.
  for (int64_t n : {1, 3, 1023, 100000}) {
    const Tensor t = empty({n}, TensorOptions{DType::f16, gpu()});
    CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
  }
}

TEST_CASE("vectorized: unary at every length and misalignment", "[gpu][vectorized][elementwise]") {
  manual_seed(11);
  struct Case {
    DType dtype;
    UnaryOp op;
  };
  std::vector<Case> cases;
  for (DType dt : kFloating) {
    cases.push_back({dt, UnaryOp::Exp});
    cases.push_back({dt, UnaryOp::Relu});
  }
  cases.push_back({DType::i32, UnaryOp::Neg});
  cases.push_back({DType::i64, UnaryOp::Abs});
  for (const Case& c : cases) {
    for (int64_t n : kLengths) {
      const Tensor base = random_base(n, c.dtype), base_g = base.to(gpu());
      for (int64_t o_in = 0; o_in < 4; ++o_in) {
        for (int64_t o_out : {o_in, (o_in + 1) % 4}) {  // same offset: packs + head; different: scalar path
          INFO("unary " << kernels::unary_op_name(c.op) << " " << c.dtype << " n " << n << " in offset "
                        << o_in << " out offset " << o_out);
          const Tensor in = at(base, o_in, n), in_g = at(base_g, o_in, n);
          Tensor ref = empty({n}, TensorOptions{c.dtype});
          kernels::cpu::unary(c.op, in.view_for_kernel(), ref.view_for_kernel());
          Tensor out_base = poison_buffer(n + kMargin, c.dtype);
          Tensor out = at(out_base, o_out, n);
          on_gpu([&] {
            kernels::cuda::unary(mg::cuda::current_kernel_stream(), c.op, in_g.view_for_kernel(),
                                 out.view_for_kernel());
          });
          check_result(out, ref, tolerance(c.dtype));
          check_margins(out_base, o_out, n);
        }
      }
    }
  }
}

TEST_CASE("vectorized: in-place unary on a misaligned view", "[gpu][vectorized][elementwise]") {
  manual_seed(12);
  for (DType dt : kFloating) {
    for (int64_t o = 0; o < 4; ++o) {
      const int64_t n = 1029;
      INFO("dtype " << dt << " offset " << o);
      const Tensor base = random_base(n, dt);
      Tensor ref = empty({n}, TensorOptions{dt});
      kernels::cpu::unary(UnaryOp::Neg, at(base, o, n).view_for_kernel(), ref.view_for_kernel());
      Tensor base_g = base.to(gpu());
      Tensor x = at(base_g, o, n);
      on_gpu([&] {
        kernels::cuda::unary(mg::cuda::current_kernel_stream(), UnaryOp::Neg, x.view_for_kernel(),
                             x.view_for_kernel());
      });
      check_result(x, ref, 0.0);
      // Untouched around the view: equal to the original values.
      CHECK(at(base_g, 0, o).to_vector<double>() == at(base, 0, o).to_vector<double>());
      CHECK(at(base_g, o + n, kMargin - o).to_vector<double>() ==
            at(base, o + n, kMargin - o).to_vector<double>());
    }
  }
}

TEST_CASE("vectorized: binary and binary_scalar at every length and misalignment",
          "[gpu][vectorized][elementwise]") {
  manual_seed(13);
  const DType dtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64};
  for (DType dt : dtypes) {
    for (int64_t n : kLengths) {
      const Tensor a = random_base(n, dt), b = random_base(n, dt, 0.5);
      const Tensor a_g = a.to(gpu()), b_g = b.to(gpu());
      for (int64_t o = 0; o < 4; ++o) {
        for (BinaryOp op : {BinaryOp::Add, BinaryOp::Mul, BinaryOp::Lt}) {
          const bool to_bool = kernels::binary_op_returns_bool(op);
          const DType out_dt = to_bool ? DType::boolean : dt;
          // a and out at offset o; b at o (packs) or at o + 1 (scalar fallback).
          for (int64_t o_b : {o, (o + 1) % 4}) {
            if (op != BinaryOp::Add && o_b != o) continue;
            INFO("binary " << kernels::binary_op_name(op) << " " << dt << " n " << n << " offset " << o
                           << " b offset " << o_b);
            const Tensor x = at(a, o, n), y = at(b, o_b, n);
            Tensor ref = empty({n}, TensorOptions{out_dt});
            kernels::cpu::binary(op, x.view_for_kernel(), y.view_for_kernel(), ref.view_for_kernel());
            Tensor out_base = poison_buffer(n + kMargin, out_dt);
            Tensor out = at(out_base, o, n);
            if (to_bool) out.copy_(eq(ref, 0.0).to(gpu()));  // poison the view with the complement
            const Tensor xg = at(a_g, o, n), yg = at(b_g, o_b, n);
            on_gpu([&] {
              kernels::cuda::binary(mg::cuda::current_kernel_stream(), op, xg.view_for_kernel(),
                                    yg.view_for_kernel(), out.view_for_kernel());
            });
            check_result(out, ref, tolerance(dt));
            check_margins(out_base, o, n);
          }
        }
        for (BinaryOp op : {BinaryOp::Mul, BinaryOp::Gt}) {
          const bool to_bool = kernels::binary_op_returns_bool(op);
          const DType out_dt = to_bool ? DType::boolean : dt;
          const double s = is_floating(dt) ? -0.75 : 3.0;
          INFO("binary_scalar " << kernels::binary_op_name(op) << " " << dt << " n " << n << " offset " << o);
          const Tensor x = at(a, o, n), xg = at(a_g, o, n);
          Tensor ref = empty({n}, TensorOptions{out_dt});
          kernels::cpu::binary_scalar(op, x.view_for_kernel(), s, ref.view_for_kernel());
          Tensor out_base = poison_buffer(n + kMargin, out_dt);
          Tensor out = at(out_base, o, n);
          if (to_bool) out.copy_(eq(ref, 0.0).to(gpu()));
          on_gpu([&] {
            kernels::cuda::binary_scalar(mg::cuda::current_kernel_stream(), op, xg.view_for_kernel(), s,
                                         out.view_for_kernel());
          });
          check_result(out, ref, tolerance(dt));
          check_margins(out_base, o, n);
        }
      }
    }
  }
}

TEST_CASE("vectorized: axpby at every length and misalignment, and in place",
          "[gpu][vectorized][elementwise]") {
  manual_seed(14);
  for (DType dt : kFloating) {
    for (int64_t n : kLengths) {
      const Tensor a = random_base(n, dt), b = random_base(n, dt);
      const Tensor a_g = a.to(gpu()), b_g = b.to(gpu());
      for (int64_t o = 0; o < 4; ++o) {
        for (int64_t o_b : {o, (o + 3) % 4}) {
          INFO("axpby " << dt << " n " << n << " offset " << o << " b offset " << o_b);
          const Tensor x = at(a, o, n), y = at(b, o_b, n);
          Tensor ref = empty({n}, TensorOptions{dt});
          kernels::cpu::axpby(x.view_for_kernel(), -0.3, y.view_for_kernel(), ref.view_for_kernel());
          Tensor out_base = poison_buffer(n + kMargin, dt);
          Tensor out = at(out_base, o, n);
          const Tensor xg = at(a_g, o, n), yg = at(b_g, o_b, n);
          on_gpu([&] {
            kernels::cuda::axpby(mg::cuda::current_kernel_stream(), xg.view_for_kernel(), -0.3,
                                 yg.view_for_kernel(), out.view_for_kernel());
          });
          check_result(out, ref, tolerance(dt));
          check_margins(out_base, o, n);
        }
      }
    }
    // out aliasing a (the optimizer's x += alpha * y), misaligned.
    const int64_t n = 1027;
    for (int64_t o = 0; o < 4; ++o) {
      INFO("axpby in place " << dt << " offset " << o);
      const Tensor a = random_base(n, dt), b = random_base(n, dt);
      Tensor ref = empty({n}, TensorOptions{dt});
      kernels::cpu::axpby(at(a, o, n).view_for_kernel(), 2.5, at(b, o, n).view_for_kernel(),
                          ref.view_for_kernel());
      Tensor a_g = a.to(gpu());
      const Tensor b_g = b.to(gpu());
      Tensor x = at(a_g, o, n);
      const Tensor y = at(b_g, o, n);
      on_gpu([&] {
        kernels::cuda::axpby(mg::cuda::current_kernel_stream(), x.view_for_kernel(), 2.5, y.view_for_kernel(),
                             x.view_for_kernel());
      });
      check_result(x, ref, tolerance(dt));
    }
  }
}

TEST_CASE("vectorized: fill at every length and misalignment, all dtypes", "[gpu][vectorized][elementwise]") {
  const DType all[] = {DType::f32, DType::f64, DType::f16,    DType::bf16,
                       DType::i32, DType::i64, DType::boolean};
  for (DType dt : all) {
    // bool's poison is true, so fill it with false to see the writes.
    const double value = dt == DType::boolean ? 0.0 : -2.7;
    for (int64_t n : kLengths) {
      for (int64_t o = 0; o < 4; ++o) {
        INFO("fill " << dt << " n " << n << " offset " << o);
        Tensor ref = empty({n}, TensorOptions{dt});
        kernels::cpu::fill(ref.view_for_kernel(), value);
        Tensor out_base = poison_buffer(n + kMargin, dt);
        Tensor out = at(out_base, o, n);
        on_gpu([&] { kernels::cuda::fill(mg::cuda::current_kernel_stream(), out.view_for_kernel(), value); });
        CHECK(out.to_vector<double>() == ref.to_vector<double>());
        check_margins(out_base, o, n);
      }
    }
  }
}

TEST_CASE("vectorized: casts at every length and misalignment", "[gpu][vectorized][copy]") {
  manual_seed(15);
  struct Pair {
    DType from, to;
  };
  std::vector<Pair> pairs;
  for (DType from : kFloating) {
    for (DType to : kFloating) {
      if (from != to) pairs.push_back({from, to});  // the 12 vectorized casts
    }
  }
  // A few that stay on the runtime-switched kernel.
  pairs.push_back({DType::f32, DType::i32});
  pairs.push_back({DType::i64, DType::f32});
  pairs.push_back({DType::bf16, DType::boolean});
  pairs.push_back({DType::i32, DType::f16});
  for (const Pair& p : pairs) {
    for (int64_t n : kLengths) {
      // Fractions, negatives, zeros and values that round differently in each dtype.
      Tensor src = mul(random_cpu({n + kMargin}, DType::f64), 40.0);
      src = where(lt(abs(src), 10.0), zeros_like(src), src).to(p.from);
      const Tensor src_g = src.to(gpu());
      for (int64_t o = 0; o < 4; ++o) {
        for (int64_t o_out : {o, (o + 2) % 4}) {
          INFO("copy " << p.from << " -> " << p.to << " n " << n << " in offset " << o << " out offset "
                       << o_out);
          Tensor ref = empty({n}, TensorOptions{p.to});
          kernels::cpu::copy(at(src, o, n).view_for_kernel(), ref.view_for_kernel());
          Tensor out_base = poison_buffer(n + kMargin, p.to);
          Tensor out = at(out_base, o_out, n);
          if (p.to == DType::boolean) out.copy_(eq(ref, 0.0).to(gpu()));
          const Tensor in_g = at(src_g, o, n);
          on_gpu([&] {
            kernels::cuda::copy(mg::cuda::current_kernel_stream(), in_g.view_for_kernel(),
                                out.view_for_kernel());
          });
          CHECK(out.to_vector<double>() == ref.to_vector<double>());
          check_margins(out_base, o_out, n);
        }
      }
    }
  }
}

// ---- 2-d: the multi-dim pack path -----------------------------------------------------------
// Rows of `cols` elements inside rows of `pitch`, starting `offset` elements into each row of a
// poisoned [rows, pitch] buffer.
struct Slab {
  Tensor buffer;  // [rows, pitch], poisoned
  Tensor view;    // [rows, cols]
};
Slab poisoned_slab(int64_t rows, int64_t cols, int64_t pitch, int64_t offset, DType dtype) {
  Slab s;
  s.buffer = poison_buffer(rows * pitch, dtype).view({rows, pitch});
  s.view = s.buffer.narrow(1, offset, cols);
  return s;
}
// Every element of the slab's buffer outside its view still holds the poison.
void check_slab_margins(const Slab& s) {
  const std::vector<double> all = s.buffer.to_vector<double>();
  const int64_t pitch = s.buffer.shape()[1], cols = s.view.shape()[1];
  const int64_t offset =
      (static_cast<const char*>(s.view.data_ptr()) - static_cast<const char*>(s.buffer.data_ptr())) /
      static_cast<int64_t>(dtype_size(s.buffer.dtype()));
  int64_t bad = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(all.size()); ++i) {
    const int64_t c = i % pitch;
    if (c >= offset && c < offset + cols) continue;
    bad += is_poison(all[static_cast<size_t>(i)], s.buffer.dtype()) ? 0 : 1;
  }
  INFO("elements written outside the 2-d view: " << bad);
  CHECK(bad == 0);
}

TEST_CASE("vectorized: 2-d binary with row and column broadcasting", "[gpu][vectorized][elementwise]") {
  manual_seed(16);
  const int64_t rows = 33;
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32}) {
    for (int64_t cols : {1, 3, 8, 16, 37, 64, 1000}) {
      for (int64_t pitch_extra : {0, 8, 5}) {  // 0: contiguous rows; 5: rows not a multiple of any pack
        const int64_t pitch = cols + pitch_extra;
        // a: [rows, cols] rows inside [rows, pitch], the same layout on both devices (the GPU copy
        // is one contiguous transfer, then sliced, so no kernel under test prepares the inputs).
        const Tensor a_full = random_cpu({rows, pitch}, DType::f32, 3.0).to(dt);
        const Tensor a = a_full.narrow(1, 0, cols), a_g = a_full.to(gpu()).narrow(1, 0, cols);
        // Right operands: a row (aligned, and starting at element 1 of its buffer) and a column.
        const Tensor row_full = random_cpu({cols + 1}, DType::f32, 3.0).to(dt);
        const Tensor col = random_cpu({rows, 1}, DType::f32, 3.0).to(dt);
        const Tensor row_full_g = row_full.to(gpu()), col_g = col.to(gpu());
        for (int which = 0; which < 3; ++which) {
          const char* kind = which == 0 ? "row" : (which == 1 ? "row at offset 1" : "column");
          Tensor b, b_g;
          if (which == 2) {
            b = col.expand({rows, cols});
            b_g = col_g.expand({rows, cols});
          } else {
            b = row_full.narrow(0, which, cols).expand({rows, cols});
            b_g = row_full_g.narrow(0, which, cols).expand({rows, cols});
          }
          INFO("binary add 2-d " << dt << " cols " << cols << " pitch " << pitch << " broadcast " << kind);
          Tensor ref = empty({rows, cols}, TensorOptions{dt});
          kernels::cpu::binary(BinaryOp::Add, a.view_for_kernel(), b.view_for_kernel(),
                               ref.view_for_kernel());
          Slab out = poisoned_slab(rows, cols, pitch, 0, dt);
          on_gpu([&] {
            kernels::cuda::binary(mg::cuda::current_kernel_stream(), BinaryOp::Add, a_g.view_for_kernel(),
                                  b_g.view_for_kernel(), out.view.view_for_kernel());
          });
          check_result(out.view, ref, tolerance(dt));
          check_slab_margins(out);
        }
      }
    }
  }
}

TEST_CASE("vectorized: 2-d slices through unary, axpby, fill, casts and strided copies",
          "[gpu][vectorized][elementwise]") {
  manual_seed(17);
  const int64_t rows = 17;
  for (DType dt : kFloating) {
    for (int64_t cols : {1, 8, 16, 24, 37, 64}) {
      for (int64_t offset : {0, 1, 8}) {
        for (int64_t pitch_extra : {8, 5}) {
          const int64_t pitch = cols + offset + pitch_extra;
          INFO("2-d " << dt << " cols " << cols << " column offset " << offset << " pitch " << pitch);
          // Source: a [rows, cols] slice at `offset` inside [rows, pitch], same layout on both devices.
          const Tensor src_full = random_cpu({rows, pitch}, dt);
          const Tensor src = src_full.narrow(1, offset, cols);
          const Tensor src_g = src_full.to(gpu()).narrow(1, offset, cols);
          {  // unary into a slice with the same layout
            Tensor ref = empty({rows, cols}, TensorOptions{dt});
            kernels::cpu::unary(UnaryOp::Exp, src.view_for_kernel(), ref.view_for_kernel());
            Slab out = poisoned_slab(rows, cols, pitch, offset, dt);
            on_gpu([&] {
              kernels::cuda::unary(mg::cuda::current_kernel_stream(), UnaryOp::Exp, src_g.view_for_kernel(),
                                   out.view.view_for_kernel());
            });
            check_result(out.view, ref, tolerance(dt));
            check_slab_margins(out);
          }
          {  // axpby with the slice and a contiguous operand into a slice
            const Tensor other = random_cpu({rows, cols}, dt), other_g = other.to(gpu());
            Tensor ref = empty({rows, cols}, TensorOptions{dt});
            kernels::cpu::axpby(src.view_for_kernel(), 0.5, other.view_for_kernel(), ref.view_for_kernel());
            Slab out = poisoned_slab(rows, cols, pitch, offset, dt);
            on_gpu([&] {
              kernels::cuda::axpby(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(), 0.5,
                                   other_g.view_for_kernel(), out.view.view_for_kernel());
            });
            check_result(out.view, ref, tolerance(dt));
            check_slab_margins(out);
          }
          {  // fill a slice
            Slab out = poisoned_slab(rows, cols, pitch, offset, dt);
            on_gpu([&] {
              kernels::cuda::fill(mg::cuda::current_kernel_stream(), out.view.view_for_kernel(), 1.25);
            });
            CHECK(out.view.to_vector<double>() ==
                  std::vector<double>(static_cast<size_t>(rows * cols), 1.25));
            check_slab_margins(out);
          }
          {  // same-dtype strided copy (slice -> contiguous and slice -> slice)
            Tensor out_c = poison_buffer(rows * cols, dt).view({rows, cols});
            on_gpu([&] {
              kernels::cuda::copy(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(),
                                  out_c.view_for_kernel());
            });
            CHECK(out_c.to_vector<double>() == src.to_vector<double>());
            Slab out = poisoned_slab(rows, cols, pitch, offset, dt);
            on_gpu([&] {
              kernels::cuda::copy(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(),
                                  out.view.view_for_kernel());
            });
            CHECK(out.view.to_vector<double>() == src.to_vector<double>());
            check_slab_margins(out);
          }
          for (DType to : kFloating) {  // casts of the slice into a slice
            if (to == dt) continue;
            INFO("cast to " << to);
            Tensor ref = empty({rows, cols}, TensorOptions{to});
            kernels::cpu::copy(src.view_for_kernel(), ref.view_for_kernel());
            Slab out = poisoned_slab(rows, cols, pitch, offset, to);
            on_gpu([&] {
              kernels::cuda::copy(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(),
                                  out.view.view_for_kernel());
            });
            CHECK(out.view.to_vector<double>() == ref.to_vector<double>());
            check_slab_margins(out);
          }
        }
      }
    }
  }
}

// ---- the 16-bit (and every other) scalar paths that now take packs ------------------------------
// Lengths around every pack width (2, 4, 8, 16 elements) and a multi-block one; the 2^20 sweeps
// above already cover the grid-stride loop, which these kernels share.
const int64_t kPackLengths[] = {0, 1, 3, 7, 8, 9, 15, 16, 17, 33, 1023, 65543};

TEST_CASE("vectorized: unary_backward at every length and misalignment", "[gpu][vectorized][elementwise]") {
  manual_seed(18);
  struct Case {
    UnaryOp op;
    bool saved_is_output;  // the formula reads y (else x); Neg reads neither
  };
  for (DType dt : kFloating) {
    for (const Case& c : {Case{UnaryOp::Tanh, true}, Case{UnaryOp::Relu, false}, Case{UnaryOp::Neg, false}}) {
      for (int64_t n : kPackLengths) {
        const Tensor g = random_base(n, dt), v = random_base(n, dt, 0.5);
        const Tensor g_g = g.to(gpu()), v_g = v.to(gpu());
        for (int64_t o = 0; o < 4; ++o) {
          for (int64_t o_v : {o, (o + 1) % 4}) {  // same offset: packs; different: the scalar path
            INFO("unary_backward " << kernels::unary_op_name(c.op) << " " << dt << " n " << n << " offset "
                                   << o << " saved offset " << o_v);
            const bool reads = c.op != UnaryOp::Neg;
            auto saved = [&](const Tensor& t) {
              return reads ? at(t, o_v, n).view_for_kernel() : StridedView{};
            };
            const StridedView none{};
            Tensor ref = empty({n}, TensorOptions{dt});
            kernels::cpu::unary_backward(c.op, at(g, o, n).view_for_kernel(),
                                         c.saved_is_output ? none : saved(v),
                                         c.saved_is_output ? saved(v) : none, ref.view_for_kernel());
            Tensor out_base = poison_buffer(n + kMargin, dt);
            Tensor out = at(out_base, o, n);
            on_gpu([&] {
              kernels::cuda::unary_backward(mg::cuda::current_kernel_stream(), c.op,
                                            at(g_g, o, n).view_for_kernel(),
                                            c.saved_is_output ? none : saved(v_g),
                                            c.saved_is_output ? saved(v_g) : none, out.view_for_kernel());
            });
            check_result(out, ref, tolerance(dt));
            check_margins(out_base, o, n);
          }
        }
      }
    }
  }
}

TEST_CASE("vectorized: where and clamp at every length and misalignment, all dtypes",
          "[gpu][vectorized][elementwise]") {
  manual_seed(19);
  const DType all[] = {DType::f32, DType::f64, DType::bf16,   DType::f16,
                       DType::i32, DType::i64, DType::boolean};
  for (DType dt : all) {
    for (int64_t n : kPackLengths) {
      const Tensor a = random_base(n, dt), b = random_base(n, dt, 0.5), c = random_base(n, DType::boolean);
      const Tensor a_g = a.to(gpu()), b_g = b.to(gpu()), c_g = c.to(gpu());
      for (int64_t o = 0; o < 4; ++o) {
        for (int64_t o_c : {o, (o + 3) % 4}) {  // the condition at the same offset (packs) or not
          INFO("where " << dt << " n " << n << " offset " << o << " condition offset " << o_c);
          Tensor ref = empty({n}, TensorOptions{dt});
          kernels::cpu::where(at(c, o_c, n).view_for_kernel(), at(a, o, n).view_for_kernel(),
                              at(b, o, n).view_for_kernel(), ref.view_for_kernel());
          Tensor out_base = poison_buffer(n + kMargin, dt);
          Tensor out = at(out_base, o, n);
          if (dt == DType::boolean) out.copy_(eq(ref, 0.0).to(gpu()));
          on_gpu([&] {
            kernels::cuda::where(mg::cuda::current_kernel_stream(), at(c_g, o_c, n).view_for_kernel(),
                                 at(a_g, o, n).view_for_kernel(), at(b_g, o, n).view_for_kernel(),
                                 out.view_for_kernel());
          });
          CHECK(out.to_vector<double>() == ref.to_vector<double>());
          check_margins(out_base, o, n);
        }
        if (dt == DType::boolean) continue;
        for (int64_t o_out : {o, (o + 1) % 4}) {
          for (const std::pair<double, double>& bounds :
               {std::pair<double, double>{-0.4, 0.3}, {2.5, -1.0}}) {
            const double scale = is_floating(dt) ? 1.0 : 40.0;
            const double lo = bounds.first * scale, hi = bounds.second * scale;
            INFO("clamp " << dt << " n " << n << " in offset " << o << " out offset " << o_out << " [" << lo
                          << ", " << hi << "]");
            Tensor ref = empty({n}, TensorOptions{dt});
            kernels::cpu::clamp(at(a, o, n).view_for_kernel(), ref.view_for_kernel(), lo, hi);
            Tensor out_base = poison_buffer(n + kMargin, dt);
            Tensor out = at(out_base, o_out, n);
            on_gpu([&] {
              kernels::cuda::clamp(mg::cuda::current_kernel_stream(), at(a_g, o, n).view_for_kernel(),
                                   out.view_for_kernel(), lo, hi);
            });
            CHECK(out.to_vector<double>() == ref.to_vector<double>());
            check_margins(out_base, o_out, n);
          }
        }
      }
    }
  }
}

TEST_CASE("vectorized: where with broadcast operands, 2-d", "[gpu][vectorized][elementwise]") {
  manual_seed(20);
  const int64_t rows = 9, cols = 48;
  for (DType dt : {DType::bf16, DType::f32, DType::f64}) {
    const Tensor a = random_cpu({rows, cols}, dt), a_g = a.to(gpu());
    const Tensor c_row = gt(random_cpu({cols}), 0.0), c_col = gt(random_cpu({rows, 1}), 0.0);
    const Tensor b_scalar = random_cpu({1}, dt), b_row = random_cpu({cols}, dt);
    const Tensor c_row_g = c_row.to(gpu()), c_col_g = c_col.to(gpu()), b_scalar_g = b_scalar.to(gpu()),
                 b_row_g = b_row.to(gpu());
    const Shape shape{rows, cols};
    for (int which = 0; which < 2; ++which) {
      // 0: a row condition and a scalar b (stride 0 in both dims); 1: a column condition and a row b.
      const Tensor c = which == 0 ? c_row.expand(shape) : c_col.expand(shape);
      const Tensor c_g = which == 0 ? c_row_g.expand(shape) : c_col_g.expand(shape);
      const Tensor b = which == 0 ? b_scalar.expand(shape) : b_row.expand(shape);
      const Tensor b_g = which == 0 ? b_scalar_g.expand(shape) : b_row_g.expand(shape);
      INFO("where 2-d " << dt << " case " << which);
      Tensor ref = empty(shape, TensorOptions{dt});
      kernels::cpu::where(c.view_for_kernel(), a.view_for_kernel(), b.view_for_kernel(),
                          ref.view_for_kernel());
      Tensor out = poisoned(shape, dt, gpu());
      on_gpu([&] {
        kernels::cuda::where(mg::cuda::current_kernel_stream(), c_g.view_for_kernel(), a_g.view_for_kernel(),
                             b_g.view_for_kernel(), out.view_for_kernel());
      });
      CHECK(out.to_vector<double>() == ref.to_vector<double>());
    }
  }
}

TEST_CASE("vectorized: casts with an integer or bool side, including a broadcast source",
          "[gpu][vectorized][copy]") {
  manual_seed(21);
  // The runtime-switched kernel's pack path (the pairs above cover its 1-d edges): every pack
  // width (2: an 8-byte side, 4, 8), and a column broadcast along rows (inner stride 0: one
  // element converted per pack).
  const std::pair<DType, DType> pairs[] = {{DType::boolean, DType::bf16}, {DType::i64, DType::f16},
                                           {DType::f16, DType::i64},      {DType::i32, DType::boolean},
                                           {DType::boolean, DType::i64},  {DType::bf16, DType::i32}};
  for (const auto& [from, to] : pairs) {
    for (int64_t n : kPackLengths) {
      Tensor src = mul(random_cpu({n + kMargin}, DType::f64), 40.0);
      src = where(lt(abs(src), 10.0), zeros_like(src), src).to(from);
      const Tensor src_g = src.to(gpu());
      for (int64_t o = 0; o < 4; ++o) {
        INFO("copy " << from << " -> " << to << " n " << n << " offset " << o);
        Tensor ref = empty({n}, TensorOptions{to});
        kernels::cpu::copy(at(src, o, n).view_for_kernel(), ref.view_for_kernel());
        Tensor out_base = poison_buffer(n + kMargin, to);
        Tensor out = at(out_base, o, n);
        if (to == DType::boolean) out.copy_(eq(ref, 0.0).to(gpu()));
        on_gpu([&] {
          kernels::cuda::copy(mg::cuda::current_kernel_stream(), at(src_g, o, n).view_for_kernel(),
                              out.view_for_kernel());
        });
        CHECK(out.to_vector<double>() == ref.to_vector<double>());
        check_margins(out_base, o, n);
      }
    }
    const int64_t rows = 7, cols = 32;
    Tensor col = mul(random_cpu({rows, 1}, DType::f64), 40.0).to(from);
    const Tensor src = col.expand({rows, cols}), src_g = col.to(gpu()).expand({rows, cols});
    INFO("copy " << from << " -> " << to << " of a broadcast column");
    Tensor ref = empty({rows, cols}, TensorOptions{to});
    kernels::cpu::copy(src.view_for_kernel(), ref.view_for_kernel());
    Tensor out = poisoned({rows, cols}, to, gpu());
    on_gpu([&] {
      kernels::cuda::copy(mg::cuda::current_kernel_stream(), src_g.view_for_kernel(), out.view_for_kernel());
    });
    CHECK(out.to_vector<double>() == ref.to_vector<double>());
  }
}

TEST_CASE("vectorized: dropout at every length and misalignment, the CPU's mask bit for bit",
          "[gpu][vectorized][dropout]") {
  manual_seed(22);
  const uint64_t seed = 0x0123456789abcdefull, call_offset = 11;
  const double p = 0.3;
  for (DType dt : kFloating) {
    for (int64_t n : kPackLengths) {
      const Tensor x = random_base(n, dt), x_g = x.to(gpu());
      for (int64_t o = 0; o < 4; ++o) {
        for (int64_t o_mask : {o, (o + 1) % 4}) {  // the mask at the same offset (packs) or not
          INFO("dropout " << dt << " n " << n << " offset " << o << " mask offset " << o_mask);
          Tensor ref = empty({n}, TensorOptions{dt}), ref_mask = empty({n}, TensorOptions{DType::boolean});
          kernels::cpu::dropout_forward(dt, at(x, o, n).data_ptr(), ref.data_ptr(), ref_mask.data<bool>(), n,
                                        p, seed, call_offset);
          Tensor y_base = poison_buffer(n + kMargin, dt),
                 mask_base = poison_buffer(n + kMargin, DType::boolean);
          Tensor y = at(y_base, o, n), mask = at(mask_base, o_mask, n);
          mask.copy_(eq(ref_mask, 0.0).to(gpu()));  // the complement of the expected mask
          on_gpu([&] {
            kernels::cuda::dropout_forward(mg::cuda::current_kernel_stream(), dt, at(x_g, o, n).data_ptr(),
                                           y.data_ptr(), mask.data<bool>(), n, p, seed, call_offset);
          });
          CHECK(mask.to_vector<double>() == ref_mask.to_vector<double>());
          CHECK(y.to_vector<double>() == ref.to_vector<double>());
          check_margins(y_base, o, n);
          check_margins(mask_base, o_mask, n);

          Tensor ref_gx = empty({n}, TensorOptions{dt});
          kernels::cpu::dropout_backward(dt, at(x, o, n).data_ptr(), ref_mask.data<bool>(), ref_gx.data_ptr(),
                                         n, p);
          Tensor gx_base = poison_buffer(n + kMargin, dt);
          Tensor gx = at(gx_base, o, n);
          on_gpu([&] {
            kernels::cuda::dropout_backward(mg::cuda::current_kernel_stream(), dt, at(x_g, o, n).data_ptr(),
                                            mask.data<bool>(), gx.data_ptr(), n, p);
          });
          CHECK(gx.to_vector<double>() == ref_gx.to_vector<double>());
          check_margins(gx_base, o, n);
        }
      }
    }
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
