// The fused CPU scaled_dot_product_attention against the composed path (matmul, softmax, where,
// dropout, matmul) computed in f64: outputs and gradients across the edge cases (T not a multiple of
// the 64-row tile, T = 1, Tq != Tk with and without the causal mask, B and H > 1, D = 24 / 64 /
// 128, strided views), a row that sees no key, a finite-difference gradcheck, the in-kernel
// Philox dropout (its mask rebuilt here from base/philox.h), determinism, the allocator's peak
// bytes, which must stay far below one [H, T, T] score matrix, and CausalSelfAttention (which runs
// the fused path on the CPU) against its steps written out with the composed path.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "base/philox.h"
#include "multigrad.h"
#include "tests/gradcheck.h"

using namespace mg;

namespace {

// The error relative to the reference's scale, at least 1e-2 (an all-zero reference).
double rel_diff(const Tensor& a, const Tensor& b) { return testing::relative_error(a, b, 1e-2); }

bool all_finite(const Tensor& t) {
  for (double x : t.to_vector<double>())
    if (!std::isfinite(x)) return false;
  return true;
}

using testing::leaf;

struct Case {
  int64_t B, H, Tq, Tk, D;
  bool causal;
};

// Runs fused (f32) and composed (f64) on the same values; compares the output and the gradients
// of sum(out * w) for a random w.
void check_against_composed(const Case& c, uint64_t seed) {
  INFO("B=" << c.B << " H=" << c.H << " Tq=" << c.Tq << " Tk=" << c.Tk << " D=" << c.D
            << " causal=" << c.causal);
  manual_seed(seed);
  const Tensor q0 = randn({c.B, c.H, c.Tq, c.D}), k0 = randn({c.B, c.H, c.Tk, c.D}),
               v0 = randn({c.B, c.H, c.Tk, c.D}), w = randn({c.B, c.H, c.Tq, c.D});
  Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
  Tensor qr = leaf(q0.to(DType::f64)), kr = leaf(k0.to(DType::f64)), vr = leaf(v0.to(DType::f64));
  const AttentionOptions opt{c.causal, 0.0, std::nullopt};

  Tensor out = nn::scaled_dot_product_attention(q, k, v, opt);
  Tensor ref = scaled_dot_product_attention_composed(qr, kr, vr, opt);
  REQUIRE(out.dtype() == DType::f32);
  REQUIRE(out.shape() == Shape{c.B, c.H, c.Tq, c.D});
  CHECK(rel_diff(out, ref) < 1e-5);

  sum(mul(out, w)).backward();
  sum(mul(ref, w.to(DType::f64))).backward();
  CHECK(rel_diff(v.grad(), vr.grad()) < 1e-5);
  if (c.Tk == 1 || (c.causal && c.Tq == 1)) {
    // Every query sees exactly one key: P = 1 whatever q and k are, so their exact gradients are 0.
    // The fused path's dS = P (dP - delta) subtracts two f32 sums of size |dO| |v| sqrt(D) that
    // agree to rounding: compare absolutely, at the inputs' scale (randn, O(1)).
    CHECK(max(abs(qr.grad())).item<double>() == 0.0);
    CHECK(max(abs(q.grad())).item<double>() < 1e-5);
    CHECK(max(abs(k.grad())).item<double>() < 1e-5);
  } else {
    CHECK(rel_diff(q.grad(), qr.grad()) < 1e-5);
    CHECK(rel_diff(k.grad(), kr.grad()) < 1e-5);
  }
}

// The keep decision of score (b, h, i, j) the kernel must make, from Philox directly.
Tensor reference_keep_mask(int64_t B, int64_t H, int64_t Tq, int64_t Tk, double p, GeneratorState call) {
  std::vector<double> mask(static_cast<size_t>(B * H * Tq * Tk));
  for (size_t e = 0; e < mask.size(); ++e)
    mask[e] = philox_dropout_uniform(call.seed, e, call.offset) >= static_cast<float>(p) ? 1.0 : 0.0;
  return tensor<double>(mask, {B, H, Tq, Tk}, TensorOptions{DType::f64});
}

}  // namespace

