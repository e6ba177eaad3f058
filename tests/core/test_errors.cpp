// Errors name both sides: shapes, dtypes, devices, dims and values appear in the
// message, so the user can fix the call without a debugger. Bad input never
// corrupts state.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"
#include "multigrad.h"

using namespace mg;
using Catch::Matchers::Contains;

namespace {

// Runs `f`, which must throw mg::Error, and returns the message.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected mg::Error, got another std::exception: " << e.what());
  }
  FAIL("expected mg::Error, nothing was thrown");
  return "";
}

TensorOptions requires_grad_f32() { return TensorOptions{DType::f32, Device::cpu(), true}; }

}  // namespace

TEST_CASE("shape mismatches name both shapes", "[errors]") {
  SECTION("add") {
    const std::string m = error_of([] { add(zeros({2, 3}), zeros({4})); });
    CHECK_THAT(m, Contains("[2, 3]") && Contains("[4]"));
    CHECK_THAT(error_of([] { zeros({2, 3}) + zeros({4}); }), Contains("[2, 3]") && Contains("[4]"));
    CHECK_THAT(error_of([] {
                 mul(zeros({5, 1, 3}), zeros({2, 7}));
               }),
               Contains("[5, 1, 3]") && Contains("[2, 7]"));
  }
  SECTION("matmul") {
    const std::string m = error_of([] { matmul(zeros({2, 3}), zeros({4, 5})); });
    CHECK_THAT(m, Contains("[2, 3]") && Contains("[4, 5]"));
    CHECK_THAT(error_of([] { matmul(zeros({3}), zeros({4})); }), Contains("[3]") && Contains("[4]"));
  }
  SECTION("cat") {
    const std::string m = error_of([] { cat({zeros({2, 3}), zeros({2, 4})}, 0); });
    CHECK_THAT(m, Contains("[2, 3]") && Contains("[2, 4]"));
    CHECK_THAT(error_of([] { cat({zeros({2, 3}), zeros({3})}, 0); }), Contains("[2, 3]") && Contains("[3]"));
    CHECK_THAT(error_of([] { stack({zeros({2}), zeros({3})}); }), Contains("[2]") && Contains("[3]"));
  }
  SECTION("cross_entropy targets") {
    const std::string m = error_of([] {
      cross_entropy(zeros({2, 3}), tensor<int64_t>({0, 1, 2, 0}, TensorOptions{DType::i64}));
    });
    CHECK_THAT(m, Contains("[2, 3]") && Contains("[4]"));
    CHECK_THAT(m, Contains("[2]"));  // the expected targets shape
    CHECK_THAT(error_of([] { cross_entropy(zeros({2, 3}), zeros({2})); }), Contains("f32"));  // float targets
  }
  SECTION("view / reshape") {
    CHECK_THAT(error_of([] { zeros({2, 3}).view({4}); }), Contains("[2, 3]") && Contains("[4]"));
    CHECK_THAT(error_of([] { zeros({2, 3}).t().view({6}); }), Contains("[3, 2]") && Contains("[6]"));
    CHECK_THAT(error_of([] { zeros({3, 1}).expand({2, 4}); }), Contains("[3, 1]") && Contains("[2, 4]"));
  }
  SECTION("in-place copy_") {
    Tensor x = zeros({2, 3});
    CHECK_THAT(error_of([&] { x.copy_(zeros({4})); }), Contains("[2, 3]") && Contains("[4]"));
  }
  SECTION("set_grad") {
    Tensor x = zeros({2, 3});
    CHECK_THAT(error_of([&] { x.set_grad(zeros({3, 2})); }), Contains("[2, 3]") && Contains("[3, 2]"));
  }
}

TEST_CASE("matmul with incompatible batch dims names both operand shapes", "[errors][matmul]") {
  // The batch dims [2] and [3] cannot broadcast; the user passed [2, 2, 3] and [3, 3, 1],
  // and the message should say so (not only the batch parts).
  const std::string m = error_of([] { matmul(zeros({2, 2, 3}), zeros({3, 3, 1})); });
  CHECK_THAT(m, Contains("matmul"));
  CHECK_THAT(m, Contains("[2, 2, 3]") && Contains("[3, 3, 1]"));
}

