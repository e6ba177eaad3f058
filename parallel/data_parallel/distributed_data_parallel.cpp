// DistributedDataParallel: construction checks, initial broadcast, per-forward buffer sync and
// the replica-consistency check (the gradient work is the Reducer's, reducer.cpp).
#include "parallel/data_parallel/distributed_data_parallel.h"

#include <map>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "parallel/comm/object_collectives.h"

namespace mg::parallel {

namespace {

// "name [shape] dtype" per line, for comparing ranks' models.
std::vector<std::string> describe_parameters(const nn::Module& module) {
  std::vector<std::string> lines;
  for (auto& [name, p] : module.named_parameters())
    lines.push_back(str_cat(name, " ", shape_str(p.shape()), " ", dtype_name(p.dtype())));
  for (auto& [name, b] : module.named_buffers())
    lines.push_back(str_cat("buffer ", name, " ", shape_str(b.shape()), " ", dtype_name(b.dtype())));
  return lines;
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup group, DDPOptions options)
    : module_(&module), group_(std::move(group)), options_(options) {
  MG_CHECK(group_.defined(),
           "DistributedDataParallel: the process group is undefined (use init_process_group())");
  register_module("module", module);
  for (auto& [name, p] : module.named_parameters()) {
    MG_CHECK(p.device() == group_.device(), "DistributedDataParallel: parameter '", name, "' is on ",
             p.device(), " but this rank's device is ", group_.device(),
             "; call module.to(pg.device()) before wrapping it");
  }
  verify_same_parameters_everywhere();
  broadcast_state(/*parameters=*/true, /*buffers=*/true);

  if (options_.bucket_cap_auto) {
    bucket_cap_choice_ = autotune_bucket_cap(module.parameters(), group_, options_.first_bucket_cap_mb,
                                             options_.bucket_cap_mb, options_.bucket_cap_auto_backward_ms);
    options_.bucket_cap_mb = bucket_cap_choice_.bucket_cap_mb;
    options_.first_bucket_cap_mb = bucket_cap_choice_.first_bucket_cap_mb;
  }
  ReducerOptions reducer_options;
  reducer_options.bucket_cap_mb = options_.bucket_cap_mb;
  reducer_options.first_bucket_cap_mb = options_.first_bucket_cap_mb;
  reducer_options.algo = options_.algo;
  reducer_options.find_unused_parameters = options_.find_unused_parameters;
  reducer_options.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  reducer_options.static_graph = options_.static_graph;
  reducer_ = Reducer::create(module.named_parameters(), group_, reducer_options);
}

// Every rank compares its own description with rank 0's; then all ranks learn whether any
// differed, so they all fail together (a lone failing rank would leave the others hanging).
void DistributedDataParallel::verify_same_parameters_everywhere() const {
  ProcessGroup group = group_;
  std::vector<std::string> mine = describe_parameters(*module_);
  std::vector<std::string> reference = split_lines(broadcast_object(group, join_lines(mine)));
  std::string problem;
  for (size_t i = 0; i < std::max(mine.size(), reference.size()) && problem.empty(); ++i) {
    std::string a = i < mine.size() ? mine[i] : "(nothing)";
    std::string b = i < reference.size() ? reference[i] : "(nothing)";
    if (a != b)
      problem = str_cat("tensor #", i, " is '", a, "' on rank ", group.rank(), " but '", b, "' on rank 0");
  }
  const bool everyone_ok = all_ranks(group, problem.empty());
  if (!problem.empty())
    throw Error(str_cat("DistributedDataParallel: the ranks hold different models: ", problem,
                        " (every rank must build the same model before wrapping it)"));
  MG_CHECK(everyone_ok,
           "DistributedDataParallel: another rank holds a different model than rank 0 (its error names "
           "the first difference)");
}

// One broadcast per dtype, of the tensors packed into one flat buffer: every forward re-sends the
// buffers, and BatchNorm alone has three small ones per layer, each of which would otherwise pay
// a collective's latency (and its signature check) on its own.
void DistributedDataParallel::broadcast_state(bool parameters, bool buffers, int root_rank) {
  if (group_.size() == 1) return;
  std::map<DType, std::vector<Tensor>> by_dtype;
  if (parameters)
    for (Tensor& p : module_->parameters()) by_dtype[p.dtype()].push_back(p);
  if (buffers)
    for (Tensor& b : module_->buffers()) by_dtype[b.dtype()].push_back(b);
  NoGradGuard no_grad;  // plain copies into the module's tensors, nothing to differentiate
  const bool root = group_.rank() == root_rank;
  for (auto& [dtype, tensors] : by_dtype) {
    int64_t total = 0;
    for (const Tensor& t : tensors) total += t.numel();
    Tensor flat = empty({total}, TensorOptions{dtype, tensors.front().device()});
    if (root) {
      int64_t offset = 0;
      for (const Tensor& t : tensors) {
        flat.narrow(0, offset, t.numel()).copy_(t.reshape({-1}));
        offset += t.numel();
      }
    }
    group_.broadcast(flat, root_rank)->wait();
    if (root) continue;
    int64_t offset = 0;
    for (Tensor& t : tensors) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.shape()));
      offset += t.numel();
    }
  }
}

