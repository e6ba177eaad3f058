// Context parallelism under `mpiexec -n K` (K = 1, 2, 3, 4): every rank holds 1/K of the sequence,
// and its part of the output and of the gradients of q, k and v must equal the same part of
// attention over the whole sequence (computed on every rank from the same seed): ring attention
// in both layouts and Ulysses attention, causal and not.
#include <catch2/catch.hpp>

#include <functional>
#include <string>

#include "multigrad.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

namespace {

const char* layout_name(ContextLayout layout) {
  return layout == ContextLayout::zigzag ? "zigzag" : "contiguous";
}

using ShardedAttention = std::function<Tensor(const Tensor& q, const Tensor& k, const Tensor& v)>;

// Draws q, k, v and a loss weight of [2, heads, total, dim] (the same on every rank), computes
// attention over the whole sequence with loss sum(out * weight), then `sharded` on this rank's part
// in `layout` with the loss over its part (the ranks' losses sum to the whole one), and requires
// the part of the output and of each gradient to match.
void check_against_whole(const ProcessGroup& pg, int64_t heads, int64_t total, int64_t dim, bool causal,
                         ContextLayout layout, const ShardedAttention& sharded) {
  const Device device = pg.device();
  manual_seed(1234);
  const TensorOptions f32{DType::f32};
  const Shape shape{2, heads, total, dim};
  const Tensor q = randn(shape, f32).to(device), k = randn(shape, f32).to(device),
               v = randn(shape, f32).to(device), weight = randn(shape, f32).to(device);
  auto shard = [&](const Tensor& t) { return context_shard(t, 2, pg.rank(), pg.size(), layout); };

  Tensor qf = q.clone(), kf = k.clone(), vf = v.clone();
  for (Tensor* t : {&qf, &kf, &vf}) t->set_requires_grad(true);
  AttentionOptions whole;
  whole.causal = causal;
  const Tensor reference = scaled_dot_product_attention(qf, kf, vf, whole);
  (reference * weight).sum().backward();

  Tensor ql = shard(q), kl = shard(k), vl = shard(v);
  for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
  const Tensor out = sharded(ql, kl, vl);
  REQUIRE(out.shape() == ql.shape());
  (out * shard(weight)).sum().backward();

  testing::require_close(out, shard(reference.detach()), 1e-5);
  testing::require_close(ql.grad(), shard(qf.grad()), 1e-5);
  testing::require_close(kl.grad(), shard(kf.grad()), 1e-5);
  testing::require_close(vl.grad(), shard(vf.grad()), 1e-5);
}

}  // namespace

TEST_CASE("ring attention equals attention over the whole sequence", "[mpi][context_parallel]") {
  ProcessGroup pg = testing::mpi_test_group();
  for (ContextLayout layout : {ContextLayout::contiguous, ContextLayout::zigzag})
    for (bool causal : {false, true}) {
      INFO(layout_name(layout) << (causal ? ", causal" : ", not causal") << ", rank " << pg.rank() << " of "
                               << pg.size() << " on " << pg.device());
      RingAttentionOptions ring;
      ring.causal = causal;
      ring.layout = layout;
      // 3 positions a zigzag chunk, 6 a contiguous one.
      check_against_whole(pg, 2, 2 * pg.size() * 3, 8, causal, layout,
                          [&](const Tensor& q, const Tensor& k, const Tensor& v) {
                            return ring_attention(q, k, v, pg, ring);
                          });
    }
}

TEST_CASE("ring attention: the zigzag layout needs an even local length", "[mpi][context_parallel]") {
  ProcessGroup pg = testing::mpi_test_group();
  const Tensor x = zeros({1, 1, 3, 4}, TensorOptions{DType::f32, pg.device()});
  RingAttentionOptions zigzag;
  zigzag.layout = ContextLayout::zigzag;
  REQUIRE_THROWS_WITH(ring_attention(x, x, x, pg, zigzag), Catch::Contains("T_local = 3"));
  REQUIRE_THROWS_WITH(context_shard(zeros({5}), 0, 0, 2, ContextLayout::contiguous),
                      Catch::Contains("does not divide into 2 equal chunks"));
}

TEST_CASE("Ulysses attention equals attention over the whole sequence", "[mpi][context_parallel]") {
  ProcessGroup pg = testing::mpi_test_group();
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "not causal")
         << ", rank " << pg.rank() << " of " << pg.size() << " on " << pg.device());
    AttentionOptions options;
    options.causal = causal;
    // 12 heads divide over 2, 3 and 4 ranks.
    check_against_whole(pg, 12, pg.size() * 5, 4, causal, ContextLayout::contiguous,
                        [&](const Tensor& q, const Tensor& k, const Tensor& v) {
                          return ulysses_attention(q, k, v, pg, options);
                        });
  }
  if (pg.size() > 1) {
    const Tensor odd = zeros({1, pg.size() + 1, 2, 4}, TensorOptions{DType::f32, pg.device()});
    REQUIRE_THROWS_WITH(ulysses_attention(odd, odd, odd, pg), Catch::Contains("do not divide over"));
  }
}
