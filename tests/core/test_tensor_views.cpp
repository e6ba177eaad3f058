// Views share storage: view/reshape, transpose/permute, narrow/slice/select,
// expand, squeeze/unsqueeze, flatten; contiguous(); 0-d and empty tensors; printing.
#include <catch2/catch.hpp>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "multigrad.h"
#include "tests/tensor_values.h"

using namespace mg;
using Catch::Matchers::Contains;

using mg::testing::values;

namespace {

// 0, 1, ..., n-1 as f32 with the given shape.
Tensor iota(const Shape& shape) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  return tensor<float>(v, shape);
}

}  // namespace

TEST_CASE("view shares storage and writes through", "[views]") {
  Tensor base = iota({12});
  Tensor v = base.view({3, 4});
  REQUIRE(v.shape() == Shape{3, 4});
  REQUIRE(v.strides() == Shape{4, 1});
  CHECK(v.data_ptr() == base.data_ptr());
  CHECK(v.storage() == base.storage());
  CHECK_FALSE(v.is_same(base));

  // Write through a narrowed row of the view: visible in the base.
  v.narrow(0, 1, 1).fill_(-1.0);
  std::vector<float> b = values(base);
  for (int i = 0; i < 12; ++i) CHECK(b[i] == (i >= 4 && i < 8 ? -1.0f : static_cast<float>(i)));

  // Raw write through the view's pointer.
  v.data<float>()[11] = 42.0f;
  CHECK(values(base)[11] == 42.0f);

  // And the other way: writing the base changes the view.
  base.data<float>()[0] = 7.0f;
  CHECK(values(v)[0] == 7.0f);
}

TEST_CASE("reshape of a contiguous tensor is a view", "[views]") {
  Tensor base = iota({2, 3, 4});
  Tensor r = base.reshape({6, 4});
  CHECK(r.data_ptr() == base.data_ptr());
  CHECK(r.storage() == base.storage());
  CHECK(r.shape() == Shape{6, 4});
  r.select(0, 5).fill_(100.0);  // last row of r = last 4 elements of base
  std::vector<float> b = values(base);
  for (int i = 20; i < 24; ++i) CHECK(b[i] == 100.0f);
  CHECK(b[19] == 19.0f);
}

TEST_CASE("-1 infers one dimension", "[views]") {
  Tensor base = iota({12});
  CHECK(base.view({-1, 3}).shape() == Shape{4, 3});
  CHECK(base.view({2, -1, 2}).shape() == Shape{2, 3, 2});
  CHECK(base.reshape({-1}).shape() == Shape{12});
  CHECK(base.view({3, -1}).strides() == Shape{4, 1});
  CHECK_THROWS_AS(base.view({-1, -1}), Error);
  CHECK_THROWS_AS(base.view({5, -1}), Error);  // 12 is not a multiple of 5
  CHECK_THROWS_AS(base.view({5}), Error);
  CHECK_THROWS_AS(base.reshape({7, 2}), Error);
}

