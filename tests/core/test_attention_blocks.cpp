// Attention over blocks of keys (core/attention.h: attention_block_forward, merge_attention_blocks,
// attention_block_backward), what ring attention is built from: the blocks' results merged through
// the log-sum-exp against the whole attention, forward and backward, in f64 and f32; the causal
// split into query and key chunks that a ring of ranks computes; blocks that see no key; and the
// argument checks.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "multigrad.h"
#include "tests/gradcheck.h"

using namespace mg;

namespace {

double rel_diff(const Tensor& a, const Tensor& b) { return testing::relative_error(a, b, 1e-2); }

// The whole attention and its gradients for the loss sum(out * dout), by the op and autograd.
struct Whole {
  Tensor out, dq, dk, dv;
};
Whole whole_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, bool causal) {
  Tensor ql = testing::leaf(q), kl = testing::leaf(k), vl = testing::leaf(v);
  Tensor out = scaled_dot_product_attention(ql, kl, vl, AttentionOptions{causal, 0.0, std::nullopt});
  sum(mul(out, dout)).backward();
  return {out.detach(), ql.grad(), kl.grad(), vl.grad()};
}

// log sum_j exp(q_i . k_j * scale) per row, written out (non-causal).
std::vector<double> reference_lse(const Tensor& q, const Tensor& k) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  const std::vector<double> qv = q.to_vector<double>(), kv = k.to_vector<double>();
  const double scale = 1.0 / std::sqrt(double(D));
  std::vector<double> lse;
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t i = 0; i < Tq; ++i) {
      std::vector<double> s(Tk);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < Tk; ++j) {
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += qv[(bh * Tq + i) * D + d] * kv[(bh * Tk + j) * D + d];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double total = 0;
      for (double x : s) total += std::exp(x - m);
      lse.push_back(m + std::log(total));
    }
  return lse;
}

void check_blocks_merge_to_whole(DType dtype, double tol) {
  manual_seed(41);
  const int64_t B = 2, H = 3, Tq = 21, Tk = 37, D = 16;
  const TensorOptions opt{dtype};
  const Tensor q = randn({B, H, Tq, D}, opt), k = randn({B, H, Tk, D}, opt), v = randn({B, H, Tk, D}, opt),
               dout = randn({B, H, Tq, D}, opt);
  const std::vector<int64_t> starts = {0, 10, 30, Tk};  // three blocks of 10, 20 and 7 keys
  std::vector<AttentionBlock> blocks;
  for (size_t b = 0; b + 1 < starts.size(); ++b) {
    const int64_t len = starts[b + 1] - starts[b];
    blocks.push_back(attention_block_forward(q, k.narrow(2, starts[b], len), v.narrow(2, starts[b], len)));
  }
  const AttentionBlock merged =
      merge_attention_blocks(merge_attention_blocks(blocks[0], blocks[1]), blocks[2]);
  const Whole w = whole_attention(q, k, v, dout, false);
  CHECK(rel_diff(merged.out, w.out) < tol);
  // The merged lse is the whole row's, written out; and the merge does not depend on the order.
  const std::vector<double> lse = merged.lse.to_vector<double>(), expected = reference_lse(q, k);
  for (size_t i = 0; i < lse.size(); ++i)
    REQUIRE(std::abs(lse[i] - expected[i]) < tol * (1 + std::abs(expected[i])));
  const AttentionBlock reversed =
      merge_attention_blocks(blocks[2], merge_attention_blocks(blocks[1], blocks[0]));
  CHECK(rel_diff(reversed.out, merged.out) < tol);

  // Each block's share of the gradients, from the merged out and lse: dq sums, dk and dv are the
  // block's rows of the whole.
  Tensor dq = zeros({B, H, Tq, D}, opt);
  for (size_t b = 0; b + 1 < starts.size(); ++b) {
    const int64_t len = starts[b + 1] - starts[b];
    const AttentionBlockGrads g =
        attention_block_backward(q, k.narrow(2, starts[b], len), v.narrow(2, starts[b], len), merged, dout);
    dq = add(dq, g.dq);
    CHECK(rel_diff(g.dk, w.dk.narrow(2, starts[b], len)) < tol);
    CHECK(rel_diff(g.dv, w.dv.narrow(2, starts[b], len)) < tol);
  }
  CHECK(rel_diff(dq, w.dq) < tol);
}

}  // namespace

TEST_CASE("attention over key blocks, merged, equals the whole attention, forward and backward",
          "[attention][blocks]") {
  SECTION("f64") { check_blocks_merge_to_whole(DType::f64, 1e-10); }
  SECTION("f32") { check_blocks_merge_to_whole(DType::f32, 1e-5); }
}