TEST_CASE("fused attention equals the composed path, forward and backward", "[nn][attention]") {
  const std::vector<Case> cases = {
      {1, 1, 1, 1, 64, false},     {1, 1, 1, 1, 64, true},        // T = 1
      {2, 3, 100, 100, 24, false}, {2, 3, 100, 100, 24, true},    // T not a multiple of 64, odd D
      {1, 2, 70, 130, 64, false},  {1, 2, 70, 130, 64, true},     // Tq < Tk
      {1, 2, 130, 70, 64, false},  {1, 2, 130, 70, 64, true},     // Tq > Tk
      {2, 2, 65, 65, 128, true},   {1, 1, 129, 200, 128, false},  // D = 128
      {1, 1, 1, 77, 64, true},     {1, 1, 77, 1, 24, true},       // one query, one key
  };
  uint64_t seed = 11;
  for (const Case& c : cases) check_against_composed(c, seed++);
}

TEST_CASE("fused attention reads strided views (the head split of [B, T, H, D])", "[nn][attention]") {
  manual_seed(3);
  const int64_t B = 2, T = 90, H = 3, D = 32;
  for (bool causal : {false, true}) {
    INFO("causal=" << causal);
    Tensor x0 = randn({B, T, 3 * H, D}), w = randn({B, H, T, D});
    Tensor x = leaf(x0), xr = leaf(x0.to(DType::f64));
    auto heads = [&](const Tensor& t, int64_t part) {  // [B, T, H, D] slice -> [B, H, T, D] view
      return t.narrow(2, part * H, H).transpose(1, 2);
    };
    Tensor q = heads(x, 0), k = heads(x, 1), v = heads(x, 2);
    REQUIRE_FALSE(q.is_contiguous());
    const AttentionOptions opt{causal, 0.0, 0.3};
    Tensor out = scaled_dot_product_attention(q, k, v, opt);
    Tensor ref = scaled_dot_product_attention_composed(heads(xr, 0), heads(xr, 1), heads(xr, 2), opt);
    CHECK(rel_diff(out, ref) < 1e-5);
    // The upstream gradient arrives strided too, as it does from CausalSelfAttention's transpose.
    Tensor wt = w.transpose(1, 2).contiguous().transpose(1, 2);
    sum(mul(out, wt)).backward();
    sum(mul(ref, wt.to(DType::f64))).backward();
    CHECK(rel_diff(x.grad(), xr.grad()) < 1e-5);
  }
}

TEST_CASE("fused attention: a row that sees no key gives zeros and no NaN", "[nn][attention]") {
  manual_seed(5);
  for (bool causal : {false, true}) {
    Tensor q = leaf(randn({1, 2, 70, 16})), k = leaf(randn({1, 2, 0, 16})), v = leaf(randn({1, 2, 0, 16}));
    Tensor out = scaled_dot_product_attention(q, k, v, {causal, 0.0, std::nullopt});
    REQUIRE(out.shape() == Shape{1, 2, 70, 16});
    CHECK(all_finite(out));
    CHECK(max(abs(out)).item<double>() == 0.0);
    sum(mul(out, randn(out.shape()))).backward();
    REQUIRE(q.grad().defined());
    CHECK(all_finite(q.grad()));
    CHECK(max(abs(q.grad())).item<double>() == 0.0);
  }
}

TEST_CASE("fused attention passes a finite-difference gradcheck in f64", "[nn][attention][gradcheck]") {
  for (bool causal : {false, true}) {
    for (double p : {0.0, 0.4}) {
      INFO("causal=" << causal << " dropout_p=" << p);
      std::vector<Tensor> inputs = {testing::grid_input({1, 2, 3, 4}, -1.0, 0.09, 1),
                                    testing::grid_input({1, 2, 5, 4}, -0.8, 0.05, 2),
                                    testing::grid_input({1, 2, 5, 4}, -1.2, 0.07, 3)};
      auto f = [&](const std::vector<Tensor>& x) {
        set_generator_state({1234, 7});  // the same dropout mask on every evaluation
        return scaled_dot_product_attention(x[0], x[1], x[2], {causal, p, std::nullopt});
      };
      MG_REQUIRE_GRADCHECK(testing::gradcheck(f, inputs));
    }
  }
}