TEST_CASE("view of a non-contiguous tensor throws; reshape copies", "[views]") {
  Tensor base = iota({2, 3});
  Tensor t = base.t();  // [3, 2], strides [1, 3]
  REQUIRE_FALSE(t.is_contiguous());
  REQUIRE_THROWS_WITH(t.view({6}), Contains("reshape"));
  REQUIRE_THROWS_AS(t.view({6}), Error);

  Tensor r = t.reshape({6});
  CHECK(r.shape() == Shape{6});
  CHECK(r.is_contiguous());
  CHECK(r.data_ptr() != base.data_ptr());
  CHECK(values(r) == std::vector<float>{0, 3, 1, 4, 2, 5});
  // The copy is independent of the base.
  r.fill_(9.0);
  CHECK(values(base) == std::vector<float>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("view of a non-contiguous tensor that only splits a contiguous dim is allowed", "[views]") {
  Tensor base = iota({2, 3, 4});
  Tensor p = base.transpose(0, 1);  // [3, 2, 4], strides [4, 12, 1]
  REQUIRE(p.strides() == Shape{4, 12, 1});
  Tensor v = p.view({3, 2, 2, 2});  // splits the last (contiguous) dim
  CHECK(v.data_ptr() == base.data_ptr());
  CHECK(v.strides() == Shape{4, 12, 2, 1});
  CHECK(values(v) == values(p));
  // Merging dims 1 and 2 of p (strides 12 and 1) needs a copy.
  CHECK_THROWS_AS(p.view({3, 8}), Error);
  Tensor merged = p.reshape({3, 8});
  CHECK(merged.data_ptr() != base.data_ptr());
  CHECK(values(merged) == values(p));
}

TEST_CASE("transpose and permute swap shape and strides", "[views]") {
  Tensor x = iota({2, 3, 4});
  REQUIRE(x.strides() == Shape{12, 4, 1});

  Tensor t = x.transpose(0, 2);
  CHECK(t.shape() == Shape{4, 3, 2});
  CHECK(t.strides() == Shape{1, 4, 12});
  CHECK(t.data_ptr() == x.data_ptr());
  CHECK_FALSE(t.is_contiguous());
  CHECK(x.transpose(-1, -3).strides() == Shape{1, 4, 12});

  Tensor p = x.permute({1, 2, 0});
  CHECK(p.shape() == Shape{3, 4, 2});
  CHECK(p.strides() == Shape{4, 1, 12});
  CHECK(p.data_ptr() == x.data_ptr());
  // Element (i, j, k) of p is element (k, i, j) of x.
  std::vector<float> pv = values(p);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      for (int k = 0; k < 2; ++k) CHECK(pv[(i * 4 + j) * 2 + k] == static_cast<float>(k * 12 + i * 4 + j));

  Tensor m = iota({2, 3});
  CHECK(m.t().shape() == Shape{3, 2});
  CHECK(m.t().strides() == Shape{1, 3});
  CHECK(values(m.t()) == std::vector<float>{0, 3, 1, 4, 2, 5});
  CHECK_THROWS_AS(x.t(), Error);                 // t() is 2-d only
  CHECK_THROWS_AS(x.permute({0, 0, 1}), Error);  // repeated dim
  CHECK_THROWS_AS(x.permute({0, 1}), Error);     // wrong count
}

TEST_CASE("narrow and slice set offsets and strides", "[views]") {
  Tensor x = iota({10});
  Tensor n = x.narrow(0, 2, 5);
  CHECK(n.shape() == Shape{5});
  CHECK(n.offset() == 2);
  CHECK(n.data_ptr() == static_cast<void*>(x.data<float>() + 2));
  CHECK(values(n) == std::vector<float>{2, 3, 4, 5, 6});
  CHECK(n.is_contiguous());

  Tensor s = x.slice(0, 1, 9, 3);
  CHECK(s.shape() == Shape{3});
  CHECK(s.strides() == Shape{3});
  CHECK(s.offset() == 1);
  CHECK(values(s) == std::vector<float>{1, 4, 7});
  CHECK_FALSE(s.is_contiguous());

  // Negative start/end count from the end.
  Tensor neg = x.slice(0, -4, -1);
  CHECK(neg.offset() == 6);
  CHECK(values(neg) == std::vector<float>{6, 7, 8});
  // Out-of-range ends are clamped (Python semantics).
  CHECK(values(x.slice(0, 8, 100)) == std::vector<float>{8, 9});
  CHECK(x.slice(0, 5, 2).numel() == 0);
  CHECK_THROWS_AS(x.slice(0, 0, 5, 0), Error);
  CHECK_THROWS_AS(x.narrow(0, 8, 5), Error);
  CHECK_THROWS_AS(x.narrow(0, -1, 2), Error);

  Tensor m = iota({4, 5});
  Tensor cols = m.slice(1, 1, 5, 2);  // columns 1 and 3
  CHECK(cols.shape() == Shape{4, 2});
  CHECK(cols.strides() == Shape{5, 2});
  CHECK(cols.offset() == 1);
  CHECK(values(cols) == std::vector<float>{1, 3, 6, 8, 11, 13, 16, 18});
  Tensor rows = m.narrow(0, 1, 2);
  CHECK(rows.offset() == 5);
  CHECK(rows.is_contiguous());
  CHECK(values(rows) == std::vector<float>{5, 6, 7, 8, 9, 10, 11, 12, 13, 14});
  // A slice of a slice composes offsets.
  Tensor inner = rows.slice(1, 2, 4);
  CHECK(inner.offset() == 7);
  CHECK(values(inner) == std::vector<float>{7, 8, 12, 13});
  // Writing a slice writes the base.
  cols.fill_(-1.0);
  std::vector<float> mv = values(m);
  CHECK(mv[1] == -1.0f);
  CHECK(mv[3] == -1.0f);
  CHECK(mv[2] == 2.0f);
  CHECK(mv[18] == -1.0f);
}

TEST_CASE("select removes a dim", "[views]") {
  Tensor m = iota({4, 5});
  Tensor row = m.select(0, 2);
  CHECK(row.shape() == Shape{5});
  CHECK(row.offset() == 10);
  CHECK(row.is_contiguous());
  CHECK(values(row) == std::vector<float>{10, 11, 12, 13, 14});

  Tensor col = m.select(1, -1);
  CHECK(col.shape() == Shape{4});
  CHECK(col.strides() == Shape{5});
  CHECK(col.offset() == 4);
  CHECK_FALSE(col.is_contiguous());
  CHECK(values(col) == std::vector<float>{4, 9, 14, 19});

  Tensor elem = m.select(0, 3).select(0, 1);
  CHECK(elem.dim() == 0);
  CHECK(elem.item<float>() == 16.0f);

  CHECK_THROWS_AS(m.select(0, 4), Error);
  CHECK_THROWS_AS(m.select(1, -6), Error);
  CHECK_THROWS_AS(m.select(2, 0), Error);
}

TEST_CASE("expand gives stride 0 and shares storage", "[views]") {
  Tensor col = tensor<float>({1, 2, 3}, {3, 1});
  Tensor e = col.expand({3, 4});
  CHECK(e.shape() == Shape{3, 4});
  CHECK(e.strides() == Shape{1, 0});
  CHECK(e.data_ptr() == col.data_ptr());
  CHECK_FALSE(e.is_contiguous());
  CHECK(values(e) == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});

  // -1 keeps a size; new leading dims get stride 0.
  Tensor lead = tensor<float>({1, 2, 3}).expand({2, -1});
  CHECK(lead.shape() == Shape{2, 3});
  CHECK(lead.strides() == Shape{0, 1});
  CHECK(values(lead) == std::vector<float>{1, 2, 3, 1, 2, 3});

  // A write to the base shows in every expanded position.
  col.data<float>()[1] = 20.0f;
  std::vector<float> ev = values(e);
  for (int j = 0; j < 4; ++j) CHECK(ev[4 + j] == 20.0f);

  CHECK_THROWS_AS(col.expand({2, 4}), Error);  // 3 -> 2 is not a broadcast
  CHECK_THROWS_AS(col.expand({4}), Error);     // fewer dims
  CHECK(e.contiguous().strides() == Shape{4, 1});
  CHECK(values(e.contiguous()) == values(e));
}

TEST_CASE("squeeze and unsqueeze", "[views]") {
  Tensor z = iota({1, 3, 1, 2});
  Tensor all = z.squeeze();
  CHECK(all.shape() == Shape{3, 2});
  CHECK(all.data_ptr() == z.data_ptr());
  CHECK(z.squeeze(0).shape() == Shape{3, 1, 2});
  CHECK(z.squeeze(2).shape() == Shape{1, 3, 2});
  CHECK(z.squeeze(-2).shape() == Shape{1, 3, 2});
  CHECK(z.squeeze(1).shape() == Shape{1, 3, 1, 2});  // size 3: unchanged
  CHECK(z.squeeze(0).data_ptr() == z.data_ptr());

  Tensor m = iota({3, 2});
  Tensor u0 = m.unsqueeze(0);
  CHECK(u0.shape() == Shape{1, 3, 2});
  CHECK(u0.data_ptr() == m.data_ptr());
  CHECK(u0.is_contiguous());
  CHECK(m.unsqueeze(1).shape() == Shape{3, 1, 2});
  CHECK(m.unsqueeze(2).shape() == Shape{3, 2, 1});
  CHECK(m.unsqueeze(-1).shape() == Shape{3, 2, 1});
  CHECK(m.unsqueeze(-3).shape() == Shape{1, 3, 2});
  CHECK(values(m.unsqueeze(1)) == values(m));
  CHECK_THROWS_AS(m.unsqueeze(4), Error);
  CHECK_THROWS_AS(m.unsqueeze(-4), Error);
  // unsqueeze of a transposed view keeps it a view with the right values.
  Tensor tu = m.t().unsqueeze(1);
  CHECK(tu.shape() == Shape{2, 1, 3});
  CHECK(tu.data_ptr() == m.data_ptr());
  CHECK(values(tu) == std::vector<float>{0, 2, 4, 1, 3, 5});
}

TEST_CASE("flatten", "[views]") {
  Tensor x = iota({2, 3, 4});
  CHECK(x.flatten().shape() == Shape{24});
  CHECK(x.flatten().data_ptr() == x.data_ptr());
  CHECK(x.flatten(1).shape() == Shape{2, 12});
  CHECK(x.flatten(0, 1).shape() == Shape{6, 4});
  CHECK(x.flatten(-2, -1).shape() == Shape{2, 12});
  CHECK(x.flatten(1, 1).shape() == Shape{2, 3, 4});
  CHECK_THROWS_AS(x.flatten(2, 1), Error);
  // Non-contiguous: flatten copies and keeps logical order.
  Tensor t = x.transpose(0, 2);
  Tensor f = t.flatten();
  CHECK(f.shape() == Shape{24});
  CHECK(values(f) == values(t));
  CHECK(f.data_ptr() != x.data_ptr());
  // 0-d flattens to [1].
  CHECK(scalar_tensor(5.0).flatten().shape() == Shape{1});
}

TEST_CASE("contiguous returns the same impl when already contiguous, else a copy", "[views]") {
  Tensor x = iota({3, 4});
  Tensor c = x.contiguous();
  CHECK(c.is_same(x));

  Tensor t = x.t();
  Tensor tc = t.contiguous();
  CHECK_FALSE(tc.is_same(t));
  CHECK(tc.is_contiguous());
  CHECK(tc.data_ptr() != x.data_ptr());
  CHECK(tc.shape() == Shape{4, 3});
  CHECK(tc.strides() == Shape{3, 1});
  CHECK(values(tc) == values(t));
  tc.fill_(0.0);  // independent memory
  CHECK(values(x)[5] == 5.0f);

  // A contiguous narrow (rows) is returned as is, with its offset.
  Tensor rows = x.narrow(0, 1, 2);
  CHECK(rows.contiguous().is_same(rows));
  CHECK(rows.contiguous().offset() == 4);
}

TEST_CASE("is_contiguous on various views", "[views]") {
  Tensor x = iota({4, 5, 6});
  CHECK(x.is_contiguous());
  CHECK_FALSE(x.transpose(0, 1).is_contiguous());
  CHECK_FALSE(x.permute({2, 0, 1}).is_contiguous());
  CHECK(x.permute({0, 1, 2}).is_contiguous());
  CHECK(x.narrow(0, 1, 2).is_contiguous());
  CHECK_FALSE(x.narrow(1, 1, 2).is_contiguous());
  CHECK_FALSE(x.narrow(2, 0, 3).is_contiguous());
  CHECK(x.select(0, 3).is_contiguous());
  CHECK_FALSE(x.select(2, 3).is_contiguous());
  CHECK_FALSE(x.slice(0, 0, 4, 2).is_contiguous());
  CHECK(x.unsqueeze(1).is_contiguous());
  CHECK_FALSE(x.narrow(1, 2, 1).select(1, 0).is_contiguous());  // [4, 6] with strides [30, 1]
  CHECK(x.select(0, 1).narrow(0, 2, 1).is_contiguous());        // [1, 6]: one row
  // Size-1 dims do not break contiguity whatever their stride.
  Tensor one_row = x.narrow(0, 2, 1).narrow(1, 1, 1);  // [1, 1, 6]
  CHECK(one_row.is_contiguous());
  CHECK(x.transpose(0, 1).narrow(0, 0, 1).narrow(1, 0, 1).is_contiguous());  // [1, 1, 6]
  CHECK_FALSE(tensor<float>({1, 2}).view({2, 1}).expand({2, 3}).is_contiguous());
  CHECK(tensor<float>({1, 2, 3}).view({1, 3}).expand({1, 3}).is_contiguous());
}

TEST_CASE("0-d tensors", "[views]") {
  Tensor s = scalar_tensor(3.5);
  CHECK(s.dim() == 0);
  CHECK(s.numel() == 1);
  CHECK(s.shape().empty());
  CHECK(s.strides().empty());
  CHECK(s.is_contiguous());
  CHECK(s.item<float>() == 3.5f);
  CHECK(s.item<double>() == 3.5);
  CHECK(s.item<int64_t>() == 3);

  Tensor one = s.reshape({1});
  CHECK(one.shape() == Shape{1});
  CHECK(one.data_ptr() == s.data_ptr());
  Tensor back = one.reshape({});
  CHECK(back.dim() == 0);
  CHECK(back.data_ptr() == s.data_ptr());
  CHECK(back.item<float>() == 3.5f);
  CHECK(s.view({1, 1}).shape() == Shape{1, 1});
  CHECK(s.unsqueeze(0).shape() == Shape{1});
  CHECK(s.expand({2, 3}).strides() == Shape{0, 0});
  CHECK(values(s.expand({2, 2})) == std::vector<float>{3.5f, 3.5f, 3.5f, 3.5f});
  CHECK(s.squeeze().dim() == 0);
  CHECK_THROWS_AS(s.reshape({2}), Error);

  // A 0-d tensor from a reduction.
  Tensor total = iota({4}).sum();
  CHECK(total.dim() == 0);
  CHECK(total.item<float>() == 6.0f);
}

TEST_CASE("empty tensors (a 0 in the shape)", "[views]") {
  Tensor e = zeros({2, 0, 3});
  CHECK(e.numel() == 0);
  CHECK(e.nbytes() == 0);
  CHECK(e.shape() == Shape{2, 0, 3});
  CHECK(e.to_vector<float>().empty());
  CHECK(e.reshape({0, 5}).shape() == Shape{0, 5});
  CHECK(e.view({-1}).shape() == Shape{0});
  CHECK_THROWS_AS(e.view({-1, 0}), Error);  // -1 is ambiguous with 0 elements
  CHECK(e.transpose(0, 1).shape() == Shape{0, 2, 3});
  CHECK(e.contiguous().numel() == 0);
  CHECK(e.sum().item<float>() == 0.0f);
  CHECK(e.sum({1}).shape() == Shape{2, 3});
  CHECK(values(e.sum({1})) == std::vector<float>(6, 0.0f));
  Tensor x = iota({5});
  CHECK(x.narrow(0, 5, 0).numel() == 0);
  CHECK((add(e, 1.0)).shape() == Shape{2, 0, 3});
  CHECK_THROWS_AS(e.item<float>(), Error);
  CHECK_THAT(e.str(), Contains("[2, 0, 3]"));
}

TEST_CASE("printing shows values, shape, dtype and device", "[views][print]") {
  Tensor t = tensor<float>({1.5f, -2.25f, 3.0f});
  const std::string s = t.str();
  CHECK_THAT(s, Contains("1.5000"));
  CHECK_THAT(s, Contains("-2.2500"));
  CHECK_THAT(s, Contains("3.0000"));
  CHECK_THAT(s, Contains("[3]"));
  CHECK_THAT(s, Contains("f32"));
  CHECK_THAT(s, Contains("cpu:0"));
  CHECK_THAT(s, !Contains("..."));

  Tensor m = tensor<int64_t>({7, -8, 9, 10}, {2, 2});
  const std::string ms = m.str();
  CHECK_THAT(ms, Contains("7"));
  CHECK_THAT(ms, Contains("-8"));
  CHECK_THAT(ms, Contains("[2, 2]"));
  CHECK_THAT(ms, Contains("i64"));
  CHECK_THAT(ms, !Contains("7.0000"));  // integers print as integers

  // Non-contiguous tensors print in logical order.
  const std::string ts = iota({2, 3}).t().str();
  CHECK(ts.find("3.0000") < ts.find("1.0000"));

  Tensor moved = tensor<float>({1, 2}).to(Device::cpu(1));
  CHECK_THAT(moved.str(), Contains("cpu:1"));
  CHECK_THAT(tensor<double>({0.5}).str(), Contains("f64"));
  CHECK_THAT(tensor<bool>({true, false}).str(), Contains("bool"));

  Tensor w = ones({2}, TensorOptions{DType::f32, Device::cpu(), true});
  CHECK_THAT(w.str(), Contains("requires_grad"));

  std::ostringstream os;
  os << t;
  CHECK(os.str() == s);
}

TEST_CASE("printing a big tensor summarises with ...", "[views][print]") {
  Tensor big = arange(2000);
  const std::string s = big.str();
  CHECK_THAT(s, Contains("..."));
  CHECK_THAT(s, Contains("0.0000"));
  CHECK_THAT(s, Contains("1.0000"));
  CHECK_THAT(s, Contains("1999.0000"));
  CHECK_THAT(s, Contains("[2000]"));
  CHECK_THAT(s, !Contains("1000.0000"));
  CHECK(s.size() < 400);

  Tensor big2d = arange(0.0, 1e4, 1.0).reshape({100, 100});
  const std::string s2 = big2d.str();
  CHECK_THAT(s2, Contains("..."));
  CHECK_THAT(s2, Contains("9999.0000"));
  CHECK_THAT(s2, Contains("[100, 100]"));
  CHECK_THAT(s2, !Contains("5050.0000"));
  CHECK(s2.size() < 2000);
}

TEST_CASE("views of tensors with size-1 dims and of expanded tensors", "[views]") {
  // A single row narrowed out of a matrix views as 1-d without copying.
  Tensor m = iota({3, 4});
  Tensor row = m.narrow(0, 1, 1);  // [1, 4], offset 4
  Tensor flat = row.view({4});
  CHECK(flat.data_ptr() == row.data_ptr());
  CHECK(values(flat) == std::vector<float>{4, 5, 6, 7});
  CHECK(row.view({2, 2}).strides() == Shape{2, 1});

  // A size-1 dim moved to the front keeps the tensor viewable.
  Tensor x = iota({4, 1, 3});
  Tensor moved = x.transpose(0, 1);  // [1, 4, 3]
  CHECK(moved.is_contiguous());
  Tensor v = moved.view({4, 3});
  CHECK(v.data_ptr() == x.data_ptr());
  CHECK(values(v) == values(x));

  // An expanded tensor can take extra size-1 dims as a view, but flattening it copies.
  Tensor e = tensor<float>({1, 2, 3}).expand({2, 3});
  Tensor e3 = e.view({2, 3, 1});
  CHECK(e3.data_ptr() == e.data_ptr());
  CHECK(e3.strides()[0] == 0);
  CHECK_THROWS_AS(e.view({6}), Error);
  Tensor ef = e.reshape({6});
  CHECK(ef.is_contiguous());
  CHECK(values(ef) == std::vector<float>{1, 2, 3, 1, 2, 3});

  // Every other column of a [2, 6]: the rows stay evenly spaced (6 = 3 * 2), so it
  // flattens to one stride-2 view; every other column of the first four does not.
  Tensor cols = iota({2, 6}).slice(1, 0, 6, 2);  // [2, 3], strides [6, 2]
  Tensor cv = cols.view({6});
  CHECK(cv.strides() == Shape{2});
  CHECK(cv.data_ptr() == cols.data_ptr());
  CHECK(values(cv) == std::vector<float>{0, 2, 4, 6, 8, 10});
  Tensor uneven = iota({2, 6}).slice(1, 0, 4, 2);  // [2, 2], strides [6, 2]: 0, 2, 6, 8
  CHECK_THROWS_AS(uneven.view({4}), Error);
  CHECK(values(uneven.reshape({4})) == std::vector<float>{0, 2, 6, 8});
}
