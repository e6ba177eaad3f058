// bench_kernels family "memory" (order 10): the memory-bound CUDA kernels against the copy
// ceiling of the same run.
//
// Every row runs one kernel of kernels/cuda/kernels.h on buffers of at least 64 MiB: n = 16 Mi
// f32 elements per 64 MiB (--quick: 64 MiB only; otherwise 64 and 256 MiB), so that neither the
// launch cost nor the L2 cache (50 MB on an H100/H200) flatters the number. The rows:
//
//   unary relu, exp            f32 [n]                       reads 4n, writes 4n bytes
//   binary add                 f32 [n] and bf16 [n]          reads 2 x s n, writes s n
//   add, row broadcast         f32 [n/1024, 1024] + [1024]   reads 4n (+4 KiB), writes 4n
//   axpby a + alpha b          f32 [n]                       reads 8n, writes 4n
//   casts (kernels::cuda::copy between dtypes)
//                              f32->bf16, bf16->f32, f32->f16 [n]   reads s_in n, writes s_out n
//   fill                       f32 [n]                       writes 4n
//   transpose (strided copy)   f32 [4096, n/4096]^T -> contiguous   reads 4n, writes 4n
//   reduce sum, all            f32 [n] -> [1]                reads 4n
//   reduce sum, last dim       f32 [n/1024, 1024] -> [n/1024]       reads 4n, writes 4n/1024
//   softmax, rows of 1024 and 32768    f32                   reads 4n, writes 4n
//   layer_norm forward, rows of 768 and 4096   f32 (weight, bias; saves mean and rstd)
//                                                            reads 4n, writes 4n + 8 rows
//   cross_entropy forward and backward, 50257 classes, f32 logits [n/50257, 50257]
//                              forward reads 4n + 8 rows, writes 12 rows (loss, max, log-sum);
//                              backward reads 4n + 16 rows (with the forward's row statistics),
//                              writes 4n
//
// Bytes are the compulsory traffic: each operand read once and each result written once, as a
// perfect kernel would move them. A kernel that makes several sweeps (softmax reads its row up to
// three times, hoping for L2) gets no credit for them, so rereads from DRAM show up as a lower
// ratio. achieved = bytes / median time; ratio = achieved / the copy ceiling (main.cpp).
//
// Floors (docs/kernels.md, for an H200): elementwise ops, fill and the casts >= 0.80 of the copy
// bandwidth; softmax, layer_norm and cross-entropy >= 0.70. Rows without a floor (transpose,
// reductions) are measured and reported for what they are: reduce-to-a-scalar still runs on one
// block, and the transpose reads with a stride of a whole row.
//
// Correctness (bandwidth_row.h): every row also runs its CPU twin (kernels/cpu/*) on the same input and
// is WRONG above its tolerance: 0 for the ops whose result is exact on both sides (relu, add, fill, the
// casts, the copies), 1e-6 (a few float ulps) for exp and axpby (GPU and CPU math libraries and FMA
// contraction differ in the last bit), 1e-5 for layer_norm, cross-entropy and the row sums,
// row_sum_tolerance(dim) for softmax (bench_kernels.h: 1e-5, 4.3e-5 for rows of 32768), 1e-4 for
// the sum of all n values (summation order).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bandwidth_row.h"
#include "bench_kernels.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/kernels.h"

namespace {

using mg::DType;
using mg::StridedView;
namespace bench = mg::bench;
namespace kcpu = mg::kernels::cpu;
namespace kcuda = mg::kernels::cuda;
using namespace mg::bench;  // bandwidth_row.h: buffers, inputs, measure()

constexpr double kElementwiseFloor = 0.80;
constexpr double kRowwiseFloor = 0.70;
constexpr double kUlps = 1e-6;  // a few float ulps, relative to the largest value

// ---- the rows, for n f32 elements (4n bytes) -----------------------------------------------------
void unary_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  const HostArray x = random_host(DType::f32, n, 1, -2.0, 2.0);
  const DeviceBuffer xd = upload(x);
  DeviceBuffer yd(x.size());
  struct Op {
    mg::kernels::UnaryOp op;
    const char* name;
    double tolerance;
  };
  for (const Op& op : {Op{mg::kernels::UnaryOp::Relu, "unary relu", 0.0},
                       Op{mg::kernels::UnaryOp::Exp, "unary exp", kUlps}}) {
    HostArray ref(DType::f32, n);
    kcpu::unary(op.op, view(x.data(), DType::f32, {n}), view(ref.data(), DType::f32, {n}));
    rows.push_back(measure(
        {op.name, "f32", count_text(n), 8.0 * n, kElementwiseFloor, op.tolerance},
        [&] {
          kcuda::unary(mg::cuda::current_kernel_stream(), op.op, view(xd.ptr, DType::f32, {n}),
                       view(yd.ptr, DType::f32, {n}));
        },
        {{&yd, &ref}}, env));
  }
}

