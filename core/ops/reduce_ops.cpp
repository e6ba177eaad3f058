// Reductions over chosen dims: sum, mean, max, min, var, argmax, and sum_to
// (the adjoint of broadcasting, used by every binary op's backward).
//
// The kernel reduces the middle axis of a contiguous [outer, reduce, inner]
// block. When the reduced dims are adjacent in a contiguous tensor that is just
// a reinterpretation of the shape (no copy). Floating sums and means over
// non-adjacent dims (BatchNorm's [N, C, H, W] over {0, 2, 3}) run as two such
// reductions, the trailing run of reduced dims first, in f64; anything else
// (var, max, ...) permutes the kept dims to the front and copies the tensor
// once into that layout.
#include <algorithm>
#include <numeric>

#include "core/autocast.h"
#include "core/ops/op_common.h"
#include "kernels/cpu/reduce.h"

namespace mg {
using namespace ops_detail;
using kernels::ReduceOp;

namespace {

struct ReducePlan {
  std::vector<bool> reduced;  // per input dim
  int64_t reduce_count = 1;   // product of reduced sizes
  Shape out_shape;            // without keepdim
  Shape keep_shape;           // with reduced dims as 1
};

ReducePlan plan_reduction(const Tensor& x, const std::vector<int64_t>& dims, const char* op) {
  ReducePlan plan;
  const int64_t nd = x.dim();
  plan.reduced.assign(nd, dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, nd, op);
    MG_CHECK(!plan.reduced[w], op, ": dimension ", w, " appears twice in the reduced dims");
    plan.reduced[w] = true;
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (plan.reduced[d]) {
      plan.reduce_count *= x.size(d);
      plan.keep_shape.push_back(1);
    } else {
      plan.out_shape.push_back(x.size(d));
      plan.keep_shape.push_back(x.size(d));
    }
  }
  return plan;
}

Tensor run_reduce(const char* op_name, ReduceOp op, const Tensor& x_in, const ReducePlan& plan,
                  DType out_dtype, int64_t correction = 1);

// Sum or mean over dims that are not adjacent, without copying the input: first reduce the
// trailing run of reduced dims [run_first, last] (adjacent, so no copy) into f64, then the
// remaining reduced dims of that much smaller result. Every partial covers the same number
// of elements, so a mean of the partial means is the mean. For BatchNorm's statistics and
// every per-channel bias gradient this replaces a permuting copy of the whole activation.
Tensor reduce_in_two_steps(const char* op_name, ReduceOp op, const Tensor& x, const ReducePlan& plan,
                           DType out_dtype, int64_t last) {
  int64_t run_first = last;
  while (run_first > 0 && plan.reduced[run_first - 1]) --run_first;
  ReducePlan trailing, rest = plan;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool in_run = d >= run_first && d <= last;
    trailing.reduced.push_back(in_run);
    trailing.keep_shape.push_back(in_run ? 1 : x.size(d));
    if (in_run) {
      trailing.reduce_count *= x.size(d);
      rest.reduced[d] = false;  // size 1 in the partial result: nothing left to reduce there
    } else {
      trailing.out_shape.push_back(x.size(d));
    }
  }
  rest.reduce_count = plan.reduce_count / trailing.reduce_count;
  const Tensor partial = run_reduce(op_name, op, x, trailing, DType::f64);
  return run_reduce(op_name, op, partial, rest, out_dtype);
}

// Runs the kernel; returns the result in the keepdim shape.
Tensor run_reduce(const char* op_name, ReduceOp op, const Tensor& x_in, const ReducePlan& plan,
                  DType out_dtype, int64_t correction) {
  Tensor x = x_in.detach();
  const int64_t nd = x.dim();
  int64_t first = -1, last = -1;
  for (int64_t d = 0; d < nd; ++d)
    if (plan.reduced[d]) {
      if (first < 0) first = d;
      last = d;
    }
  bool adjacent = first >= 0;
  for (int64_t d = first; adjacent && d <= last; ++d) adjacent = plan.reduced[d] || x.size(d) == 1;
  kernels::ReduceShape shape{1, plan.reduce_count, 1};
  if (first < 0) {  // nothing to reduce (0-d input): reduce over a single element
    x = x.contiguous();
    shape = {x.numel(), 1, 1};
  } else if (adjacent) {
    x = x.contiguous();
    for (int64_t d = 0; d < first; ++d) shape.outer *= x.size(d);
    for (int64_t d = last + 1; d < nd; ++d) shape.inner *= x.size(d);
  } else if ((op == ReduceOp::Sum || op == ReduceOp::Mean) && is_floating(x.dtype()) &&
             plan.reduce_count > 0) {
    return reduce_in_two_steps(op_name, op, x, plan, out_dtype, last);
  } else {
    std::vector<int64_t> order;
    for (int64_t d = 0; d < nd; ++d)
      if (!plan.reduced[d]) order.push_back(d);
    for (int64_t d = 0; d < nd; ++d)
      if (plan.reduced[d]) order.push_back(d);
    x = x.permute(order).contiguous();
    shape.outer = shape_numel(plan.out_shape);
  }
  Tensor out = new_output(plan.keep_shape, out_dtype, x);
  MG_KERNEL_SCRATCH(x.device(), reduce, op, shape, x.data_ptr(), x.dtype(), out.data_ptr(), out_dtype,
                    correction);
  return out;
}

