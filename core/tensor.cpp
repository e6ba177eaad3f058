// Tensor metadata, views, conversion, autograd accessors and in-place ops.
#include "core/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "base/checked_size.h"
#include "core/allocator.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/ops/op_common.h"  // MG_KERNEL: the CPU or CUDA twin by device
#include "kernels/cpu/elementwise.h"

namespace mg {

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t running = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what) {
  const int64_t lo = ndim == 0 ? -1 : -ndim, hi = ndim == 0 ? 0 : ndim - 1;
  MG_CHECK(dim >= lo && dim <= hi, what, ": dimension ", dim, " is out of range for a tensor with ", ndim,
           " dims (expected to be in [", lo, ", ", hi, "])");
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset,
                   DType dtype) {
  MG_CHECK(shape.size() <= static_cast<size_t>(kMaxDims), "tensors have at most ", kMaxDims, " dims, got ",
           shape_str(shape));
  checked_numel(shape, "tensor");  // every dim >= 0 and numel (and every contiguous stride) fits in int64
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

namespace {
void require_defined(const Tensor& t, const char* what) {
  MG_CHECK(t.defined(), what, ": the tensor is undefined (default-constructed)");
}

// Records a view op's backward: grad of the view -> grad of its base.
Tensor record_view(const char* name, const Tensor& base, Tensor view,
                   std::function<Tensor(const Tensor&)> grad_to_base) {
  if (autograd::any_requires_grad({base})) {
    autograd::record(name, {base}, {view}, [grad_to_base](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{grad_to_base(g[0])};
    });
  }
  return view;
}

Tensor as_strided_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  return make_tensor(base.storage(), std::move(shape), std::move(strides), offset, base.dtype());
}

void check_inplace_allowed(const Tensor& self, const char* op, const std::vector<Tensor>& others = {}) {
  require_defined(self, op);
  if (!GradMode::is_enabled()) return;
  MG_CHECK(!self.requires_grad(), op, ": in-place operation on a tensor that requires grad (shape ",
           shape_str(self.shape()),
           ") is not tracked by autograd; run it under NoGradGuard (as optimizer steps do) or use the "
           "out-of-place op");
  for (const Tensor& o : others)
    MG_CHECK(
        !o.defined() || !o.requires_grad(), op,
        ": in-place operation whose source requires grad is not tracked by autograd; detach() the source or "
        "run under NoGradGuard");
}
}  // namespace

// ---- metadata --------------------------------------------------------------
const Shape& Tensor::shape() const {
  require_defined(*this, "shape");
  return impl_->shape;
}
const Shape& Tensor::strides() const {
  require_defined(*this, "strides");
  return impl_->strides;
}
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }
int64_t Tensor::numel() const { return shape_numel(shape()); }
int64_t Tensor::offset() const {
  require_defined(*this, "offset");
  return impl_->offset;
}
DType Tensor::dtype() const {
  require_defined(*this, "dtype");
  return impl_->dtype;
}
Device Tensor::device() const {
  require_defined(*this, "device");
  return impl_->storage->device();
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  require_defined(*this, "storage");
  return impl_->storage;
}

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (impl_->shape[i] != 1 && impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage()->data()) + impl_->offset * static_cast<int64_t>(itemsize());
}

StridedView Tensor::view_for_kernel() const {
  StridedView v;
  v.data = data_ptr();
  v.dtype = dtype();
  v.ndim = static_cast<int>(dim());
  for (int i = 0; i < v.ndim; ++i) {
    v.shape[i] = impl_->shape[i];
    v.strides[i] = impl_->strides[i];
  }
  return v;
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu(device().is_cpu() ? device().index : 0)).contiguous();
  std::vector<T> out(static_cast<size_t>(host.numel()));
  visit_dtype(host.dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    const S* src = static_cast<const S*>(host.data_ptr());
    for (size_t i = 0; i < out.size(); ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        out[i] = static_cast<double>(acc_t<S>(src[i])) != 0.0;
      } else {
        out[i] = static_cast<T>(static_cast<acc_t<S>>(src[i]));
      }
    }
  });
  return out;
}

template <class T>
T Tensor::item() const {
  MG_CHECK(numel() == 1, "item(): the tensor has ", numel(), " elements (shape ", shape_str(shape()),
           "); only one-element tensors convert to a number");
  return to_vector<T>()[0];
}

template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int32_t Tensor::item<int32_t>() const;
template int64_t Tensor::item<int64_t>() const;
template bool Tensor::item<bool>() const;

