// The backward engine: a dependency-counted walk of the graph.
//
// 1. From the roots, count for every reachable Node how many edges point at it
//    (its dependencies): a node may run only when all of its gradients arrived.
// 2. Seed the roots' input buffers with the given gradients.
// 3. Repeatedly take a ready node (all dependencies satisfied), highest sequence
//    number first (= created last in forward), run its tensor hooks, call
//    apply(), and add each resulting gradient into the buffer of the node its
//    edge points to; a node whose count drops to zero becomes ready.
// 4. Run the callbacks queued during the pass (DDP waits for its buckets here); a pass nested in
//    another (a checkpointed block's recompute) leaves them to the outer pass.
//
// A graph on one device runs on the calling thread: easy to trace, and deterministic.
// A graph that spans several devices (DataParallel's replicas on cpu:0, cpu:1, ... or
// cuda:0, cuda:1, ...) runs each device's nodes on a thread of its own, as PyTorch's engine
// does for GPUs: otherwise every replica's backward would run one after the other and
// DataParallel would parallelise only the forward. The caller's thread takes the device of
// the first root; the others get a worker for the duration of the pass. Bookkeeping
// (dependency counts, gradient buffers) is shared under one mutex; formulas run outside it.
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>

#include "core/autograd/graph_task.h"
#include "core/cuda_stream.h"
#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::autograd {
namespace detail {

GraphTask*& current_task() {
  thread_local GraphTask* task = nullptr;
  return task;
}

RunningTask::RunningTask(GraphTask& task) : task_(task), outer_(current_task()) { current_task() = &task; }

RunningTask::~RunningTask() { current_task() = outer_; }

void RunningTask::finish() {
  // A backward run from inside another one (activation checkpointing's recompute) hands its
  // callbacks to the outer pass: "once the current backward pass has finished" means the pass
  // the user started, so DDP's finalize still waits for every bucket of the whole step.
  if (outer_ != nullptr) {
    std::lock_guard<std::mutex> lock(outer_->callbacks_mutex);
    for (auto& callback : task_.callbacks) outer_->callbacks.push_back(std::move(callback));
    task_.callbacks.clear();
    return;
  }
  // Callbacks may queue more callbacks (index loop, not iterators).
  for (size_t i = 0; i < task_.callbacks.size(); ++i) {
    auto callback = std::move(task_.callbacks[i]);
    callback();
  }
  task_.callbacks.clear();
}

void accumulate_into(std::vector<Tensor>& buffer, size_t slot, const Tensor& grad) {
  if (buffer.size() <= slot) buffer.resize(slot + 1);
  buffer[slot] = buffer[slot].defined() ? add(buffer[slot], grad) : grad;
}

void run_pre_hooks(Node& node, std::vector<Tensor>& grads) {
  for (auto& [output_nr, hook] : node.pre_hooks) {
    if (output_nr >= grads.size() || !grads[output_nr].defined()) continue;
    Tensor replaced = hook(grads[output_nr]);
    if (replaced.defined()) grads[output_nr] = replaced;
  }
}

// Formulas may assume every output gradient is present: fill the missing ones
// with zeros, unless none arrived at all (then the node contributes nothing).
bool materialize_missing_grads(const Node& node, std::vector<Tensor>& grads) {
  grads.resize(node.output_meta.size());
  bool any = false;
  for (const Tensor& g : grads) any = any || g.defined();
  if (!any) return false;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) continue;
    const TensorMeta& meta = node.output_meta[i];
    grads[i] = zeros(meta.shape, TensorOptions{meta.dtype, meta.device, false});
  }
  return true;
}

void check_gradient(const Node& node, size_t input, const Tensor& grad) {
  const TensorMeta& meta = node.input_meta.at(input);
  MG_CHECK(grad.shape() == meta.shape, node.name(), " returned a gradient of shape ", shape_str(grad.shape()),
           " for input ", input, " of shape ", shape_str(meta.shape));
  MG_CHECK(grad.device() == meta.device, node.name(), " returned a gradient on ", grad.device(),
           " for input ", input, " on ", meta.device);
}

Device node_device(const Node& node) {
  if (!node.output_meta.empty()) return node.output_meta[0].device;
  if (!node.input_meta.empty()) return node.input_meta[0].device;
  return Device::cpu(0);
}

