// Tensor factories: empty/zeros/ones/full/arange, Philox-driven rand/randn/randint,
// and tensors built from host values.
#include <cmath>

#include "base/checked_size.h"
#include "base/philox.h"
#include "core/ops.h"
#include "core/ops/op_common.h"
#include "core/random.h"
#include "core/tensor.h"
#include "kernels/cpu/elementwise.h"

namespace mg {

Tensor empty(const Shape& shape, const TensorOptions& options) {
  const int64_t numel = checked_numel(shape, "empty");  // rejects negative dims and overflow
  const size_t nbytes = static_cast<size_t>(checked_nbytes(numel, dtype_size(options.dtype), "empty"));
  auto storage = std::make_shared<Storage>(nbytes, options.device);
  Tensor t = make_tensor(std::move(storage), shape, contiguous_strides(shape), 0, options.dtype);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}

namespace {
// Fills a freshly made tensor on the CPU, then moves it to the requested device.
template <class Fill>
Tensor make_on_cpu_then_move(const Shape& shape, const TensorOptions& options, Fill fill) {
  TensorOptions cpu_options = options;
  cpu_options.requires_grad = false;
  if (options.device.is_cuda()) cpu_options.device = Device::cpu();
  Tensor t = empty(shape, cpu_options);
  fill(t);
  if (options.device.is_cuda()) t = t.to(options.device);
  if (options.requires_grad) t.set_requires_grad(true);
  return t;
}
}  // namespace

Tensor full(const Shape& shape, double value, const TensorOptions& options) {
  if (options.device.is_cuda()) {  // filled where it lives: no host buffer, no transfer
    Tensor t = empty(shape, TensorOptions{options.dtype, options.device, false});
    MG_KERNEL(t.device(), fill, t.view_for_kernel(), value);
    if (options.requires_grad) t.set_requires_grad(true);
    return t;
  }
  return make_on_cpu_then_move(shape, options,
                               [value](Tensor& t) { kernels::cpu::fill(t.view_for_kernel(), value); });
}
Tensor zeros(const Shape& shape, const TensorOptions& options) { return full(shape, 0.0, options); }
Tensor ones(const Shape& shape, const TensorOptions& options) { return full(shape, 1.0, options); }

Tensor arange(double start, double end, double step, const TensorOptions& options) {
  MG_CHECK(step != 0, "arange: step must be nonzero");
  MG_CHECK((end - start) / step >= 0 || start == end, "arange: the range [", start, ", ", end,
           ") is empty in the "
           "direction of step ",
           step);
  const int64_t n = static_cast<int64_t>(std::ceil((end - start) / step));
  return make_on_cpu_then_move({std::max<int64_t>(n, 0)}, options,
                               [=](Tensor& t) { kernels::cpu::arange(t.view_for_kernel(), start, step); });
}

Tensor arange(int64_t end, const TensorOptions& options) {
  return arange(0.0, static_cast<double>(end), 1.0, options);
}

Tensor rand(const Shape& shape, const TensorOptions& options) {
  const GeneratorState call = next_random_call();
  return make_on_cpu_then_move(shape, options, [&](Tensor& t) {
    Tensor values = empty(shape, TensorOptions{DType::f32});
    float* out = values.data<float>();
    for (int64_t i = 0; i < values.numel(); ++i) out[i] = philox_uniform(call.seed, i, call.offset);
    t.copy_(values);
  });
}

Tensor randn(const Shape& shape, const TensorOptions& options) {
  const GeneratorState call = next_random_call();
  return make_on_cpu_then_move(shape, options, [&](Tensor& t) {
    Tensor values = empty(shape, TensorOptions{DType::f32});
    float* out = values.data<float>();
    for (int64_t i = 0; i < values.numel(); ++i) out[i] = philox_normal(call.seed, i, call.offset);
    t.copy_(values);
  });
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options) {
  MG_CHECK(high > low, "randint: high (", high, ") must be greater than low (", low, ")");
  const GeneratorState call = next_random_call();
  return make_on_cpu_then_move(shape, options, [&](Tensor& t) {
    Tensor values = empty(shape, TensorOptions{DType::i64});
    int64_t* out = values.data<int64_t>();
    const uint64_t range = static_cast<uint64_t>(high - low);
    for (int64_t i = 0; i < values.numel(); ++i) {
      PhiloxBlock b = philox4x32_10(call.seed, static_cast<uint64_t>(i), call.offset);
      const uint64_t bits = (static_cast<uint64_t>(b.word[0]) << 32) | b.word[1];
      out[i] = low + static_cast<int64_t>(bits % range);
    }
    t.copy_(values);
  });
}

Tensor empty_like(const Tensor& t) { return empty(t.shape(), TensorOptions{t.dtype(), t.device(), false}); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), TensorOptions{t.dtype(), t.device(), false}); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), TensorOptions{t.dtype(), t.device(), false}); }

Tensor scalar_tensor(double value, const TensorOptions& options) { return full({}, value, options); }

template <class T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, const TensorOptions& options) {
  const int64_t numel = checked_numel(shape, "tensor");
  MG_CHECK(static_cast<int64_t>(values.size()) == numel, "tensor: ", values.size(),
           " values do not fill shape ", shape_str(shape), " (", numel, " elements)");
  using Host = std::conditional_t<std::is_same_v<T, bool>, bool, T>;
  return make_on_cpu_then_move(shape, options, [&](Tensor& t) {
    Tensor host = empty(shape, TensorOptions{dtype_of<Host>()});
    Host* out = host.data<Host>();
    for (size_t i = 0; i < values.size(); ++i) out[i] = values[i];
    t.copy_(host);
  });
}

template Tensor tensor<float>(const std::vector<float>&, const Shape&, const TensorOptions&);
template Tensor tensor<double>(const std::vector<double>&, const Shape&, const TensorOptions&);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, const Shape&, const TensorOptions&);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, const Shape&, const TensorOptions&);
template Tensor tensor<bool>(const std::vector<bool>&, const Shape&, const TensorOptions&);

}  // namespace mg
