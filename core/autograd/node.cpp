#include "core/autograd/node.h"

#include <atomic>

#include "core/grad_mode.h"
#include "core/ops.h"

namespace mg::autograd {
namespace {
std::atomic<uint64_t> next_sequence_nr{0};

TensorMeta meta_of(const Tensor& t) { return TensorMeta{t.shape(), t.dtype(), t.device()}; }
}  // namespace

Node::Node() : sequence_nr(next_sequence_nr.fetch_add(1)) {}

// ---------------------------------------------------------------------------
AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {
  Tensor l(leaf_);
  input_meta.push_back(meta_of(l));
  output_meta.push_back(meta_of(l));
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  Tensor grad = std::move(grad_outputs.at(0));
  if (!grad.defined()) return {};
  AutogradMeta& meta = leaf_->autograd_meta();
  for (auto& hook : meta.leaf_hooks) {
    Tensor replaced = hook(grad);
    if (replaced.defined()) grad = replaced;
  }
  Tensor leaf(leaf_);
  MG_CHECK(grad.shape() == leaf.shape() && grad.dtype() == leaf.dtype() && grad.device() == leaf.device(),
           "AccumulateGrad: gradient ", shape_str(grad.shape()), " ", grad.dtype(), " on ", grad.device(),
           " does not match the leaf ", shape_str(leaf.shape()), " ", leaf.dtype(), " on ", leaf.device());
  if (!meta.grad.defined()) {
    // The incoming gradient may alias another tensor (AddBackward hands the same
    // tensor to both inputs), so .grad gets its own memory unless nobody else holds it.
    const bool sole_owner = grad.impl_ptr().use_count() == 1 && grad.storage().use_count() == 1 &&
                            grad.is_contiguous() && grad.offset() == 0;
    meta.grad = sole_owner ? grad : grad.clone();
  } else {
    meta.grad.add_(grad);
  }
  for (auto& hook : meta.post_accumulate_hooks) hook(leaf);
  return {};
}

// ---------------------------------------------------------------------------
SavedTensor::SavedTensor(const Tensor& tensor, std::string saved_by) : saved_by_(std::move(saved_by)) {
  if (!tensor.defined()) return;
  data_ = tensor.detach();
  version_ = tensor.version();
}

Tensor SavedTensor::unpack() const {
  if (!data_.defined()) return data_;
  MG_CHECK(data_.version() == version_,
           "one of the tensors needed for gradient computation has been modified by an in-place operation: ",
           saved_by_, " saved a tensor of shape ", shape_str(data_.shape()), " at version ", version_,
           ", and it is now at version ", data_.version(),
           ". Clone it before the in-place op, or do the in-place op after backward.");
  return data_;
}

// ---------------------------------------------------------------------------
std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>&& grad_outputs) {
  MG_CHECK(
      static_cast<bool>(backward_), "trying to run backward through ", name_,
      " a second time (its saved tensors were freed). Pass retain_graph=true to the first backward if you "
      "need to call backward twice.");
  return backward_(grad_outputs);
}

// ---------------------------------------------------------------------------
bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  AutogradMeta& meta = leaf.impl()->autograd_meta();
  std::shared_ptr<Node> node = meta.grad_accumulator.lock();
  if (!node) {
    node = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
    meta.grad_accumulator = node;
  }
  return node;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return Edge{};
  if (t.grad_fn()) return Edge{t.grad_fn(), t.impl()->autograd->output_nr};
  return Edge{grad_accumulator(t), 0};
}

std::shared_ptr<Node> record(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, FunctionNode::Backward backward) {
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  for (const Tensor& input : inputs) {
    node->next_edges.push_back(gradient_edge(input));
    node->input_meta.push_back(input.defined() ? meta_of(input) : TensorMeta{});
  }
  uint32_t output_nr = 0;
  for (const Tensor& output : outputs) {
    node->output_meta.push_back(meta_of(output));
    AutogradMeta& meta = output.impl()->autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = output_nr++;
  }
  return node;
}

}  // namespace mg::autograd
