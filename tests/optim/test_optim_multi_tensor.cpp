// The multi-tensor optimizer path on the CPU: kernels/cpu/optim.h's *_step_multi
// against one *_step call per tensor (each tensor with its own first_step / step
// count), and Optimizer::step's split of a group into (device, dtype) runs: a
// group mixing f32 and f64 parameters, one of which starts late, must end
// exactly where one optimizer per parameter does. (The CUDA twin is compared
// with these in tests/gpu/test_cuda_optim_multi.cpp.)
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "kernels/cpu/optim.h"
#include "multigrad.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace mg {
namespace {

// Deterministic, distinct values for buffer `which` (no two buffers alike): n
// elements for the kernel plus one guard element past them, which no kernel may
// write (it also gives a 0-element tensor a real address, as a Storage does).
std::vector<float> values(int64_t n, int which, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n + 1));
  for (int64_t i = 0; i <= n; ++i) v[i] = scale * (0.37f * float((i * 7 + which * 13) % 23) - 3.9f);
  return v;
}

std::vector<float> squares(std::vector<float> v) {
  for (float& x : v) x = x * x;
  return v;
}

const std::vector<int64_t> kSizes = {0, 1, 7, 1000};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST_CASE("cpu sgd_step_multi equals one sgd_step per tensor", "[optim][multi_tensor]") {
  kernels::SgdHyper h{0.1, 0.9, 0.0, 0.01, true};
  // Per tensor: p, g, buf for the multi call and copies for the per-tensor calls.
  std::vector<std::vector<float>> p, g, buf, p_ref, buf_ref;
  for (size_t t = 0; t < kSizes.size(); ++t) {
    p.push_back(values(kSizes[t], int(t)));
    g.push_back(values(kSizes[t], int(t) + 10, 0.5f));
    buf.push_back(values(kSizes[t], int(t) + 20));
  }
  p_ref = p;
  buf_ref = buf;
  std::vector<kernels::SgdTensor> list;
  for (size_t t = 0; t < kSizes.size(); ++t) {
    const bool first_step = t % 2 == 0;  // tensors 0 and 2 start their momentum now
    list.push_back({p[t].data(), g[t].data(), buf[t].data(), kSizes[t], first_step});
    kernels::cpu::sgd_step(DType::f32, kSizes[t], p_ref[t].data(), g[t].data(), buf_ref[t].data(), first_step,
                           h);
  }
  kernels::cpu::sgd_step_multi(DType::f32, list, h);
  for (size_t t = 0; t < kSizes.size(); ++t) {
    INFO("tensor " << t << " of " << kSizes[t] << " elements");
    CHECK(same_bits(p[t], p_ref[t]));
    CHECK(same_bits(buf[t], buf_ref[t]));
  }
  CHECK(p[3] != values(1000, 3));                // the step changed something
  CHECK(p[3].back() == values(1000, 3).back());  // ... but not the guard
}

