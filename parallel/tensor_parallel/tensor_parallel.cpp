#include "parallel/tensor_parallel/tensor_parallel.h"

#include <vector>

#include "base/error.h"
#include "core/autograd/node.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "nn/activation.h"
#include "nn/linear.h"

namespace mg::parallel {
namespace {

// The sum over the group, in place on a contiguous copy (the collective wants one).
Tensor all_reduced(const Tensor& x, ProcessGroup group) {
  NoGradGuard no_grad;
  Tensor sum = x.detach().contiguous().clone();
  group.allreduce(sum)->wait();
  return sum;
}

// The output of a function of `x` that autograd should see as `out`, with `backward` for dL/dx.
Tensor with_backward(const char* name, const Tensor& x, Tensor out,
                     std::function<Tensor(const Tensor&)> backward) {
  if (!autograd::any_requires_grad({x})) return out;
  autograd::record(name, {x}, {out},
                   [backward](const std::vector<Tensor>& g) { return std::vector<Tensor>{backward(g[0])}; });
  return out;
}

void check_divides(int64_t features, const ProcessGroup& group, const char* layer, const char* which) {
  MG_CHECK(group.defined(), layer, ": the process group is undefined");
  MG_CHECK(features % group.size() == 0, layer, ": ", which, " ", features,
           " do not divide over the group's ", group.size(), " ranks");
}

// This rank's slice of each of `blocks` equal blocks of `full` along dim 0, side by side.
Tensor rows_of_rank(const Tensor& full, int64_t blocks, const ProcessGroup& group) {
  const int64_t block = full.size(0) / blocks, mine = block / group.size();
  std::vector<Tensor> slices;
  for (int64_t b = 0; b < blocks; ++b)
    slices.push_back(full.narrow(0, b * block + group.rank() * mine, mine));
  return cat(slices, 0).contiguous().clone();
}

}  // namespace

Tensor copy_to_tensor_parallel(const Tensor& x, const ProcessGroup& group) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = x.detach();
  }
  return with_backward("CopyToTensorParallelBackward", x, out,
                       [group](const Tensor& g) { return all_reduced(g, group); });
}

Tensor reduce_from_tensor_parallel(const Tensor& x, const ProcessGroup& group) {
  return with_backward("ReduceFromTensorParallelBackward", x, all_reduced(x, group),
                       [](const Tensor& g) { return g; });
}

Tensor gather_from_tensor_parallel(const Tensor& x, const ProcessGroup& group) {
  const int world = group.size(), rank = group.rank();
  const int64_t last = x.size(-1);
  Tensor out;
  {
    NoGradGuard no_grad;
    Tensor mine = x.detach().contiguous();
    Tensor all = empty({world * mine.numel()}, TensorOptions{x.dtype(), x.device()});
    ProcessGroup(group).allgather(all, mine)->wait();
    std::vector<Tensor> slices;
    for (int r = 0; r < world; ++r)
      slices.push_back(all.narrow(0, r * mine.numel(), mine.numel()).view(x.shape()));
    out = cat(slices, x.dim() - 1);
  }
  return with_backward("GatherFromTensorParallelBackward", x, out, [rank, last](const Tensor& g) {
    return g.narrow(g.dim() - 1, rank * last, last).contiguous();
  });
}

// ---- ColumnParallelLinear ----------------------------------------------------------------------

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, ProcessGroup group, bool has_bias,
                                           bool gather)
    : ColumnParallelLinear(nn::Linear(in, out, has_bias), std::move(group), gather) {}

ColumnParallelLinear::ColumnParallelLinear(const nn::Linear& full, ProcessGroup group, bool gather,
                                           int64_t out_blocks)
    : in_features(full.in_features),
      out_features(full.out_features),
      out_per_rank(group.defined() && group.size() > 0 ? full.out_features / group.size() : 0),
      gather_output(gather),
      blocks(out_blocks),
      group_(std::move(group)) {
  MG_CHECK(blocks > 0 && out_features % blocks == 0, "ColumnParallelLinear: out_features ", out_features,
           " are not ", blocks, " equal blocks");
  check_divides(out_features / blocks, group_, "ColumnParallelLinear",
                blocks > 1 ? "out_features per block" : "out_features");
  MG_CHECK(!(gather_output && blocks > 1), "ColumnParallelLinear: gather_output needs blocks = 1");
  NoGradGuard no_grad;
  weight = rows_of_rank(full.weight, blocks, group_);
  register_parameter("weight", weight);
  if (full.bias.defined()) {
    bias = rows_of_rank(full.bias, blocks, group_);
    register_parameter("bias", bias);
  }
}