TEST_CASE("dtype mismatches name both dtypes", "[errors]") {
  const std::string m = error_of([] { matmul(zeros({2, 2}), zeros({2, 2}, TensorOptions{DType::f64})); });
  CHECK_THAT(m, Contains("f32") && Contains("f64"));
  const std::string m2 = error_of([] {
    matmul(zeros({2, 2}, TensorOptions{DType::bf16}), zeros({2, 2}, TensorOptions{DType::f16}));
  });
  CHECK_THAT(m2, Contains("bf16") && Contains("f16"));
  CHECK_THAT(error_of([] { zeros({2}).data<double>(); }), Contains("f64") && Contains("f32"));
}

TEST_CASE("device mismatches name both devices", "[errors]") {
  Tensor a = zeros({2});
  Tensor b = zeros({2}).to(Device::cpu(1));
  REQUIRE(b.device() == Device::cpu(1));
  REQUIRE(a.device() == Device::cpu(0));

  CHECK_THAT(error_of([&] { add(a, b); }), Contains("cpu:0") && Contains("cpu:1"));
  CHECK_THAT(error_of([&] { add(b, a); }), Contains("cpu:0") && Contains("cpu:1"));
  CHECK_THAT(error_of([&] { mul(a, b); }), Contains("cpu:0") && Contains("cpu:1"));
  CHECK_THAT(error_of([&] {
               matmul(zeros({2, 2}), zeros({2, 2}).to(Device::cpu(1)));
             }),
             Contains("cpu:0") && Contains("cpu:1"));
  CHECK_THAT(error_of([&] { cat({a, b}); }), Contains("cpu:0") && Contains("cpu:1"));
  CHECK_THAT(error_of([&] { eq(a, b); }), Contains("cpu:0") && Contains("cpu:1"));
  // Same logical device works; copy_ crosses devices on purpose.
  CHECK(add(b, b).device() == Device::cpu(1));
  Tensor c = zeros({2});
  c.copy_(ones({2}).to(Device::cpu(1)));
  CHECK(c.to_vector<float>() == std::vector<float>{1, 1});
}

TEST_CASE("out-of-range dims name the dim and the valid range", "[errors]") {
  Tensor x = zeros({2, 3});
  const std::string m = error_of([&] { sum(x, {5}); });
  CHECK_THAT(m, Contains("5") && Contains("[-2, 1]"));
  CHECK_THAT(error_of([&] { x.sum({-3}); }), Contains("-3") && Contains("[-2, 1]"));
  CHECK_THAT(error_of([&] { mean(x, {2}); }), Contains("2") && Contains("[-2, 1]"));
  CHECK_THAT(error_of([&] { x.transpose(0, 4); }), Contains("4") && Contains("[-2, 1]"));
  CHECK_THAT(error_of([&] { softmax(x, 2); }), Contains("[-2, 1]"));
  CHECK_THAT(error_of([&] { x.size(7); }), Contains("7"));
  CHECK_THAT(error_of([&] { x.unsqueeze(3); }), Contains("3") && Contains("[-3, 2]"));
  CHECK_THAT(error_of([&] { argmax(x, -5); }), Contains("-5"));
  CHECK_THAT(error_of([&] { sum(x, {0, 0}); }), Contains("twice"));
}

