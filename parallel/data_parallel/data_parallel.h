// DataParallel: one process, several devices, one model (torch.nn.DataParallel).
//
// Every forward:
//
//            x (whole batch)
//              │ scatter: chunk along dim 0, chunk i ─▶ devices[i]
//      ┌───────┼────────────┐
//      x0      x1     ...   x(n-1)          replicate: parameters broadcast from devices[0]
//      │       │            │               (autograd Broadcast), buffers copied
//   replica0 replica1 ... replica(n-1)      parallel_apply: one thread per device
//      │       │            │
//      y0      y1     ...   y(n-1)
//      └───────┼────────────┘
//              │ gather: to(output_device) + cat along dim 0
//              y (whole batch, on output_device)
//
// The loss is then computed on output_device over the whole batch, exactly as without
// DataParallel, and one backward runs Gather → replicas → Broadcast: each parameter's
// gradient is the sum of the replicas' gradients, accumulated into the *wrapped
// module's* .grad on devices[0]. So the optimizer is built on the module's parameters
// (dp.parameters() are the same tensors) and steps there. Because the batch rows are
// only split and re-joined, the result equals a single-device run up to floating-point
// summation order, unless the module mixes rows: BatchNorm in training mode normalises
// each chunk with its own statistics (PyTorch's DataParallel does the same).
//
//   nn::FashionCNN net;                    // parameters on devices[0]
//   parallel::DataParallel dp(net, {Device::cpu(0), Device::cpu(1)});
//   optim::AdamWOptions adamw;
//   adamw.lr = 1e-3;
//   optim::AdamW opt(net.parameters(), adamw);
//   Tensor loss = nn::cross_entropy(dp(x), y);   // output and loss on cpu:0
//   opt.zero_grad(); loss.backward(); opt.step();
//
// Several inputs and outputs (nested lists of them too) go through forward_values:
//
//   nn::Values out = dp(nn::Values{x, nn::Value{mask, lengths}});   // each tensor split by rows
//   Tensor loss = nn::cross_entropy(out[0].tensor(), y) + out[1].tensor().mean();
//
// Works for CPU devices (logical: cpu:0, cpu:1, ... share host memory) and CUDA devices
// alike; it only moves tensors with Tensor::to. With one device (or a batch of one row)
// it simply calls the module. See docs/data-parallel.md for why device 0 becomes the
// bottleneck and what each phase costs (last_timings()).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/device.h"
#include "core/tensor.h"
#include "nn/module.h"

namespace mg::parallel {

// Wall-clock milliseconds of each phase of the last forward (what DataParallel costs
// on top of the replicas' own compute, which is inside apply_ms).
struct DataParallelTimings {
  double scatter_ms = 0;
  double replicate_ms = 0;
  double apply_ms = 0;
  double gather_ms = 0;
  int replicas = 0;  // replicas that ran: fewer than the devices when the batch has fewer rows
  double total_ms() const { return scatter_ms + replicate_ms + apply_ms + gather_ms; }
};

// The devices DataParallel uses when given none: every CUDA device when the build has a
// CUDA backend and a GPU, otherwise just `fallback`.
std::vector<Device> default_devices(Device fallback = Device::cpu(0));

class DataParallel : public nn::Module {
 public:
  // Wraps `module` (not owned: it must outlive this object), whose parameters and
  // buffers must be on devices[0]. No devices: default_devices(module's device).
  // output_device defaults to devices[0]; `dim` is the batch dimension.
  explicit DataParallel(nn::Module& module, std::vector<Device> devices = {},
                        std::optional<Device> output_device = std::nullopt, int64_t dim = 0);
  // The same, sharing ownership of `module`.
  explicit DataParallel(std::shared_ptr<nn::Module> module, std::vector<Device> devices = {},
                        std::optional<Device> output_device = std::nullopt, int64_t dim = 0);

  Tensor forward(const Tensor& x) override;  // forward_values({x}), which must give one tensor
  // Any signature (nn/value.h): every tensor input is scattered along `dim`, every other input
  // copied to each replica, and every tensor output gathered onto output_device (scatter_gather.h).
  nn::Values forward_values(const nn::Values& inputs) override;

  nn::Module& module() const { return *module_; }
  const std::vector<Device>& devices() const { return devices_; }
  Device output_device() const { return output_device_; }
  const DataParallelTimings& last_timings() const { return timings_; }

  std::string extra_repr() const override;

 private:
  void init(std::vector<Device> devices, std::optional<Device> output_device);

  nn::Module* module_;
  std::shared_ptr<nn::Module> owned_;  // set by the shared_ptr constructor
  std::vector<Device> devices_;
  Device output_device_;
  int64_t dim_;
  // Replica shells, built on the first multi-device forward and re-filled each time
  // (rebuilt when the module's parameter/buffer names change).
  std::vector<std::shared_ptr<nn::Module>> shells_;
  std::vector<std::string> shell_names_;
  DataParallelTimings timings_;
};

}  // namespace mg::parallel
