// Elementwise ops: unary math, binary arithmetic with NumPy broadcasting and
// type promotion, comparisons, where, clamp, and their backward formulas.
#include <cmath>
#include <limits>

#include "core/ops/op_common.h"
#include "kernels/cpu/elementwise.h"

namespace mg {
using namespace ops_detail;
using kernels::BinaryOp;
using kernels::UnaryOp;

// ---- shared checks -----------------------------------------------------------
void check_same_device(const char* op, const std::vector<Tensor>& tensors) {
  const Tensor* first = nullptr;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!first) {
      first = &t;
      continue;
    }
    MG_CHECK(t.device() == first->device(), op, ": expected all tensors on the same device, but found ",
             first->device(), " and ", t.device());
  }
}

void require_cpu(const char* op, const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors)
    if (t.defined())  // (optional arguments such as a missing bias are undefined)
      MG_CHECK(t.device().is_cpu(), op, ": got a tensor on ", t.device(), ", but ", op,
               " has no CUDA kernel yet (only the CPU one is written; kernels/cuda/ lists what exists)");
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    MG_CHECK(da == db || da == 1 || db == 1, op, ": shapes ", shape_str(a), " and ", shape_str(b),
             " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

namespace {

// ---- unary -------------------------------------------------------------------
Tensor unary_forward(const char* name, UnaryOp op, const Tensor& x, double scalar = 0.0) {
  check_defined(name, {x});
  Tensor out = new_output(x.shape(), x.dtype(), x);
  MG_KERNEL(x.device(), unary, op, x.view_for_kernel(), out.view_for_kernel(), scalar);
  return out;
}

// A differentiable unary op: forward kernel + fused backward kernel.
Tensor unary_op(const char* name, UnaryOp op, const Tensor& x, double scalar = 0.0) {
  Tensor out = unary_forward(name, op, x, scalar);
  if (autograd::any_requires_grad({x})) {
    check_floating(name, x);
    autograd::SavedTensor saved_x(x, name), saved_out(out, name);
    autograd::record(std::string(name) + "Backward", {x}, {out},
                     [op, scalar, saved_x, saved_out](const std::vector<Tensor>& g) {
                       Tensor input = saved_x.unpack(), output = saved_out.unpack();
                       Tensor grad_out = g[0].contiguous();
                       Tensor grad_in = new_output(input.shape(), input.dtype(), input);
                       MG_KERNEL(input.device(), unary_backward, op, grad_out.view_for_kernel(),
                                 input.view_for_kernel(), output.view_for_kernel(), grad_in.view_for_kernel(),
                                 scalar);
                       return std::vector<Tensor>{grad_in};
                     });
  }
  return out;
}

// Integer inputs of ops that only make sense in floating point become f32.
Tensor to_floating(const Tensor& x) { return is_floating(x.dtype()) ? x : x.to(DType::f32); }

// ---- binary ------------------------------------------------------------------
bool is_comparison(BinaryOp op) {
  return op == BinaryOp::Eq || op == BinaryOp::Ne || op == BinaryOp::Lt || op == BinaryOp::Le ||
         op == BinaryOp::Gt || op == BinaryOp::Ge || op == BinaryOp::LogicalAnd || op == BinaryOp::LogicalOr;
}

// Broadcasts, promotes and runs the kernel; no autograd.
Tensor binary_forward(const char* name, BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  check_defined(name, {a_in, b_in});
  check_same_device(name, {a_in, b_in});
  DType common = promote_types(a_in.dtype(), b_in.dtype());
  if (op == BinaryOp::Div && !is_floating(common)) common = DType::f32;
  const Shape shape = broadcast_shapes(a_in.shape(), b_in.shape(), name);
  Tensor a = a_in.detach(), b = b_in.detach();
  if (a.dtype() != common) a = a.to(common);
  if (b.dtype() != common) b = b.to(common);
  Tensor out = new_output(shape, is_comparison(op) ? DType::boolean : common, a);
  MG_KERNEL(a.device(), binary, op, broadcast_view(a, shape), broadcast_view(b, shape),
            out.view_for_kernel());
  return out;
}

Tensor binary_scalar_forward(const char* name, BinaryOp op, const Tensor& a_in, double scalar) {
  check_defined(name, {a_in});
  Tensor a = a_in.detach();
  const bool needs_float = (op == BinaryOp::Div || op == BinaryOp::Pow || scalar != std::floor(scalar)) &&
                           !is_floating(a.dtype()) && !is_comparison(op);
  if (needs_float) a = a.to(DType::f32);
  Tensor out = new_output(a.shape(), is_comparison(op) ? DType::boolean : a.dtype(), a);
  MG_KERNEL(a.device(), binary_scalar, op, a.view_for_kernel(), scalar, out.view_for_kernel());
  return out;
}

using BinaryGrad = std::function<std::vector<Tensor>(const Tensor& g, const Tensor& a, const Tensor& b)>;

// A differentiable binary op; `grads` returns full-shape gradients for a and b,
// which are then summed back to each input's shape and dtype.
Tensor binary_op(const char* name, BinaryOp op, const Tensor& a, const Tensor& b, BinaryGrad grads,
                 bool saves_inputs) {
  Tensor out = binary_forward(name, op, a, b);
  if (autograd::any_requires_grad({a, b})) {
    autograd::SavedTensor saved_a, saved_b;
    if (saves_inputs) {
      saved_a = autograd::SavedTensor(a, name);
      saved_b = autograd::SavedTensor(b, name);
    }
    const autograd::TensorMeta meta_a = meta_of(a), meta_b = meta_of(b);
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record(std::string(name) + "Backward", {a, b}, {out}, [=](const std::vector<Tensor>& g) {
      std::vector<Tensor> full = grads(g[0], saved_a.unpack(), saved_b.unpack());
      return std::vector<Tensor>{need_a ? grad_like(full[0], meta_a) : Tensor(),
                                 need_b ? grad_like(full[1], meta_b) : Tensor()};
    });
  }
  return out;
}

Tensor scalar_op(const char* name, BinaryOp op, const Tensor& a, double scalar,
                 std::function<Tensor(const Tensor& g, const Tensor& a)> grad, bool saves_input) {
  Tensor out = binary_scalar_forward(name, op, a, scalar);
  if (autograd::any_requires_grad({a})) {
    autograd::SavedTensor saved_a = saves_input ? autograd::SavedTensor(a, name) : autograd::SavedTensor();
    const autograd::TensorMeta meta_a = meta_of(a);
    autograd::record(std::string(name) + "Backward", {a}, {out}, [=](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{grad_like(grad(g[0], saved_a.unpack()), meta_a)};
    });
  }
  return out;
}

// d max(a, b): the larger input gets the gradient; ties split it evenly (PyTorch).
std::vector<Tensor> select_grads(const Tensor& g, const Tensor& a, const Tensor& b, BinaryOp winner) {
  Tensor a_wins = binary_forward("maximum", winner, a, b).to(g.dtype());
  Tensor tie = binary_forward("maximum", BinaryOp::Eq, a, b).to(g.dtype());
  Tensor share_a = add(a_wins, mul(tie, 0.5));
  return {mul(g, share_a), mul(g, rsub(share_a, 1.0))};
}

}  // namespace

// ---- unary entry points --------------------------------------------------------
Tensor neg(const Tensor& x) {
  Tensor out = unary_forward("neg", UnaryOp::Neg, x);
  if (autograd::any_requires_grad({x}))
    autograd::record("NegBackward", {x}, {out},
                     [](const std::vector<Tensor>& g) { return std::vector<Tensor>{neg(g[0])}; });
  return out;
}
Tensor exp(const Tensor& x) { return unary_op("Exp", UnaryOp::Exp, to_floating(x)); }
Tensor log(const Tensor& x) { return unary_op("Log", UnaryOp::Log, to_floating(x)); }
Tensor sqrt(const Tensor& x) { return unary_op("Sqrt", UnaryOp::Sqrt, to_floating(x)); }
Tensor rsqrt(const Tensor& x) { return unary_op("Rsqrt", UnaryOp::Rsqrt, to_floating(x)); }
Tensor abs(const Tensor& x) { return unary_op("Abs", UnaryOp::Abs, x); }
Tensor tanh(const Tensor& x) { return unary_op("Tanh", UnaryOp::Tanh, to_floating(x)); }
Tensor sigmoid(const Tensor& x) { return unary_op("Sigmoid", UnaryOp::Sigmoid, to_floating(x)); }
Tensor relu(const Tensor& x) { return unary_op("Relu", UnaryOp::Relu, x); }
Tensor gelu(const Tensor& x) { return unary_op("Gelu", UnaryOp::GeluTanh, to_floating(x)); }
Tensor pow(const Tensor& x, double exponent) {
  return unary_op("Pow", UnaryOp::PowScalar, to_floating(x), exponent);
}
Tensor square(const Tensor& x) { return unary_op("Square", UnaryOp::Square, x); }
Tensor reciprocal(const Tensor& x) { return unary_op("Reciprocal", UnaryOp::Reciprocal, to_floating(x)); }
Tensor sign(const Tensor& x) { return unary_forward("sign", UnaryOp::Sign, x); }

// ---- binary entry points -------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b, double alpha) {
  if (alpha == 1.0) {
    return binary_op(
        "Add", BinaryOp::Add, a, b,
        [](const Tensor& g, const Tensor&, const Tensor&) {
          return std::vector<Tensor>{g, g};
        },
        false);
  }
  return add(a, mul(b, alpha));
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary_op(
      "Sub", BinaryOp::Sub, a, b,
      [](const Tensor& g, const Tensor&, const Tensor&) {
        return std::vector<Tensor>{g, neg(g)};
      },
      false);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary_op(
      "Mul", BinaryOp::Mul, a, b,
      [](const Tensor& g, const Tensor& a, const Tensor& b) {
        return std::vector<Tensor>{mul(g, b), mul(g, a)};
      },
      true);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary_op(
      "Div", BinaryOp::Div, a, b,
      [](const Tensor& g, const Tensor& a, const Tensor& b) {
        Tensor ga = div(g, b);
        return std::vector<Tensor>{ga, neg(mul(ga, div(a, b)))};
      },
      true);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary_op(
      "Maximum", BinaryOp::Maximum, a, b,
      [](const Tensor& g, const Tensor& a, const Tensor& b) { return select_grads(g, a, b, BinaryOp::Gt); },
      true);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary_op(
      "Minimum", BinaryOp::Minimum, a, b,
      [](const Tensor& g, const Tensor& a, const Tensor& b) { return select_grads(g, a, b, BinaryOp::Lt); },
      true);
}