// ---- views -----------------------------------------------------------------
namespace {
Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from) {
  Shape shape = requested;
  int64_t known_nonzero = 1, infer_at = -1;  // the product of the given dims, a 0 counted as 1
  bool known_zero = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MG_CHECK(infer_at < 0, "view: only one dimension can be -1 in ", shape_str(requested));
      infer_at = static_cast<int64_t>(i);
    } else {
      MG_CHECK(shape[i] >= 0, "view: invalid size in ", shape_str(requested));
      if (shape[i] == 0) {
        known_zero = true;
        continue;
      }
      const std::optional<int64_t> product = try_mul(known_nonzero, shape[i]);
      MG_CHECK(product, "view: shape ", shape_str(requested), " has more elements than 64 bits can count");
      known_nonzero = *product;
    }
  }
  const int64_t known = known_zero ? 0 : known_nonzero;
  if (infer_at >= 0) {
    MG_CHECK(known != 0 && numel % known == 0, "view: shape ", shape_str(requested),
             " is invalid for input of shape ", shape_str(from));
    shape[infer_at] = numel / known;
  }
  MG_CHECK(shape_numel(shape) == numel, "view: shape ", shape_str(requested),
           " is invalid for input of shape ", shape_str(from), " (", numel, " elements)");
  return shape;
}

// Strides that let `shape` view memory laid out as (old_shape, old_strides), or
// an empty result when no such strides exist (then reshape must copy). Works
// chunk by chunk: each run of old dims that are contiguous with each other can
// be re-split freely.
bool compute_view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape, Shape& out) {
  out.assign(shape.size(), 1);
  if (old_shape.empty() || shape_numel(old_shape) == 0) {  // a scalar or an empty tensor views as anything
    out = contiguous_strides(shape);
    return true;
  }
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    const bool chunk_ends = tensor_d == 0 || (old_shape[tensor_d - 1] != 1 &&
                                              old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride);
    if (chunk_ends) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}
}  // namespace

Tensor Tensor::view(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), this->shape());
  Shape strides;
  MG_CHECK(compute_view_strides(this->shape(), this->strides(), shape, strides),
           "view: cannot view a tensor of shape ", shape_str(this->shape()), " with strides ",
           shape_str(this->strides()), " as ", shape_str(shape), " without copying; use reshape()");
  Shape base_shape = this->shape();
  return record_view("ViewBackward", *this, as_strided_view(*this, shape, strides, offset()),
                     [base_shape](const Tensor& g) { return g.reshape(base_shape); });
}

Tensor Tensor::reshape(const Shape& requested) const {
  Shape shape = infer_shape(requested, numel(), this->shape());
  Shape strides;
  if (compute_view_strides(this->shape(), this->strides(), shape, strides)) return view(shape);
  return contiguous().view(shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim, dim(), "flatten");
  end_dim = wrap_dim(end_dim, dim(), "flatten");
  MG_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " must not come after end_dim ", end_dim);
  Shape shape(this->shape().begin(), this->shape().begin() + start_dim);
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged *= size(d);
  shape.push_back(merged);
  shape.insert(shape.end(), this->shape().begin() + end_dim + 1, this->shape().end());
  return reshape(shape);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  dim0 = wrap_dim(dim0, dim(), "transpose");
  dim1 = wrap_dim(dim1, dim(), "transpose");
  Shape shape = this->shape(), strides = this->strides();
  std::swap(shape[dim0], shape[dim1]);
  std::swap(strides[dim0], strides[dim1]);
  return record_view("TransposeBackward", *this, as_strided_view(*this, shape, strides, offset()),
                     [dim0, dim1](const Tensor& g) { return g.transpose(dim0, dim1); });
}