TEST_CASE("cpu adam(w)_step_multi equals one step per tensor with its own step count",
          "[optim][multi_tensor]") {
  for (bool decoupled : {false, true}) {
    kernels::AdamHyper h;
    h.lr = 0.01;
    h.weight_decay = 0.1;
    h.amsgrad = true;
    h.step = 999;  // must be ignored: each tensor has its own
    std::vector<std::vector<float>> p, g, m, v, vmax;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      p.push_back(values(kSizes[t], int(t)));
      g.push_back(values(kSizes[t], int(t) + 10, 0.5f));
      m.push_back(values(kSizes[t], int(t) + 20, 0.1f));
      v.push_back(squares(values(kSizes[t], int(t) + 30, 0.1f)));  // second moments are >= 0
      vmax.push_back(squares(values(kSizes[t], int(t) + 40, 0.1f)));
    }
    auto p_ref = p, m_ref = m, v_ref = v, vmax_ref = vmax;
    std::vector<kernels::AdamTensor> list;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      const int64_t step = int64_t(t) + 1;
      list.push_back({p[t].data(), g[t].data(), m[t].data(), v[t].data(), vmax[t].data(), kSizes[t], step});
      kernels::AdamHyper ht = h;
      ht.step = step;
      if (decoupled) {
        kernels::cpu::adamw_step(DType::f32, kSizes[t], p_ref[t].data(), g[t].data(), m_ref[t].data(),
                                 v_ref[t].data(), vmax_ref[t].data(), ht);
      } else {
        kernels::cpu::adam_step(DType::f32, kSizes[t], p_ref[t].data(), g[t].data(), m_ref[t].data(),
                                v_ref[t].data(), vmax_ref[t].data(), ht);
      }
    }
    if (decoupled) {
      kernels::cpu::adamw_step_multi(DType::f32, list, h);
    } else {
      kernels::cpu::adam_step_multi(DType::f32, list, h);
    }
    for (size_t t = 0; t < kSizes.size(); ++t) {
      INFO((decoupled ? "AdamW" : "Adam") << ", tensor " << t << " of " << kSizes[t] << " elements");
      CHECK(same_bits(p[t], p_ref[t]));
      CHECK(same_bits(m[t], m_ref[t]));
      CHECK(same_bits(v[t], v_ref[t]));
      CHECK(same_bits(vmax[t], vmax_ref[t]));
    }
  }
}

// Three steps of `make({a, b, c})` against three optimizers `make({a'})`, `make({b'})`,
// `make({c'})` on copies; c gets no gradient in the first step (so its step count lags).
template <class Make>
void check_mixed_group(Make make) {
  manual_seed(7);
  std::vector<Tensor> params = {randn({5}, TensorOptions{DType::f32}), randn({3}, TensorOptions{DType::f64}),
                                randn({1}, TensorOptions{DType::f32}),
                                randn({4, 2}, TensorOptions{DType::f64})};
  std::vector<Tensor> copies;
  for (Tensor& p : params) {
    p.set_requires_grad(true);
    copies.push_back(p.detach().clone().set_requires_grad(true));
  }
  auto together = make(params);
  std::vector<decltype(make(params))> alone;
  for (Tensor& c : copies) alone.push_back(make({c}));
  for (int step = 0; step < 3; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      if (i == 2 && step == 0) continue;
      const Tensor g = randn(params[i].shape(), TensorOptions{params[i].dtype()});
      params[i].set_grad(g);
      copies[i].set_grad(g.clone());
    }
    together->step();
    for (auto& opt : alone) opt->step();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    INFO("parameter " << i << " (" << params[i].dtype() << ")");
    CHECK(params[i].to_vector<double>() == copies[i].to_vector<double>());
  }
}

TEST_CASE("a group mixing f32 and f64 parameters steps as one optimizer per parameter",
          "[optim][multi_tensor]") {
  SECTION("SGD, nesterov momentum and weight decay") {
    check_mixed_group([](std::vector<Tensor> ps) {
      optim::SGDOptions sgd;
      sgd.lr = 0.1;
      sgd.momentum = 0.9;
      sgd.weight_decay = 0.01;
      sgd.nesterov = true;
      return std::make_unique<optim::SGD>(ps, sgd);
    });
  }
  SECTION("Adam with weight decay") {
    check_mixed_group([](std::vector<Tensor> ps) {
      optim::AdamOptions adam;
      adam.lr = 0.01;
      adam.weight_decay = 0.1;
      return std::make_unique<optim::Adam>(ps, adam);
    });
  }
  SECTION("AdamW with amsgrad") {
    check_mixed_group([](std::vector<Tensor> ps) {
      optim::AdamWOptions adamw;
      adamw.lr = 0.01;
      adamw.weight_decay = 0.1;
      adamw.amsgrad = true;
      return std::make_unique<optim::AdamW>(ps, adamw);
    });
  }
}

}  // namespace
}  // namespace mg
