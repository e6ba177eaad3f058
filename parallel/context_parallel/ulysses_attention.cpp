// DeepSpeed-Ulysses attention (ulysses_attention.h): the sequence <-> heads exchange around a local
// fused attention. Only the all-to-all needs a backward of its own; the reshapes and permutes
// around it are ordinary ops.
#include "parallel/context_parallel/ulysses_attention.h"

#include <vector>

#include "base/error.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"

namespace mg::parallel {
namespace {

Tensor exchanged(const Tensor& x, ProcessGroup group) {  // (a handle: copies share the group)
  NoGradGuard no_grad;
  Tensor in = x.detach().contiguous();
  Tensor out = empty_like(in);
  group.all_to_all(out, in)->wait();
  return out;
}

// [B, H, T/N, D] (the sequence split) -> [B, H/N, T, D] (the heads split).
Tensor sequence_to_heads(const Tensor& x, const ProcessGroup& group) {
  const int64_t n = group.size(), b = x.size(0), h = x.size(1), t = x.size(2), d = x.size(3);
  // Block j of dim 0 holds head group j, for rank j; the one from rank i is sequence chunk i.
  const Tensor blocks = x.reshape({b, n, h / n, t, d}).permute({1, 0, 2, 3, 4});
  const Tensor received = all_to_all_with_grad(blocks, group);  // [N (chunk), B, H/N, T/N, D]
  return received.permute({1, 2, 0, 3, 4}).reshape({b, h / n, n * t, d});
}

// [B, H/N, T, D] -> [B, H, T/N, D]: sequence_to_heads backwards.
Tensor heads_to_sequence(const Tensor& x, const ProcessGroup& group) {
  const int64_t n = group.size(), b = x.size(0), hn = x.size(1), t = x.size(2) / n, d = x.size(3);
  // Block j of dim 0 holds sequence chunk j, for rank j; the one from rank i is head group i.
  const Tensor blocks = x.reshape({b, hn, n, t, d}).permute({2, 0, 1, 3, 4});
  const Tensor received = all_to_all_with_grad(blocks, group);  // [N (head group), B, H/N, T/N, D]
  return received.permute({1, 0, 2, 3, 4}).reshape({b, n * hn, t, d});
}

}  // namespace

Tensor all_to_all_with_grad(const Tensor& x, const ProcessGroup& group) {
  MG_CHECK(group.defined(), "all_to_all_with_grad: the process group is undefined");
  MG_CHECK(x.dim() >= 1 && x.size(0) % group.size() == 0, "all_to_all_with_grad: dim 0 of shape ",
           shape_str(x.shape()), " does not divide into the group's ", group.size(), " ranks");
  Tensor out = exchanged(x, group);
  if (autograd::any_requires_grad({x}))
    autograd::record("AllToAllBackward", {x}, {out}, [group](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{exchanged(g[0], group)};
    });
  return out;
}

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const ProcessGroup& group,
                         const AttentionOptions& options) {
  MG_CHECK(group.defined(), "ulysses_attention: the process group is undefined");
  MG_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "ulysses_attention: q, k, v must be [B, H, T_local, D]; got ", shape_str(q.shape()), ", ",
           shape_str(k.shape()), ", ", shape_str(v.shape()));
  MG_CHECK(k.shape() == q.shape() && v.shape() == q.shape(),
           "ulysses_attention: q, k and v must have the same shape; got ", shape_str(q.shape()), ", ",
           shape_str(k.shape()), ", ", shape_str(v.shape()));
  MG_CHECK(q.size(1) % group.size() == 0, "ulysses_attention: ", q.size(1),
           " heads do not divide over the group's ", group.size(), " ranks (use ring_attention)");
  const Tensor out = scaled_dot_product_attention(sequence_to_heads(q, group), sequence_to_heads(k, group),
                                                  sequence_to_heads(v, group), options);
  return heads_to_sequence(out, group);
}

}  // namespace mg::parallel
