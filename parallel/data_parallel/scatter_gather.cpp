// scatter (narrow + to) and gather (to + cat); see scatter_gather.h.
#include "parallel/data_parallel/scatter_gather.h"

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

}  // namespace mg::parallel
