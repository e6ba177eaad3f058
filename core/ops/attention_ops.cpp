// scaled_dot_product_attention: argument checks, the fused kernels (kernels/cpu/attention.cpp and
// kernels/cuda/attention.cu) with their backward node, and the composed path (the reference).
#include "core/attention.h"

#include <cmath>
#include <limits>

#include "core/ops/op_common.h"
#include "core/random.h"
#include "kernels/cpu/attention.h"

namespace mg {
using namespace ops_detail;

namespace {

constexpr const char* kName = "scaled_dot_product_attention";

// Checks shapes and dtypes; returns the problem (sizes, scale, causal, dropout_p) without the seed.
kernels::AttentionProblem check_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                          const AttentionOptions& options) {
  check_defined(kName, {q, k, v});
  check_same_device(kName, {q, k, v});
  check_floating(kName, q);
  MG_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kName, ": q, k and v must share a dtype, got ",
           q.dtype(), ", ", k.dtype(), " and ", v.dtype());
  MG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, kName,
           ": expected q [B, H, Tq, D], k and v [B, H, Tk, D], got ", shape_str(q.shape()), ", ",
           shape_str(k.shape()), " and ", shape_str(v.shape()));
  const bool consistent = k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                          v.size(1) == q.size(1) && v.size(2) == k.size(2) && k.size(3) == q.size(3) &&
                          v.size(3) == q.size(3);
  MG_CHECK(consistent, kName,
           ": expected q [B, H, Tq, D], k and v [B, H, Tk, D] (the value dim equal to D), got ",
           shape_str(q.shape()), ", ", shape_str(k.shape()), " and ", shape_str(v.shape()));
  MG_CHECK(q.size(3) > 0, kName, ": the head dim D must be positive");
  MG_CHECK(options.dropout_p >= 0 && options.dropout_p <= 1, kName, ": dropout_p must be in [0, 1], got ",
           options.dropout_p);
  kernels::AttentionProblem p;
  p.B = q.size(0);
  p.H = q.size(1);
  p.Tq = q.size(2);
  p.Tk = k.size(2);
  p.D = q.size(3);
  p.scale = options.scale.value_or(1.0 / std::sqrt(static_cast<double>(p.D)));
  p.causal = options.causal;
  p.dropout_p = options.dropout_p;
  return p;
}

// A detached view the kernel can read in place: last dim contiguous, else a contiguous copy.
Tensor kernel_operand(const Tensor& t) {
  Tensor d = t.detach();
  return d.size(3) <= 1 || d.stride(3) == 1 ? d : d.contiguous();
}

kernels::AttentionStrides strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2)}; }

// The fused forward on kernel operands: out [B, H, Tq, D] and lse [B, H, Tq].
AttentionBlock run_forward(const kernels::AttentionProblem& p, const Tensor& q, const Tensor& k,
                           const Tensor& v) {
  AttentionBlock r{new_output({p.B, p.H, p.Tq, p.D}, q.dtype(), q),
                   new_output({p.B, p.H, p.Tq}, kernels::attention_stats_dtype(q.dtype()), q)};
  MG_KERNEL(q.device(), attention_forward, q.dtype(), p, q.data_ptr(), strides_of(q), k.data_ptr(),
            strides_of(k), v.data_ptr(), strides_of(v), r.out.data_ptr(), r.lse.data_ptr());
  return r;
}

// The fused backward on kernel operands, given the forward's (or the merged) contiguous out and lse.
AttentionBlockGrads run_backward(const kernels::AttentionProblem& p, const Tensor& q, const Tensor& k,
                                 const Tensor& v, const Tensor& out, const Tensor& lse, const Tensor& gout) {
  AttentionBlockGrads g{new_output(q.shape(), q.dtype(), q), new_output(k.shape(), k.dtype(), k),
                        new_output(v.shape(), v.dtype(), v)};
  Tensor delta = new_output({p.B, p.H, p.Tq}, lse.dtype(), lse);
  MG_KERNEL(q.device(), attention_backward, q.dtype(), p, q.data_ptr(), strides_of(q), k.data_ptr(),
            strides_of(k), v.data_ptr(), strides_of(v), out.data_ptr(), lse.data_ptr(), gout.data_ptr(),
            strides_of(gout), delta.data_ptr(), g.dq.data_ptr(), g.dk.data_ptr(), g.dv.data_ptr());
  return g;
}

}  // namespace