Tensor Tensor::t() const {
  MG_CHECK(dim() == 2, "t(): expects a 2-d tensor, got shape ", shape_str(shape()));
  return transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  MG_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: got ", dims.size(),
           " dims for a tensor of shape ", shape_str(shape()));
  Shape shape(dims.size()), strides(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim(), "permute");
    MG_CHECK(inverse[d] < 0, "permute: dimension ", d, " repeats in the permutation");
    inverse[d] = static_cast<int64_t>(i);
    shape[i] = this->shape()[d];
    strides[i] = this->strides()[d];
  }
  return record_view("PermuteBackward", *this, as_strided_view(*this, shape, strides, offset()),
                     [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  MG_CHECK(step > 0, "slice: step must be positive, got ", step);
  const int64_t n = size(d);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape shape = this->shape(), strides = this->strides();
  shape[d] = (end - start + step - 1) / step;
  strides[d] *= step;
  const int64_t new_offset = offset() + start * this->strides()[d];
  Shape base_shape = this->shape();
  DType dt = dtype();
  Device dev = device();
  return record_view("SliceBackward", *this, as_strided_view(*this, shape, strides, new_offset),
                     [=](const Tensor& g) {
                       Tensor grad = zeros(base_shape, TensorOptions{dt, dev, false});
                       grad.slice(d, start, end, step).copy_(g);
                       return grad;
                     });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim(), "narrow");
  MG_CHECK(length >= 0 && start >= 0 && start + length <= size(d), "narrow: [", start, ", ", start + length,
           ") is out of range for dimension ", d, " of size ", size(d), " (shape ", shape_str(shape()), ")");
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  const int64_t n = size(d);
  MG_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ", d,
           " of size ", n);
  if (index < 0) index += n;
  return narrow(d, index, 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& requested) const {
  MG_CHECK(requested.size() >= shape().size(), "expand: the target ", shape_str(requested),
           " has fewer dims than the tensor's shape ", shape_str(shape()));
  const size_t lead = requested.size() - shape().size();
  Shape shape(requested.size()), strides(requested.size());
  for (size_t i = 0; i < requested.size(); ++i) {
    if (i < lead) {
      MG_CHECK(requested[i] >= 0, "expand: -1 is not allowed for a new leading dim in ",
               shape_str(requested));
      shape[i] = requested[i];
      strides[i] = 0;
      continue;
    }
    const int64_t have = this->shape()[i - lead];
    const int64_t want = requested[i] == -1 ? have : requested[i];
    MG_CHECK(have == want || have == 1, "expand: the size ", have, " at dim ", i - lead, " of ",
             shape_str(this->shape()), " must match ", want, " in ", shape_str(requested), " (or be 1)");
    shape[i] = want;
    strides[i] = have == want ? this->strides()[i - lead] : 0;
  }
  Shape base_shape = this->shape();
  return record_view("ExpandBackward", *this, as_strided_view(*this, shape, strides, offset()),
                     [base_shape](const Tensor& g) { return sum_to(g, base_shape); });
}

Tensor Tensor::squeeze() const {
  Shape shape;
  for (int64_t s : this->shape())
    if (s != 1) shape.push_back(s);
  return reshape(shape);
}

Tensor Tensor::squeeze(int64_t d) const {
  if (dim() == 0) return *this;
  d = wrap_dim(d, dim(), "squeeze");
  if (size(d) != 1) return *this;
  Shape shape = this->shape(), strides = this->strides();
  shape.erase(shape.begin() + d);
  strides.erase(strides.begin() + d);
  Shape base_shape = this->shape();
  return record_view("SqueezeBackward", *this, as_strided_view(*this, shape, strides, offset()),
                     [base_shape](const Tensor& g) { return g.reshape(base_shape); });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape shape = this->shape(), strides = this->strides();
  const int64_t stride = d < dim() ? strides[d] * shape[d] : 1;
  shape.insert(shape.begin() + d, 1);
  strides.insert(strides.begin() + d, stride);
  Shape base_shape = this->shape();
  return record_view("UnsqueezeBackward", *this, as_strided_view(*this, shape, strides, offset()),
                     [base_shape](const Tensor& g) { return g.reshape(base_shape); });
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

// ---- conversion ------------------------------------------------------------
namespace {
// A contiguous copy of `src` converted to `dtype` on `device` (no autograd).
Tensor copy_to(const Tensor& src, Device device, DType dtype) {
  Tensor out = empty(src.shape(), TensorOptions{dtype, device, false});
  out.copy_(src);
  return out;
}
}  // namespace

Tensor Tensor::pin_memory() const {
  require_defined(*this, "pin_memory");
  MG_CHECK(device().is_cpu(), "pin_memory: only CPU tensors can be pinned, this one is on ", device());
  if (is_pinned()) return *this;
  auto storage = std::make_shared<Storage>(nbytes(), device(), /*pinned=*/true);
  Tensor out = make_tensor(std::move(storage), shape(), contiguous_strides(shape()), 0, dtype());
  NoGradGuard no_grad;
  out.copy_(*this);
  return out;
}

bool Tensor::is_pinned() const { return defined() && storage() && storage()->pinned(); }

Tensor Tensor::clone() const {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = copy_to(*this, device(), dtype());
  }
  if (autograd::any_requires_grad({*this}))
    autograd::record("CloneBackward", {*this}, {out}, [](const std::vector<Tensor>& g) { return g; });
  return out;
}