Edge seed_root(const Tensor& root, const Tensor& given, size_t index, GraphTask& task, const char* who) {
  MG_CHECK(
      root.requires_grad(), who, ": element ", index,
      " of the roots does not require grad and has no grad_fn (did you forget set_requires_grad(true), or "
      "run the forward under NoGradGuard?)");
  Tensor grad = given;
  if (!grad.defined()) {
    MG_CHECK(root.numel() == 1, who,
             ": grad can be implicitly created only for scalar outputs, but this "
             "tensor has shape ",
             shape_str(root.shape()), "; pass a gradient of that shape to backward()");
    grad = ones(root.shape(), TensorOptions{root.dtype(), root.device(), false});
  }
  MG_CHECK(grad.shape() == root.shape(), who, ": gradient shape ", shape_str(grad.shape()),
           " does not match the tensor's shape ", shape_str(root.shape()));
  Edge edge = gradient_edge(root);
  accumulate_into(task.input_buffers[edge.node.get()], edge.input_nr, grad.detach());
  return edge;
}

namespace {
thread_local const std::vector<bool>* wanted_inputs = nullptr;  // set by apply_masked
}  // namespace

std::vector<Tensor> apply_masked(Node& node, std::vector<Tensor>&& grads, const std::vector<bool>* mask) {
  struct Restore {
    const std::vector<bool>* outer;
    ~Restore() { wanted_inputs = outer; }
  } restore{wanted_inputs};
  wanted_inputs = mask;
  return node.apply(std::move(grads));
}

}  // namespace detail

bool needs_input_grad(size_t input) {
  const std::vector<bool>* mask = detail::wanted_inputs;
  return mask == nullptr || (input < mask->size() && (*mask)[input]);
}

namespace {
using namespace detail;

void count_dependencies(const std::vector<std::shared_ptr<Node>>& roots, GraphTask& task) {
  std::vector<Node*> stack;
  std::unordered_map<Node*, bool> seen;
  for (const auto& root : roots) {
    if (!seen[root.get()]) {
      seen[root.get()] = true;
      stack.push_back(root.get());
    }
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges) {
      if (!edge.is_valid()) continue;
      ++task.dependencies[edge.node.get()];
      if (!seen[edge.node.get()]) {
        seen[edge.node.get()] = true;
        stack.push_back(edge.node.get());
      }
    }
  }
}

// Hooks, the formula, and the checks of what it returned.
std::vector<Tensor> run_node(Node& node, std::vector<Tensor> grads_in, bool retain_graph) {
  run_pre_hooks(node, grads_in);
  std::vector<Tensor> grads_out;
  if (materialize_missing_grads(node, grads_in)) {
    grads_out = apply_masked(node, std::move(grads_in), nullptr);  // every input (a nested pass too)
    if (!retain_graph) node.release_saved();
  }
  const bool is_accumulator = dynamic_cast<AccumulateGrad*>(&node) != nullptr;
  MG_CHECK(is_accumulator || grads_out.empty() || grads_out.size() == node.next_edges.size(), node.name(),
           " returned ", grads_out.size(), " gradients for ", node.next_edges.size(), " inputs");
  for (size_t i = 0; i < node.next_edges.size() && i < grads_out.size(); ++i)
    if (node.next_edges[i].is_valid() && grads_out[i].defined()) check_gradient(node, i, grads_out[i]);
  return grads_out;
}

// Hands `node`'s output gradients to the nodes its edges lead to (summing into their input
// buffers), and calls `ready(next)` for each node whose last awaited gradient this was.
template <class OnReady>
void pass_gradients_on(const Node& node, const std::vector<Tensor>& grads_out, GraphTask& task,
                       std::unordered_map<Node*, bool>& queued, OnReady&& ready) {
  for (size_t i = 0; i < node.next_edges.size(); ++i) {
    const Edge& edge = node.next_edges[i];
    if (!edge.is_valid()) continue;
    if (i < grads_out.size() && grads_out[i].defined())
      accumulate_into(task.input_buffers[edge.node.get()], edge.input_nr, grads_out[i]);
    if (--task.dependencies[edge.node.get()] == 0 && !queued[edge.node.get()]) {
      queued[edge.node.get()] = true;
      ready(edge.node);
    }
  }
}

// Whether the graph under `roots` has nodes on more than one device.
bool spans_devices(const std::vector<std::shared_ptr<Node>>& roots, const GraphTask& task) {
  Device first = node_device(*roots.front());
  for (const auto& root : roots)
    if (node_device(*root) != first) return true;
  for (const auto& entry : task.dependencies)
    if (node_device(*entry.first) != first) return true;
  return false;
}