Tensor add(const Tensor& a, double b) {
  return scalar_op(
      "AddScalar", BinaryOp::Add, a, b, [](const Tensor& g, const Tensor&) { return g; }, false);
}
Tensor sub(const Tensor& a, double b) {
  return scalar_op(
      "SubScalar", BinaryOp::Sub, a, b, [](const Tensor& g, const Tensor&) { return g; }, false);
}
Tensor mul(const Tensor& a, double b) {
  return scalar_op(
      "MulScalar", BinaryOp::Mul, a, b, [b](const Tensor& g, const Tensor&) { return mul(g, b); }, false);
}
Tensor div(const Tensor& a, double b) {
  return scalar_op(
      "DivScalar", BinaryOp::Div, a, b, [b](const Tensor& g, const Tensor&) { return div(g, b); }, false);
}
Tensor rsub(const Tensor& a, double b) { return add(neg(a), b); }
Tensor rdiv(const Tensor& a, double b) { return mul(reciprocal(a), b); }
namespace {
// max(a, b) / min(a, b) against a scalar: the gradient flows to `a` where it won, half of it
// where it tied.
Tensor scalar_extremum(const char* name, BinaryOp op, const Tensor& a, double b) {
  const bool is_max = op == BinaryOp::Maximum;
  return scalar_op(
      name, op, a, b,
      [b, is_max](const Tensor& g, const Tensor& a) {
        Tensor won = is_max ? gt(a, b) : lt(a, b);
        Tensor share = add(won.to(g.dtype()), mul(eq(a, b).to(g.dtype()), 0.5));
        return mul(g, share);
      },
      true);
}
}  // namespace

