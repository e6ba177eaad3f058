#include "parallel/pipeline/pipeline.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "base/clock.h"
#include "base/error.h"
#include "core/autograd/split_backward.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::parallel {
namespace {

using Clock = std::chrono::steady_clock;

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

std::vector<std::shared_ptr<nn::Sequential> > pipeline_chunks(const nn::Sequential& model, int rank,
                                                              int num_ranks, int chunks) {
  MG_CHECK(num_ranks >= 1 && rank >= 0 && rank < num_ranks && chunks >= 1, "pipeline_chunks: rank ", rank,
           " of ", num_ranks, ", ", chunks, " chunks per rank");
  std::vector<std::shared_ptr<nn::Sequential> > mine;
  for (int k = 0; k < chunks; ++k)
    mine.push_back(pipeline_stage(model, k * num_ranks + rank, num_ranks * chunks));
  return mine;
}

Pipeline::Pipeline(std::shared_ptr<nn::Module> stage, ProcessGroup group, LossFn loss,
                   PipelineSchedule schedule)
    : chunks_{std::move(stage)}, group_(std::move(group)), loss_(std::move(loss)), schedule_(schedule) {
  MG_CHECK(chunks_.front() != nullptr, "Pipeline: the stage module is null");
  MG_CHECK(group_.defined(), "Pipeline: the process group is undefined");
  MG_CHECK(loss_ != nullptr, "Pipeline: no loss function");
  MG_CHECK(schedule_ != PipelineSchedule::Interleaved1F1B || group_.size() >= 2,
           "Pipeline: the interleaved schedule needs at least 2 ranks");
}

Pipeline::Pipeline(std::vector<std::shared_ptr<nn::Module> > chunks, ProcessGroup group, LossFn loss)
    : chunks_(std::move(chunks)),
      group_(std::move(group)),
      loss_(std::move(loss)),
      schedule_(PipelineSchedule::Interleaved1F1B) {
  MG_CHECK(!chunks_.empty(), "Pipeline: no model chunks");
  for (const auto& c : chunks_) MG_CHECK(c != nullptr, "Pipeline: a model chunk is null");
  MG_CHECK(group_.defined(), "Pipeline: the process group is undefined");
  MG_CHECK(loss_ != nullptr, "Pipeline: no loss function");
  MG_CHECK(group_.size() >= 2, "Pipeline: the interleaved schedule needs at least 2 ranks (got ",
           group_.size(), "); one rank runs its chunks as one stage");
}

std::vector<PipelineUnit> pipeline_order(PipelineSchedule schedule, int p, int rank, int m, int v) {
  MG_CHECK(p >= 1 && rank >= 0 && rank < p && m >= 1 && v >= 1, "pipeline_order: rank ", rank, " of ", p,
           ", ", m, " micro-batches, ", v, " chunks");
  MG_CHECK(v == 1 || schedule == PipelineSchedule::Interleaved1F1B,
           "pipeline_order: only the interleaved schedule runs several chunks per rank");
  using U = PipelineUnit;
  std::vector<U> order;
  if (schedule == PipelineSchedule::GPipe) {
    for (int i = 0; i < m; ++i) order.push_back({U::Forward, 0, i});
    for (int i = 0; i < m; ++i) order.push_back({U::Backward, 0, i});
    return order;
  }
  if (schedule == PipelineSchedule::ZeroBubbleH1) {
    // 1F1B's forwards and B's, in 1F1B's order (so the messages are 1F1B's); each B's W runs
    // as soon as more than `rank` W's wait, and in the drain after every B but the last, where
    // 1F1B would wait for the next gradient.
    const int warmup = std::min(p - 1 - rank, m);
    std::vector<int> waiting;  // micro-batches whose W has not run, oldest first
    size_t oldest = 0;
    auto input_grad = [&](int i) {
      order.push_back({U::InputGrad, 0, i});
      waiting.push_back(i);
    };
    auto weight_grad = [&] { order.push_back({U::WeightGrad, 0, waiting[oldest++]}); };
    for (int i = 0; i < warmup; ++i) order.push_back({U::Forward, 0, i});
    for (int i = warmup; i < m; ++i) {
      order.push_back({U::Forward, 0, i});
      input_grad(i - warmup);
      if (waiting.size() - oldest > static_cast<size_t>(rank)) weight_grad();
    }
    for (int i = m - warmup; i < m; ++i) {
      input_grad(i);
      if (i < m - 1) weight_grad();
    }
    while (oldest < waiting.size()) weight_grad();
    return order;
  }
  // 1F1B, plain (v = 1) or interleaved: forward unit k of the m v runs chunk c of micro-batch i,
  // taking micro-batches in groups of p (all of a group's chunk 0, then its chunk 1, ...);
  // backward unit k the same with the chunks reversed.
  const int total = m * v;
  auto unit = [&](int k, bool forward) {
    const int group = k / (p * v), within = k % (p * v);
    const int c = within / p;
    return U{forward ? U::Forward : U::Backward, forward ? c : v - 1 - c, group * p + within % p};
  };
  if (v == 1) {  // plain 1F1B: micro-batches in order
    const int warmup = std::min(p - 1 - rank, m);
    for (int i = 0; i < warmup; ++i) order.push_back({U::Forward, 0, i});
    for (int i = warmup; i < m; ++i) {
      order.push_back({U::Forward, 0, i});
      order.push_back({U::Backward, 0, i - warmup});
    }
    for (int i = m - warmup; i < m; ++i) order.push_back({U::Backward, 0, i});
    return order;
  }
  // Fill: every chunk but the last on a group of p, plus 2 per stage still below this one.
  const int warmup = std::min(2 * (p - 1 - rank) + (v - 1) * p, total);
  for (int k = 0; k < warmup; ++k) order.push_back(unit(k, true));
  for (int k = warmup; k < total; ++k) {
    order.push_back(unit(k, true));
    order.push_back(unit(k - warmup, false));
  }
  for (int k = total - warmup; k < total; ++k) order.push_back(unit(k, false));
  return order;
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

  const int v = num_chunks();
  // NCCL's send and recv between two ranks each wait until the other side's matching call is
  // posted, in issue order per pair. The interleaved order sends to a rank that is at that moment
  // sending to this one (the wrap from the last rank to the first), so both would wait forever;
  // Megatron posts each such pair together in one ncclGroupStart/End. Not done here yet.
  MG_CHECK(
      v == 1 || !group_.device().is_cuda(),
      "Pipeline::train_step: the interleaved schedule runs over MPI (CPU tensors) only for now: over NCCL "
      "its sends and receives would have to be posted in pairs (one NCCL group), which this pipeline "
      "does not do yet");
  MG_CHECK(v == 1 || m % p == 0,
           "Pipeline::train_step: the interleaved schedule takes micro-batches in groups of ", "the ", p,
           " ranks; ", m, " micro-batches do not divide into them");
  // Where chunk c of this rank sends its output and takes its input: the next and previous global
  // stage (k p + rank), on the next and previous rank, wrapping round from the last rank to the
  // first with the chunk index one up.
  const bool first_chunk_is_model_input = is_first(), last_chunk_is_model_output = is_last();
  auto takes_input = [&](int c) { return c == 0 && first_chunk_is_model_input; };
  auto makes_loss = [&](int c) { return c == v - 1 && last_chunk_is_model_output; };
  const int next = (rank + 1) % p, prev = (rank + p - 1) % p;

  PipelineStepResult result;
  const auto step_start = Clock::now();
  struct InFlight {
    Tensor input;   // what this chunk received (a leaf requiring grad), or the first chunk's micro-batch
    Tensor output;  // the chunk's output, or for the model's last chunk the micro-batch's loss
  };
  std::map<std::pair<int, int>, InFlight> in_flight;  // (chunk, micro-batch)

  auto forward = [&](int c, int i) {
    Tensor x = takes_input(c) ? inputs[static_cast<size_t>(i)] : recv_tensor(prev, kActivationTag);
    if (!takes_input(c)) x.set_requires_grad(true);
    const auto t0 = Clock::now();
    Tensor y = (*chunks_[static_cast<size_t>(c)])(x);
    if (makes_loss(c)) {
      Tensor loss = loss_(y, targets[static_cast<size_t>(i)]) * (1.0 / m);
      result.loss += loss.item<double>();
      in_flight[{c, i}] = {x, loss};
    } else {
      in_flight[{c, i}] = {x, y};
    }
    result.compute_ms += ms_since(t0);
    if (!makes_loss(c)) send_tensor(y, next, kActivationTag);
  };
  // The whole backward, or (ZB-H1) its input half, whose weight half waits in `waiting_w`.
  std::map<std::pair<int, int>, autograd::DeferredWeightGrad> waiting_w;
  auto backward = [&](int c, int i, bool split) {
    auto it = in_flight.find({c, i});
    MG_CHECK(it != in_flight.end(), "Pipeline: backward of chunk ", c, ", micro-batch ", i,
             " before its forward");
    InFlight f = std::move(it->second);
    in_flight.erase(it);
    Tensor grad = makes_loss(c) ? Tensor() : recv_tensor(next, kGradientTag);
    const auto t0 = Clock::now();
    if (split) {
      waiting_w[{c, i}] = autograd::backward_input(
          {f.output}, {grad}, takes_input(c) ? std::vector<Tensor>{} : std::vector<Tensor>{f.input});
    } else {
      f.output.backward(grad);
    }
    result.compute_ms += ms_since(t0);
    if (!takes_input(c)) send_tensor(f.input.grad(), prev, kGradientTag);
  };
  auto weight_grad = [&](int c, int i) {
    auto it = waiting_w.find({c, i});
    MG_CHECK(it != waiting_w.end(), "Pipeline: W of chunk ", c, ", micro-batch ", i, " before its B");
    const auto t0 = Clock::now();
    it->second.run();
    waiting_w.erase(it);
    result.compute_ms += ms_since(t0);
  };
  // Each direction between two ranks carries one kind of message (activations forward, gradients
  // backward) in an order both ends derive from the same unit numbering, so one tag per kind
  // suffices: MPI and NCCL deliver the messages of one (source, tag) in the order they were sent.
  for (const PipelineUnit& u : pipeline_order(schedule_, p, rank, m, v)) {
    switch (u.kind) {
      case PipelineUnit::Forward: forward(u.chunk, u.micro_batch); break;
      case PipelineUnit::Backward: backward(u.chunk, u.micro_batch, false); break;
      case PipelineUnit::InputGrad: backward(u.chunk, u.micro_batch, true); break;
      case PipelineUnit::WeightGrad: weight_grad(u.chunk, u.micro_batch); break;
    }
  }
  for (const WorkPtr& w : pending_sends_) w->wait();
  pending_sends_.clear();
  result.step_ms = ms_since(step_start);
  return result;
}

}  // namespace mg::parallel
