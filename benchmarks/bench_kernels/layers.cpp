// bench_kernels family "layers" (order 11): the memory-bound kernels of the layers and optimizers
// beyond the "memory" family -- embedding, pooling, dropout, the fused optimizer steps, the
// backward passes of layer norm and softmax, and conv2d's im2col and col2im -- against the copy
// ceiling of the same run.
//
// Every row runs one kernel of kernels/cuda/kernels.h on about 64 MiB of f32 (n = 16 Mi elements;
// --check: 1 MiB), checked against its CPU twin and timed as bandwidth_row.h describes. The rows
// (bytes are the compulsory traffic: every input read once, every output written once):
//
//   embedding fwd (deferred index check)  [n/768 positions] of a [50257, 768] table
//                                          reads the named rows 4n and the indices, writes 4n
//   embedding bwd (atomics)               adds [n/768, 768] into the named rows: reads 4n and the
//                                          indices, reads and writes each named row (8n)
//   max_pool2d fwd, bwd 2x2/2             [n/1024 planes, 32, 32]: fwd reads 4n, writes n (values)
//                                          + 2n (int64 argmax); bwd reads 3n, writes 4n
//   avg_pool2d fwd, bwd 2x2/2             fwd reads 4n, writes n; bwd reads n, writes 4n
//   dropout fwd, bwd p = 0.1              fwd reads 4n, writes 4n + n (bool mask); bwd the same
//   AdamW, SGD momentum (multi-tensor)    one list of n/4 parameters in 4 tensors; AdamW reads p,
//                                          g, m, v and writes p, m, v (28 bytes a parameter); SGD
//                                          reads p, g, buf and writes p, buf (20)
//   layer_norm bwd, rows of 768           reads gy, x and the saved mean/rstd, writes gx, and the
//                                          weight and bias gradients
//   softmax bwd, rows of 1024             reads gy and y, writes gx
//   im2col, col2im 3x3 pad 1              64-channel 56x56 images, as many as make n/9 image
//                                          elements: im2col reads the image, writes 9 x it;
//                                          col2im reads the columns, reads and writes the image
//
// No floors: these rows are measured and reported for what they are (docs/kernels.md). Their
// tolerances: 0 where both sides compute the same bits (the gathers, pooling, dropout, whose mask
// is the CPU's bit for bit, im2col); 1e-6 for the optimizers (FMA contraction); 1e-5 for the
// reductions inside the backward passes and for the atomics' order in embedding's and col2im's
// sums.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bandwidth_row.h"
#include "bench_kernels.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/conv.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/optim.h"
#include "kernels/cpu/pool.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/kernels.h"