Tensor maximum(const Tensor& a, double b) {
  return scalar_extremum("MaximumScalar", BinaryOp::Maximum, a, b);
}
Tensor minimum(const Tensor& a, double b) {
  return scalar_extremum("MinimumScalar", BinaryOp::Minimum, a, b);
}

// ---- comparisons -----------------------------------------------------------------
Tensor eq(const Tensor& a, const Tensor& b) { return binary_forward("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return binary_forward("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary_forward("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return binary_forward("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary_forward("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return binary_forward("ge", BinaryOp::Ge, a, b); }
Tensor eq(const Tensor& a, double b) { return binary_scalar_forward("eq", BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, double b) { return binary_scalar_forward("ne", BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, double b) { return binary_scalar_forward("lt", BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, double b) { return binary_scalar_forward("le", BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, double b) { return binary_scalar_forward("gt", BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, double b) { return binary_scalar_forward("ge", BinaryOp::Ge, a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return binary_forward("logical_and", BinaryOp::LogicalAnd, a.to(DType::boolean), b.to(DType::boolean));
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return binary_forward("logical_or", BinaryOp::LogicalOr, a.to(DType::boolean), b.to(DType::boolean));
}

// ---- where / clamp -----------------------------------------------------------------
Tensor where(const Tensor& condition, const Tensor& a, const Tensor& b) {
  check_defined("where", {condition, a, b});
  check_same_device("where", {condition, a, b});
  MG_CHECK(condition.dtype() == DType::boolean, "where: the condition must be bool, got ", condition.dtype());
  const Shape shape =
      broadcast_shapes(broadcast_shapes(condition.shape(), a.shape(), "where"), b.shape(), "where");
  const DType common = promote_types(a.dtype(), b.dtype());
  Tensor av = a.detach().to(common), bv = b.detach().to(common);
  Tensor out = new_output(shape, common, av);
  MG_KERNEL(av.device(), where, broadcast_view(condition, shape), broadcast_view(av, shape),
            broadcast_view(bv, shape), out.view_for_kernel());
  if (autograd::any_requires_grad({a, b})) {
    autograd::SavedTensor saved_condition(condition, "where");
    const autograd::TensorMeta meta_a = meta_of(a), meta_b = meta_of(b);
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::record("WhereBackward", {a, b}, {out}, [=](const std::vector<Tensor>& g) {
      Tensor cond = saved_condition.unpack();
      Tensor zero = zeros({}, TensorOptions{g[0].dtype(), g[0].device(), false});
      return std::vector<Tensor>{need_a ? grad_like(where(cond, g[0], zero), meta_a) : Tensor(),
                                 need_b ? grad_like(where(cond, zero, g[0]), meta_b) : Tensor()};
    });
  }
  return out;
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  check_defined("clamp", {x});
  const double low = lo.value_or(-std::numeric_limits<double>::infinity());
  const double high = hi.value_or(std::numeric_limits<double>::infinity());
  MG_CHECK(!(low > high), "clamp: min (", low, ") is greater than max (", high, ")");
  Tensor out = new_output(x.shape(), x.dtype(), x);
  MG_KERNEL(x.device(), clamp, x.view_for_kernel(), out.view_for_kernel(), low, high);
  if (autograd::any_requires_grad({x})) {
    autograd::SavedTensor saved_x(x, "clamp");
    autograd::record("ClampBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      Tensor input = saved_x.unpack();
      Tensor inside = logical_and(ge(input, low), le(input, high));
      Tensor zero = zeros({}, TensorOptions{g[0].dtype(), g[0].device(), false});
      return std::vector<Tensor>{where(inside, g[0], zero)};
    });
  }
  return out;
}

Tensor cast(const Tensor& x, DType dtype) { return x.to(dtype); }

// ---- operators ---------------------------------------------------------------------
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, double b) { return add(a, b); }
Tensor operator-(const Tensor& a, double b) { return sub(a, b); }
Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
Tensor operator/(const Tensor& a, double b) { return div(a, b); }
Tensor operator+(double a, const Tensor& b) { return add(b, a); }
Tensor operator-(double a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
Tensor operator/(double a, const Tensor& b) { return rdiv(b, a); }

}  // namespace mg
