// parallel_apply: one std::thread per replica; see parallel_apply.h.
#include "parallel/data_parallel/parallel_apply.h"

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "core/autocast.h"
#include "core/cuda_stream.h"
#include "core/grad_mode.h"

namespace mg::parallel {
namespace {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Checks that replica i's parameters are on devices[i].
void check_replica(const std::shared_ptr<nn::Module>& replica, size_t i, Device device) {
  MG_CHECK(replica != nullptr, "parallel_apply: replica ", i, " is null");
  for (const auto& [name, p] : replica->named_parameters())
    MG_CHECK(p.device() == device, "parallel_apply: replica ", i, " should be on ", device,
             " but its parameter '", name, "' is on ", p.device());
}

// Runs apply(i) for every replica, one thread each (none for a single replica), with the
// caller's grad mode, autocast state and current CUDA streams; rethrows the first failure
// naming its replica and device.
void run_replicas(const std::vector<Device>& devices, const std::function<void(size_t)>& apply) {
  const size_t n = devices.size();
  std::vector<std::exception_ptr> errors(n);
  const bool grad_enabled = GradMode::is_enabled();
  const AutocastState autocast = autocast_state();
  // CUDA: each replica runs on the caller's current stream of its device, as in PyTorch. A worker
  // thread would otherwise start on the device's default stream (current streams are per host
  // thread), and its kernels would not be ordered after the scatter and broadcast copies the
  // caller queued on a stream it had made current, nor the caller's gather after them.
  std::vector<cuda::Stream> streams(n);
  for (size_t i = 0; i < n; ++i)
    if (devices[i].is_cuda()) streams[i] = cuda::current_stream(devices[i].index);
  auto run = [&](size_t i) {
    try {
      std::optional<cuda::StreamGuard> stream_guard;  // also makes the device current
      if (devices[i].is_cuda()) stream_guard.emplace(streams[i]);
      GradMode::set_enabled(grad_enabled);
      AutocastGuard autocast_guard(autocast.dtype, autocast.enabled);
      apply(i);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };

  if (n == 1) {
    run(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(n);
    try {
      for (size_t i = 0; i < n; ++i) threads.emplace_back(run, i);
    } catch (...) {  // the OS refused a thread: wait for the ones already running
      for (std::thread& t : threads) t.join();
      throw;
    }
    for (std::thread& t : threads) t.join();
  }
  for (size_t i = 0; i < n; ++i)
    if (errors[i]) throw Error(str_cat("replica ", i, " on ", devices[i], " failed: ", describe(errors[i])));
}

void check_counts(size_t replicas, size_t inputs, size_t devices) {
  MG_CHECK(replicas > 0, "parallel_apply: expected at least one replica");
  MG_CHECK(replicas == inputs, "parallel_apply: ", replicas, " replicas but ", inputs, " inputs");
  MG_CHECK(devices == 0 || devices == replicas, "parallel_apply: ", replicas, " replicas but ", devices,
           " devices");
}

}  // namespace

std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                   const std::vector<Tensor>& inputs, const std::vector<Device>& devices_in) {
  check_counts(replicas.size(), inputs.size(), devices_in.size());
  const size_t n = replicas.size();
  std::vector<Device> devices = devices_in;
  for (size_t i = 0; i < n; ++i) {
    MG_CHECK(replicas[i] != nullptr, "parallel_apply: replica ", i, " is null");
    MG_CHECK(inputs[i].defined(), "parallel_apply: input ", i, " is undefined");
    if (devices_in.empty()) devices.push_back(inputs[i].device());
    MG_CHECK(inputs[i].device() == devices[i], "parallel_apply: input ", i, " is on ", inputs[i].device(),
             " but replica ", i, " runs on ", devices[i]);
    check_replica(replicas[i], i, devices[i]);
  }
  std::vector<Tensor> outputs(n);
  run_replicas(devices, [&](size_t i) { outputs[i] = replicas[i]->forward(inputs[i]); });
  for (size_t i = 0; i < n; ++i)
    MG_CHECK(outputs[i].defined(), "parallel_apply: replica ", i, " on ", devices[i],
             " returned an undefined tensor");
  return outputs;
}

std::vector<nn::Values> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                       const std::vector<nn::Values>& inputs,
                                       const std::vector<Device>& devices_in) {
  check_counts(replicas.size(), inputs.size(), devices_in.size());
  const size_t n = replicas.size();
  std::vector<Device> devices = devices_in;
  for (size_t i = 0; i < n; ++i) {
    const auto leaves = nn::named_tensors(inputs[i]);
    if (devices_in.empty()) {
      MG_CHECK(!leaves.empty() && leaves.front().second.defined(), "parallel_apply: input ", i, " ",
               nn::describe(inputs[i]), " holds no tensor to take replica ", i,
               "'s device from; pass the devices");
      devices.push_back(leaves.front().second.device());
    }
    for (const auto& [path, tensor] : leaves) {
      MG_CHECK(tensor.defined(), "parallel_apply: input ", i, path, " is undefined");
      MG_CHECK(tensor.device() == devices[i], "parallel_apply: input ", i, path, " is on ", tensor.device(),
               " but replica ", i, " runs on ", devices[i]);
    }
    check_replica(replicas[i], i, devices[i]);
  }
  std::vector<nn::Values> outputs(n);
  run_replicas(devices, [&](size_t i) { outputs[i] = replicas[i]->forward_values(inputs[i]); });
  for (size_t i = 0; i < n; ++i)
    for (const auto& [path, tensor] : nn::named_tensors(outputs[i]))
      MG_CHECK(tensor.defined(), "parallel_apply: replica ", i, " on ", devices[i],
               " returned an undefined tensor at ", path);
  return outputs;
}

}  // namespace mg::parallel