Tensor ColumnParallelLinear::forward(const Tensor& x) {
  Tensor y = linear(copy_to_tensor_parallel(x, group_), weight, bias);
  return gather_output ? gather_from_tensor_parallel(y, group_) : y;
}

std::shared_ptr<nn::Module> ColumnParallelLinear::clone_empty() const {
  return std::make_shared<ColumnParallelLinear>(nn::Linear(in_features, out_features, bias.defined()), group_,
                                                gather_output, blocks);
}

std::string ColumnParallelLinear::extra_repr() const {
  return str_cat("in_features=", in_features, ", out_features=", out_features, " (", out_per_rank,
                 " on this rank of ", group_.size(), "), gather_output=", gather_output ? "true" : "false",
                 blocks > 1 ? str_cat(", blocks=", blocks) : std::string());
}

// ---- RowParallelLinear -------------------------------------------------------------------------

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, ProcessGroup group, bool has_bias,
                                     bool input_parallel)
    : RowParallelLinear(nn::Linear(in, out, has_bias), std::move(group), input_parallel) {}

RowParallelLinear::RowParallelLinear(const nn::Linear& full, ProcessGroup group, bool input_parallel)
    : in_features(full.in_features),
      out_features(full.out_features),
      in_per_rank(group.defined() && group.size() > 0 ? full.in_features / group.size() : 0),
      input_is_parallel(input_parallel),
      group_(std::move(group)) {
  check_divides(in_features, group_, "RowParallelLinear", "in_features");
  NoGradGuard no_grad;
  weight = full.weight.narrow(1, group_.rank() * in_per_rank, in_per_rank).contiguous().clone();
  register_parameter("weight", weight);
  if (full.bias.defined()) {
    bias = full.bias.clone();
    register_parameter("bias", bias);
  }
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  Tensor mine = input_is_parallel ? x
                                  : copy_to_tensor_parallel(x, group_).narrow(
                                        x.dim() - 1, group_.rank() * in_per_rank, in_per_rank);
  MG_CHECK(mine.size(-1) == in_per_rank, "RowParallelLinear: this rank expects ", in_per_rank,
           " input features (its slice of ", in_features, "), got ", mine.size(-1));
  Tensor y = reduce_from_tensor_parallel(linear(mine, weight), group_);
  return bias.defined() ? y + bias : y;
}

std::shared_ptr<nn::Module> RowParallelLinear::clone_empty() const {
  return std::make_shared<RowParallelLinear>(in_features, out_features, group_, bias.defined(),
                                             input_is_parallel);
}

std::string RowParallelLinear::extra_repr() const {
  return str_cat("in_features=", in_features, " (", in_per_rank, " on this rank of ", group_.size(),
                 "), out_features=", out_features,
                 ", input_is_parallel=", input_is_parallel ? "true" : "false");
}

// ---- TensorParallelMLP -------------------------------------------------------------------------

TensorParallelMLP::TensorParallelMLP(int64_t d, int64_t h, ProcessGroup group)
    : features(d), hidden(h), group_(std::move(group)) {
  up = register_module("up", std::make_shared<ColumnParallelLinear>(d, h, group_));
  down = register_module("down", std::make_shared<RowParallelLinear>(h, d, group_));
}

Tensor TensorParallelMLP::forward(const Tensor& x) { return (*down)(relu((*up)(x))); }

std::shared_ptr<nn::Module> TensorParallelMLP::clone_empty() const {
  return std::make_shared<TensorParallelMLP>(features, hidden, group_);
}

}  // namespace mg::parallel
