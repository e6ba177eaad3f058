// nn::Value: the tree of a module's inputs and outputs, and the walks over its tensor leaves
// (see value.h).
#include "nn/value.h"

#include "base/error.h"

namespace mg::nn {
namespace {

const char* kind_name(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::None: return "None";
    case Value::Kind::Tensor: return "a tensor";
    case Value::Kind::Int: return "an int";
    case Value::Kind::Double: return "a double";
    case Value::Kind::String: return "a string";
    case Value::Kind::List: return "a list";
  }
  return "?";
}

void collect(const Values& values, const std::string& prefix,
             std::vector<std::pair<std::string, Tensor>>& out) {
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string path = str_cat(prefix, "[", i, "]");
    if (values[i].is_tensor()) out.emplace_back(path, values[i].tensor());
    if (values[i].is_list()) collect(values[i].list(), path, out);
  }
}

Values map_with_prefix(const Values& values, const std::string& prefix,
                       const std::function<Tensor(const std::string&, const Tensor&)>& fn) {
  Values out;
  out.reserve(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string path = str_cat(prefix, "[", i, "]");
    if (values[i].is_tensor())
      out.emplace_back(fn(path, values[i].tensor()));
    else if (values[i].is_list())
      out.emplace_back(map_with_prefix(values[i].list(), path, fn));
    else
      out.push_back(values[i]);
  }
  return out;
}

bool same_structure_at(const Values& a, const Values& b, const std::string& prefix, std::string* where) {
  if (a.size() != b.size()) {
    if (where)
      *where =
          str_cat(prefix.empty() ? "the top level" : prefix, " (", a.size(), " vs ", b.size(), " items)");
    return false;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    const std::string path = str_cat(prefix, "[", i, "]");
    if (a[i].kind() != b[i].kind()) {
      if (where) *where = str_cat(path, " (", kind_name(a[i].kind()), " vs ", kind_name(b[i].kind()), ")");
      return false;
    }
    if (a[i].is_list() && !same_structure_at(a[i].list(), b[i].list(), path, where)) return false;
  }
  return true;
}

}  // namespace

Value::Value(Tensor tensor) : kind_(Kind::Tensor), tensor_(std::move(tensor)) {}
Value::Value(Values items) : kind_(Kind::List), list_(std::move(items)) {}

const Tensor& Value::tensor() const {
  MG_CHECK(kind_ == Kind::Tensor, "nn::Value: expected a tensor but this value is ", kind_name(kind_), ": ",
           str());
  return tensor_;
}

int64_t Value::to_int() const {
  MG_CHECK(kind_ == Kind::Int, "nn::Value: expected an int but this value is ", kind_name(kind_), ": ",
           str());
  return int_;
}

double Value::to_double() const {
  MG_CHECK(kind_ == Kind::Double || kind_ == Kind::Int, "nn::Value: expected a number but this value is ",
           kind_name(kind_), ": ", str());
  return kind_ == Kind::Int ? static_cast<double>(int_) : double_;
}

const std::string& Value::to_string() const {
  MG_CHECK(kind_ == Kind::String, "nn::Value: expected a string but this value is ", kind_name(kind_), ": ",
           str());
  return string_;
}

const Values& Value::list() const {
  MG_CHECK(kind_ == Kind::List, "nn::Value: expected a list but this value is ", kind_name(kind_), ": ",
           str());
  return list_;
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::None: return "None";
    case Kind::Tensor:
      return tensor_.defined() ? str_cat("Tensor", shape_str(tensor_.shape())) : "Tensor(undefined)";
    case Kind::Int: return str_cat(int_);
    case Kind::Double: return str_cat(double_);
    case Kind::String: return str_cat("\"", string_, "\"");
    case Kind::List: {
      std::string text = "[";
      for (size_t i = 0; i < list_.size(); ++i) text += (i ? ", " : "") + list_[i].str();
      return text + "]";
    }
  }
  return "?";
}

std::string describe(const Values& values) {
  std::string text = "(";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + values[i].str();
  return text + ")";
}

std::vector<std::pair<std::string, Tensor>> named_tensors(const Values& values) {
  std::vector<std::pair<std::string, Tensor>> out;
  collect(values, "", out);
  return out;
}

std::vector<Tensor> flatten_tensors(const Values& values) {
  std::vector<Tensor> out;
  for (auto& [path, tensor] : named_tensors(values)) out.push_back(std::move(tensor));
  return out;
}

Values map_tensors(const Values& values, const std::function<Tensor(const std::string&, const Tensor&)>& fn) {
  return map_with_prefix(values, "", fn);
}

Values unflatten_tensors(const Values& structure, const std::vector<Tensor>& tensors) {
  size_t next = 0;
  Values out = map_tensors(structure, [&](const std::string& path, const Tensor&) {
    MG_CHECK(next < tensors.size(), "unflatten_tensors: ", tensors.size(),
             " tensors given but the structure has more tensor leaves (the next is ", path, " in ",
             describe(structure), ")");
    return tensors[next++];
  });
  MG_CHECK(next == tensors.size(), "unflatten_tensors: ", tensors.size(), " tensors given but the structure ",
           describe(structure), " has ", next, " tensor leaves");
  return out;
}

bool same_structure(const Values& a, const Values& b, std::string* where) {
  return same_structure_at(a, b, "", where);
}

}  // namespace mg::nn