TEST_CASE("bad indices name the offending value", "[errors]") {
  SECTION("index_select") {
    Tensor x = zeros({3, 2});
    const std::string m = error_of([&] { index_select(x, 0, tensor<int64_t>({0, 7})); });
    CHECK_THAT(m, Contains("7"));
    CHECK_THAT(m, Contains("3"));  // the size of the indexed dim
    CHECK_THAT(error_of([&] { index_select(x, 0, tensor<int64_t>({-1})); }), Contains("-1"));
    CHECK_THAT(error_of([&] { index_select(x, 0, tensor<float>({0})); }), Contains("f32"));
  }
  SECTION("embedding") {
    Tensor w = zeros({4, 2});
    const std::string m = error_of([&] { embedding(w, tensor<int64_t>({1, 9, 2})); });
    CHECK_THAT(m, Contains("9"));
    CHECK_THAT(m, Contains("4"));
    CHECK_THAT(error_of([&] { embedding(w, tensor<int32_t>({-3})); }), Contains("-3"));
  }
  SECTION("cross_entropy target") {
    const std::string m = error_of([] { cross_entropy(zeros({2, 3}), tensor<int64_t>({1, 5})); });
    CHECK_THAT(m, Contains("5"));
    CHECK_THAT(m, Contains("3"));  // number of classes
    CHECK_THAT(error_of([] { cross_entropy(zeros({2, 3}), tensor<int64_t>({-2, 0})); }), Contains("-2"));
    // ignore_index is not an error.
    CrossEntropyOptions options;
    options.ignore_index = -100;
    CHECK_NOTHROW(cross_entropy(zeros({2, 3}), tensor<int64_t>({-100, 1}), options));
  }
  SECTION("select / narrow") {
    Tensor x = zeros({4, 5});
    CHECK_THAT(error_of([&] { x.select(1, 5); }), Contains("5"));
    CHECK_THAT(error_of([&] { x.narrow(0, 3, 2); }), Contains("4"));
  }
}

TEST_CASE("item() on a multi-element tensor", "[errors]") {
  const std::string m = error_of([] { zeros({2, 3}).item<float>(); });
  CHECK_THAT(m, Contains("6"));
  CHECK_THAT(m, Contains("[2, 3]"));
  CHECK(zeros({1, 1}).item<float>() == 0.0f);
}

TEST_CASE("backward on a non-scalar needs a gradient", "[errors]") {
  Tensor x = ones({3}, requires_grad_f32());
  Tensor y = mul(x, 2.0);
  const std::string m = error_of([&] { y.backward(); });
  CHECK_THAT(m, Contains("[3]"));
  CHECK_THAT(m, Contains("scalar"));
  // A gradient of the wrong shape names both shapes.
  CHECK_THAT(error_of([&] { y.backward(ones({4})); }), Contains("[3]") && Contains("[4]"));
  // Backward of something that does not require grad.
  CHECK_THAT(error_of([] { zeros({1}).sum().backward(); }), Contains("require"));
}

TEST_CASE("set_requires_grad on an integer tensor", "[errors]") {
  Tensor i = tensor<int64_t>({1, 2});
  const std::string m = error_of([&] { i.set_requires_grad(true); });
  CHECK_THAT(m, Contains("i64"));
  CHECK_THAT(m, Contains("floating"));
  CHECK_THAT(error_of([] { tensor<bool>({true}).set_requires_grad(true); }), Contains("bool"));
  CHECK_THAT(error_of([] { zeros({2}, TensorOptions{DType::i32, Device::cpu(), true}); }), Contains("i32"));
  CHECK_NOTHROW(tensor<int64_t>({1}).set_requires_grad(false));
  // A non-leaf cannot change requires_grad.
  Tensor x = ones({2}, requires_grad_f32());
  Tensor y = mul(x, 2.0);
  CHECK_THAT(error_of([&] { y.set_requires_grad(false); }), Contains("leaf"));
  // Casting a tensor that requires grad to an integer dtype is refused.
  CHECK_THAT(error_of([&] { x.to(DType::i64); }), Contains("i64"));
}

