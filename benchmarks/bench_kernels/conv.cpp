// bench_kernels family "conv": conv2d on the GPU, cuDNN against im2col + GEMM, for the forward
// pass and both backward passes (kernels/cuda/conv_cudnn.h selects between them).
//
// Both backends run through the op layer exactly as a model runs them: the forward is
// mg::conv2d under NoGradGuard, and each backward pass is the conv2d autograd node applied to a
// fixed output gradient (only x requiring grad gives backward-data, only w backward-filter).
// So the im2col numbers include what that path really does: chunking the batch so the column
// buffer stays under 16 MiB, the permuting copies, zero-filling the gradients.
//
// FLOPs: every direction is 2 * N * K * C * kh * kw * OH * OW multiply-adds counted as two.
// Rows, per shape, dtype and direction:
//   "cudnn <dir> (<algorithm>)"  ceiling: a cuBLAS GEMM of the same size (the im2col GEMM alone,
//                                without building columns: what "convolution as one GEMM" costs).
//   "im2col+GEMM <dir>"          ceiling: cuDNN; ratio = im2col / cuDNN throughput (below 1 =
//                                slower than cuDNN).
// max_rel_error on both rows: max |cudnn - im2col| / max |im2col| over the result.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_kernels.h"
#include "core/autograd/node.h"
#include "core/cuda_allocator.h"
#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/cuda/conv_cudnn.h"