namespace {

using mg::DType;
namespace kcpu = mg::kernels::cpu;
namespace kcuda = mg::kernels::cuda;
using namespace mg::bench;  // bandwidth_row.h: buffers, inputs, measure()

constexpr double kUlps = 1e-6;

cudaStream_t stream() { return mg::cuda::current_kernel_stream(); }

void zero(const DeviceBuffer& d, const Env& env) {
  cuda_ok(cudaMemsetAsync(d.ptr, 0, d.bytes, env.stream), "zeroing an accumulated output");
}
void copy_in(const DeviceBuffer& d, const HostArray& a, const Env& env) {
  cuda_ok(cudaMemcpyAsync(d.ptr, a.data(), a.size(), cudaMemcpyHostToDevice, env.stream), "cudaMemcpy");
}

HostArray indices(int64_t count, int64_t rows, uint64_t seed) {
  HostArray a(DType::i64, count);
  for (int64_t i = 0; i < count; ++i)
    static_cast<int64_t*>(a.data())[i] = static_cast<int64_t>(mix(seed + static_cast<uint64_t>(i)) % rows);
  return a;
}

void embedding_rows(int64_t n, const Env& env, std::vector<KernelResult>& rows) {
  const int64_t dim = 768, table = env.options.check ? 1024 : 50257, count = n / dim;
  const HostArray w = random_host(DType::f32, table * dim, 21, -1.0, 1.0);
  const HostArray idx = indices(count, table, 22);
  const DeviceBuffer wd = upload(w), idxd = upload(idx);
  const auto* idx_dev = static_cast<const int64_t*>(idxd.ptr);
  const std::string shape = std::to_string(table) + "x768[" + std::to_string(count) + "]";

  HostArray out(DType::f32, count * dim);
  kcpu::embedding_forward(DType::f32, w.data(), table, dim, static_cast<const int64_t*>(idx.data()), count,
                          out.data());
  DeviceBuffer outd(out.size()), checkd(kcuda::kEmbeddingCheckWords * sizeof(uint64_t));
  rows.push_back(measure(
      {"embedding fwd (deferred check)", "f32", shape, 8.0 * count * dim + 8.0 * count, 0, 0},
      [&] {
        kcuda::embedding_forward_deferred(stream(), DType::f32, wd.ptr, table, dim, idx_dev, count, outd.ptr,
                                          checkd.ptr);
      },
      {{&outd, &out}}, env));

  const HostArray gy = random_host(DType::f32, count * dim, 23, -1.0, 1.0);
  const DeviceBuffer gyd = upload(gy);
  HostArray gw(DType::f32, table * dim);
  kcpu::embedding_backward(DType::f32, gy.data(), static_cast<const int64_t*>(idx.data()), count, dim, table,
                           -1, gw.data());
  DeviceBuffer gwd(gw.size());
  rows.push_back(measure(
      {"embedding bwd (atomics)", "f32", shape, 12.0 * count * dim + 8.0 * count, 0, 1e-5,
       "grad_weight accumulates: zeroed before the checked call, then every timed call adds"},
      [&] {
        kcuda::embedding_backward_unchecked(stream(), DType::f32, gyd.ptr, idx_dev, count, dim, table, -1,
                                            gwd.ptr);
      },
      {{&gwd, &gw}}, env, [&] { zero(gwd, env); }));
}

void pool_rows(int64_t n, const Env& env, std::vector<KernelResult>& rows) {
  mg::kernels::Pool2dGeometry g;
  g.planes = n / 1024;
  g.height = g.width = 32;
  g.kernel_h = g.kernel_w = g.stride_h = g.stride_w = 2;
  const int64_t outs = g.planes * g.out_h() * g.out_w();
  const std::string shape = dims_text({g.planes, 32, 32});
  const HostArray x = random_host(DType::f32, n, 31, -2.0, 2.0),
                  gy = random_host(DType::f32, outs, 32, -1.0, 1.0);
  const DeviceBuffer xd = upload(x), gyd = upload(gy);

  HostArray y(DType::f32, outs), argmax(DType::i64, outs);
  kcpu::max_pool2d_forward(g, DType::f32, x.data(), y.data(), static_cast<int64_t*>(argmax.data()));
  DeviceBuffer yd(y.size()), argmaxd(argmax.size());
  rows.push_back(measure(
      {"max_pool2d fwd 2x2/2", "f32", shape, 4.0 * n + 12.0 * outs, 0, 0},
      [&] {
        kcuda::max_pool2d_forward(stream(), g, DType::f32, xd.ptr, yd.ptr,
                                  static_cast<int64_t*>(argmaxd.ptr));
      },
      {{&yd, &y}, {&argmaxd, &argmax}}, env));

  HostArray gx(DType::f32, n);
  kcpu::max_pool2d_backward(g, DType::f32, gy.data(), static_cast<const int64_t*>(argmax.data()), gx.data());
  const DeviceBuffer argmax_cpu = upload(argmax);  // the CPU's winners, so both sides scatter alike
  DeviceBuffer gxd(gx.size());
  rows.push_back(measure(
      {"max_pool2d bwd 2x2/2", "f32", shape, 12.0 * outs + 4.0 * n, 0, 0},
      [&] {
        kcuda::max_pool2d_backward(stream(), g, DType::f32, gyd.ptr,
                                   static_cast<const int64_t*>(argmax_cpu.ptr), gxd.ptr);
      },
      {{&gxd, &gx}}, env));

  HostArray avg(DType::f32, outs);
  kcpu::avg_pool2d_forward(g, DType::f32, x.data(), avg.data(), true);
  DeviceBuffer avgd(avg.size());
  rows.push_back(measure(
      {"avg_pool2d fwd 2x2/2", "f32", shape, 4.0 * n + 4.0 * outs, 0, kUlps},
      [&] { kcuda::avg_pool2d_forward(stream(), g, DType::f32, xd.ptr, avgd.ptr, true); }, {{&avgd, &avg}},
      env));

  HostArray agx(DType::f32, n);
  kcpu::avg_pool2d_backward(g, DType::f32, gy.data(), agx.data(), true);
  DeviceBuffer agxd(agx.size());
  rows.push_back(measure(
      {"avg_pool2d bwd 2x2/2", "f32", shape, 4.0 * outs + 4.0 * n, 0, kUlps},
      [&] { kcuda::avg_pool2d_backward(stream(), g, DType::f32, gyd.ptr, agxd.ptr, true); }, {{&agxd, &agx}},
      env));
}

void dropout_rows(int64_t n, const Env& env, std::vector<KernelResult>& rows) {
  const double p = 0.1;
  const uint64_t seed = 1234, offset = 0;
  const HostArray x = random_host(DType::f32, n, 41, -2.0, 2.0);
  const DeviceBuffer xd = upload(x);
  HostArray y(DType::f32, n), mask(DType::boolean, n);
  kcpu::dropout_forward(DType::f32, x.data(), y.data(), static_cast<bool*>(mask.data()), n, p, seed, offset);
  DeviceBuffer yd(y.size()), maskd(mask.size());
  rows.push_back(measure(
      {"dropout fwd p=0.1", "f32", count_text(n), 9.0 * n, 0, 0},
      [&] {
        kcuda::dropout_forward(stream(), DType::f32, xd.ptr, yd.ptr, static_cast<bool*>(maskd.ptr), n, p,
                               seed, offset);
      },
      {{&yd, &y}, {&maskd, &mask}}, env));

  const HostArray gy = random_host(DType::f32, n, 42, -1.0, 1.0);
  const DeviceBuffer gyd = upload(gy), mask_cpu = upload(mask);
  HostArray gx(DType::f32, n);
  kcpu::dropout_backward(DType::f32, gy.data(), static_cast<const bool*>(mask.data()), gx.data(), n, p);
  DeviceBuffer gxd(gx.size());
  rows.push_back(measure(
      {"dropout bwd p=0.1", "f32", count_text(n), 9.0 * n, 0, 0},
      [&] {
        kcuda::dropout_backward(stream(), DType::f32, gyd.ptr, static_cast<const bool*>(mask_cpu.ptr),
                                gxd.ptr, n, p);
      },
      {{&gxd, &gx}}, env));
}

// One list of n/4 parameters in four tensors (a weight of 3/4 of them, one of 1/4 - 2 x 1024, and
// two biases of 1024), as a model's parameter group is.
std::vector<int64_t> tensor_sizes(int64_t total) {
  const int64_t big = total / 4 * 3;
  return {big, total - big - 2048, 1024, 1024};
}

void optimizer_rows(int64_t n, const Env& env, std::vector<KernelResult>& rows) {
  const int64_t total = n / 4;
  const std::vector<int64_t> sizes = tensor_sizes(total);
  // p, g, m, v (AdamW) or p, g, buf (SGD), each one array over every tensor, offset by tensor.
  const HostArray p = random_host(DType::f32, total, 51, -1.0, 1.0),
                  g = random_host(DType::f32, total, 52, -1.0, 1.0),
                  m = random_host(DType::f32, total, 53, -0.1, 0.1),
                  v = random_host(DType::f32, total, 54, 0.0, 0.01);
  const DeviceBuffer gd = upload(g);
  DeviceBuffer pd(p.size()), md(m.size()), vd(v.size());
  auto at = [](const void* base, int64_t offset) {
    return static_cast<float*>(const_cast<void*>(base)) + offset;
  };
  const std::string shape = std::to_string(sizes.size()) + " tensors, " + count_text(total);

  mg::kernels::AdamHyper adam;
  adam.lr = 1e-3;
  adam.weight_decay = 0.1;
  adam.step = 3;
  HostArray p_ref = p, m_ref = m, v_ref = v;
  std::vector<mg::kernels::AdamTensor> cpu_adam, gpu_adam;
  int64_t offset = 0;
  for (int64_t size : sizes) {
    cpu_adam.push_back({at(p_ref.data(), offset), at(g.data(), offset), at(m_ref.data(), offset),
                        at(v_ref.data(), offset), nullptr, size, adam.step});
    gpu_adam.push_back({at(pd.ptr, offset), at(gd.ptr, offset), at(md.ptr, offset), at(vd.ptr, offset),
                        nullptr, size, adam.step});
    offset += size;
  }
  kcpu::adamw_step_multi(DType::f32, cpu_adam, adam);
  rows.push_back(measure(
      {"AdamW step (multi-tensor)", "f32", shape, 28.0 * total, 0, kUlps,
       "updates in place: the state uploaded afresh before the checked call"},
      [&] { kcuda::adamw_step_multi(stream(), mg::cuda::current_scratch(), DType::f32, gpu_adam, adam); },
      {{&pd, &p_ref}, {&md, &m_ref}, {&vd, &v_ref}}, env,
      [&] {
        copy_in(pd, p, env);
        copy_in(md, m, env);
        copy_in(vd, v, env);
      }));

  mg::kernels::SgdHyper sgd;
  sgd.lr = 0.01;
  sgd.momentum = 0.9;
  HostArray sp_ref = p, buf_ref = m;
  std::vector<mg::kernels::SgdTensor> cpu_sgd, gpu_sgd;
  offset = 0;
  for (int64_t size : sizes) {
    cpu_sgd.push_back(
        {at(sp_ref.data(), offset), at(g.data(), offset), at(buf_ref.data(), offset), size, false});
    gpu_sgd.push_back({at(pd.ptr, offset), at(gd.ptr, offset), at(md.ptr, offset), size, false});
    offset += size;
  }
  kcpu::sgd_step_multi(DType::f32, cpu_sgd, sgd);
  rows.push_back(measure(
      {"SGD momentum step (multi-tensor)", "f32", shape, 20.0 * total, 0, kUlps,
       "updates in place: the state uploaded afresh before the checked call"},
      [&] { kcuda::sgd_step_multi(stream(), mg::cuda::current_scratch(), DType::f32, gpu_sgd, sgd); },
      {{&pd, &sp_ref}, {&md, &buf_ref}}, env,
      [&] {
        copy_in(pd, p, env);
        copy_in(md, m, env);
      }));
}

void norm_backward_rows(int64_t n, const Env& env, std::vector<KernelResult>& rows) {
  {
    const int64_t cols = 768, nrows = n / cols;
    const HostArray x = random_host(DType::f32, nrows * cols, 61, -1.5, 2.5),
                    gy = random_host(DType::f32, nrows * cols, 62, -1.0, 1.0),
                    w = random_host(DType::f32, cols, 63, 0.5, 1.5),
                    b = random_host(DType::f32, cols, 64, -0.5, 0.5);
    HostArray y(DType::f32, nrows * cols), mean(DType::f32, nrows), rstd(DType::f32, nrows);
    kcpu::layer_norm_forward(DType::f32, x.data(), w.data(), b.data(), nrows, cols, 1e-5, y.data(),
                             mean.data(), rstd.data());
    HostArray gx(DType::f32, nrows * cols), gw(DType::f32, cols), gb(DType::f32, cols);
    kcpu::layer_norm_backward(DType::f32, gy.data(), x.data(), mean.data(), rstd.data(), w.data(), nrows,
                              cols, gx.data(), gw.data(), gb.data());
    const DeviceBuffer xd = upload(x), gyd = upload(gy), wd = upload(w), meand = upload(mean),
                       rstdd = upload(rstd);
    DeviceBuffer gxd(gx.size()), gwd(gw.size()), gbd(gb.size());
    rows.push_back(measure(
        {"layer_norm bwd, rows of 768", "f32", dims_text({nrows, cols}),
         12.0 * nrows * cols + 8.0 * nrows + 12.0 * cols, 0, 1e-5},
        [&] {
          kcuda::layer_norm_backward(stream(), mg::cuda::current_scratch(), DType::f32, gyd.ptr, xd.ptr,
                                     meand.ptr, rstdd.ptr, wd.ptr, nrows, cols, gxd.ptr, gwd.ptr, gbd.ptr);
        },
        {{&gxd, &gx}, {&gwd, &gw}, {&gbd, &gb}}, env));
  }
  {
    const int64_t dim = 1024, outer = n / dim;
    const mg::kernels::SoftmaxShape s{outer, dim, 1};
    const HostArray x = random_host(DType::f32, n, 65, -4.0, 4.0),
                    gy = random_host(DType::f32, n, 66, -1.0, 1.0);
    HostArray y(DType::f32, n), gx(DType::f32, n);
    kcpu::softmax_forward(DType::f32, s, x.data(), y.data(), false);
    kcpu::softmax_backward(DType::f32, s, gy.data(), y.data(), gx.data(), false);
    const DeviceBuffer yd = upload(y), gyd = upload(gy);
    DeviceBuffer gxd(gx.size());
    rows.push_back(measure(
        {"softmax bwd, rows of 1024", "f32", dims_text({outer, dim}), 12.0 * n, 0, 1e-5},
        [&] { kcuda::softmax_backward(stream(), DType::f32, s, gyd.ptr, yd.ptr, gxd.ptr, false); },
        {{&gxd, &gx}}, env));
  }
}

void conv_rows(int64_t n, const Env& env, std::vector<KernelResult>& rows) {
  mg::kernels::Conv2dGeometry g;
  g.channels = env.options.check ? 8 : 64;
  g.height = g.width = env.options.check ? 16 : 56;
  g.kernel_h = g.kernel_w = 3;
  g.pad_h = g.pad_w = 1;
  const int64_t image = g.channels * g.height * g.width;
  const int64_t images = std::max<int64_t>(1, n / 9 / image);
  const int64_t columns = g.column_rows() * g.column_cols() * images;
  const std::string shape = dims_text({images, g.channels, g.height, g.width});
  const HostArray x = random_host(DType::f32, images * image, 71, -1.0, 1.0);
  const DeviceBuffer xd = upload(x);
  HostArray cols(DType::f32, columns);
  kcpu::im2col(g, DType::f32, x.data(), cols.data(), images);
  DeviceBuffer colsd(cols.size());
  rows.push_back(measure(
      {"im2col 3x3 pad 1", "f32", shape, 4.0 * (images * image + columns), 0, 0},
      [&] { kcuda::im2col(stream(), g, DType::f32, xd.ptr, colsd.ptr, images); }, {{&colsd, &cols}}, env));

  const DeviceBuffer cols_in = upload(cols);
  HostArray back(DType::f32, images * image);  // zeroed by HostArray: col2im accumulates
  kcpu::col2im(g, DType::f32, cols.data(), back.data(), images);
  DeviceBuffer backd(back.size());
  rows.push_back(measure(
      {"col2im 3x3 pad 1", "f32", shape, 4.0 * (columns + 2.0 * images * image), 0, 1e-5,
       "col2im accumulates into the image: zeroed before the checked call"},
      [&] { kcuda::col2im(stream(), g, DType::f32, cols_in.ptr, backd.ptr, images); }, {{&backd, &back}}, env,
      [&] { zero(backd, env); }));
}

std::vector<KernelResult> bench_layers(const BenchOptions& options, const Ceilings& ceilings) {
  const Env env{options, ceilings,
                static_cast<cudaStream_t>(mg::cuda::current_stream(mg::cuda::current_device()).handle),
                "layers"};
  std::vector<KernelResult> rows;
  const int64_t n = (int64_t{options.check ? 1 : 64} << 20) / 4;  // f32 elements
  embedding_rows(n, env, rows);
  pool_rows(n, env, rows);
  dropout_rows(n, env, rows);
  optimizer_rows(n, env, rows);
  norm_backward_rows(n, env, rows);
  conv_rows(n, env, rows);
  return rows;
}

const RegisterFamily kRegistered("layers", 11, bench_layers);

}  // namespace