// The multi-device pass: one ready queue and one thread per device.
void run_on_device_threads(const std::vector<std::shared_ptr<Node>>& initial, GraphTask& task,
                           bool retain_graph, Device caller_device) {
  std::mutex mutex;
  std::condition_variable wake;
  std::map<std::pair<int, int>, ReadyQueue> queues;  // (device type, index) -> its ready nodes
  auto key_of = [](Device d) { return std::make_pair(static_cast<int>(d.type), d.index); };
  std::unordered_map<Node*, bool> queued;
  int64_t outstanding = 0;  // nodes queued and not yet finished
  std::exception_ptr error;

  for (const auto& node : initial) {
    queued[node.get()] = true;
    queues[key_of(node_device(*node))].push(node);
    ++outstanding;
  }
  // Every device that may get work needs its queue (and thread) from the start.
  for (const auto& entry : task.dependencies) queues[key_of(node_device(*entry.first))];

  // CUDA: the worker threads queue their kernels on the caller's current stream of every device
  // (current streams are per host thread, so a new thread would start on the default streams and
  // its work would not be ordered with what the caller queued on a stream it had made current).
  std::map<int, cuda::Stream> caller_streams;  // CUDA device index -> the caller's current stream
  for (const auto& entry : queues)
    if (entry.first.first == static_cast<int>(DeviceType::CUDA))
      caller_streams[entry.first.second] = cuda::current_stream(entry.first.second);

  auto work = [&](std::pair<int, int> key) {
    GraphTask* outer = current_task();
    current_task() = &task;
    NoGradGuard no_grad;
    std::vector<std::unique_ptr<cuda::StreamGuard>> stream_guards;
    if (key != key_of(caller_device)) {
      // Every other device's stream first, this thread's own device last (a guard also makes its
      // device current).
      for (const auto& [index, stream] : caller_streams)
        if (!(key.first == static_cast<int>(DeviceType::CUDA) && key.second == index))
          stream_guards.push_back(std::make_unique<cuda::StreamGuard>(stream));
      if (key.first == static_cast<int>(DeviceType::CUDA))
        stream_guards.push_back(std::make_unique<cuda::StreamGuard>(caller_streams.at(key.second)));
    }
    for (;;) {
      std::shared_ptr<Node> node;
      std::vector<Tensor> grads_in;
      {
        std::unique_lock<std::mutex> lock(mutex);
        wake.wait(lock, [&] { return outstanding == 0 || error || !queues[key].empty(); });
        if (outstanding == 0 || error) break;
        node = queues[key].top();
        queues[key].pop();
        grads_in = std::move(task.input_buffers[node.get()]);
        task.input_buffers.erase(node.get());
      }
      try {
        std::vector<Tensor> grads_out = run_node(*node, std::move(grads_in), retain_graph);
        std::lock_guard<std::mutex> lock(mutex);
        pass_gradients_on(*node, grads_out, task, queued, [&](const std::shared_ptr<Node>& next) {
          queues[key_of(node_device(*next))].push(next);
          ++outstanding;
        });
        --outstanding;
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
      wake.notify_all();
    }
    current_task() = outer;
  };

  std::vector<std::thread> workers;
  for (const auto& entry : queues)
    if (entry.first != key_of(caller_device)) workers.emplace_back(work, entry.first);
  work(key_of(caller_device));
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (outstanding != 0 && !error)
      error = std::make_exception_ptr(Error("backward: device threads stopped early"));
  }
  wake.notify_all();
  for (auto& t : workers) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph) {
  MG_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(),
           " gradients");
  GraphTask task;
  RunningTask running(task);

  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i)
    root_nodes.push_back(seed_root(roots[i], grads[i], i, task, "backward").node);
  count_dependencies(root_nodes, task);

  std::vector<std::shared_ptr<Node>> initial;
  std::unordered_map<Node*, bool> queued;
  for (const auto& node : root_nodes) {
    if (task.dependencies[node.get()] == 0 && !queued[node.get()]) {
      queued[node.get()] = true;
      initial.push_back(node);
    }
  }

  NoGradGuard no_grad;  // formulas compute plain tensors; no graph of the graph
  if (spans_devices(root_nodes, task)) {
    run_on_device_threads(initial, task, retain_graph, node_device(*root_nodes.front()));
  } else {
    ReadyQueue ready;
    for (const auto& node : initial) ready.push(node);
    while (!ready.empty()) {
      std::shared_ptr<Node> node = ready.top();
      ready.pop();
      std::vector<Tensor> grads_in = std::move(task.input_buffers[node.get()]);
      task.input_buffers.erase(node.get());
      std::vector<Tensor> grads_out = run_node(*node, std::move(grads_in), retain_graph);
      pass_gradients_on(*node, grads_out, task, queued,
                        [&](const std::shared_ptr<Node>& next) { ready.push(next); });
    }
  }
  running.finish();
}

void queue_callback(std::function<void()> callback) {
  GraphTask* task = current_task();
  MG_CHECK(task != nullptr, "queue_callback: only valid while a backward pass is running");
  std::lock_guard<std::mutex> lock(task->callbacks_mutex);
  task->callbacks.push_back(std::move(callback));
}

bool in_backward() { return current_task() != nullptr; }

}  // namespace mg::autograd
