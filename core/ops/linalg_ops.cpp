// matmul with NumPy semantics (1-d dot, 2-d, batched with broadcast batch dims)
// and linear. The work is one strided batched GEMM call: each operand is passed
// with a transpose flag and leading dimension read off its strides, so
// transposed views (x.t(), the W^T of linear) cost no copy.
#include "core/autocast.h"
#include "core/ops/op_common.h"
#include "kernels/cpu/gemm.h"

namespace mg {
using namespace ops_detail;

namespace {

// How one operand of a batched GEMM sits in memory.
struct GemmOperand {
  Tensor storage_owner;  // keeps a copied operand alive
  const void* data = nullptr;
  bool transposed = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

// Describes `t` (shape [batch..., rows, cols], batch already broadcast) for GEMM,
// copying it only when its strides cannot be expressed as (trans, ld, batch stride).
GemmOperand describe_operand(const Tensor& t) {
  const int64_t nd = t.dim();
  const int64_t rows = t.size(nd - 2), cols = t.size(nd - 1);
  const int64_t rs = t.stride(nd - 2), cs = t.stride(nd - 1);
  GemmOperand op;
  bool matrix_ok = true;
  if ((cs == 1 || cols == 1) && rs >= std::max<int64_t>(cols, 1)) {
    op.transposed = false;
    op.ld = rs;
  } else if ((rs == 1 || rows == 1) && cs >= std::max<int64_t>(rows, 1)) {
    op.transposed = true;
    op.ld = cs;
  } else {
    matrix_ok = false;
  }
  // The batch dims must collapse into one stride (or be fully broadcast: stride 0).
  bool batch_ok = true;
  int64_t batch_stride = 0;
  bool all_broadcast = true;
  for (int64_t d = 0; d < nd - 2; ++d)
    if (t.size(d) != 1 && t.stride(d) != 0) all_broadcast = false;
  if (!all_broadcast) {
    int64_t expected = -1;
    for (int64_t d = nd - 3; d >= 0; --d) {
      if (t.size(d) == 1) continue;
      if (expected < 0) {
        batch_stride = t.stride(d);
        expected = t.stride(d) * t.size(d);
      } else if (t.stride(d) != expected) {
        batch_ok = false;
      } else {
        expected *= t.size(d);
      }
    }
    if (batch_stride == 0) batch_ok = false;
  }
  if (matrix_ok && batch_ok) {
    op.storage_owner = t;
    op.data = t.data_ptr();
    op.batch_stride = batch_stride;
    return op;
  }
  Tensor copy = t.contiguous();
  op.storage_owner = copy;
  op.data = copy.data_ptr();
  op.transposed = false;
  op.ld = std::max<int64_t>(cols, 1);
  op.batch_stride = nd > 2 ? rows * cols : 0;
  return op;
}

// True when a's dims before the last collapse into one without a copy (each one's stride is the
// next one's stride times its size; dims of size 1 fit anywhere).
bool rows_fold_to_a_view(const Tensor& t) {
  int64_t inner = -1;  // the nearest dim after d (up to the rows) of size > 1
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (inner >= 0 && t.stride(d) != t.stride(inner) * t.size(inner)) return false;
    inner = d;
  }
  return true;
}

// True for a matrix (or batch of matrices) stored column by column, e.g. w.t() of a
// contiguous w: its last two dims have strides (1, rows).
bool is_column_major(const Tensor& t) {
  const int64_t rows = t.size(-2), cols = t.size(-1);
  return rows > 1 && cols > 1 && t.stride(-2) == 1 && t.stride(-1) == rows;
}

// a [..., m, k] @ b [..., k, n] for tensors with >= 2 dims, no autograd.
Tensor batched_matmul_forward(const Tensor& a_in, const Tensor& b_in, bool reference) {
  Tensor a = a_in.detach(), b = b_in.detach();
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  MG_CHECK(b.size(-2) == k, "matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
           " cannot be multiplied (", m, "x", k, " and ", b.size(-2), "x", n, ")");
  Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  Shape batch;
  try {
    batch = broadcast_shapes(batch_a, batch_b, "matmul");
  } catch (const Error&) {
    throw Error(str_cat("matmul: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()),
                        " cannot be multiplied: their batch dims ", shape_str(batch_a), " and ",
                        shape_str(batch_b), " do not broadcast"));
  }
  Shape shape_a = batch, shape_b = batch, out_shape = batch;
  shape_a.insert(shape_a.end(), {m, k});
  shape_b.insert(shape_b.end(), {k, n});
  out_shape.insert(out_shape.end(), {m, n});
  GemmOperand oa = describe_operand(a.expand(shape_a)), ob = describe_operand(b.expand(shape_b));
  Tensor out = new_output(out_shape, a.dtype(), a);
  kernels::GemmArgs args;
  args.dtype = a.dtype();
  args.trans_a = oa.transposed;
  args.trans_b = ob.transposed;
  args.m = m;
  args.n = n;
  args.k = k;
  args.a = oa.data;
  args.lda = oa.ld;
  args.batch_stride_a = oa.batch_stride;
  args.b = ob.data;
  args.ldb = ob.ld;
  args.batch_stride_b = ob.batch_stride;
  args.c = out.data_ptr();
  args.ldc = std::max<int64_t>(n, 1);
  args.batch_stride_c = m * n;
  args.batch = shape_numel(batch);
  if (args.batch == 0 || m == 0 || n == 0) return out;
  if (reference) {
    kernels::cpu::gemm_reference(args);
  } else {
    MG_KERNEL_SCRATCH(out.device(), gemm, args);
  }
  return out;
}

Tensor batched_matmul(const Tensor& a, const Tensor& b, bool reference) {
  Tensor out = batched_matmul_forward(a, b, reference);
  if (!reference && autograd::any_requires_grad({a, b})) {
    autograd::SavedTensor saved_a(a, "matmul"), saved_b(b, "matmul");
    const autograd::TensorMeta meta_a = meta_of(a), meta_b = meta_of(b);
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    // An operand that is a transposed view (Linear's weight.t()) gets its gradient computed
    // transposed, (dC^T A)^T instead of A^T dC: the same numbers, but the transpose view's
    // backward then hands the weight a contiguous gradient, so accumulating it needs no copy.
    const bool a_transposed = is_column_major(a), b_transposed = is_column_major(b);
    autograd::record("MatmulBackward", {a, b}, {out}, [=](const std::vector<Tensor>& g) {
      // C = A B  =>  dA = dC B^T,  dB = A^T dC  (then undo batch broadcasting)
      Tensor ga, gb;
      const Tensor gt = g[0].transpose(-1, -2);
      if (need_a && autograd::needs_input_grad(0)) {
        const Tensor bt = saved_b.unpack().transpose(-1, -2);
        ga = a_transposed ? batched_matmul(bt.transpose(-1, -2), gt, false).transpose(-1, -2)
                          : batched_matmul(g[0], bt, false);
        ga = grad_like(ga, meta_a);
      }
      if (need_b && autograd::needs_input_grad(1)) {
        const Tensor at = saved_a.unpack().transpose(-1, -2);
        gb = b_transposed ? batched_matmul(gt, at.transpose(-1, -2), false).transpose(-1, -2)
                          : batched_matmul(at, g[0], false);
        gb = grad_like(gb, meta_b);
      }
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor matmul_impl(const Tensor& a, const Tensor& b, bool reference) {
  const char* name = reference ? "matmul_reference" : "matmul";
  check_defined(name, {a, b});
  check_same_device(name, {a, b});
  if (reference) require_cpu(name, {a, b});  // the triple-loop yardstick exists on the CPU only
  MG_CHECK(a.dtype() == b.dtype(), name, ": both operands must have the same dtype, got ", a.dtype(), " and ",
           b.dtype());
  check_floating(name, a);
  MG_CHECK(a.dim() >= 1 && b.dim() >= 1, name, ": both operands need at least 1 dim, got shapes ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  if (a.dim() == 1 && b.dim() == 1) {
    MG_CHECK(a.size(0) == b.size(0), name, ": dot product of shapes ", shape_str(a.shape()), " and ",
             shape_str(b.shape()), " needs equal lengths");
    return batched_matmul(a.unsqueeze(0), b.unsqueeze(1), reference).reshape({});
  }
  if (a.dim() == 1) return batched_matmul(a.unsqueeze(0), b, reference).squeeze(-2);
  if (b.dim() == 1) return batched_matmul(a, b.unsqueeze(1), reference).squeeze(-1);
  if (a.dim() >= 3 && b.dim() == 2 && rows_fold_to_a_view(a)) {
    // One matrix shared by every batch entry (a Linear's weight applied to [B, T, C]): fold the
    // batch dims into the rows, one [B*T, k] @ [k, n] product, as PyTorch does. Broadcast as a
    // batch, b's gradient would be a [B, k, n] stack of per-entry products summed afterwards --
    // 308 MB a sequence for GPT-2's lm_head -- where folded it is one GEMM of that size.
    Shape out_shape = a.shape();
    out_shape.back() = b.size(1);
    const int64_t rows = shape_numel(Shape(a.shape().begin(), a.shape().end() - 1));
    return batched_matmul(a.reshape({rows, a.size(-1)}), b, reference).reshape(out_shape);
  }
  return batched_matmul(a, b, reference);
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  return matmul_impl(autocast_to_low_precision(a), autocast_to_low_precision(b), false);
}
Tensor matmul_reference(const Tensor& a, const Tensor& b) { return matmul_impl(a, b, true); }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined("linear", {x, weight});
  MG_CHECK(weight.dim() == 2, "linear: weight must be 2-d [out_features, in_features], got ",
           shape_str(weight.shape()));
  MG_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input of shape ", shape_str(x.shape()),
           " does not match weight of shape ", shape_str(weight.shape()), " (last dim must be ",
           weight.size(1), ")");
  Tensor out = matmul(x, weight.t());
  if (bias.defined()) {
    // Under autocast the product is 16-bit; the bias joins it in that dtype.
    const Tensor b = bias.dtype() == out.dtype() ? bias : bias.to(out.dtype());
    MG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear: bias of shape ",
             shape_str(bias.shape()), " does not match weight of shape ", shape_str(weight.shape()));
    out = add(out, b);
  }
  return out;
}

}  // namespace mg