TEST_CASE("fused attention's dropout: a pure function of seed and offset, mg::dropout's mask",
          "[nn][attention][dropout]") {
  manual_seed(21);
  const int64_t B = 2, H = 3, Tq = 75, Tk = 90, D = 24;
  const double p = 0.25;
  const Tensor q0 = randn({B, H, Tq, D}), k0 = randn({B, H, Tk, D}), v0 = randn({B, H, Tk, D}),
               w = randn({B, H, Tq, D});
  const AttentionOptions opt{true, p, std::nullopt};

  const GeneratorState state{99, 40};
  set_generator_state(state);
  Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
  Tensor out = scaled_dot_product_attention(q, k, v, opt);
  CHECK(generator_state().offset == state.offset + 1);  // one random call, as mg::dropout
  set_generator_state(state);
  Tensor again = scaled_dot_product_attention(q0, k0, v0, opt);
  CHECK(rel_diff(again, out) == 0.0);
  set_generator_state({state.seed, state.offset + 1});
  Tensor other = scaled_dot_product_attention(q0, k0, v0, opt);
  CHECK(rel_diff(other, out) > 1e-2);

  // Reference: softmax, times the explicit Philox mask / (1 - p), times v, in f64.
  const Tensor keep = reference_keep_mask(B, H, Tq, Tk, p, state);
  Tensor qr = leaf(q0.to(DType::f64)), kr = leaf(k0.to(DType::f64)), vr = leaf(v0.to(DType::f64));
  const TensorOptions idx{DType::i64};
  Tensor s = mul(matmul(qr, kr.transpose(-2, -1)), 1.0 / std::sqrt(static_cast<double>(D)));
  s = where(ge(arange(Tq, idx).unsqueeze(1), arange(Tk, idx).unsqueeze(0)), s,
            full({}, -INFINITY, TensorOptions{DType::f64}));
  Tensor ref = matmul(mul(mul(softmax(s, -1), keep), 1.0 / (1.0 - p)), vr);
  CHECK(rel_diff(out, ref) < 1e-5);
  sum(mul(out, w)).backward();
  sum(mul(ref, w.to(DType::f64))).backward();
  CHECK(rel_diff(q.grad(), qr.grad()) < 1e-5);
  CHECK(rel_diff(k.grad(), kr.grad()) < 1e-5);
  CHECK(rel_diff(v.grad(), vr.grad()) < 1e-5);

  // The composed path (mg::dropout on the probabilities) drops the same elements for the same state.
  set_generator_state(state);
  Tensor composed =
      scaled_dot_product_attention_composed(q0.to(DType::f64), k0.to(DType::f64), v0.to(DType::f64), opt);
  CHECK(rel_diff(out, composed) < 1e-5);
}

TEST_CASE("fused attention's dropout keeps about 1 - p, exactly where Philox says",
          "[nn][attention][dropout]") {
  // q = 0 makes every probability 1 / Tk, and v = I (D = Tk) makes out[i, j] = keep_ij / ((1 - p) Tk).
  const int64_t H = 2, Tq = 512, Tk = 128;
  const double p = 0.3;
  Tensor q = zeros({1, H, Tq, Tk});
  std::vector<float> identity(static_cast<size_t>(H * Tk * Tk), 0.0f);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < Tk; ++j) identity[static_cast<size_t>((h * Tk + j) * Tk + j)] = 1.0f;
  Tensor v = tensor<float>(identity, {1, H, Tk, Tk});
  const GeneratorState state{7, 1000};
  set_generator_state(state);
  const std::vector<double> out =
      scaled_dot_product_attention(q, q.narrow(2, 0, Tk), v, {false, p, std::nullopt}).to_vector<double>();
  const std::vector<double> keep = reference_keep_mask(1, H, Tq, Tk, p, state).to_vector<double>();
  int64_t kept = 0, mismatches = 0;
  for (size_t e = 0; e < out.size(); ++e) {
    const bool k = out[e] != 0.0;
    kept += k;
    mismatches += k != (keep[e] != 0.0);
    if (k) REQUIRE(std::abs(out[e] - 1.0 / ((1.0 - p) * Tk)) < 1e-6);
  }
  CHECK(mismatches == 0);
  const double fraction = static_cast<double>(kept) / static_cast<double>(out.size());
  CHECK(std::abs(fraction - (1.0 - p)) < 0.01);  // 131072 draws: the standard deviation is 0.0013
}

