// Neural-network ops with fused kernels: softmax / log_softmax, cross-entropy
// (log_softmax + NLL in one pass, never materialising the probabilities in the
// forward), layer_norm, embedding, dropout.
#include "core/autocast.h"
#include "core/ops/op_common.h"
#include "core/random.h"
#if defined(MG_HAS_CUDA)
#include "core/cuda_device_checks.h"
#endif
#include "kernels/cpu/batch_norm.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layer_norm.h"
#include "kernels/cpu/softmax.h"

namespace mg {
using namespace ops_detail;

namespace {

kernels::SoftmaxShape softmax_shape(const Tensor& x, int64_t dim) {
  kernels::SoftmaxShape s{1, x.dim() == 0 ? 1 : x.size(dim), 1};
  for (int64_t d = 0; d < dim; ++d) s.outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) s.inner *= x.size(d);
  return s;
}

Tensor softmax_impl(const char* name, const Tensor& x_in, int64_t dim, bool log) {
  check_defined(name, {x_in});
  check_floating(name, x_in);
  dim = wrap_dim(dim, x_in.dim(), name);
  Tensor x = x_in.detach().contiguous();
  const kernels::SoftmaxShape shape = softmax_shape(x, dim);
  Tensor out = new_output(x.shape(), x.dtype(), x);
  MG_KERNEL(x.device(), softmax_forward, x.dtype(), shape, x.data_ptr(), out.data_ptr(), log);
  if (autograd::any_requires_grad({x_in})) {
    autograd::SavedTensor saved_out(out, name);
    autograd::record(log ? "LogSoftmaxBackward" : "SoftmaxBackward", {x_in}, {out},
                     [=](const std::vector<Tensor>& g) {
                       Tensor y = saved_out.unpack();
                       Tensor gy = g[0].contiguous();
                       Tensor gx = new_output(y.shape(), y.dtype(), y);
                       MG_KERNEL(y.device(), softmax_backward, y.dtype(), shape, gy.data_ptr(), y.data_ptr(),
                                 gx.data_ptr(), log);
                       return std::vector<Tensor>{gx};
                     });
  }
  return out;
}

// logits [rows, classes] contiguous-able, targets [rows] i64.
Tensor cross_entropy_2d(const Tensor& logits_in, const Tensor& targets_in,
                        const CrossEntropyOptions& options) {
  Tensor logits = logits_in.detach().contiguous();
  Tensor targets = targets_in.detach().to(DType::i64).contiguous();
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const bool need_grad = autograd::any_requires_grad({logits_in});
  Tensor losses = new_output({rows}, logits.dtype(), logits);
  // The number of rows not ignored, the mean's divisor, stays on the logits' device (f32, exact to
  // 2^24 rows): on a GPU the step never waits for it.
  Tensor counted = new_output({}, DType::f32, logits);
  // CUDA: each row's max and log-sum-exp, [rows, 2] in the compute type, saved for the backward
  // (as layer_norm saves mean and rstd), which then reads the logits once.
  Tensor row_stats;
  if (logits.device().is_cuda()) {
#if defined(MG_HAS_CUDA)
    // The kernel's verdict on the targets lands in three device words whose copy to the host is
    // queued now; a bad target is an error at the next synchronisation (the loss read), naming the
    // row and the value (core/cuda_device_checks.h). The words' memory is reused only after the copy.
    const int device = logits.device().index;
    cuda::DeviceGuard guard(device);
    if (need_grad)
      row_stats = new_output({rows, 2}, logits.dtype() == DType::f64 ? DType::f64 : DType::f32, logits);
    Tensor words = new_output({kernels::cuda::kCrossEntropyCheckWords}, DType::i64, logits);
    kernels::cuda::cross_entropy_forward_counted(
        cuda::kernel_stream(device), logits.dtype(), logits.data_ptr(), targets.data<int64_t>(), rows,
        classes, options.ignore_index, options.label_smoothing, losses.data_ptr(),
        row_stats.defined() ? row_stats.data_ptr() : nullptr, counted.data<float>(), words.data_ptr());
    const int64_t ignore_index = options.ignore_index;
    cuda::defer_device_check(
        device, words.data_ptr(), words.nbytes(), [rows, classes, ignore_index](const void* host_words) {
          return kernels::cuda::cross_entropy_target_error(host_words, rows, classes, ignore_index);
        });
#else
    MG_CHECK(false, "cross_entropy: ", logits.device(),
             " needs the CUDA backend, and this multigrad was built without CUDA");
#endif
  } else {
    kernels::cpu::cross_entropy_forward_counted(logits.dtype(), logits.data_ptr(), targets.data<int64_t>(),
                                                rows, classes, options.ignore_index, options.label_smoothing,
                                                losses.data_ptr(), counted.data<float>());
  }
  auto divided = [counted](const Tensor& t) {  // t / counted, in f32 (f64 for f64), back in t's dtype
    const DType wide = t.dtype() == DType::f64 ? DType::f64 : DType::f32;
    return div(t.to(wide), counted.to(wide)).to(t.dtype());
  };
  Tensor out;
  {
    NoGradGuard no_grad;
    switch (options.reduction) {
      case Reduction::None: out = losses; break;
      case Reduction::Sum: out = sum(losses); break;
      case Reduction::Mean: out = divided(sum(losses)); break;
    }
  }
  if (need_grad) {
    autograd::SavedTensor saved_logits(logits, "cross_entropy"), saved_targets(targets, "cross_entropy");
    const CrossEntropyOptions opts = options;
    autograd::record("CrossEntropyBackward", {logits_in}, {out}, [=](const std::vector<Tensor>& g) {
      Tensor x = saved_logits.unpack(), t = saved_targets.unpack();
      // Gradient of the reduction first: one weight per row.
      Tensor grad_losses;
      if (opts.reduction == Reduction::None) {
        grad_losses = g[0].contiguous();
      } else {
        Tensor scale = opts.reduction == Reduction::Mean ? divided(g[0]) : g[0];
        grad_losses = scale.reshape({1}).expand({rows}).contiguous();
      }
      Tensor gx = new_output(x.shape(), x.dtype(), x);
      if (x.device().is_cuda()) {
#if defined(MG_HAS_CUDA)
        // The saved stats: one read of the logits, one write of the gradient.
        cuda::DeviceGuard guard(x.device().index);
        kernels::cuda::cross_entropy_backward(cuda::kernel_stream(x.device().index), x.dtype(), x.data_ptr(),
                                              t.data<int64_t>(), rows, classes, opts.ignore_index,
                                              opts.label_smoothing, grad_losses.data_ptr(), gx.data_ptr(),
                                              row_stats.data_ptr());
#endif
      } else {
        kernels::cpu::cross_entropy_backward(x.dtype(), x.data_ptr(), t.data<int64_t>(), rows, classes,
                                             opts.ignore_index, opts.label_smoothing, grad_losses.data_ptr(),
                                             gx.data_ptr());
      }
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  return softmax_impl("softmax", autocast_to_full_precision(x), dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  return softmax_impl("log_softmax", autocast_to_full_precision(x), dim, true);
}

Tensor cross_entropy(const Tensor& logits_arg, const Tensor& targets, const CrossEntropyOptions& options) {
  const Tensor logits = autocast_to_full_precision(logits_arg);
  check_defined("cross_entropy", {logits, targets});
  check_same_device("cross_entropy", {logits, targets});
  check_floating("cross_entropy", logits);
  MG_CHECK(is_integral(targets.dtype()), "cross_entropy: targets must be class indices (i64 or i32), got ",
           targets.dtype());
  MG_CHECK(options.label_smoothing >= 0 && options.label_smoothing < 1,
           "cross_entropy: label_smoothing must be in [0, 1), got ", options.label_smoothing);
  MG_CHECK(logits.dim() >= 2, "cross_entropy: logits must be [N, C] or [N, C, d1, ...], got ",
           shape_str(logits.shape()));
  // Expected targets shape: logits shape without the class dim.
  Shape expected = logits.shape();
  expected.erase(expected.begin() + 1);
  MG_CHECK(targets.shape() == expected, "cross_entropy: logits of shape ", shape_str(logits.shape()),
           " need targets of shape ", shape_str(expected), ", got ", shape_str(targets.shape()));
  if (logits.dim() == 2) return cross_entropy_2d(logits, targets, options);
  // [N, C, d1, ...] -> [N, d1, ..., C] -> [rows, C]: the class dim goes last.
  std::vector<int64_t> order{0};
  for (int64_t d = 2; d < logits.dim(); ++d) order.push_back(d);
  order.push_back(1);
  const int64_t classes = logits.size(1);
  Tensor flat_logits = logits.permute(order).reshape({-1, classes});
  Tensor out = cross_entropy_2d(flat_logits, targets.reshape({-1}), options);
  return options.reduction == Reduction::None ? out.reshape(expected) : out;
}

Tensor layer_norm(const Tensor& x_arg, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  const Tensor x_in = autocast_to_full_precision(x_arg);
  check_defined("layer_norm", {x_in});
  check_same_device("layer_norm", {x_in, weight, bias});
  check_floating("layer_norm", x_in);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  MG_CHECK(k >= 1 && k <= x_in.dim() && Shape(x_in.shape().end() - k, x_in.shape().end()) == normalized_shape,
           "layer_norm: normalized_shape ", shape_str(normalized_shape),
           " must match the trailing dims of the input ", shape_str(x_in.shape()));
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    MG_CHECK(p->shape() == normalized_shape, "layer_norm: weight/bias of shape ", shape_str(p->shape()),
             " must have normalized_shape ", shape_str(normalized_shape));
    MG_CHECK(p->dtype() == x_in.dtype(), "layer_norm: weight/bias dtype ", p->dtype(),
             " differs from input dtype ", x_in.dtype());
  }
  const int64_t cols = shape_numel(normalized_shape), rows = cols == 0 ? 0 : x_in.numel() / cols;
  Tensor x = x_in.detach().contiguous();
  Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  const DType stats_dtype = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor y = new_output(x.shape(), x.dtype(), x);
  Tensor mean = new_output({rows}, stats_dtype, x), rstd = new_output({rows}, stats_dtype, x);
  MG_KERNEL(x.device(), layer_norm_forward, x.dtype(), x.data_ptr(), w.defined() ? w.data_ptr() : nullptr,
            b.defined() ? b.data_ptr() : nullptr, rows, cols, eps, y.data_ptr(), mean.data_ptr(),
            rstd.data_ptr());
  if (autograd::any_requires_grad({x_in, weight, bias})) {
    autograd::SavedTensor saved_x(x, "layer_norm"), saved_w(w, "layer_norm");
    const bool need_w = weight.defined() && weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    const bool has_w = weight.defined(), has_b = bias.defined();
    autograd::record("LayerNormBackward", {x_in, weight, bias}, {y}, [=](const std::vector<Tensor>& g) {
      Tensor xs = saved_x.unpack(), ws = saved_w.unpack(), gy = g[0].contiguous();
      Tensor gx = new_output(xs.shape(), xs.dtype(), xs);
      // The split backward's B asks for gx alone: the kernel then skips the column sums.
      Tensor gw =
          has_w && autograd::needs_input_grad(1) ? new_output(normalized_shape, xs.dtype(), xs) : Tensor();
      Tensor gb =
          has_b && autograd::needs_input_grad(2) ? new_output(normalized_shape, xs.dtype(), xs) : Tensor();
      MG_KERNEL_SCRATCH(xs.device(), layer_norm_backward, xs.dtype(), gy.data_ptr(), xs.data_ptr(),
                        mean.data_ptr(), rstd.data_ptr(), ws.defined() ? ws.data_ptr() : nullptr, rows, cols,
                        gx.data_ptr(), gw.defined() ? gw.data_ptr() : nullptr,
                        gb.defined() ? gb.data_ptr() : nullptr);
      return std::vector<Tensor>{gx, need_w ? gw : Tensor(), need_b ? gb : Tensor()};
    });
  }
  return y;
}

Tensor batch_norm(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double eps, Tensor* batch_mean,
                  Tensor* batch_var) {
  check_defined("batch_norm", {x_in});
  require_cpu("batch_norm", {x_in, weight, bias, running_mean, running_var});
  MG_CHECK(x_in.dtype() == DType::f32 || x_in.dtype() == DType::f64,
           "batch_norm: the fused kernel takes f32 or f64 input, got ", x_in.dtype());
  MG_CHECK(x_in.dim() >= 2, "batch_norm: expected input [N, C, ...], got ", shape_str(x_in.shape()));
  const int64_t n = x_in.size(0), c = x_in.size(1);
  const int64_t hw = n * c == 0 ? 0 : x_in.numel() / (n * c);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    MG_CHECK(p->shape() == Shape{c} && p->dtype() == x_in.dtype(), "batch_norm: weight/bias ",
             shape_str(p->shape()), " ", p->dtype(), " must be [", c, "] ", x_in.dtype(), " for input ",
             shape_str(x_in.shape()));
  }
  Tensor x = x_in.detach().contiguous();
  Tensor w = weight.defined() ? weight.detach().contiguous() : Tensor();
  Tensor b = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor mean, var;
  if (training) {
    MG_CHECK(n * hw > 1, "batch_norm: training needs more than one value per channel, got input ",
             shape_str(x_in.shape()));
    mean = new_output({c}, x.dtype(), x);
    var = new_output({c}, x.dtype(), x);
    kernels::cpu::batch_norm_stats(x.dtype(), x.data_ptr(), n, c, hw, mean.data_ptr(), var.data_ptr());
  } else {
    MG_CHECK(running_mean.defined() && running_var.defined() && running_mean.numel() == c &&
                 running_var.numel() == c,
             "batch_norm: eval mode needs running_mean and running_var of ", c, " elements");
    // Copies: the buffers may be updated in place before this graph's backward runs.
    mean = running_mean.detach().to(x.dtype()).reshape({c}).clone();
    var = running_var.detach().to(x.dtype()).reshape({c}).clone();
  }
  Tensor rstd;
  {
    NoGradGuard no_grad;
    rstd = rsqrt(add(var, eps)).contiguous();
  }
  Tensor y = new_output(x.shape(), x.dtype(), x);
  kernels::cpu::batch_norm_apply(x.dtype(), x.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
                                 w.defined() ? w.data_ptr() : nullptr, b.defined() ? b.data_ptr() : nullptr,
                                 n, c, hw, y.data_ptr());
  if (batch_mean) *batch_mean = mean;
  if (batch_var) *batch_var = var;
  if (autograd::any_requires_grad({x_in, weight, bias})) {
    autograd::SavedTensor saved_x(x, "batch_norm"), saved_w(w, "batch_norm");
    const bool need_x = x_in.requires_grad(), need_w = weight.defined() && weight.requires_grad(),
               need_b = bias.defined() && bias.requires_grad();
    autograd::record("BatchNormBackward", {x_in, weight, bias}, {y}, [=](const std::vector<Tensor>& g) {
      Tensor xs = saved_x.unpack(), ws = saved_w.unpack(), gy = g[0].contiguous();
      Tensor gx = need_x ? new_output(xs.shape(), xs.dtype(), xs) : Tensor();
      Tensor gw = need_w ? new_output({c}, xs.dtype(), xs) : Tensor();
      Tensor gb = need_b ? new_output({c}, xs.dtype(), xs) : Tensor();
      kernels::cpu::batch_norm_backward(
          xs.dtype(), gy.data_ptr(), xs.data_ptr(), mean.data_ptr(), rstd.data_ptr(),
          ws.defined() ? ws.data_ptr() : nullptr, n, c, hw, training, gx.defined() ? gx.data_ptr() : nullptr,
          gw.defined() ? gw.data_ptr() : nullptr, gb.defined() ? gb.data_ptr() : nullptr);
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return y;
}

Tensor embedding(const Tensor& weight, const Tensor& indices_in, int64_t padding_idx) {
  check_defined("embedding", {weight, indices_in});
  check_same_device("embedding", {weight, indices_in});
  MG_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, embedding_dim], got ",
           shape_str(weight.shape()));
  MG_CHECK(is_integral(indices_in.dtype()), "embedding: indices must be i64 or i32, got ",
           indices_in.dtype());
  const int64_t num = weight.size(0), dim = weight.size(1);
  MG_CHECK(padding_idx >= -1 && padding_idx < num, "embedding: padding_idx ", padding_idx, " is outside [0, ",
           num, ")");
  Tensor w = weight.detach().contiguous();
  Tensor indices = indices_in.detach().to(DType::i64).contiguous();
  Shape out_shape = indices.shape();
  out_shape.push_back(dim);
  Tensor out = new_output(out_shape, w.dtype(), w);
  const int64_t count = indices.numel();
  if (w.device().is_cuda()) {
#if defined(MG_HAS_CUDA)
    // As cross_entropy's targets: the gather checks the indices itself and its verdict (the first
    // bad position and its value) is copied back without waiting, an error at the next
    // synchronisation (core/cuda_device_checks.h). A bad index reads nothing out of bounds.
    const int device = w.device().index;
    cuda::DeviceGuard guard(device);
    Tensor words = new_output({kernels::cuda::kEmbeddingCheckWords}, DType::i64, w);
    kernels::cuda::embedding_forward_deferred(cuda::kernel_stream(device), w.dtype(), w.data_ptr(), num, dim,
                                              indices.data<int64_t>(), count, out.data_ptr(),
                                              words.data_ptr());
    if (count > 0)
      cuda::defer_device_check(device, words.data_ptr(), words.nbytes(),
                               [count, num](const void* host_words) {
                                 return kernels::cuda::embedding_index_error(host_words, count, num);
                               });
#else
    MG_CHECK(false, "embedding: ", w.device(),
             " needs the CUDA backend, and this multigrad was built without CUDA");
#endif
  } else {
    kernels::cpu::embedding_forward(w.dtype(), w.data_ptr(), num, dim, indices.data<int64_t>(), count,
                                    out.data_ptr());
  }
  if (autograd::any_requires_grad({weight})) {
    autograd::SavedTensor saved_indices(indices, "embedding");
    const DType dtype = w.dtype();
    autograd::record("EmbeddingBackward", {weight}, {out}, [=](const std::vector<Tensor>& g) {
      Tensor idx = saved_indices.unpack(), gy = g[0].contiguous();
      Tensor gw = new_output({num, dim}, dtype, gy);
      if (gy.device().is_cuda()) {
#if defined(MG_HAS_CUDA)
        // The forward checked these indices (its verdict is pending or already reported).
        cuda::DeviceGuard guard(gy.device().index);
        kernels::cuda::embedding_backward_unchecked(cuda::kernel_stream(gy.device().index), dtype,
                                                    gy.data_ptr(), idx.data<int64_t>(), idx.numel(), dim, num,
                                                    padding_idx, gw.data_ptr());
#endif
      } else {
        kernels::cpu::embedding_backward(dtype, gy.data_ptr(), idx.data<int64_t>(), idx.numel(), dim, num,
                                         padding_idx, gw.data_ptr());
      }
      return std::vector<Tensor>{gw};
    });
  }
  return out;
}

Tensor dropout(const Tensor& x_in, double p, bool training) {
  check_defined("dropout", {x_in});
  MG_CHECK(p >= 0 && p <= 1, "dropout: probability must be in [0, 1], got ", p);
  if (!training || p == 0) return x_in;
  check_floating("dropout", x_in);
  Tensor x = x_in.detach().contiguous();
  Tensor y = new_output(x.shape(), x.dtype(), x);
  Tensor mask = new_output(x.shape(), DType::boolean, x);
  const GeneratorState call = next_random_call();
  MG_KERNEL(x.device(), dropout_forward, x.dtype(), x.data_ptr(), y.data_ptr(), mask.data<bool>(), x.numel(),
            p, call.seed, call.offset);
  if (autograd::any_requires_grad({x_in})) {
    autograd::SavedTensor saved_mask(mask, "dropout");
    autograd::record("DropoutBackward", {x_in}, {y}, [=](const std::vector<Tensor>& g) {
      Tensor m = saved_mask.unpack(), gy = g[0].contiguous();
      Tensor gx = new_output(gy.shape(), gy.dtype(), gy);
      MG_KERNEL(gy.device(), dropout_backward, gy.dtype(), gy.data_ptr(), m.data<bool>(), gx.data_ptr(),
                gy.numel(), p);
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

}  // namespace mg
