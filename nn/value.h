// nn::Value / nn::Values: what a module takes and returns when one tensor is not enough.
//
// Why: a forward(const Tensor&) fits a layer, but models take a batch *and* a mask, a list of
// feature maps, a token tensor and a length; and return logits *and* an auxiliary loss.
// DataParallel must still split every input along the batch and join every output, and DDP must
// still run its per-forward work, whatever that signature is. A Value is a small tree that says
// where the tensors are:
//
//   Value  = None | Tensor | int | double | string | list of Values
//   Values = std::vector<Value>     (a module's positional inputs, or its outputs)
//
//   nn::Values in{x, nn::Value{a, b}, 0.5};   // x, the nested list [a, b], a number
//   nn::Values out = net.forward_values(in);
//   Tensor logits = out[0].tensor();
//
// Braces make a list, as with std::vector: Value{t} is a list holding t, Value(t) is t itself.
// The helpers below flatten the tensor leaves (depth first, left to right) and rebuild the same
// structure around new tensors, which is all DataParallel's scatter and gather need.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg::nn {

class Value;
using Values = std::vector<Value>;

class Value {
 public:
  enum class Kind { None, Tensor, Int, Double, String, List };

  Value() = default;  // None
  Value(Tensor tensor);
  Value(Values items);
  Value(std::initializer_list<Value> items) : Value(Values(items)) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Value(T number) : kind_(Kind::Int), int_(static_cast<int64_t>(number)) {}
  Value(double number) : kind_(Kind::Double), double_(number) {}
  Value(std::string text) : kind_(Kind::String), string_(std::move(text)) {}
  Value(const char* text) : Value(std::string(text)) {}
  Value(bool) = delete;  // no bool kind (it would become the double 1.0): pass 0 or 1

  Kind kind() const { return kind_; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_tensor() const { return kind_ == Kind::Tensor; }
  bool is_list() const { return kind_ == Kind::List; }

  // The leaf or list itself; each throws naming what the value is instead when the kind differs.
  const Tensor& tensor() const;
  int64_t to_int() const;
  double to_double() const;  // a Double, or an Int converted
  const std::string& to_string() const;
  const Values& list() const;

  // A short description for error messages: "Tensor[8, 3]", "[Tensor[8, 2], 3]", "None".
  std::string str() const;

 private:
  Kind kind_ = Kind::None;
  Tensor tensor_;
  int64_t int_ = 0;
  double double_ = 0;
  std::string string_;
  Values list_;
};

// "(Tensor[8, 3], [Tensor[8, 2], 3])": the description of a module's inputs or outputs.
std::string describe(const Values& values);

// Every tensor leaf, depth first and left to right, with its path ("[1][0]": element 0 of the
// list that is argument 1) for error messages.
std::vector<Tensor> flatten_tensors(const Values& values);
std::vector<std::pair<std::string, Tensor>> named_tensors(const Values& values);

// `structure` with its tensor leaves replaced, in flatten_tensors order, by `tensors` (which
// must have exactly one tensor per leaf); every other leaf is copied.
Values unflatten_tensors(const Values& structure, const std::vector<Tensor>& tensors);

// `values` with every tensor leaf t replaced by fn(path, t); every other leaf is copied.
Values map_tensors(const Values& values, const std::function<Tensor(const std::string&, const Tensor&)>& fn);

// True when a and b have the same tree: the same kinds in the same places and lists of the same
// lengths (tensor shapes and the values of other leaves are not compared). When they differ,
// `where` (if given) receives the path of the first difference.
bool same_structure(const Values& a, const Values& b, std::string* where = nullptr);

}  // namespace mg::nn
