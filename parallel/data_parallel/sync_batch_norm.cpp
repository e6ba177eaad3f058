#include "parallel/data_parallel/sync_batch_norm.h"

#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "nn/normalization.h"

namespace mg::parallel {

Tensor all_reduce_with_gradient(const Tensor& x, const ProcessGroup& group) {
  Tensor reduced = x.detach().contiguous().clone();
  ProcessGroup pg = group;
  pg.allreduce(reduced, ReduceOp::Sum)->wait();
  if (GradMode::is_enabled() && x.requires_grad()) {
    autograd::record("AllReduceWithGradientBackward", {x}, {reduced},
                     [pg](const std::vector<Tensor>& grads) mutable {
                       Tensor g = grads[0].contiguous().clone();
                       pg.allreduce(g, ReduceOp::Sum)->wait();
                       return std::vector<Tensor>{g};
                     });
  }
  return reduced;
}

int convert_sync_batchnorm(nn::Module& module, const ProcessGroup& group) {
  int converted = 0;
  for (const auto& [name, m] : module.named_modules()) {
    auto* bn = dynamic_cast<nn::BatchNorm*>(m);
    if (bn == nullptr) continue;
    ProcessGroup pg = group;
    bn->set_statistics_all_reduce([pg](const Tensor& local) { return all_reduce_with_gradient(local, pg); });
    ++converted;
  }
  return converted;
}

}  // namespace mg::parallel
