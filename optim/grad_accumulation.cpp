// GradAccumulator: scale each micro-batch loss by 1/k, backward, count to k.
// The gradient sum itself is the autograd engine's AccumulateGrad.
#include "optim/grad_accumulation.h"

#include "base/error.h"
#include "core/ops.h"

namespace mg::optim {

GradAccumulator::GradAccumulator(int64_t micro_batches) : micro_batches_(micro_batches) {
  MG_CHECK(micro_batches >= 1, "GradAccumulator: need at least 1 micro-batch per step, got ", micro_batches);
}

bool GradAccumulator::backward(const Tensor& loss) {
  MG_CHECK(loss.defined() && loss.numel() == 1,
           "GradAccumulator::backward: expected a one-element loss, got ",
           loss.defined() ? shape_str(loss.shape()) : std::string("an undefined tensor"));
  (micro_batches_ == 1 ? loss : loss / static_cast<double>(micro_batches_)).backward();
  count_ = (count_ + 1) % micro_batches_;
  return count_ == 0;
}

}  // namespace mg::optim
