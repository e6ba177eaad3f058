// Joining, splitting and indexing: cat, stack, split, chunk, index_select.
// split/chunk return views (narrow); cat copies each input into its slice of
// one output; the backward of cat is the matching narrow of the gradient.
#include "core/ops/op_common.h"
#include "kernels/cpu/index.h"

namespace mg {
using namespace ops_detail;

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  MG_CHECK(!tensors.empty(), "cat: expected at least one tensor");
  check_defined("cat", tensors);
  check_same_device("cat", tensors);  // device-generic: each input is copied with copy_
  const Tensor& first = tensors[0];
  dim = wrap_dim(dim, first.dim(), "cat");
  DType dtype = first.dtype();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MG_CHECK(t.dim() == first.dim(), "cat: tensor 0 has shape ", shape_str(first.shape()), " but tensor ", i,
             " has shape ", shape_str(t.shape()), " (different number of dims)");
    for (int64_t d = 0; d < t.dim(); ++d)
      MG_CHECK(d == dim || t.size(d) == first.size(d), "cat: tensor 0 has shape ", shape_str(first.shape()),
               " but tensor ", i, " has shape ", shape_str(t.shape()), "; sizes must match except in dim ",
               dim);
    dtype = promote_types(dtype, t.dtype());
    total += t.size(dim);
  }
  Shape shape = first.shape();
  shape[dim] = total;
  Tensor out = new_output(shape, dtype, first);
  std::vector<int64_t> sizes;
  {
    NoGradGuard no_grad;
    int64_t offset = 0;
    for (const Tensor& t : tensors) {
      out.narrow(dim, offset, t.size(dim)).copy_(t.detach());
      offset += t.size(dim);
      sizes.push_back(t.size(dim));
    }
  }
  if (autograd::any_requires_grad(tensors)) {
    std::vector<autograd::TensorMeta> metas;
    for (const Tensor& t : tensors) metas.push_back(meta_of(t));
    autograd::record("CatBackward", tensors, {out}, [=](const std::vector<Tensor>& g) {
      std::vector<Tensor> grads;
      int64_t offset = 0;
      for (size_t i = 0; i < sizes.size(); ++i) {
        grads.push_back(grad_like(g[0].narrow(dim, offset, sizes[i]), metas[i]));
        offset += sizes[i];
      }
      return grads;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  MG_CHECK(!tensors.empty(), "stack: expected at least one tensor");
  check_defined("stack", tensors);
  dim = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    MG_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor 0 has shape ",
             shape_str(tensors[0].shape()), " but tensor ", i, " has shape ", shape_str(tensors[i].shape()),
             "; stack needs equal shapes");
    expanded.push_back(tensors[i].unsqueeze(dim));
  }
  return cat(expanded, dim);
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined("split", {x});
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    MG_CHECK(s >= 0, "split: negative section size ", s);
    total += s;
  }
  MG_CHECK(total == x.size(dim), "split: section sizes add up to ", total, " but dim ", dim, " of shape ",
           shape_str(x.shape()), " has size ", x.size(dim));
  std::vector<Tensor> parts;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    parts.push_back(x.narrow(dim, offset, s));
    offset += s;
  }
  return parts;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  check_defined("split", {x});
  MG_CHECK(split_size > 0, "split: split_size must be positive, got ", split_size);
  dim = wrap_dim(dim, x.dim(), "split");
  std::vector<int64_t> sizes;
  for (int64_t left = x.size(dim); left > 0; left -= split_size) sizes.push_back(std::min(left, split_size));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  MG_CHECK(chunks > 0, "chunk: the number of chunks must be positive, got ", chunks);
  check_defined("chunk", {x});
  const int64_t n = x.size(wrap_dim(dim, x.dim(), "chunk"));
  return split(x, std::max<int64_t>((n + chunks - 1) / chunks, 1), dim);
}

Tensor index_select(const Tensor& x_in, int64_t dim, const Tensor& index_in) {
  check_defined("index_select", {x_in, index_in});
  check_same_device("index_select", {x_in, index_in});
  MG_CHECK(is_integral(index_in.dtype()), "index_select: index must be i64 or i32, got ", index_in.dtype());
  MG_CHECK(index_in.dim() <= 1, "index_select: index must be 0-d or 1-d, got shape ",
           shape_str(index_in.shape()));
  dim = wrap_dim(dim, x_in.dim(), "index_select");
  Tensor x = x_in.detach().contiguous();
  Tensor index = index_in.detach().to(DType::i64).contiguous();
  kernels::IndexShape shape{1, x.dim() == 0 ? 1 : x.size(dim), 1};
  for (int64_t d = 0; d < dim; ++d) shape.outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) shape.inner *= x.size(d);
  Shape out_shape = x.shape();
  if (!out_shape.empty()) out_shape[dim] = index.numel();
  Tensor out = new_output(out_shape, x.dtype(), x);
  MG_KERNEL_SCRATCH(x.device(), index_select, x.dtype(), shape, x.data_ptr(), index.data<int64_t>(),
                    index.numel(), out.data_ptr());
  if (autograd::any_requires_grad({x_in})) {
    autograd::SavedTensor saved_index(index, "index_select");
    const Shape input_shape = x.shape();
    autograd::record("IndexSelectBackward", {x_in}, {out}, [=](const std::vector<Tensor>& g) {
      Tensor idx = saved_index.unpack(), gy = g[0].contiguous();
      Tensor gx = zeros(input_shape, TensorOptions{gy.dtype(), gy.device()});
      MG_KERNEL_SCRATCH(gy.device(), index_add, gy.dtype(), shape, gy.data_ptr(), idx.data<int64_t>(),
                        idx.numel(), gx.data_ptr());
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace mg
