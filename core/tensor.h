// Tensor: a handle to a strided view of a Storage, plus autograd metadata.
//
//   element (i0, i1, ...) lives at  storage.data + (offset + i0*stride0 + i1*stride1 + ...) * itemsize
//
// Views (view/reshape, transpose/permute, narrow/slice, expand, squeeze,
// unsqueeze) make a new TensorImpl over the SAME storage with other
// shape/strides/offset; nothing is copied. `contiguous()` copies only when the
// strides are not row-major already.
//
// Copying a Tensor copies the handle (like torch.Tensor in Python, or
// at::Tensor in libtorch): both refer to the same data and the same grad.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "base/device.h"
#include "base/dtype.h"
#include "base/strided_view.h"
#include "core/storage.h"

namespace mg {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);  // "[2, 3]"

namespace autograd {
class Node;
}
struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;  // undefined: holds nothing
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- metadata ----
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  size_t itemsize() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(); }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const;

  // Pointer to element 0 (storage data + offset). T must match dtype().
  void* data_ptr() const;
  template <class T>
  T* data() const {
    MG_CHECK(dtype_of<T>() == dtype(), "Tensor::data<", dtype_name(dtype_of<T>()),
             ">() on a tensor of dtype ", dtype());
    return static_cast<T*>(data_ptr());
  }
  // The kernel-facing description of this tensor (<= kMaxDims dims).
  StridedView view_for_kernel() const;

  // Value of a one-element tensor, converted to T (copies from the GPU if needed).
  template <class T>
  T item() const;
  // All elements, converted to T, in row-major order (copies from the GPU if needed).
  template <class T>
  std::vector<T> to_vector() const;

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;     // needs compatible strides; one dim may be -1
  Tensor reshape(const Shape& shape) const;  // view when possible, else copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // 2-d transpose
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  Tensor expand(const Shape& shape) const;          // -1 keeps a size; new leading dims allowed
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous() const;

  // ---- conversion ----
  Tensor to(Device device) const;  // returns *this when already there
  // Page-locked host memory (PyTorch's pin_memory): a contiguous copy of this CPU
  // tensor in pinned memory, or *this when already pinned. A copy from a pinned
  // tensor to a GPU (.to(cuda), copy_) is queued without waiting (core/allocator.h).
  // Needs the CUDA backend: throws mg::Error naming it otherwise. No autograd.
  Tensor pin_memory() const;
  // Whether the memory is pinned (false for GPU tensors and ordinary CPU tensors).
  bool is_pinned() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  Tensor clone() const;  // a copy with its own storage (recorded by autograd)

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool requires_grad);  // leaves only
  bool is_leaf() const;
  const Tensor& grad() const;  // undefined until a backward reaches this leaf
  Tensor& mutable_grad() const;
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  // Seeds backward with `gradient` (required unless this is a one-element tensor).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;     // same storage, no history
  void retain_grad() const;  // keep .grad on a non-leaf
  bool retains_grad() const;
  // Runs on the gradient w.r.t. this tensor before it is used; may return a replacement
  // (or an undefined Tensor to keep the gradient as it was).
  using GradHook = std::function<Tensor(const Tensor& grad)>;
  void register_hook(GradHook hook) const;
  // Leaves only: runs after the gradient has been accumulated into .grad (DDP's trigger).
  using PostAccumulateHook = std::function<void(const Tensor& leaf)>;
  void register_post_accumulate_grad_hook(PostAccumulateHook hook) const;
  uint64_t version() const;

  // ---- in-place (bump the version counter; refused on tensors that require grad
  //      while grad mode is on, as an optimizer step runs under NoGradGuard) ----
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& add_(double value);
  Tensor& sub_(const Tensor& other) { return add_(other, -1.0); }
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);
  Tensor& div_(const Tensor& other);
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype, crosses devices
  Tensor& clamp_(double lo, double hi);

  // ---- method forms of common ops (see core/ops.h) ----
  Tensor sum() const;
  Tensor sum(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const std::vector<int64_t>& dims, bool keepdim = false) const;
  Tensor matmul(const Tensor& other) const;
  Tensor pow(double exponent) const;
  Tensor exp() const;
  Tensor log() const;
  Tensor relu() const;
  Tensor abs() const;
  Tensor sqrt() const;
  Tensor argmax(int64_t dim, bool keepdim = false) const;

  std::string str() const;  // PyTorch-like printing

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Autograd state of a tensor. Only tensors that take part in autograd have it.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;         // null for leaves
  uint32_t output_nr = 0;                          // which output of grad_fn this is
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: their AccumulateGrad, while a graph holds it
  bool retains_grad = false;
  std::vector<Tensor::GradHook> leaf_hooks;  // hooks of a leaf (non-leaf hooks live on grad_fn)
  std::vector<Tensor::PostAccumulateHook> post_accumulate_hooks;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;  // lazily created

  AutogradMeta& autograd_meta() {
    if (!autograd) autograd = std::make_unique<AutogradMeta>();
    return *autograd;
  }
};

// Row-major strides for a shape.
Shape contiguous_strides(const Shape& shape);
int64_t shape_numel(const Shape& shape);
// Wraps a possibly negative dim into [0, ndim); the error names `what`.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* what);

// A new tensor on `storage` with the given geometry (no autograd history).
Tensor make_tensor(std::shared_ptr<Storage> storage, Shape shape, Shape strides, int64_t offset, DType dtype);

// ---- factories ----
struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
};
Tensor empty(const Shape& shape, const TensorOptions& options = {});
Tensor zeros(const Shape& shape, const TensorOptions& options = {});
Tensor ones(const Shape& shape, const TensorOptions& options = {});
Tensor full(const Shape& shape, double value, const TensorOptions& options = {});
Tensor arange(double start, double end, double step = 1.0, const TensorOptions& options = {});
Tensor arange(int64_t end, const TensorOptions& options = {});
Tensor rand(const Shape& shape, const TensorOptions& options = {});   // uniform [0, 1), Philox
Tensor randn(const Shape& shape, const TensorOptions& options = {});  // standard normal, Philox
Tensor randint(int64_t low, int64_t high, const Shape& shape, const TensorOptions& options = {DType::i64});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// From host values, converted to options.dtype (by default the dtype of T, as
// torch::tensor keeps int64 and bool: tensor<int64_t>({1, 2}) is an i64 tensor).
template <class T>
Tensor tensor(const std::vector<T>& values, const Shape& shape, const TensorOptions& options);
template <class T>
Tensor tensor(const std::vector<T>& values, const Shape& shape) {
  return tensor(values, shape, TensorOptions{dtype_of<T>()});
}
template <class T>
Tensor tensor(const std::vector<T>& values, const TensorOptions& options = TensorOptions{dtype_of<T>()}) {
  return tensor(values, Shape{static_cast<int64_t>(values.size())}, options);
}
Tensor scalar_tensor(double value, const TensorOptions& options = {});

}  // namespace mg
