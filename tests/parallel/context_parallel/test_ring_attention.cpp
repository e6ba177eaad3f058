// Ring attention under `mpiexec -n K` (K = 2, 3, 4): every rank holds 1/K of the sequence, and its
// part of the output and of the gradients of q, k and v must equal the same part of attention over
// the whole sequence (computed on every rank from the same seed), in both layouts, causal and not.
#include <catch2/catch.hpp>

#include <string>

#include "multigrad.h"
#include "tests/parallel/mpi_test_support.h"

using namespace mg;
using namespace mg::parallel;

namespace {

const char* layout_name(ContextLayout layout) {
  return layout == ContextLayout::zigzag ? "zigzag" : "contiguous";
}

}  // namespace

TEST_CASE("ring attention equals attention over the whole sequence", "[mpi][context_parallel]") {
  ProcessGroup pg = testing::mpi_test_group();
  const int world = pg.size(), me = pg.rank();
  const Device device = pg.device();
  const int64_t batch = 2, heads = 2, dim = 8;
  const int64_t total = 2 * world * 3;  // 3 positions a zigzag chunk, 6 a contiguous one
  for (ContextLayout layout : {ContextLayout::contiguous, ContextLayout::zigzag})
    for (bool causal : {false, true}) {
      INFO(layout_name(layout) << (causal ? ", causal" : ", not causal") << ", rank " << me << " of " << world
                               << " on " << device);
      manual_seed(1234);  // the same sequence on every rank
      const TensorOptions f32{DType::f32};
      const Shape shape{batch, heads, total, dim};
      const Tensor q = randn(shape, f32).to(device), k = randn(shape, f32).to(device),
                   v = randn(shape, f32).to(device), weight = randn(shape, f32).to(device);
      auto shard = [&](const Tensor& t) { return context_shard(t, 2, me, world, layout); };

      // The reference: attention over the whole sequence, loss = sum(out * weight).
      Tensor qf = q.clone(), kf = k.clone(), vf = v.clone();
      for (Tensor* t : {&qf, &kf, &vf}) t->set_requires_grad(true);
      AttentionOptions whole;
      whole.causal = causal;
      const Tensor reference = scaled_dot_product_attention(qf, kf, vf, whole);
      (reference * weight).sum().backward();

      // This rank's part: the sum of every rank's local loss is the reference's loss.
      Tensor ql = shard(q), kl = shard(k), vl = shard(v);
      for (Tensor* t : {&ql, &kl, &vl}) t->set_requires_grad(true);
      RingAttentionOptions ring;
      ring.causal = causal;
      ring.layout = layout;
      const Tensor out = ring_attention(ql, kl, vl, pg, ring);
      REQUIRE(out.shape() == ql.shape());
      (out * shard(weight)).sum().backward();

      testing::require_close(out, shard(reference.detach()), 1e-5);
      testing::require_close(ql.grad(), shard(qf.grad()), 1e-5);
      testing::require_close(kl.grad(), shard(kf.grad()), 1e-5);
      testing::require_close(vl.grad(), shard(vf.grad()), 1e-5);
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