Tensor finish(const Tensor& keep, const ReducePlan& plan, bool keepdim) {
  return keepdim ? keep : keep.reshape(plan.out_shape);
}

// Expands a gradient of the (possibly squeezed) result back over the reduced dims.
Tensor expand_grad(const Tensor& g, const Shape& keep_shape, const Shape& input_shape) {
  return g.reshape(keep_shape).expand(input_shape);
}

DType sum_dtype(DType t) { return is_floating(t) ? t : DType::i64; }

Tensor min_max(const char* name, ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims,
               bool keepdim) {
  check_defined(name, {x});
  ReducePlan plan = plan_reduction(x, dims, name);
  MG_CHECK(plan.reduce_count > 0, name, ": cannot reduce over an empty dimension (shape ",
           shape_str(x.shape()), ")");
  Tensor keep = run_reduce(name, op, x, plan, x.dtype());
  Tensor out = finish(keep, plan, keepdim);
  if (autograd::any_requires_grad({x})) {
    autograd::SavedTensor saved_x(x, name), saved_keep(keep, name);
    const Shape keep_shape = plan.keep_shape, input_shape = x.shape();
    std::vector<int64_t> reduced_dims;
    for (size_t d = 0; d < plan.reduced.size(); ++d)
      if (plan.reduced[d]) reduced_dims.push_back(static_cast<int64_t>(d));
    autograd::record(std::string(name) + "Backward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      // Every element equal to the extreme shares the gradient evenly (PyTorch's amax rule).
      Tensor mask = eq(saved_x.unpack(), saved_keep.unpack()).to(g[0].dtype());
      Tensor count = sum(mask, reduced_dims, true);
      return std::vector<Tensor>{div(mul(expand_grad(g[0], keep_shape, input_shape), mask), count)};
    });
  }
  return out;
}

}  // namespace

Tensor sum(const Tensor& x_arg, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = autocast_to_full_precision(x_arg);
  check_defined("sum", {x});
  ReducePlan plan = plan_reduction(x, dims, "sum");
  Tensor out = finish(run_reduce("sum", ReduceOp::Sum, x, plan, sum_dtype(x.dtype())), plan, keepdim);
  if (autograd::any_requires_grad({x})) {
    const Shape keep_shape = plan.keep_shape, input_shape = x.shape();
    autograd::record("SumBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{expand_grad(g[0], keep_shape, input_shape)};
    });
  }
  return out;
}

Tensor mean(const Tensor& x_arg, const std::vector<int64_t>& dims, bool keepdim) {
  const Tensor x = autocast_to_full_precision(x_arg);
  check_defined("mean", {x});
  check_floating("mean", x);
  ReducePlan plan = plan_reduction(x, dims, "mean");
  Tensor out = finish(run_reduce("mean", ReduceOp::Mean, x, plan, x.dtype()), plan, keepdim);
  if (autograd::any_requires_grad({x})) {
    const Shape keep_shape = plan.keep_shape, input_shape = x.shape();
    const double count = static_cast<double>(plan.reduce_count);
    autograd::record("MeanBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{div(expand_grad(g[0], keep_shape, input_shape), count)};
    });
  }
  return out;
}

Tensor max(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return min_max("Max", ReduceOp::Max, x, dims, keepdim);
}
Tensor min(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  return min_max("Min", ReduceOp::Min, x, dims, keepdim);
}

Tensor var(const Tensor& x_arg, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) {
  const Tensor x = autocast_to_full_precision(x_arg);
  check_defined("var", {x});
  check_floating("var", x);
  ReducePlan plan = plan_reduction(x, dims, "var");
  Tensor out = finish(run_reduce("var", ReduceOp::Var, x, plan, x.dtype(), correction), plan, keepdim);
  if (autograd::any_requires_grad({x})) {
    autograd::SavedTensor saved_x(x, "var");
    const Shape keep_shape = plan.keep_shape, input_shape = x.shape();
    std::vector<int64_t> reduced_dims;
    for (size_t d = 0; d < plan.reduced.size(); ++d)
      if (plan.reduced[d]) reduced_dims.push_back(static_cast<int64_t>(d));
    const double denominator = static_cast<double>(plan.reduce_count - correction);
    autograd::record("VarBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      // d var / dx_i = 2 (x_i - mean) / (n - correction)
      Tensor input = saved_x.unpack();
      Tensor centered = sub(input, mean(input, reduced_dims, true));
      return std::vector<Tensor>{
          mul(expand_grad(g[0], keep_shape, input_shape), mul(centered, 2.0 / denominator))};
    });
  }
  return out;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  check_defined("argmax", {x});
  ReducePlan plan = plan_reduction(x, {dim}, "argmax");
  MG_CHECK(plan.reduce_count > 0, "argmax: cannot reduce over an empty dimension (shape ",
           shape_str(x.shape()), ")");
  return finish(run_reduce("argmax", ReduceOp::Argmax, x, plan, DType::i64), plan, keepdim);
}

Tensor argmax(const Tensor& x) { return argmax(x.detach().reshape({-1}), 0, false); }

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  MG_CHECK(lead >= 0, "sum_to: cannot sum shape ", shape_str(x.shape()), " down to ", shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && x.size(d) != 1) {
      dims.push_back(d);
    } else {
      MG_CHECK(shape[d - lead] == x.size(d), "sum_to: cannot sum shape ", shape_str(x.shape()), " down to ",
               shape_str(shape));
    }
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

}  // namespace mg