void binary_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const HostArray a = random_host(dt, n, 2, -2.0, 2.0), b = random_host(dt, n, 3, -2.0, 2.0);
    const DeviceBuffer ad = upload(a), bd = upload(b);
    DeviceBuffer od(a.size());
    HostArray ref(dt, n);
    kcpu::binary(mg::kernels::BinaryOp::Add, view(a.data(), dt, {n}), view(b.data(), dt, {n}),
                 view(ref.data(), dt, {n}));
    const double s = static_cast<double>(mg::dtype_size(dt));
    rows.push_back(measure(
        {"binary add", mg::dtype_name(dt), count_text(n), 3.0 * s * n, kElementwiseFloor, 0.0},
        [&] {
          kcuda::binary(mg::cuda::current_kernel_stream(), mg::kernels::BinaryOp::Add, view(ad.ptr, dt, {n}),
                        view(bd.ptr, dt, {n}), view(od.ptr, dt, {n}));
        },
        {{&od, &ref}}, env));
  }
  // A [rows, 1024] matrix plus a row vector broadcast down it (a bias add).
  const int64_t cols = 1024, nrows = n / cols;
  const HostArray a = random_host(DType::f32, nrows * cols, 4, -2.0, 2.0),
                  b = random_host(DType::f32, cols, 5, -2.0, 2.0);
  const DeviceBuffer ad = upload(a), bd = upload(b);
  DeviceBuffer od(a.size());
  auto row_view = [&](const void* data) {
    StridedView v = view(data, DType::f32, {nrows, cols});
    v.strides[0] = 0;  // the same row for every row
    return v;
  };
  HostArray ref(DType::f32, nrows * cols);
  kcpu::binary(mg::kernels::BinaryOp::Add, view(a.data(), DType::f32, {nrows, cols}), row_view(b.data()),
               view(ref.data(), DType::f32, {nrows, cols}));
  rows.push_back(measure(
      {"binary add, row broadcast", "f32", dims_text({nrows, cols}) + "+" + std::to_string(cols),
       8.0 * nrows * cols + 4.0 * cols, kElementwiseFloor, 0.0},
      [&] {
        kcuda::binary(mg::cuda::current_kernel_stream(), mg::kernels::BinaryOp::Add,
                      view(ad.ptr, DType::f32, {nrows, cols}), row_view(bd.ptr),
                      view(od.ptr, DType::f32, {nrows, cols}));
      },
      {{&od, &ref}}, env));
}

void axpby_row(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  const HostArray a = random_host(DType::f32, n, 6, -2.0, 2.0), b = random_host(DType::f32, n, 7, -2.0, 2.0);
  const DeviceBuffer ad = upload(a), bd = upload(b);
  DeviceBuffer od(a.size());
  const double alpha = -0.37;
  HostArray ref(DType::f32, n);
  kcpu::axpby(view(a.data(), DType::f32, {n}), alpha, view(b.data(), DType::f32, {n}),
              view(ref.data(), DType::f32, {n}));
  rows.push_back(measure(
      {"axpby a + alpha b", "f32", count_text(n), 12.0 * n, kElementwiseFloor, kUlps},
      [&] {
        kcuda::axpby(mg::cuda::current_kernel_stream(), view(ad.ptr, DType::f32, {n}), alpha,
                     view(bd.ptr, DType::f32, {n}), view(od.ptr, DType::f32, {n}));
      },
      {{&od, &ref}}, env));
}

void cast_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  const std::pair<DType, DType> pairs[] = {
      {DType::f32, DType::bf16}, {DType::bf16, DType::f32}, {DType::f32, DType::f16}};
  for (const auto& pair : pairs) {
    const DType from = pair.first, to = pair.second;
    const HostArray x = random_host(from, n, 8, -3.0, 3.0);
    const DeviceBuffer xd = upload(x);
    HostArray ref(to, n);
    DeviceBuffer yd(ref.size());
    kcpu::copy(view(x.data(), from, {n}), view(ref.data(), to, {n}));
    const double bytes = static_cast<double>(mg::dtype_size(from) + mg::dtype_size(to)) * n;
    rows.push_back(measure(
        {std::string("cast ") + mg::dtype_name(from) + "->" + mg::dtype_name(to),
         std::string(mg::dtype_name(from)) + ">" + mg::dtype_name(to), count_text(n), bytes,
         kElementwiseFloor, 0.0},
        [&] {
          kcuda::copy(mg::cuda::current_kernel_stream(), view(xd.ptr, from, {n}), view(yd.ptr, to, {n}));
        },
        {{&yd, &ref}}, env));
  }
}

