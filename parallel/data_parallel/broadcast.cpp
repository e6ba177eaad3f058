// Broadcast (forward) and ReduceAdd (its backward); see broadcast.h for the picture.
#include "parallel/data_parallel/broadcast.h"

#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::parallel {

void check_devices(const std::vector<Device>& devices, const char* who) {
  MG_CHECK(!devices.empty(), who, ": expected at least one device");
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      MG_CHECK(devices[i] != devices[j], who, ": device ", devices[i], " is listed twice (positions ", j,
               " and ", i, ")");
}

Tensor reduce_add(const std::vector<Tensor>& tensors, Device destination) {
  MG_CHECK(!tensors.empty(), "reduce_add: expected at least one tensor");
  NoGradGuard no_grad;
  Tensor total;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MG_CHECK(t.defined(), "reduce_add: tensor ", i, " is undefined");
    MG_CHECK(t.shape() == tensors[0].shape() && t.dtype() == tensors[0].dtype(), "reduce_add: tensor 0 is ",
             shape_str(tensors[0].shape()), " ", tensors[0].dtype(), " but tensor ", i, " is ",
             shape_str(t.shape()), " ", t.dtype());
    Tensor here = t.to(destination);
    total = total.defined() ? add(total, here) : here;
  }
  return total;
}

std::vector<std::vector<Tensor>> broadcast(const std::vector<Tensor>& tensors,
                                           const std::vector<Device>& devices) {
  check_devices(devices, "broadcast");
  if (tensors.empty()) return std::vector<std::vector<Tensor>>(devices.size());
  const Device source = tensors[0].device();
  for (size_t i = 0; i < tensors.size(); ++i) {
    MG_CHECK(tensors[i].defined(), "broadcast: tensor ", i, " is undefined");
    MG_CHECK(tensors[i].device() == source,
             "broadcast: all tensors must be on one device, but tensor 0 is on ", source, " and tensor ", i,
             " is on ", tensors[i].device());
  }

  // 1. The copies, without history (an alias on the source device).
  std::vector<std::vector<Tensor>> out(devices.size());
  {
    NoGradGuard no_grad;
    for (size_t d = 0; d < devices.size(); ++d)
      for (const Tensor& t : tensors)
        out[d].push_back(devices[d] == source ? t.detach() : t.detach().to(devices[d]));
  }

  // 2. One autograd node over the inputs that need a gradient. Its outputs are those
  //    inputs' copies, device-major: output d * k + j is input j on devices[d].
  std::vector<Tensor> inputs;
  std::vector<size_t> which;  // index into `tensors` of each recorded input
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (autograd::any_requires_grad({tensors[i]})) {
      inputs.push_back(tensors[i]);
      which.push_back(i);
    }
  }
  if (inputs.empty()) return out;
  std::vector<Tensor> outputs;
  for (size_t d = 0; d < devices.size(); ++d)
    for (size_t i : which) outputs.push_back(out[d][i]);
  const size_t k = inputs.size(), num_devices = devices.size();
  autograd::record("BroadcastBackward", inputs, outputs,
                   [k, num_devices, source](const std::vector<Tensor>& g) {
                     // ReduceAdd: input j's gradient is the sum over devices of its copies' gradients.
                     std::vector<Tensor> grads;
                     for (size_t j = 0; j < k; ++j) {
                       std::vector<Tensor> per_device;
                       for (size_t d = 0; d < num_devices; ++d) per_device.push_back(g[d * k + j]);
                       grads.push_back(reduce_add(per_device, source));
                     }
                     return grads;
                   });
  return out;
}

}  // namespace mg::parallel
