// parallel_apply: one std::thread per replica; see parallel_apply.h.
#include "parallel/data_parallel/parallel_apply.h"

#include <exception>
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

}  // namespace

std::vector<Tensor> parallel_apply(const std::vector<std::shared_ptr<nn::Module>>& replicas,
                                   const std::vector<Tensor>& inputs, const std::vector<Device>& devices_in) {
  MG_CHECK(!replicas.empty(), "parallel_apply: expected at least one replica");
  MG_CHECK(replicas.size() == inputs.size(), "parallel_apply: ", replicas.size(), " replicas but ",
           inputs.size(), " inputs");
  MG_CHECK(devices_in.empty() || devices_in.size() == replicas.size(), "parallel_apply: ", replicas.size(),
           " replicas but ", devices_in.size(), " devices");
  const size_t n = replicas.size();
  std::vector<Device> devices = devices_in;
  for (size_t i = 0; i < n; ++i) {
    MG_CHECK(replicas[i] != nullptr, "parallel_apply: replica ", i, " is null");
    MG_CHECK(inputs[i].defined(), "parallel_apply: input ", i, " is undefined");
    if (devices_in.empty()) devices.push_back(inputs[i].device());
    MG_CHECK(inputs[i].device() == devices[i], "parallel_apply: input ", i, " is on ", inputs[i].device(),
             " but replica ", i, " runs on ", devices[i]);
    for (const auto& [name, p] : replicas[i]->named_parameters())
      MG_CHECK(p.device() == devices[i], "parallel_apply: replica ", i, " should be on ", devices[i],
               " but its parameter '", name, "' is on ", p.device());
  }

  std::vector<Tensor> outputs(n);
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
      outputs[i] = replicas[i]->forward(inputs[i]);
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

  for (size_t i = 0; i < n; ++i) {
    if (errors[i]) throw Error(str_cat("replica ", i, " on ", devices[i], " failed: ", describe(errors[i])));
    MG_CHECK(outputs[i].defined(), "parallel_apply: replica ", i, " on ", devices[i],
             " returned an undefined tensor");
  }
  return outputs;
}

}  // namespace mg::parallel
