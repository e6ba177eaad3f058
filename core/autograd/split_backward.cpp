// backward_input (B) and DeferredWeightGrad::run (W): one backward pass cut in two.
//
// Why the cut is clean: call a node "on the B path" when one of its edges leads, through any
// number of nodes, to one of the inputs' accumulators. A node off the path can only pass
// gradients to nodes off the path (if it reached an on-path node it would reach the inputs
// too), so:
//   B  counts dependencies along on-path edges only and runs the on-path nodes in the engine's
//      order; it is complete once they have run, because no off-path node feeds them;
//   W  starts from what B left (the on-path nodes' off-path edges, with the same incoming
//      gradients, and the roots B never reached) and walks a subgraph B never touched.
// Every edge of the graph is taken exactly once, by B or by W, so the gradients accumulated are
// backward()'s, summed in the same places.
#include "core/autograd/split_backward.h"

#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/autograd/graph_task.h"
#include "core/grad_mode.h"

namespace mg::autograd {
namespace {
using namespace detail;

// The nodes reachable from `roots`, and which of them reach one of `targets` (post-order walk,
// no recursion: a deep model must not overflow the stack).
std::unordered_map<Node*, bool> mark_input_paths(const std::vector<std::shared_ptr<Node>>& roots,
                                                 const std::unordered_set<Node*>& targets) {
  std::unordered_map<Node*, bool> on_path;      // every reachable node; true if it reaches a target
  std::vector<std::pair<Node*, size_t>> stack;  // (node, next edge to look at)
  auto visit = [&](Node* node) {
    if (on_path.count(node) != 0) return;
    on_path[node] = targets.count(node) != 0;
    stack.emplace_back(node, 0);
  };
  for (const auto& root : roots) {
    visit(root.get());
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->next_edges.size()) {
        const Edge& edge = node->next_edges[next++];
        if (!edge.is_valid()) continue;
        // A node met before is finished (a graph has no cycles): take its answer now, or this
        // parent would miss a path that runs through it (a diamond: q, k and v of one matmul).
        if (auto seen = on_path.find(edge.node.get()); seen != on_path.end()) {
          if (seen->second) on_path[node] = true;
          continue;
        }
        visit(edge.node.get());
        continue;
      }
      Node* done = node;
      stack.pop_back();
      if (!stack.empty() && on_path[done]) on_path[stack.back().first] = true;
    }
  }
  return on_path;
}

}  // namespace

struct DeferredWeightGrad::State {
  struct Start {
    std::shared_ptr<Node> node;
    std::vector<Tensor> grads;  // its incoming gradients, hooks already applied
    std::vector<bool> wanted;   // the inputs W asks it for
  };
  std::vector<Start> starts;  // on-path nodes with off-path edges
  struct WaitingRoot {
    std::shared_ptr<Node> node;
    std::vector<Tensor> seed;
  };
  std::vector<WaitingRoot> roots;  // the roots B never reached, with their seeds
  bool retain_graph = false;
};

DeferredWeightGrad::DeferredWeightGrad() = default;
DeferredWeightGrad::~DeferredWeightGrad() = default;
DeferredWeightGrad::DeferredWeightGrad(DeferredWeightGrad&&) noexcept = default;
DeferredWeightGrad& DeferredWeightGrad::operator=(DeferredWeightGrad&&) noexcept = default;

size_t DeferredWeightGrad::num_deferred() const {
  return state_ ? state_->starts.size() + state_->roots.size() : 0;
}