namespace mg::bench {
namespace {

namespace kc = kernels::cuda;

struct ConvShape {
  const char* name;  // the table's shape column
  const char* note;  // where the shape comes from, when it matters
  int64_t n, c, h, w, k, kernel, stride, pad;
};

const ConvShape kShapes[] = {
    {"N128 C32 28x28 K64 3x3", "", 128, 32, 28, 28, 64, 3, 1, 1},
    {"N128 C32 14x14 K64 3x3", "FashionCNN's conv2 at batch 128", 128, 32, 14, 14, 64, 3, 1, 1},
    {"N128 C1 28x28 K32 3x3", "FashionCNN's conv1 at batch 128", 128, 1, 28, 28, 32, 3, 1, 1},
    {"N64 C64 56x56 K64 3x3", "a ResNet stage-1 layer", 64, 64, 56, 56, 64, 3, 1, 1},
    {"N64 C256 14x14 K64 1x1", "a ResNet bottleneck's 1x1 reduction", 64, 256, 14, 14, 64, 1, 1, 0},
    {"N64 C128 28x28 K128 3x3/2", "stride 2", 64, 128, 28, 28, 128, 3, 2, 1},
};

// max_rel_error (max |cudnn - im2col| / max |im2col|) above this makes the row WRONG: both paths
// accumulate in float, so f32 differs by summation order (~1e-6) and bf16 by about one rounding
// of the result (2^-8 of an element, so at most ~4e-3 of the largest).
double agreement_tolerance(DType dt) { return dt == DType::f32 ? 1e-4 : 3e-2; }

enum Direction { kForward, kBackwardData, kBackwardFilter };
const char* const kDirectionNames[] = {"fwd", "bwd-data", "bwd-filter"};

// The result and median time of one direction on one backend.
struct Timed {
  Tensor result;
  double seconds = 0;
};

// max |a - b| / max |b|, on the GPU, in f32.
double max_rel_error(const Tensor& a, const Tensor& b) {
  NoGradGuard no_grad;
  const Tensor a32 = a.to(DType::f32), b32 = b.to(DType::f32);
  const double diff = max(abs(sub(a32, b32))).item<double>(), scale = max(abs(b32)).item<double>();
  return scale > 0 ? diff / scale : diff;
}

Timed time_direction(Direction d, const Tensor& x, const Tensor& w, const Tensor& gy,
                     const Conv2dOptions& conv, const BenchOptions& o) {
  Timed t;
  if (d == kForward) {
    NoGradGuard no_grad;
    t.seconds = median_seconds([&] { t.result = conv2d(x, w, Tensor(), conv); }, o);
    return t;
  }
  // The conv2d node of a graph where only x (backward-data) or only w (backward-filter) needs a
  // gradient; applying it again and again runs just that backward pass.
  Tensor xr = x.detach(), wr = w.detach();
  (d == kBackwardData ? xr : wr).set_requires_grad(true);
  const Tensor y = conv2d(xr, wr, Tensor(), conv);
  const std::shared_ptr<autograd::Node> node = y.grad_fn();
  MG_CHECK(node != nullptr, "bench conv: conv2d recorded no autograd node");
  const size_t which = d == kBackwardData ? 0 : 1;
  NoGradGuard no_grad;
  t.seconds = median_seconds([&] { t.result = node->apply(std::vector<Tensor>{gy})[which]; }, o);
  return t;
}

// A cuBLAS GEMM (through matmul) of the size the im2col path multiplies in direction `d`:
//   fwd [K x CK] @ [CK x NS], bwd-data [CK x K] @ [K x NS], bwd-filter [K x NS] @ [NS x CK]
// with CK = C*kh*kw and NS = N*OH*OW (transposes as plain layouts: the size is what matters).
double gemm_seconds(Direction d, int64_t k, int64_t ck, int64_t ns, DType dt, Device dev,
                    const BenchOptions& o) {
  int64_t m = k, n = ns, inner = ck;
  if (d == kBackwardData) m = ck, n = ns, inner = k;
  if (d == kBackwardFilter) m = k, n = ck, inner = ns;
  NoGradGuard no_grad;
  // Constant operands (filled on the device): a GEMM's speed does not depend on the values.
  const Tensor a = full({m, inner}, 0.01, TensorOptions{dt, dev}),
               b = full({inner, n}, 0.01, TensorOptions{dt, dev});
  Tensor c;
  return median_seconds([&] { c = matmul(a, b); }, o);
}

std::vector<KernelResult> bench_conv(const BenchOptions& o, const Ceilings&) {
  std::vector<KernelResult> rows;
  mg::cuda::enable_backend();
  if (!kc::built_with_cudnn()) {
    std::printf("# conv: this build has no cuDNN (none found at configure time): nothing to compare\n");
    return rows;
  }
  const Device dev = Device::cuda(o.device);
  mg::cuda::DeviceGuard guard(o.device);
  manual_seed(7);
  std::vector<DType> dtypes = {DType::f32};
  if (!o.quick) dtypes.push_back(DType::bf16);
  const size_t shape_count = o.quick ? 2 : sizeof(kShapes) / sizeof(kShapes[0]);
  for (size_t si = o.check ? 1 : 0; si < shape_count; ++si) {  // --check: FashionCNN's conv2 only
    const ConvShape& s = kShapes[si];
    Conv2dOptions conv;
    conv.stride_h = conv.stride_w = s.stride;
    conv.pad_h = conv.pad_w = s.pad;
    kernels::Conv2dGeometry g;
    g.channels = s.c, g.height = s.h, g.width = s.w, g.kernel_h = g.kernel_w = s.kernel;
    g.stride_h = g.stride_w = s.stride, g.pad_h = g.pad_w = s.pad;
    const int64_t oh = g.out_h(), ow = g.out_w();
    const int64_t ck = s.c * s.kernel * s.kernel, ns = s.n * oh * ow;
    const double flops = 2.0 * double(s.k) * double(ck) * double(ns);
    for (DType dt : dtypes) {
      const Tensor x = randn({s.n, s.c, s.h, s.w}, TensorOptions{dt, dev});
      const Tensor w = mul(randn({s.k, s.c, s.kernel, s.kernel}, TensorOptions{dt, dev}), 0.1);
      const Tensor gy = randn({s.n, s.k, oh, ow}, TensorOptions{dt, dev});
      const std::string algorithms = kc::cudnn_conv2d_algorithms(g, s.n, s.k, dt);
      for (Direction d : {kForward, kBackwardData, kBackwardFilter}) {
        Timed cudnn, im2col;
        {
          kc::ConvBackendGuard backend(kc::ConvBackend::cudnn);
          cudnn = time_direction(d, x, w, gy, conv, o);
        }
        {
          kc::ConvBackendGuard backend(kc::ConvBackend::im2col);
          im2col = time_direction(d, x, w, gy, conv, o);
        }
        const double gemm = gemm_seconds(d, s.k, ck, ns, dt, dev, o);
        const double error = max_rel_error(cudnn.result, im2col.result);
        // "fwd IMPLICIT_PRECOMP_GEMM, bwd-data ALGO_1, ..." -> this direction's algorithm.
        std::string algorithm = algorithms;
        const std::string key = std::string(kDirectionNames[d]) + " ";
        const size_t at = algorithms.find(key);
        if (at != std::string::npos) {
          algorithm = algorithms.substr(at + key.size());
          algorithm = algorithm.substr(0, algorithm.find(','));
        }

        KernelResult r;
        r.family = "conv";
        r.dtype = dtype_name(dt);
        r.shape = s.name;
        r.unit = "TFLOP/s";
        r.max_rel_error = error;
        r.tolerance = agreement_tolerance(dt);
        if (rows.empty())
          r.note =
              "both backends run through the op layer: the im2col rows include its batch chunking, "
              "permuting copies and zero fills; the cuDNN rows' ceiling is a cuBLAS GEMM of the same "
              "M x N x K (convolution as one GEMM, no column buffer)";
        else if (d == kForward && dt == dtypes.front() && s.note[0] != '\0')
          r.note = s.note;

        r.kernel = std::string("cudnn ") + kDirectionNames[d] + " (" + algorithm + ")";
        r.seconds = cudnn.seconds;
        r.achieved = flops / cudnn.seconds / 1e12;
        r.ceiling = flops / gemm / 1e12;
        r.reference = "cuBLAS GEMM";
        r.ratio = r.achieved / r.ceiling;
        rows.push_back(r);

        r.note.clear();
        r.kernel = std::string("im2col+GEMM ") + kDirectionNames[d];
        r.seconds = im2col.seconds;
        r.achieved = flops / im2col.seconds / 1e12;
        r.ceiling = flops / cudnn.seconds / 1e12;
        r.reference = "cuDNN";
        r.ratio = r.achieved / r.ceiling;
        rows.push_back(r);
      }
    }
    mg::cuda::synchronize(mg::cuda::current_stream(o.device));
    mg::cuda::empty_cache();  // the next shape's buffers differ; don't let this one's pile up
  }
  return rows;
}

const RegisterFamily kRegistered("conv", 30, bench_conv);

}  // namespace
}  // namespace mg::bench
