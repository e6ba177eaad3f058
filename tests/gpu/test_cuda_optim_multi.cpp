// The multi-tensor optimizer kernels (kernels/cuda/optim.cu, *_step_multi):
// one launch over a list of tensors of odd sizes (0 and 1 element, a chunk
// exactly, a chunk plus one, several chunks) must give bit for bit what one
// per-tensor launch each gives, and the CPU's result within rounding, over
// several steps with per-tensor first_step / step counts. The 16-byte pack path
// (operands equally far from a 16-byte boundary: a scalar head, packs, a scalar
// tail) must give bit for bit what the element path gives (operands at different
// distances). Then Optimizer::step on CUDA parameters (which takes this path)
// against the same optimizer on the CPU. Runs on a GPU or under the emulator
// (exit 77 otherwise).
#include <catch2/catch.hpp>

#if defined(MG_HAS_CUDA)

#include <vector>

#include "core/cuda_scratch.h"
#include "core/cuda_stream.h"
#include "kernels/cpu/optim.h"
#include "kernels/cuda/kernels.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/gpu/gpu_compare.h"

namespace mg {
namespace {
using namespace gpu_test;
using Catch::Matchers::Contains;

// Chunks (elements per block) are 1024 to 16384, the largest that still gives ~1024 blocks: 1024
// for this list, so it has a chunk exactly, a chunk plus one and several chunks of each size.
const std::vector<int64_t> kSizes = {0, 1, 7, 1024, 1025, 16384, 16385, 40000};

template <class F>
void on_gpu(F&& gpu_call) {
  cuda::DeviceGuard guard(0);
  gpu_call();
  cuda::synchronize(cuda::current_stream(0));
}

// One copy of every buffer a step touches, on one device.
struct Buffers {
  std::vector<Tensor> p, buf, m, v, vmax;
};

Buffers make_buffers(DType dt, Device device) {
  manual_seed(21);  // the same values on every call
  Buffers b;
  for (int64_t n : kSizes) {
    b.p.push_back(random_cpu({n}, dt).to(device));
    b.buf.push_back(random_cpu({n}, dt).to(device));
    b.m.push_back(random_cpu({n}, dt, 0.1).to(device));
    b.v.push_back(square(random_cpu({n}, dt, 0.1)).to(device));
    b.vmax.push_back(square(random_cpu({n}, dt, 0.1)).to(device));
  }
  return b;
}

enum class Rule { Sgd, Adam, AdamW };

// Step `step` (1, 2, 3) of `rule` on every tensor of `b`: per tensor (one launch
// each) or multi (one launch), on the device of `b`.
void take_step_over(const std::vector<int64_t>& sizes, Rule rule, DType dt, Buffers& b,
                    const std::vector<Tensor>& grads, int step, bool multi, bool on_cuda) {
  kernels::SgdHyper sgd{0.1, 0.9, 0.0, 0.01, true};
  kernels::AdamHyper adam;
  adam.lr = 1e-2;
  adam.weight_decay = 0.05;
  adam.amsgrad = rule == Rule::AdamW;
  std::vector<kernels::SgdTensor> sgd_list;
  std::vector<kernels::AdamTensor> adam_list;
  for (size_t t = 0; t < sizes.size(); ++t) {
    // Tensor t is t % 2 steps behind: the per-tensor state a group can have.
    const int64_t own_step = std::max<int64_t>(1, step - int64_t(t % 2));
    sgd_list.push_back(
        {b.p[t].data_ptr(), grads[t].data_ptr(), b.buf[t].data_ptr(), sizes[t], own_step == 1});
    adam_list.push_back({b.p[t].data_ptr(), grads[t].data_ptr(), b.m[t].data_ptr(), b.v[t].data_ptr(),
                         b.vmax[t].data_ptr(), sizes[t], own_step});
  }
  auto run = [&](auto sgd_one, auto adam_one, auto adamw_one, auto sgd_many, auto adam_many,
                 auto adamw_many) {
    if (multi) {
      if (rule == Rule::Sgd) sgd_many(dt, sgd_list, sgd);
      if (rule == Rule::Adam) adam_many(dt, adam_list, adam);
      if (rule == Rule::AdamW) adamw_many(dt, adam_list, adam);
      return;
    }
    for (size_t t = 0; t < sizes.size(); ++t) {
      const auto& s = sgd_list[t];
      const auto& a = adam_list[t];
      kernels::AdamHyper h = adam;
      h.step = a.step;
      if (rule == Rule::Sgd) sgd_one(dt, s.n, s.param, s.grad, s.momentum_buffer, s.first_step, sgd);
      if (rule == Rule::Adam)
        adam_one(dt, a.n, a.param, a.grad, a.exp_avg, a.exp_avg_sq, a.max_exp_avg_sq, h);
      if (rule == Rule::AdamW)
        adamw_one(dt, a.n, a.param, a.grad, a.exp_avg, a.exp_avg_sq, a.max_exp_avg_sq, h);
    }
  };
  if (on_cuda) {
    on_gpu([&] {
      // The CUDA kernels take the stream (and the multi-tensor ones scratch) first.
      const cudaStream_t stream = mg::cuda::current_kernel_stream();
      kernels::cuda::ScratchAllocator& scratch = mg::cuda::current_scratch();
      auto with_stream = [&](auto fn) { return [=](auto&&... args) { fn(stream, args...); }; };
      auto with_scratch = [&](auto fn) {
        return [=, &scratch](auto&&... args) { fn(stream, scratch, args...); };
      };
      run(with_stream(kernels::cuda::sgd_step), with_stream(kernels::cuda::adam_step),
          with_stream(kernels::cuda::adamw_step), with_scratch(kernels::cuda::sgd_step_multi),
          with_scratch(kernels::cuda::adam_step_multi), with_scratch(kernels::cuda::adamw_step_multi));
    });
  } else {
    run(kernels::cpu::sgd_step, kernels::cpu::adam_step, kernels::cpu::adamw_step,
        kernels::cpu::sgd_step_multi, kernels::cpu::adam_step_multi, kernels::cpu::adamw_step_multi);
  }
}

void take_step(Rule rule, DType dt, Buffers& b, const std::vector<Tensor>& grads, int step, bool multi,
               bool on_cuda) {
  take_step_over(kSizes, rule, dt, b, grads, step, multi, on_cuda);
}

TEST_CASE("cuda multi-tensor optimizer steps equal the per-tensor launches bit for bit and the CPU",
          "[gpu][optim][multi_tensor]") {
  for (DType dt : {DType::f32, DType::f64}) {
    for (Rule rule : {Rule::Sgd, Rule::Adam, Rule::AdamW}) {
      INFO("dtype " << dt << ", rule " << int(rule) << " (0 SGD nesterov+wd, 1 Adam+L2, 2 AdamW amsgrad)");
      Buffers cpu = make_buffers(dt, Device::cpu()), one = make_buffers(dt, gpu()),
              many = make_buffers(dt, gpu());
      const Buffers start = make_buffers(dt, Device::cpu());
      for (int step = 1; step <= 3; ++step) {
        std::vector<Tensor> g_cpu, g_gpu;
        for (int64_t n : kSizes) {
          g_cpu.push_back(random_cpu({n}, dt));
          g_gpu.push_back(g_cpu.back().to(gpu()));
        }
        take_step(rule, dt, cpu, g_cpu, step, /*multi=*/true, /*on_cuda=*/false);
        take_step(rule, dt, one, g_gpu, step, /*multi=*/false, /*on_cuda=*/true);
        take_step(rule, dt, many, g_gpu, step, /*multi=*/true, /*on_cuda=*/true);
      }
      const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
      for (size_t t = 0; t < kSizes.size(); ++t) {
        INFO("tensor " << t << " of " << kSizes[t] << " elements");
        // Bit for bit: f32 and f64 values are exact in double.
        CHECK(many.p[t].to_vector<double>() == one.p[t].to_vector<double>());
        CHECK(many.buf[t].to_vector<double>() == one.buf[t].to_vector<double>());
        CHECK(many.m[t].to_vector<double>() == one.m[t].to_vector<double>());
        CHECK(many.v[t].to_vector<double>() == one.v[t].to_vector<double>());
        CHECK(many.vmax[t].to_vector<double>() == one.vmax[t].to_vector<double>());
        MG_REQUIRE_CLOSE(many.p[t], cpu.p[t], tol);
        MG_REQUIRE_CLOSE(many.buf[t], cpu.buf[t], tol);
        MG_REQUIRE_CLOSE(many.m[t], cpu.m[t], tol);
        MG_REQUIRE_CLOSE(many.v[t], cpu.v[t], tol);
        MG_REQUIRE_CLOSE(many.vmax[t], cpu.vmax[t], tol);
        // Every element was updated (an element the launch skipped keeps its start value), unless
        // the CPU's update left it unchanged too (an update below half an ulp of p: it happens).
        if (kSizes[t] > 0) {
          const std::vector<double> before = start.p[t].to_vector<double>(),
                                    after = many.p[t].to_vector<double>(), ref = cpu.p[t].to_vector<double>();
          for (size_t i = 0; i < before.size(); ++i)
            if (before[i] == after[i] && ref[i] != before[i]) FAIL("element " << i << " was not updated");
        }
      }
    }
  }
}

// Values of every operand of one tensor, on the CPU (the same on every call for the same seed).
struct Operands {
  Tensor p, g, buf, m, v, vmax;
};
Operands operand_values(DType dt, int64_t n, uint64_t seed) {
  manual_seed(seed);
  return {random_cpu({n}, dt),
          random_cpu({n}, dt),
          random_cpu({n}, dt),
          random_cpu({n}, dt, 0.1),
          square(random_cpu({n}, dt, 0.1)),
          square(random_cpu({n}, dt, 0.1))};
}

// `values` copied into a GPU buffer `offset` elements past a 16-byte boundary (a view into a
// larger allocation).
Tensor at_offset(const Tensor& values, int64_t offset) {
  Tensor base = zeros({values.numel() + 4}, TensorOptions{values.dtype(), gpu()});
  REQUIRE(reinterpret_cast<uintptr_t>(base.data_ptr()) % 16 == 0);
  Tensor view = base.narrow(0, offset, values.numel());
  view.copy_(values);
  return view;
}

TEST_CASE("cuda optimizer steps: the 16-byte pack path equals the element path bit for bit",
          "[gpu][optim][multi_tensor][packs]") {
  // Heads of 0..V-1 elements, tails of 0..V-1, tensors shorter than a pack, several chunks.
  const std::vector<int64_t> sizes = {1, 2, 3, 5, 6, 1023, 1025, 3001};
  for (DType dt : {DType::f32, DType::f64}) {
    const int64_t V = 16 / int64_t(dtype_size(dt));
    for (Rule rule : {Rule::Sgd, Rule::Adam, Rule::AdamW}) {
      for (bool multi : {false, true}) {
        INFO("dtype " << dt << ", rule " << int(rule) << " (0 SGD nesterov+wd, 1 Adam+L2, 2 AdamW amsgrad)"
                      << (multi ? ", one launch" : ", a launch per tensor"));
        // together: every operand of tensor t at t % V elements past a 16-byte boundary (the pack
        // path: a scalar head of (V - t % V) % V elements); apart: p there and every other operand
        // one element further (no packs: the element path).
        auto layout = [&](bool together) {
          Buffers b;
          for (size_t t = 0; t < sizes.size(); ++t) {
            const Operands o = operand_values(dt, sizes[t], 100 + t);
            const int64_t at = int64_t(t) % V, other = together ? at : (at + 1) % V;
            b.p.push_back(at_offset(o.p, at));
            b.buf.push_back(at_offset(o.buf, other));
            b.m.push_back(at_offset(o.m, other));
            b.v.push_back(at_offset(o.v, other));
            b.vmax.push_back(at_offset(o.vmax, other));
          }
          return b;
        };
        Buffers together = layout(true), apart = layout(false), cpu;
        for (size_t t = 0; t < sizes.size(); ++t) {
          const Operands o = operand_values(dt, sizes[t], 100 + t);
          cpu.p.push_back(o.p), cpu.buf.push_back(o.buf), cpu.m.push_back(o.m), cpu.v.push_back(o.v),
              cpu.vmax.push_back(o.vmax);
        }
        for (int step = 1; step <= 3; ++step) {
          std::vector<Tensor> g_cpu, g_together, g_apart;
          for (size_t t = 0; t < sizes.size(); ++t) {
            manual_seed(1000 * step + t);
            g_cpu.push_back(random_cpu({sizes[t]}, dt));
            const int64_t at = int64_t(t) % V;
            g_together.push_back(at_offset(g_cpu.back(), at));
            g_apart.push_back(at_offset(g_cpu.back(), (at + 1) % V));
          }
          take_step_over(sizes, rule, dt, cpu, g_cpu, step, multi, /*on_cuda=*/false);
          take_step_over(sizes, rule, dt, together, g_together, step, multi, /*on_cuda=*/true);
          take_step_over(sizes, rule, dt, apart, g_apart, step, multi, /*on_cuda=*/true);
        }
        const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
        for (size_t t = 0; t < sizes.size(); ++t) {
          INFO("tensor " << t << " of " << sizes[t] << " elements, p " << int64_t(t) % V
                         << " elements past a 16-byte boundary");
          CHECK(together.p[t].to_vector<double>() == apart.p[t].to_vector<double>());
          CHECK(together.buf[t].to_vector<double>() == apart.buf[t].to_vector<double>());
          CHECK(together.m[t].to_vector<double>() == apart.m[t].to_vector<double>());
          CHECK(together.v[t].to_vector<double>() == apart.v[t].to_vector<double>());
          CHECK(together.vmax[t].to_vector<double>() == apart.vmax[t].to_vector<double>());
          MG_REQUIRE_CLOSE(together.p[t], cpu.p[t], tol);
          MG_REQUIRE_CLOSE(together.buf[t], cpu.buf[t], tol);
          MG_REQUIRE_CLOSE(together.m[t], cpu.m[t], tol);
          MG_REQUIRE_CLOSE(together.v[t], cpu.v[t], tol);
          MG_REQUIRE_CLOSE(together.vmax[t], cpu.vmax[t], tol);
        }
      }
    }
  }
}

TEST_CASE("cuda multi-tensor steps refuse 16-bit parameters and missing state",
          "[gpu][optim][multi_tensor]") {
  Tensor p = zeros({3}, TensorOptions{DType::bf16, gpu()}), g = zeros_like(p);
  cuda::DeviceGuard guard(0);
  CHECK_THROWS_WITH(
      kernels::cuda::sgd_step_multi(mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(),
                                    DType::bf16, {{p.data_ptr(), g.data_ptr(), nullptr, 3, false}}, {}),
      Contains("bf16") && Contains("f32 master weights"));
  kernels::AdamHyper h;
  h.amsgrad = true;
  CHECK_THROWS_WITH(kernels::cuda::adam_step_multi(
                        mg::cuda::current_kernel_stream(), mg::cuda::current_scratch(), DType::f32,
                        {{p.data_ptr(), g.data_ptr(), p.data_ptr(), p.data_ptr(), nullptr, 3, 1}}, h),
                    Contains("amsgrad needs a max_exp_avg_sq buffer") && Contains("tensor 0"));
}

TEST_CASE("Optimizer::step on CUDA parameters matches the CPU", "[gpu][optim][multi_tensor]") {
  for (int which = 0; which < 3; ++which) {
    INFO("optimizer " << which << " (0 SGD, 1 Adam, 2 AdamW amsgrad)");
    manual_seed(5);
    std::vector<Tensor> cpu_params, gpu_params;
    for (int64_t n : {1, 300, 20000, 5}) {
      cpu_params.push_back(random_cpu({n}).set_requires_grad(true));
      gpu_params.push_back(cpu_params.back().detach().to(gpu()).set_requires_grad(true));
    }
    auto make = [&](std::vector<Tensor> ps) -> std::unique_ptr<optim::Optimizer> {
      if (which == 0) {
        optim::SGDOptions sgd;
        sgd.lr = 0.1;
        sgd.momentum = 0.9;
        sgd.nesterov = true;
        return std::make_unique<optim::SGD>(ps, sgd);
      }
      if (which == 1) {
        optim::AdamOptions adam;
        adam.lr = 0.01;
        adam.weight_decay = 0.1;
        return std::make_unique<optim::Adam>(ps, adam);
      }
      optim::AdamWOptions adamw;
      adamw.lr = 0.01;
      adamw.amsgrad = true;
      return std::make_unique<optim::AdamW>(ps, adamw);
    };
    auto on_cpu = make(cpu_params), on_cuda = make(gpu_params);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < cpu_params.size(); ++i) {
        if (i == 3 && step == 0) continue;  // a late parameter: its own step count
        const Tensor g = random_cpu(cpu_params[i].shape());
        cpu_params[i].set_grad(g);
        gpu_params[i].set_grad(g.to(gpu()));
      }
      on_cpu->step();
      on_cuda->step();
    }
    for (size_t i = 0; i < cpu_params.size(); ++i)
      MG_REQUIRE_CLOSE(gpu_params[i].detach(), cpu_params[i].detach(), 1e-5);
  }
}

}  // namespace
}  // namespace mg

#endif  // MG_HAS_CUDA