void fill_and_copy_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  {
    HostArray ref(DType::f32, n);
    kcpu::fill(view(ref.data(), DType::f32, {n}), 0.625);
    DeviceBuffer od(ref.size());
    rows.push_back(measure(
        {"fill", "f32", count_text(n), 4.0 * n, kElementwiseFloor, 0.0},
        [&] { kcuda::fill(mg::cuda::current_kernel_stream(), view(od.ptr, DType::f32, {n}), 0.625); },
        {{&od, &ref}}, env));
  }
  // out[c, r] = in[r, c]: the input read through a transposed view (a strided copy).
  const int64_t r = 4096, c = n / 4096;
  const HostArray x = random_host(DType::f32, r * c, 9, -2.0, 2.0);
  const DeviceBuffer xd = upload(x);
  auto transposed = [&](const void* data) {
    StridedView v = view(data, DType::f32, {c, r});
    v.strides[0] = 1;
    v.strides[1] = c;
    return v;
  };
  HostArray ref(DType::f32, r * c);
  kcpu::copy(transposed(x.data()), view(ref.data(), DType::f32, {c, r}));
  DeviceBuffer od(ref.size());
  rows.push_back(measure(
      {"transpose (strided copy)", "f32", dims_text({r, c}) + "^T", 8.0 * r * c, 0.0, 0.0},
      [&] {
        kcuda::copy(mg::cuda::current_kernel_stream(), transposed(xd.ptr), view(od.ptr, DType::f32, {c, r}));
      },
      {{&od, &ref}}, env));
}

void reduce_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  const HostArray x = random_host(DType::f32, n, 10, 0.0, 1.0);  // one sign: a well-conditioned sum
  const DeviceBuffer xd = upload(x);
  struct Case {
    mg::kernels::ReduceShape shape;
    std::string name, text;
    double tolerance;  // a sum of 16M floats in another order differs by ~1e-6; 1024 by far less
  };
  const int64_t cols = 1024;
  for (const Case& c : {Case{{1, n, 1}, "reduce sum, all", count_text(n) + "->1", 1e-4},
                        Case{{n / cols, cols, 1},
                             "reduce sum, last dim",
                             dims_text({n / cols, cols}) + "->" + std::to_string(n / cols),
                             1e-5}}) {
    const int64_t outs = c.shape.outer * c.shape.inner;
    HostArray ref(DType::f32, outs);
    kcpu::reduce(mg::kernels::ReduceOp::Sum, c.shape, x.data(), DType::f32, ref.data(), DType::f32);
    DeviceBuffer od(ref.size());
    rows.push_back(measure(
        {c.name, "f32", c.text, 4.0 * n + 4.0 * outs, 0.0, c.tolerance},
        [&] {
          kcuda::reduce(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                        mg::kernels::ReduceOp::Sum, c.shape, xd.ptr, DType::f32, od.ptr, DType::f32);
        },
        {{&od, &ref}}, env));
  }
}

void softmax_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  for (int64_t dim : {int64_t{1024}, int64_t{32768}}) {
    const int64_t outer = n / dim;
    const HostArray x = random_host(DType::f32, outer * dim, 11, -4.0, 4.0);
    const DeviceBuffer xd = upload(x);
    const mg::kernels::SoftmaxShape s{outer, dim, 1};
    HostArray ref(DType::f32, outer * dim);
    kcpu::softmax_forward(DType::f32, s, x.data(), ref.data(), false);
    DeviceBuffer yd(ref.size());
    rows.push_back(measure(
        {"softmax, rows of " + std::to_string(dim), "f32", dims_text({outer, dim}), 8.0 * outer * dim,
         kRowwiseFloor, bench::row_sum_tolerance(dim)},
        [&] {
          kcuda::softmax_forward(mg::cuda::current_kernel_stream(), DType::f32, s, xd.ptr, yd.ptr, false);
        },
        {{&yd, &ref}}, env));
  }
}