Tensor Tensor::to(Device device, DType dtype) const {
  if (device == this->device() && dtype == this->dtype()) return *this;
  MG_CHECK(!requires_grad() || is_floating(dtype), "to(", dtype,
           "): a tensor that requires grad can only be cast to a "
           "floating dtype");
  Tensor out;
  {
    NoGradGuard no_grad;
    out = copy_to(*this, device, dtype);
  }
  if (autograd::any_requires_grad({*this})) {
    const Device from_device = this->device();
    const DType from_dtype = this->dtype();
    autograd::record("ToBackward", {*this}, {out}, [from_device, from_dtype](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(from_device, from_dtype)};
    });
  }
  return out;
}
Tensor Tensor::to(Device device) const { return to(device, dtype()); }
Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }

// ---- autograd accessors ----------------------------------------------------
bool Tensor::requires_grad() const { return impl_ && impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  require_defined(*this, "set_requires_grad");
  MG_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad (this one comes from ",
           grad_fn() ? grad_fn()->name() : std::string("?"), "); use detach() first");
  MG_CHECK(!requires_grad || is_floating(dtype()),
           "set_requires_grad: only floating tensors can require grad, this one is ", dtype());
  impl_->autograd_meta().requires_grad = requires_grad;
  return *this;
}

bool Tensor::is_leaf() const { return !impl_ || !impl_->autograd || !impl_->autograd->grad_fn; }

const Tensor& Tensor::grad() const {
  static const Tensor undefined;
  if (!impl_ || !impl_->autograd) return undefined;
  return impl_->autograd->grad;
}

Tensor& Tensor::mutable_grad() const {
  require_defined(*this, "mutable_grad");
  return impl_->autograd_meta().grad;
}

void Tensor::set_grad(const Tensor& grad) const {
  require_defined(*this, "set_grad");
  if (grad.defined())
    MG_CHECK(grad.shape() == shape() && grad.dtype() == dtype() && grad.device() == device(),
             "set_grad: gradient ", shape_str(grad.shape()), " ", grad.dtype(), " on ", grad.device(),
             " does not match the tensor ", shape_str(shape()), " ", dtype(), " on ", device());
  impl_->autograd_meta().grad = grad;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  if (!impl_ || !impl_->autograd) return none;
  return impl_->autograd->grad_fn;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  require_defined(*this, "backward");
  autograd::backward({*this}, {gradient}, retain_graph);
}

Tensor Tensor::detach() const {
  require_defined(*this, "detach");
  return make_tensor(impl_->storage, impl_->shape, impl_->strides, impl_->offset, impl_->dtype);
}

void Tensor::retain_grad() const {
  MG_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  if (is_leaf() || retains_grad()) return;
  impl_->autograd->retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  grad_fn()->pre_hooks.emplace_back(impl_->autograd->output_nr, [weak](const Tensor& grad) {
    if (auto impl = weak.lock()) {
      Tensor& stored = impl->autograd_meta().grad;
      stored = stored.defined() ? add(stored, grad) : grad.clone();
    }
    return Tensor();
  });
}

bool Tensor::retains_grad() const { return impl_ && impl_->autograd && impl_->autograd->retains_grad; }

