// scatter (narrow + to) and gather (to + cat); see scatter_gather.h.
#include "parallel/data_parallel/scatter_gather.h"

#include <string>

#include "core/ops.h"
#include "parallel/data_parallel/broadcast.h"

namespace mg::parallel {

std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices, int64_t dim) {
  MG_CHECK(input.defined(), "scatter: the input is undefined");
  check_devices(devices, "scatter");
  MG_CHECK(input.dim() > 0, "scatter: cannot split a tensor with zero dims (a scalar) across devices");
  dim = wrap_dim(dim, input.dim(), "scatter");
  MG_CHECK(input.size(dim) > 0, "scatter: the input ", shape_str(input.shape()), " has no rows in dim ", dim,
           " to split across ", devices.size(), " devices");
  // chunk() returns narrow() views, so autograd sees narrow + to for every piece.
  std::vector<Tensor> pieces = chunk(input, static_cast<int64_t>(devices.size()), dim);
  for (size_t i = 0; i < pieces.size(); ++i) pieces[i] = pieces[i].to(devices[i]);
  return pieces;
}

Tensor gather(const std::vector<Tensor>& outputs, Device destination, int64_t dim) {
  MG_CHECK(!outputs.empty(), "gather: expected at least one output");
  std::vector<Tensor> here;
  for (size_t i = 0; i < outputs.size(); ++i) {
    MG_CHECK(outputs[i].defined(), "gather: output ", i, " is undefined");
    MG_CHECK((outputs[i].dim() == 0) == (outputs[0].dim() == 0), "gather: output 0 has shape ",
             shape_str(outputs[0].shape()), " but output ", i, " has shape ", shape_str(outputs[i].shape()),
             " (scalars and tensors cannot be mixed)");
    here.push_back(outputs[i].to(destination));
  }
  if (here[0].dim() == 0) return stack(here, 0);
  if (here.size() == 1) return here[0];
  return cat(here, dim);
}

std::vector<nn::Values> scatter(const nn::Values& inputs, const std::vector<Device>& devices, int64_t dim) {
  check_devices(devices, "scatter");
  if (inputs.empty()) return {nn::Values{}};  // no arguments: one replica, as in PyTorch
  const auto leaves = nn::named_tensors(inputs);
  if (leaves.empty()) return std::vector<nn::Values>(devices.size(), inputs);  // nothing to split

  std::vector<std::vector<Tensor>> pieces;  // [leaf][replica]
  for (const auto& [path, tensor] : leaves) {
    MG_CHECK(tensor.defined(), "scatter: input ", path, " is an undefined tensor");
    MG_CHECK(tensor.dim() > 0, "scatter: input ", path,
             " is a tensor with zero dims, which cannot be split across devices (give it a batch dimension, "
             "or pass a number, which every replica gets a copy of)");
    pieces.push_back(scatter(tensor, devices, dim));
    MG_CHECK(pieces.back().size() == pieces.front().size(), "scatter: input ", leaves.front().first, " ",
             shape_str(leaves.front().second.shape()), " splits into ", pieces.front().size(),
             " pieces but input ", path, " ", shape_str(tensor.shape()), " into ", pieces.back().size(),
             " over ", devices.size(),
             " devices; some rows would reach no replica (give every tensor input the same batch size)");
  }
  std::vector<nn::Values> per_replica;
  for (size_t r = 0; r < pieces.front().size(); ++r) {
    std::vector<Tensor> mine;
    for (const auto& leaf : pieces) mine.push_back(leaf[r]);
    per_replica.push_back(nn::unflatten_tensors(inputs, mine));
  }
  return per_replica;
}

namespace {

// Leaf by leaf over every replica's outputs at the same place in the (checked, equal) tree.
nn::Values gather_at(const std::vector<const nn::Values*>& outputs, const std::string& prefix,
                     Device destination, int64_t dim) {
  const nn::Values& first = *outputs.front();
  nn::Values joined;
  for (size_t i = 0; i < first.size(); ++i) {
    const std::string path = str_cat(prefix, "[", i, "]");
    if (first[i].is_tensor()) {
      std::vector<Tensor> tensors;
      for (size_t r = 0; r < outputs.size(); ++r) {
        const Tensor& t = (*outputs[r])[i].tensor();
        MG_CHECK(t.defined(), "gather: output ", path, " of replica ", r, " is an undefined tensor");
        tensors.push_back(t);
      }
      try {
        joined.emplace_back(gather(tensors, destination, dim));
      } catch (const Error& e) {
        throw Error(str_cat("gather: output ", path, ": ", e.what()));
      }
    } else if (first[i].is_list()) {
      std::vector<const nn::Values*> lists;
      for (const nn::Values* out : outputs) lists.push_back(&(*out)[i].list());
      joined.emplace_back(gather_at(lists, path, destination, dim));
    } else {
      MG_CHECK(first[i].is_none(), "gather: output ", path, " is ", first[i].str(),
               "; only tensors (and None) can be gathered from the replicas -- return it as a tensor");
      joined.emplace_back();
    }
  }
  return joined;
}

}  // namespace

nn::Values gather(const std::vector<nn::Values>& outputs, Device destination, int64_t dim) {
  MG_CHECK(!outputs.empty(), "gather: expected at least one replica's outputs");
  std::vector<const nn::Values*> all;
  for (size_t r = 0; r < outputs.size(); ++r) {
    std::string where;
    MG_CHECK(nn::same_structure(outputs[0], outputs[r], &where), "gather: replica ", r, " returned ",
             nn::describe(outputs[r]), " but replica 0 returned ", nn::describe(outputs[0]),
             "; they differ at ", where);
    all.push_back(&outputs[r]);
  }
  return gather_at(all, "", destination, dim);
}

}  // namespace mg::parallel