TEST_CASE("fused attention is deterministic and accepts halves", "[nn][attention]") {
  manual_seed(8);
  const Tensor q0 = randn({2, 3, 150, 64}), k0 = randn({2, 3, 150, 64}), v0 = randn({2, 3, 150, 64}),
               w = randn({2, 3, 150, 64});
  std::vector<std::vector<float>> grads[2];
  for (int run = 0; run < 2; ++run) {
    Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
    set_generator_state({5, 6});  // the same dropout mask both runs
    sum(mul(scaled_dot_product_attention(q, k, v, {true, 0.1, std::nullopt}), w)).backward();
    for (const Tensor* t : {&q, &k, &v}) grads[run].push_back(t->grad().to_vector<float>());
  }
  CHECK(grads[0] == grads[1]);  // bit for bit, with the threads the machine has

  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Tensor q = q0.to(dt), k = k0.to(dt), v = v0.to(dt);
    Tensor out = scaled_dot_product_attention(q, k, v, {true, 0.0, std::nullopt});
    REQUIRE(out.dtype() == dt);
    Tensor ref = scaled_dot_product_attention_composed(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64),
                                                       {true, 0.0, std::nullopt});
    CHECK(rel_diff(out, ref) < (dt == DType::bf16 ? 1e-2 : 2e-3));
  }
}

TEST_CASE("fused attention never holds a [T, T] score matrix", "[nn][attention][memory]") {
  manual_seed(13);
  const int64_t B = 1, H = 2, T = 2048, D = 64;
  const int64_t scores_bytes = H * T * T * 4;  // one [H, T, T] f32: 32 MiB
  const Tensor q0 = randn({B, H, T, D}), k0 = randn({B, H, T, D}), v0 = randn({B, H, T, D}),
               w = randn({B, H, T, D});
  auto peak_of = [&](bool fused) {
    Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
    const int64_t before = cpu_device_memory(0).live_bytes;
    reset_cpu_device_peak(0);
    {
      const AttentionOptions opt{false, 0.0, std::nullopt};
      Tensor out = fused ? scaled_dot_product_attention(q, k, v, opt)
                         : scaled_dot_product_attention_composed(q, k, v, opt);
      sum(mul(out, w)).backward();
    }
    return cpu_device_memory(0).peak_bytes - before;
  };
  const int64_t fused = peak_of(true);
  INFO("fused peak " << fused << " bytes, one [H, T, T] f32 " << scores_bytes);
  // The measurement sees the composed path's score matrices, so it would see the fused path's.
  CHECK(peak_of(false) > scores_bytes);
  // Fused: out, LSE, the gradients, the product out * w: about 5 MiB of [H, T, D] tensors.
  CHECK(fused < scores_bytes / 4);
}

TEST_CASE("CausalSelfAttention runs the fused path on the CPU, dropout masks unchanged", "[nn][attention]") {
  // The module (fused causal_attention) against its steps written out with the composed path, in
  // training mode with dropout (same generator state: same masks) and in eval mode.
  const int64_t B = 2, T = 70, C = 48, H = 4, D = C / H;
  manual_seed(17);
  nn::CausalSelfAttention attn(C, H, 0.2);
  const Tensor x = randn({B, T, C}), w = randn({B, T, C});
  for (bool training : {true, false}) {
    INFO("training=" << training);
    attn.train(training);
    const GeneratorState state{31, 5};
    set_generator_state(state);
    for (Tensor& prm : attn.parameters()) prm.set_grad(Tensor());
    Tensor out = attn(x);
    REQUIRE(generator_state().offset == state.offset + (training ? 2 : 0));  // attn and resid dropout
    sum(mul(out, w)).backward();
    std::vector<Tensor> fused_grads;
    for (Tensor& prm : attn.parameters()) fused_grads.push_back(prm.grad().detach().clone());

    set_generator_state(state);
    for (Tensor& prm : attn.parameters()) prm.set_grad(Tensor());
    std::vector<Tensor> qkv = split(attn.c_attn(x), C, 2);
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, H, D}).transpose(1, 2); };
    Tensor y = scaled_dot_product_attention_composed(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                                     {true, training ? 0.2 : 0.0, std::nullopt});
    Tensor ref = dropout(attn.c_proj(y.transpose(1, 2).reshape({B, T, C})), 0.2, training);
    CHECK(rel_diff(out, ref) < 1e-5);
    sum(mul(ref, w)).backward();
    const std::vector<Tensor> params = attn.parameters();
    for (size_t i = 0; i < params.size(); ++i) CHECK(rel_diff(fused_grads[i], params[i].grad()) < 1e-5);
  }
}