TEST_CASE("in-place op on a leaf requiring grad under grad mode", "[errors]") {
  Tensor w = ones({2, 2}, requires_grad_f32());
  const std::string m = error_of([&] { w.add_(1.0); });
  CHECK_THAT(m, Contains("requires grad"));
  CHECK_THAT(m, Contains("[2, 2]"));
  CHECK_THROWS_AS(w.mul_(2.0), Error);
  CHECK_THROWS_AS(w.fill_(0.0), Error);
  CHECK_THROWS_AS(w.zero_(), Error);
  CHECK_THROWS_AS(w.copy_(zeros({2, 2})), Error);
  CHECK_THROWS_AS(w.add_(ones({2, 2})), Error);
  // Nothing was written.
  CHECK(w.to_vector<float>() == std::vector<float>{1, 1, 1, 1});
  // A source that requires grad is refused too.
  Tensor plain = zeros({2, 2});
  CHECK_THROWS_AS(plain.add_(w), Error);
  CHECK(plain.to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  // Under NoGradGuard (an optimizer step) it is fine.
  {
    NoGradGuard no_grad;
    w.add_(1.0);
  }
  CHECK(w.to_vector<float>() == std::vector<float>{2, 2, 2, 2});
}

TEST_CASE("CUDA tensors in a build without a GPU", "[errors]") {
  if (cuda::device_count() != 0) {
    WARN("a CUDA device is present: skipping the no-CUDA error checks");
    return;
  }
  const std::string m = error_of([] { zeros({2}, TensorOptions{DType::f32, Device::cuda(0)}); });
  CHECK_THAT(m, Contains("CUDA"));
  CHECK_THAT(m, Contains("cuda:0"));
  CHECK_THAT(error_of([] { ones({2}).to(Device::cuda(0)); }), Contains("CUDA"));
  CHECK_THAT(error_of([] { empty({3}, TensorOptions{DType::f32, Device::cuda(1)}); }), Contains("CUDA"));
  CHECK_THAT(error_of([] { rand({3}, TensorOptions{DType::f32, Device::cuda(0)}); }), Contains("CUDA"));
}

TEST_CASE("views and reshapes reject sizes that overflow 64 bits", "[errors][overflow]") {
  const int64_t two_32 = int64_t(1) << 32;
  // An empty tensor viewed as [2^32, 2^32, 0]: unchecked, the product wraps and the view "fits".
  CHECK_THAT(error_of([&] {
               zeros({0}).view({two_32, two_32, 0});
             }),
             Contains("view") && Contains("[4294967296, 4294967296, 0]") && Contains("64 bits"));
  CHECK_THAT(error_of([&] { zeros({0}).reshape({two_32, two_32, 0}); }), Contains("64 bits"));
  CHECK_THAT(error_of([&] { zeros({4}).view({two_32, two_32, -1}); }), Contains("64 bits"));
  // expand: stride-0 dims allocate nothing, but numel() itself must not overflow.
  CHECK_THAT(error_of([&] {
               zeros({1, 1}).expand({two_32, two_32});
             }),
             Contains("[4294967296, 4294967296]") && Contains("64 bits"));
  CHECK(zeros({1}).expand({two_32}).numel() == two_32);  // large but representable: fine
}

TEST_CASE("bad input leaves state untouched", "[errors]") {
  Tensor x = ones({2, 3});
  const uint64_t v0 = x.version();
  CHECK_THROWS_AS(x.add_(ones({4})), Error);
  CHECK_THROWS_AS(x.copy_(ones({3, 2})), Error);
  CHECK_THROWS_AS(x.mul_(ones({2, 3, 2})), Error);
  CHECK(x.version() == v0);
  CHECK(x.to_vector<float>() == std::vector<float>(6, 1.0f));

  // A failed backward leaves .grad as it was.
  Tensor w = ones({3}, requires_grad_f32());
  mul(w, 2.0).sum().backward();
  REQUIRE(w.grad().defined());
  CHECK_THROWS_AS(mul(w, 2.0).backward(), Error);
  CHECK(w.grad().to_vector<float>() == std::vector<float>{2, 2, 2});

  // Errors are mg::Error, which is a std::runtime_error.
  CHECK_THROWS_AS(add(zeros({2}), zeros({3})), std::runtime_error);
  // Undefined tensors are reported, not dereferenced.
  CHECK_THROWS_AS(add(Tensor(), zeros({2})), Error);
  CHECK_THROWS_AS(Tensor().shape(), Error);
  CHECK_THAT(error_of([] { Device::parse("tpu:0"); }), Contains("tpu:0"));
  // An index beyond int is an mg::Error naming the text (std::stoi's bare "stoi" before).
  CHECK_THAT(error_of([] { Device::parse("cpu:99999999999"); }),
             Contains("cpu:99999999999") && Contains("out of range"));
  CHECK_THAT(error_of([] { Device::parse("cuda:2147483648"); }), Contains("out of range"));
  CHECK(Device::parse("cuda:999999999").index == 999999999);
}
