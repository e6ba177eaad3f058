#include "parallel/pipeline/pipeline.h"

#include <algorithm>
#include <chrono>
#include <deque>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::parallel {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// Activations flow to rank + 1 under one tag, their gradients to rank - 1 under the other.
constexpr int kActivationTag = 0x7061;  // "pa"
constexpr int kGradientTag = 0x7067;    // "pg"
constexpr int kMaxDims = 6;             // header: [ndim, dtype, d0 .. d5]

}  // namespace

std::shared_ptr<nn::Sequential> pipeline_stage(const nn::Sequential& model, int stage, int num_stages) {
  const int n = static_cast<int>(model.size());
  MG_CHECK(num_stages >= 1 && stage >= 0 && stage < num_stages, "pipeline_stage: stage ", stage, " of ",
           num_stages);
  MG_CHECK(n >= num_stages, "pipeline_stage: ", n, " layers cannot fill ", num_stages, " stages");
  const int begin = stage * n / num_stages, end = (stage + 1) * n / num_stages;
  auto part = std::make_shared<nn::Sequential>();
  for (int i = begin; i < end; ++i) part->push_back(model.ptr(static_cast<size_t>(i)));
  return part;
}

Pipeline::Pipeline(std::shared_ptr<nn::Module> stage, ProcessGroup group, LossFn loss,
                   PipelineSchedule schedule)
    : stage_(std::move(stage)), group_(std::move(group)), loss_(std::move(loss)), schedule_(schedule) {
  MG_CHECK(stage_ != nullptr, "Pipeline: the stage module is null");
  MG_CHECK(group_.defined(), "Pipeline: the process group is undefined");
  MG_CHECK(loss_ != nullptr, "Pipeline: no loss function");
}

void Pipeline::send_tensor(const Tensor& t, int dst, int tag) {
  MG_CHECK(t.dim() <= kMaxDims, "Pipeline: a ", t.dim(), "-d tensor between stages (at most ", kMaxDims, ")");
  std::vector<int64_t> header(2 + kMaxDims, 0);
  header[0] = t.dim();
  header[1] = static_cast<int64_t>(t.dtype());
  for (int64_t d = 0; d < t.dim(); ++d) header[static_cast<size_t>(2 + d)] = t.size(d);
  Tensor shape = tensor<int64_t>(header, Shape{2 + kMaxDims}, TensorOptions{DType::i64}).to(group_.device());
  Tensor data;
  {
    NoGradGuard no_grad;
    data = t.detach().contiguous();
  }
  pending_sends_.push_back(group_.send(shape, dst, tag));
  pending_sends_.push_back(group_.send(data, dst, tag));
}

Tensor Pipeline::recv_tensor(int src, int tag) {
  Tensor shape = zeros({2 + kMaxDims}, TensorOptions{DType::i64, group_.device()});
  group_.recv(shape, src, tag)->wait();
  std::vector<int64_t> header = shape.to(Device::cpu()).to_vector<int64_t>();
  // A header that is not one send_tensor writes means the stages disagree (or memory was
  // overwritten in flight): an error naming it, never a read past the header.
  const bool dims_ok = header[0] >= 0 && header[0] <= kMaxDims;
  const bool dtype_ok = header[1] >= 0 && header[1] <= static_cast<int64_t>(DType::boolean);
  bool sizes_ok = dims_ok;
  for (int64_t d = 0; sizes_ok && d < header[0]; ++d) sizes_ok = header[static_cast<size_t>(2 + d)] >= 0;
  MG_CHECK(dims_ok && dtype_ok && sizes_ok, "Pipeline: rank ", group_.rank(),
           " received a malformed header from rank ", src, " (tag ", tag, "): ", header[0],
           " dimensions, dtype code ", header[1]);
  Shape dims(header.begin() + 2, header.begin() + 2 + header[0]);
  Tensor data = empty(dims, TensorOptions{static_cast<DType>(header[1]), group_.device()});
  group_.recv(data, src, tag)->wait();
  return data;
}

PipelineStepResult Pipeline::train_step(const Tensor& input, const Tensor& target, int micro_batches) {
  const int p = group_.size(), rank = group_.rank(), m = micro_batches;
  MG_CHECK(m >= 1, "Pipeline::train_step: micro_batches must be >= 1, got ", m);
  auto cut = [m](const Tensor& whole, const char* what) {
    MG_CHECK(whole.defined(), "Pipeline::train_step: this stage needs the ", what);
    MG_CHECK(whole.size(0) % m == 0, "Pipeline::train_step: the ", what, "'s ", whole.size(0),
             " rows do not divide into ", m, " micro-batches");
    std::vector<Tensor> parts;
    const int64_t rows = whole.size(0) / m;
    for (int i = 0; i < m; ++i) parts.push_back(whole.narrow(0, i * rows, rows));
    return parts;
  };
  const std::vector<Tensor> inputs = is_first() ? cut(input, "input") : std::vector<Tensor>();
  const std::vector<Tensor> targets = is_last() ? cut(target, "target") : std::vector<Tensor>();

  PipelineStepResult result;
  const auto step_start = Clock::now();
  struct InFlight {
    Tensor input;   // what this stage received (a leaf requiring grad), or the first stage's chunk
    Tensor output;  // the stage's output, or on the last stage the micro-batch's loss
  };
  std::deque<InFlight> in_flight;
  int forwards = 0, backwards = 0;

  auto forward = [&] {
    const int i = forwards++;
    Tensor x = is_first() ? inputs[static_cast<size_t>(i)] : recv_tensor(rank - 1, kActivationTag);
    if (!is_first()) x.set_requires_grad(true);
    const auto t0 = Clock::now();
    Tensor y = (*stage_)(x);
    if (is_last()) {
      Tensor loss = loss_(y, targets[static_cast<size_t>(i)]) * (1.0 / m);
      result.loss += loss.item<double>();
      in_flight.push_back({x, loss});
    } else {
      in_flight.push_back({x, y});
    }
    result.compute_ms += ms_since(t0);
    if (!is_last()) send_tensor(y, rank + 1, kActivationTag);
  };
  auto backward = [&] {
    ++backwards;
    InFlight f = std::move(in_flight.front());
    in_flight.pop_front();
    Tensor grad = is_last() ? Tensor() : recv_tensor(rank + 1, kGradientTag);
    const auto t0 = Clock::now();
    f.output.backward(grad);
    result.compute_ms += ms_since(t0);
    if (!is_first()) send_tensor(f.input.grad(), rank - 1, kGradientTag);
  };

  if (schedule_ == PipelineSchedule::GPipe) {
    while (forwards < m) forward();
    while (backwards < m) backward();
  } else {
    // 1F1B: fill the pipe below this stage, alternate, then drain.
    const int warmup = std::min(p - 1 - rank, m);
    while (forwards < warmup) forward();
    while (forwards < m) {
      forward();
      backward();
    }
    while (backwards < m) backward();
  }
  for (const WorkPtr& w : pending_sends_) w->wait();
  pending_sends_.clear();
  result.step_ms = ms_since(step_start);
  return result;
}

}  // namespace mg::parallel