DeferredWeightGrad backward_input(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor>& inputs, bool retain_graph) {
  MG_CHECK(roots.size() == grads.size(), "backward_input: ", roots.size(), " roots but ", grads.size(),
           " gradients");
  GraphTask task;
  RunningTask running(task);
  NoGradGuard no_grad;

  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i)
    root_nodes.push_back(seed_root(roots[i], grads[i], i, task, "backward_input").node);
  std::vector<std::shared_ptr<Node>> accumulators;  // held: a pointer in `targets` must stay valid
  std::unordered_set<Node*> targets;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& input = inputs[i];
    MG_CHECK(input.defined() && input.requires_grad() && !input.grad_fn(), "backward_input: input ", i,
             " must be a leaf that requires grad (the stage's received activation, for instance)");
    accumulators.push_back(grad_accumulator(input));
    targets.insert(accumulators.back().get());
  }
  const std::unordered_map<Node*, bool> on_path = mark_input_paths(root_nodes, targets);
  for (size_t i = 0; i < inputs.size(); ++i)
    MG_CHECK(on_path.count(accumulators[i].get()) != 0, "backward_input: input ", i,
             " is not used by the graph of the roots, so it would get no gradient");
  const Device device = node_device(*root_nodes.front());
  for (const auto& [node, ignored] : on_path)
    MG_CHECK(node_device(*node) == device, "backward_input: the graph has nodes on ", device, " and on ",
             node_device(*node), "; the split backward runs graphs on one device");
  auto reaches_input = [&](const Edge& edge) { return edge.is_valid() && on_path.at(edge.node.get()); };

  DeferredWeightGrad deferred;
  deferred.state_ = std::make_unique<DeferredWeightGrad::State>();
  DeferredWeightGrad::State& state = *deferred.state_;
  state.retain_graph = retain_graph;

  // B's dependencies: on-path edges between on-path nodes.
  for (const auto& [node, reaches] : on_path) {
    if (!reaches) continue;
    for (const Edge& edge : node->next_edges)
      if (reaches_input(edge)) ++task.dependencies[edge.node.get()];
  }
  ReadyQueue ready;
  std::unordered_set<Node*> queued;
  for (const auto& node : root_nodes) {
    if (!on_path.at(node.get())) {  // W's, with its seed
      if (queued.insert(node.get()).second) {
        state.roots.push_back({node, std::move(task.input_buffers[node.get()])});
        task.input_buffers.erase(node.get());
      }
      continue;
    }
    if (task.dependencies[node.get()] == 0 && queued.insert(node.get()).second) ready.push(node);
  }

  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads_in = std::move(task.input_buffers[node.get()]);
    task.input_buffers.erase(node.get());
    run_pre_hooks(*node, grads_in);
    std::vector<Tensor> grads_out;
    if (materialize_missing_grads(*node, grads_in)) {
      std::vector<bool> for_b(node->next_edges.size()), for_w(node->next_edges.size());
      bool any_w = false;
      for (size_t i = 0; i < node->next_edges.size(); ++i) {
        for_b[i] = reaches_input(node->next_edges[i]);
        for_w[i] = node->next_edges[i].is_valid() && !for_b[i];
        any_w = any_w || for_w[i];
      }
      if (any_w) {
        grads_out = apply_masked(*node, std::vector<Tensor>(grads_in), &for_b);
        state.starts.push_back({node, std::move(grads_in), std::move(for_w)});
      } else {
        grads_out = apply_masked(*node, std::move(grads_in), nullptr);
        if (!retain_graph) node->release_saved();
      }
    }
    const bool is_accumulator = dynamic_cast<AccumulateGrad*>(node.get()) != nullptr;
    MG_CHECK(is_accumulator || grads_out.empty() || grads_out.size() == node->next_edges.size(), node->name(),
             " returned ", grads_out.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      if (!reaches_input(edge)) continue;  // W's: a formula that ignores the mask computed it anyway
      if (i < grads_out.size() && grads_out[i].defined()) {
        check_gradient(*node, i, grads_out[i]);
        accumulate_into(task.input_buffers[edge.node.get()], edge.input_nr, grads_out[i]);
      }
      if (--task.dependencies[edge.node.get()] == 0 && queued.insert(edge.node.get()).second)
        ready.push(edge.node);
    }
  }
  running.finish();
  return deferred;
}

void DeferredWeightGrad::run() {
  MG_CHECK(pending(), "DeferredWeightGrad::run: ",
           ran_ ? "the weight gradients were already computed (run() once per backward_input)"
                : "nothing to run (not made by backward_input)");
  ran_ = true;
  State& state = *state_;
  GraphTask task;
  RunningTask running(task);
  NoGradGuard no_grad;

  // W's dependencies: the starts' off-path edges and every edge below them and below the
  // unreached roots (all off the B path).
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  auto reach = [&](const Edge& edge) {
    ++task.dependencies[edge.node.get()];
    if (seen.insert(edge.node.get()).second) stack.push_back(edge.node.get());
  };
  for (const State::Start& start : state.starts)
    for (size_t i = 0; i < start.wanted.size(); ++i)
      if (start.wanted[i]) reach(start.node->next_edges[i]);
  for (const State::WaitingRoot& root : state.roots)
    if (seen.insert(root.node.get()).second) stack.push_back(root.node.get());
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges)
      if (edge.is_valid()) reach(edge);
  }
  for (State::WaitingRoot& root : state.roots) task.input_buffers[root.node.get()] = std::move(root.seed);

  // One queue, the engine's order: a start runs with its saved gradients and asks for W's inputs
  // only; any other node runs as in backward().
  std::unordered_map<Node*, State::Start*> start_of;
  ReadyQueue ready;
  for (State::Start& start : state.starts) {
    start_of[start.node.get()] = &start;
    ready.push(start.node);
  }
  for (const State::WaitingRoot& root : state.roots)
    if (task.dependencies[root.node.get()] == 0) ready.push(root.node);
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads_out;
    const std::vector<bool>* wanted = nullptr;
    auto start = start_of.find(node.get());
    if (start != start_of.end()) {
      wanted = &start->second->wanted;
      grads_out = apply_masked(*node, std::move(start->second->grads), wanted);
    } else {
      std::vector<Tensor> grads_in = std::move(task.input_buffers[node.get()]);
      task.input_buffers.erase(node.get());
      run_pre_hooks(*node, grads_in);
      if (materialize_missing_grads(*node, grads_in))
        grads_out = apply_masked(*node, std::move(grads_in), nullptr);
    }
    if (!state.retain_graph) node->release_saved();
    const bool is_accumulator = dynamic_cast<AccumulateGrad*>(node.get()) != nullptr;
    MG_CHECK(is_accumulator || grads_out.empty() || grads_out.size() == node->next_edges.size(), node->name(),
             " returned ", grads_out.size(), " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& edge = node->next_edges[i];
      if (!edge.is_valid() || (wanted != nullptr && !(*wanted)[i])) continue;  // B's, already passed
      if (i < grads_out.size() && grads_out[i].defined()) {
        check_gradient(*node, i, grads_out[i]);
        accumulate_into(task.input_buffers[edge.node.get()], edge.input_nr, grads_out[i]);
      }
      if (--task.dependencies[edge.node.get()] == 0) ready.push(edge.node);
    }
  }
  state_.reset();  // the graph's remaining saved tensors go with it
  running.finish();
}

}  // namespace mg::autograd