// What every forward does before the module runs, whatever its signature.
// Inside a Join, first the notification (join.h): who still trains, the root of the buffer
// broadcast (the lowest active rank: a joined rank's buffers are stale) and the gradient divisor.
void DistributedDataParallel::prepare_forward() {
  ++forward_count_;
  int buffer_root = 0;
  bool someone_joined = false;
  int divisor = group_.size();
  if (const JoinRound* round = notify_join_context(reducer_->sync() && GradMode::is_enabled())) {
    buffer_root = round->first_active;
    someone_joined = round->someone_joined();
    if (!divide_by_initial_world_size_) divisor = round->active_count;
  }
  reducer_->set_gradient_divisor(divisor);
  if (options_.broadcast_buffers) broadcast_state(/*parameters=*/false, /*buffers=*/true, buffer_root);
  // A joined rank's parameters are stale until the Join ends: no replica check meanwhile.
  if (options_.check_replicas_every > 0 && forward_count_ % options_.check_replicas_every == 0 &&
      !someone_joined)
    check_replicas();
}

// What a joined rank does for DDP in each round of the others' training, and at the end.
class DDPJoinHook : public JoinHook {
 public:
  explicit DDPJoinHook(DistributedDataParallel& ddp) : ddp_(ddp) {}

  void main_hook(const JoinRound& round) override {
    if (ddp_.options_.broadcast_buffers)
      ddp_.broadcast_state(/*parameters=*/false, /*buffers=*/true, round.first_active);
    if (round.sync_count > 0) ddp_.reducer_->run_joined_pass();
  }

  // Joined ranks stopped stepping: every rank takes the model of the highest last joiner.
  void post_hook(bool is_last_joiner) override {
    Tensor candidate = full({1}, is_last_joiner ? ddp_.group_.rank() : -1, TensorOptions{DType::i64});
    ddp_.group_.allreduce(candidate, ReduceOp::Max)->wait();
    const auto root = static_cast<int>(candidate.item<int64_t>());
    if (root >= 0) ddp_.broadcast_state(/*parameters=*/true, /*buffers=*/true, root);
  }

 private:
  DistributedDataParallel& ddp_;
};

std::unique_ptr<JoinHook> DistributedDataParallel::join_hook(const JoinHookOptions& options) {
  divide_by_initial_world_size_ = options.divide_by_initial_world_size;
  return std::make_unique<DDPJoinHook>(*this);
}

Tensor DistributedDataParallel::forward(const Tensor& x) {
  prepare_forward();
  return module_->forward(x);
}

nn::Values DistributedDataParallel::forward_values(const nn::Values& inputs) {
  prepare_forward();
  return module_->forward_values(inputs);
}

// Each parameter's checksum (sum and sum of squares, in f64) is all-gathered; a rank whose
// checksum differs from rank 0's bit for bit names the tensor. Bitwise is right: replicas that
// took identical steps from identical values are identical.
void DistributedDataParallel::check_replicas() const {
  ProcessGroup group = group_;
  auto named = module_->named_parameters();
  int64_t p = static_cast<int64_t>(named.size());
  Tensor sums = zeros({2 * p}, TensorOptions{DType::f64});
  {
    NoGradGuard no_grad;
    double* s = sums.data<double>();
    for (int64_t i = 0; i < p; ++i) {
      Tensor v = named[static_cast<size_t>(i)].second.detach().to(Device::cpu(), DType::f64);
      s[2 * i] = v.sum().item<double>();
      s[2 * i + 1] = (v * v).sum().item<double>();
    }
  }
  Tensor all = zeros({group.size(), 2 * p}, TensorOptions{DType::f64});
  group.allgather(all, sums)->wait();
  const double* a = all.data<double>();
  for (int r = 1; r < group.size(); ++r) {
    for (int64_t i = 0; i < p; ++i) {
      double s0 = a[2 * i], q0 = a[2 * i + 1];
      double sr = a[r * 2 * p + 2 * i], qr = a[r * 2 * p + 2 * i + 1];
      if (s0 != sr || q0 != qr)
        throw Error(str_cat("DistributedDataParallel: replicas diverged after ", forward_count_,
                            " forward passes: parameter '", named[static_cast<size_t>(i)].first, "' has sum ",
                            sr, " on rank ", r, " but ", s0,
                            " on rank 0 (look for rank-dependent code: unsynchronised buffers, different "
                            "seeds for initialisation, a rank skipping optimizer.step)"));
    }
  }
}

std::string DistributedDataParallel::extra_repr() const {
  return str_cat(
      "world_size=", group_.size(), ", device=", group_.device(),
      ", algo=", allreduce_algo_name(options_.algo), ", bucket_cap_mb=", options_.bucket_cap_mb,
      options_.bucket_cap_auto && group_.size() > 1 ? str_cat(" (", bucket_cap_choice_.summary(), ")") : "");
}

}  // namespace mg::parallel