void Tensor::register_hook(GradHook hook) const {
  MG_CHECK(requires_grad(), "register_hook: cannot register a hook on a tensor that does not require grad");
  if (is_leaf()) {
    impl_->autograd->leaf_hooks.push_back(std::move(hook));
  } else {
    grad_fn()->pre_hooks.emplace_back(impl_->autograd->output_nr, std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) const {
  MG_CHECK(requires_grad() && is_leaf(),
           "register_post_accumulate_grad_hook: only leaf tensors that require grad accumulate a gradient");
  impl_->autograd->post_accumulate_hooks.push_back(std::move(hook));
}

uint64_t Tensor::version() const { return storage()->version(); }

// ---- in-place ----------------------------------------------------------------
Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace_allowed(*this, "copy_", {src});
  require_defined(src, "copy_");
  Shape target = broadcast_shapes(shape(), src.shape(), "copy_");
  MG_CHECK(target == shape(), "copy_: source of shape ", shape_str(src.shape()), " cannot be broadcast to ",
           shape_str(shape()));
  if (src.device() != device())
    count_cross_device_copy(numel() * static_cast<int64_t>(dtype_size(src.dtype())));
  if ((src.device().is_cpu() && device().is_cpu()) || src.device() == device()) {
    // Logical CPU devices share host memory, and within one GPU a kernel reads
    // the source directly: one strided, converting copy.
    MG_KERNEL(device(), copy, src.detach().expand(shape()).view_for_kernel(), view_for_kernel());
  } else {
    // Across a GPU boundary: make the source one contiguous block on its own
    // device, move the raw bytes, then convert/scatter on this device if needed.
    Tensor staged = src.detach().expand(shape()).contiguous();
    if (staged.dtype() == dtype() && is_contiguous()) {
      device_copy(data_ptr(), device(), staged.data_ptr(), staged.device(), nbytes());
    } else {
      Tensor landed = empty(shape(), TensorOptions{staged.dtype(), device(), false});
      device_copy(landed.data_ptr(), device(), staged.data_ptr(), staged.device(), landed.nbytes());
      NoGradGuard no_grad;
      return copy_(landed);
    }
  }
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace_allowed(*this, "fill_");
  MG_KERNEL(device(), fill, view_for_kernel(), value);
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace_allowed(*this, "add_", {other});
  require_defined(other, "add_");
  // Hot path (gradient accumulation, optimizer updates): one fused pass, no temporary.
  if (other.device() == device() && other.dtype() == dtype() && is_floating(dtype())) {
    Shape target = broadcast_shapes(shape(), other.shape(), "add_");
    MG_CHECK(target == shape(), "add_: the result of shape ", shape_str(target),
             " does not fit the tensor of shape ", shape_str(shape()));
    const StridedView self_view = view_for_kernel();
    MG_KERNEL(device(), axpby, self_view, alpha, other.detach().expand(shape()).view_for_kernel(), self_view);
    storage()->bump_version();
    return *this;
  }
  Tensor result;
  {
    NoGradGuard no_grad;
    result = add(*this, other, alpha);
  }
  MG_CHECK(result.shape() == shape(), "add_: the result of shape ", shape_str(result.shape()),
           " does not fit the tensor of shape ", shape_str(shape()));
  return copy_(result);
}

Tensor& Tensor::add_(double value) {
  check_inplace_allowed(*this, "add_");
  NoGradGuard no_grad;
  return copy_(add(*this, value));
}

Tensor& Tensor::mul_(const Tensor& other) {
  check_inplace_allowed(*this, "mul_", {other});
  Tensor result;
  {
    NoGradGuard no_grad;
    result = mul(*this, other);
  }
  MG_CHECK(result.shape() == shape(), "mul_: the result of shape ", shape_str(result.shape()),
           " does not fit the tensor of shape ", shape_str(shape()));
  return copy_(result);
}

Tensor& Tensor::mul_(double value) {
  check_inplace_allowed(*this, "mul_");
  NoGradGuard no_grad;
  return copy_(mul(*this, value));
}

Tensor& Tensor::div_(const Tensor& other) {
  check_inplace_allowed(*this, "div_", {other});
  Tensor result;
  {
    NoGradGuard no_grad;
    result = div(*this, other);
  }
  MG_CHECK(result.shape() == shape(), "div_: the result of shape ", shape_str(result.shape()),
           " does not fit the tensor of shape ", shape_str(shape()));
  return copy_(result);
}

Tensor& Tensor::clamp_(double lo, double hi) {
  check_inplace_allowed(*this, "clamp_");
  NoGradGuard no_grad;
  return copy_(clamp(*this, lo, hi));
}

// ---- method forms ------------------------------------------------------------
Tensor Tensor::sum() const { return mg::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return mg::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return mg::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return mg::mean(*this, dims, keepdim);
}
Tensor Tensor::matmul(const Tensor& other) const { return mg::matmul(*this, other); }
Tensor Tensor::pow(double exponent) const { return mg::pow(*this, exponent); }
Tensor Tensor::exp() const { return mg::exp(*this); }
Tensor Tensor::log() const { return mg::log(*this); }
Tensor Tensor::relu() const { return mg::relu(*this); }
Tensor Tensor::abs() const { return mg::abs(*this); }
Tensor Tensor::sqrt() const { return mg::sqrt(*this); }
Tensor Tensor::argmax(int64_t d, bool keepdim) const { return mg::argmax(*this, d, keepdim); }

}  // namespace mg