Tensor scaled_dot_product_attention_composed(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  const kernels::AttentionProblem p = check_attention(q, k, v, options);
  Tensor att = mul(matmul(q, k.transpose(-2, -1)), p.scale);  // [B, H, Tq, Tk]
  if (p.causal) {
    const TensorOptions idx{DType::i64, q.device(), false};
    const Tensor visible = ge(arange(p.Tq, idx).unsqueeze(1), arange(p.Tk, idx).unsqueeze(0));  // j <= i
    const Tensor minus_inf =
        full({}, -std::numeric_limits<double>::infinity(), TensorOptions{att.dtype(), att.device()});
    att = where(visible, att, minus_inf);
  }
  att = softmax(att, -1);
  if (p.dropout_p > 0) att = dropout(att, p.dropout_p, /*training=*/true);
  return matmul(att, v);
}

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const AttentionOptions& options) {
  kernels::AttentionProblem p = check_attention(q_in, k_in, v_in, options);
  const Tensor q = kernel_operand(q_in), k = kernel_operand(k_in), v = kernel_operand(v_in);
  if (p.dropout_p > 0) {
    const GeneratorState call = next_random_call();  // as mg::dropout: one call offset per op
    p.seed = call.seed;
    p.offset = call.offset;
  }
  const AttentionBlock r = run_forward(p, q, k, v);

  if (autograd::any_requires_grad({q_in, k_in, v_in})) {
    const autograd::SavedTensor saved_q(q, kName), saved_k(k, kName), saved_v(v, kName),
        saved_out(r.out, kName), saved_lse(r.lse, kName);
    autograd::record("ScaledDotProductAttentionBackward", {q_in, k_in, v_in}, {r.out},
                     [=](const std::vector<Tensor>& g) {
                       const Tensor sq = saved_q.unpack();
                       const AttentionBlockGrads d =
                           run_backward(p, sq, saved_k.unpack(), saved_v.unpack(), saved_out.unpack(),
                                        saved_lse.unpack(), kernel_operand(g[0].to(sq.dtype())));
                       return std::vector<Tensor>{d.dq, d.dk, d.dv};
                     });
  }
  return r.out;
}

// ---- attention over blocks of keys ------------------------------------------------------------

AttentionBlock attention_block_forward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                       bool causal, std::optional<double> scale) {
  const kernels::AttentionProblem p = check_attention(q_in, k_in, v_in, {causal, 0.0, scale});
  return run_forward(p, kernel_operand(q_in), kernel_operand(k_in), kernel_operand(v_in));
}

AttentionBlock merge_attention_blocks(const AttentionBlock& a, const AttentionBlock& b) {
  check_defined("merge_attention_blocks", {a.out, a.lse, b.out, b.lse});
  MG_CHECK(a.out.shape() == b.out.shape() && a.lse.shape() == b.lse.shape() &&
               a.out.dtype() == b.out.dtype() && a.lse.dtype() == b.lse.dtype(),
           "merge_attention_blocks: the two blocks must be results for the same queries, got out ",
           shape_str(a.out.shape()), " ", a.out.dtype(), " and ", shape_str(b.out.shape()), " ",
           b.out.dtype());
  NoGradGuard no_grad;
  // m = the larger lse, floored to the lowest finite float so that two -inf rows give weights
  // exp(-inf) = 0 rather than exp(-inf - -inf) = NaN. Then lse = m + log(wa + wb) and out is the
  // weighted mean of the two outs (weights wa = exp(lse_a - m), wb = exp(lse_b - m), one of them
  // 1 unless both blocks saw nothing).
  const Tensor m = maximum(maximum(a.lse, b.lse), static_cast<double>(std::numeric_limits<float>::lowest()));
  const Tensor wa = exp(sub(a.lse, m)), wb = exp(sub(b.lse, m));
  const Tensor total = add(wa, wb);
  const Tensor lse = add(m, log(total));
  // total is 0 only where both saw nothing, and there both outs are 0: any divisor does.
  const Tensor divisor = maximum(total, 1.0).unsqueeze(-1);
  const DType stats = a.lse.dtype();
  const Tensor sum = add(mul(a.out.to(stats), wa.unsqueeze(-1)), mul(b.out.to(stats), wb.unsqueeze(-1)));
  return {div(sum, divisor).to(a.out.dtype()), lse};
}

AttentionBlockGrads attention_block_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                             const AttentionBlock& merged, const Tensor& dout, bool causal,
                                             std::optional<double> scale) {
  const kernels::AttentionProblem p = check_attention(q_in, k_in, v_in, {causal, 0.0, scale});
  const Tensor q = kernel_operand(q_in), k = kernel_operand(k_in), v = kernel_operand(v_in);
  const DType stats_dtype = kernels::attention_stats_dtype(q.dtype());
  MG_CHECK(
      merged.out.shape() == Shape({p.B, p.H, p.Tq, p.D}) && merged.lse.shape() == Shape({p.B, p.H, p.Tq}) &&
          dout.shape() == merged.out.shape(),
      "attention_block_backward: merged.out and dout must be [B, H, Tq, D] and merged.lse [B, H, Tq] for q ",
      shape_str(q.shape()), ", got ", shape_str(merged.out.shape()), ", ", shape_str(dout.shape()), " and ",
      shape_str(merged.lse.shape()));
  return run_backward(p, q, k, v, merged.out.detach().to(q.dtype()).contiguous(),
                      merged.lse.detach().to(stats_dtype).contiguous(), kernel_operand(dout.to(q.dtype())));
}

}  // namespace mg