TEST_CASE("causal attention computed chunk by chunk, as a ring of ranks does", "[attention][blocks]") {
  // T = 26 in 4 chunks of 7, 7, 7 and 5 positions. Query chunk i needs key chunks j < i whole, its
  // own chunk under the causal mask, and nothing after it; the key chunk j's gradient sums the
  // shares of every query chunk i >= j.
  manual_seed(42);
  const int64_t B = 1, H = 2, T = 26, D = 8;
  const std::vector<int64_t> starts = {0, 7, 14, 21, T};
  const TensorOptions opt{DType::f64};
  const Tensor q = randn({B, H, T, D}, opt), k = randn({B, H, T, D}, opt), v = randn({B, H, T, D}, opt),
               dout = randn({B, H, T, D}, opt);
  const Whole w = whole_attention(q, k, v, dout, true);
  const size_t chunks = starts.size() - 1;
  auto part = [&](const Tensor& t, size_t c) { return t.narrow(2, starts[c], starts[c + 1] - starts[c]); };
  std::vector<Tensor> dk(chunks), dv(chunks);
  for (size_t c = 0; c < chunks; ++c) {
    dk[c] = zeros(part(k, c).shape(), opt);
    dv[c] = zeros(part(v, c).shape(), opt);
  }
  for (size_t i = 0; i < chunks; ++i) {
    AttentionBlock merged = attention_block_forward(part(q, i), part(k, i), part(v, i), true);
    for (size_t j = 0; j < i; ++j)
      merged = merge_attention_blocks(merged, attention_block_forward(part(q, i), part(k, j), part(v, j)));
    INFO("query chunk " << i);
    CHECK(rel_diff(merged.out, part(w.out, i)) < 1e-10);
    Tensor dq = zeros(part(q, i).shape(), opt);
    for (size_t j = 0; j <= i; ++j) {
      const AttentionBlockGrads g =
          attention_block_backward(part(q, i), part(k, j), part(v, j), merged, part(dout, i), j == i);
      dq = add(dq, g.dq);
      dk[j] = add(dk[j], g.dk);
      dv[j] = add(dv[j], g.dv);
    }
    CHECK(rel_diff(dq, part(w.dq, i)) < 1e-10);
  }
  for (size_t j = 0; j < chunks; ++j) {
    INFO("key chunk " << j);
    CHECK(rel_diff(dk[j], part(w.dk, j)) < 1e-10);
    CHECK(rel_diff(dv[j], part(w.dv, j)) < 1e-10);
  }
}

TEST_CASE("a block that sees no key merges as nothing, and two give zeros, not NaN", "[attention][blocks]") {
  manual_seed(43);
  const Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 9, 8}), v = randn({1, 2, 9, 8});
  const Tensor none = zeros({1, 2, 0, 8});
  const AttentionBlock empty = attention_block_forward(q, none, none),
                       full = attention_block_forward(q, k, v);
  for (double x : empty.lse.to_vector<double>()) CHECK(x == -std::numeric_limits<double>::infinity());
  const AttentionBlock a = merge_attention_blocks(empty, full), b = merge_attention_blocks(full, empty);
  CHECK(rel_diff(a.out, full.out) < 1e-7);
  CHECK(rel_diff(b.lse, full.lse) < 1e-7);
  const AttentionBlock nothing = merge_attention_blocks(empty, empty);
  for (double x : nothing.out.to_vector<double>()) CHECK(x == 0.0);
  for (double x : nothing.lse.to_vector<double>()) CHECK(x == -std::numeric_limits<double>::infinity());
  // The backward of a block with no keys is a zero share of dq.
  const AttentionBlockGrads g = attention_block_backward(q, none, none, full, randn({1, 2, 5, 8}));
  for (double x : g.dq.to_vector<double>()) CHECK(x == 0.0);
}

TEST_CASE("attention blocks check their arguments", "[attention][blocks][errors]") {
  const Tensor q = randn({1, 2, 5, 8}), k = randn({1, 2, 9, 8});
  const AttentionBlock a = attention_block_forward(q, k, k),
                       other = attention_block_forward(randn({1, 2, 6, 8}), k, k);
  CHECK_THROWS_WITH(merge_attention_blocks(a, other),
                    Catch::Contains("the two blocks must be results for the same queries"));
  CHECK_THROWS_WITH(attention_block_backward(q, k, k, a, randn({1, 2, 6, 8})),
                    Catch::Contains("merged.out and dout must be [B, H, Tq, D]"));
  CHECK_THROWS_WITH(attention_block_forward(q, randn({1, 2, 9, 4}), k),
                    Catch::Contains("expected q [B, H, Tq, D]"));
}