void layer_norm_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  for (int64_t cols : {int64_t{768}, int64_t{4096}}) {
    const int64_t nrows = n / cols;
    const HostArray x = random_host(DType::f32, nrows * cols, 12, -1.5, 2.5);
    const HostArray w = random_host(DType::f32, cols, 13, 0.5, 1.5),
                    b = random_host(DType::f32, cols, 14, -0.5, 0.5);
    const DeviceBuffer xd = upload(x), wd = upload(w), bd = upload(b);
    HostArray y(DType::f32, nrows * cols), mean(DType::f32, nrows), rstd(DType::f32, nrows);
    kcpu::layer_norm_forward(DType::f32, x.data(), w.data(), b.data(), nrows, cols, 1e-5, y.data(),
                             mean.data(), rstd.data());
    DeviceBuffer yd(y.size()), md(mean.size()), rd(rstd.size());
    rows.push_back(measure(
        {"layer_norm fwd, rows of " + std::to_string(cols), "f32", dims_text({nrows, cols}),
         8.0 * nrows * cols + 8.0 * nrows + 8.0 * cols, kRowwiseFloor, 1e-5},
        [&] {
          kcuda::layer_norm_forward(mg::cuda::current_kernel_stream(), DType::f32, xd.ptr, wd.ptr, bd.ptr,
                                    nrows, cols, 1e-5, yd.ptr, md.ptr, rd.ptr);
        },
        {{&yd, &y}, {&md, &mean}, {&rd, &rstd}}, env));
  }
}

void cross_entropy_rows(int64_t n, const Env& env, std::vector<bench::KernelResult>& rows) {
  const int64_t classes = 50257, nrows = std::max<int64_t>(1, n / classes);
  const HostArray logits = random_host(DType::f32, nrows * classes, 15, -4.0, 4.0);
  HostArray targets(DType::i64, nrows);
  for (int64_t i = 0; i < nrows; ++i)
    static_cast<int64_t*>(targets.data())[i] =
        static_cast<int64_t>(mix(16 + static_cast<uint64_t>(i)) % classes);
  HostArray grad_losses(DType::f32, nrows);
  for (int64_t i = 0; i < nrows; ++i)
    static_cast<float*>(grad_losses.data())[i] = 1.0f / static_cast<float>(nrows);
  const DeviceBuffer ld = upload(logits), td = upload(targets), gd = upload(grad_losses);
  const int64_t* t_host = static_cast<const int64_t*>(targets.data());
  const int64_t* t_dev = static_cast<const int64_t*>(td.ptr);
  const std::string shape = dims_text({nrows, classes});

  HostArray losses(DType::f32, nrows);
  kcpu::cross_entropy_forward(DType::f32, logits.data(), t_host, nrows, classes, -100, 0.0, losses.data());
  DeviceBuffer lossd(losses.size());
  DeviceBuffer statsd(static_cast<size_t>(nrows) * 2 * sizeof(float));  // max and log-sum per row
  rows.push_back(measure(
      {"cross_entropy fwd", "f32", shape, 4.0 * nrows * classes + 20.0 * nrows, kRowwiseFloor, 1e-5,
       "the time includes the stream synchronisation the API does to return its count"},
      [&] {
        kcuda::cross_entropy_forward(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                     DType::f32, ld.ptr, t_dev, nrows, classes, -100, 0.0, lossd.ptr,
                                     statsd.ptr);
      },
      {{&lossd, &losses}}, env));

  HostArray grad(DType::f32, nrows * classes);
  kcpu::cross_entropy_backward(DType::f32, logits.data(), t_host, nrows, classes, -100, 0.0,
                               grad_losses.data(), grad.data());
  DeviceBuffer gradd(grad.size());
  rows.push_back(measure(
      {"cross_entropy bwd", "f32", shape, 8.0 * nrows * classes + 20.0 * nrows, kRowwiseFloor, 1e-5,
       "with the forward's saved row statistics (max, log-sum): one read of the logits"},
      [&] {
        kcuda::cross_entropy_backward(mg::cuda::current_kernel_stream(), DType::f32, ld.ptr, t_dev, nrows,
                                      classes, -100, 0.0, gd.ptr, gradd.ptr, statsd.ptr);
      },
      {{&gradd, &grad}}, env));
}

std::vector<bench::KernelResult> bench_memory(const bench::BenchOptions& options,
                                              const bench::Ceilings& ceilings) {
  // The kernels queue on the current stream of the current (logical) device, which main.cpp made
  // current; time there.
  const Env env{options, ceilings,
                static_cast<cudaStream_t>(mg::cuda::current_stream(mg::cuda::current_device()).handle),
                "memory"};
  std::vector<bench::KernelResult> rows;
  std::vector<int64_t> sizes_mib = {options.check ? 1 : 64};
  if (!options.quick) sizes_mib.push_back(256);
  for (int64_t mib : sizes_mib) {
    const int64_t n = (mib << 20) / 4;  // f32 elements
    unary_rows(n, env, rows);
    binary_rows(n, env, rows);
    axpby_row(n, env, rows);
    cast_rows(n, env, rows);
    fill_and_copy_rows(n, env, rows);
    reduce_rows(n, env, rows);
    softmax_rows(n, env, rows);
    layer_norm_rows(n, env, rows);
    cross_entropy_rows(n, env, rows);
  }
  return rows;
}

const bench::RegisterFamily kRegistered("memory", 10, bench_memory);

}  // namespace
