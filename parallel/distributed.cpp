// Distributed training helpers: agreed GradScaler skips and rank-0 checkpoints (distributed.h).
#include "parallel/distributed.h"

#include <functional>

#include "core/error.h"

namespace mg::parallel {

void synchronize_grad_scaler(optim::GradScaler& scaler, const ProcessGroup& group) {
  ProcessGroup pg = group;  // a handle: copies share the communicator
  scaler.set_found_inf_reducer([pg](bool local_found_inf) mutable {
    Tensor flag = full({1}, local_found_inf ? 1.0 : 0.0, TensorOptions{DType::i32});
    pg.allreduce(flag, ReduceOp::Max)->wait();
    return flag.item<int32_t>() != 0;
  });
}

namespace {

// Rank 0 runs `write`; its success or failure reaches every rank (a lone throw would leave the
// others waiting).
void write_on_rank0(const ProcessGroup& group, const std::string& dir, const std::function<void()>& write) {
  ProcessGroup pg = group;
  std::string error;
  if (pg.rank() == 0) {
    try {
      write();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  Tensor failed = full({1}, error.empty() ? 0.0 : 1.0, TensorOptions{DType::i32});
  pg.allreduce(failed, ReduceOp::Max)->wait();
  if (!error.empty()) throw Error(error);
  check(failed.item<int32_t>() == 0, "save_checkpoint: rank 0 failed to write the checkpoint to '", dir,
        "' (its error says why)");
}

}  // namespace

void save_checkpoint(const ProcessGroup& group, const std::string& dir, const nn::Module& module,
                     const optim::Optimizer& optimizer, optim::CheckpointInfo info,
                     const optim::GradScaler* scaler) {
  write_on_rank0(group, dir,
                 [&] { optim::save_checkpoint(dir, module, optimizer, std::move(info), scaler); });
}

optim::CheckpointInfo load_checkpoint(const ProcessGroup& group, const std::string& dir, nn::Module& module,
                                      optim::Optimizer& optimizer, optim::GradScaler* scaler) {
  ProcessGroup pg = group;
  pg.barrier()->wait();
  return optim::load_checkpoint(dir, module, optimizer, scaler);
}

void save_checkpoint(const ProcessGroup& group, const std::string& dir, const nn::Module& module,
                     optim::ZeroRedundancyOptimizer& optimizer, optim::CheckpointInfo info,
                     const optim::GradScaler* scaler) {
  const StateDict whole = optimizer.consolidated_state_dict(0);  // a collective; {} off rank 0
  write_on_rank0(group, dir, [&] { optim::save_checkpoint(dir, module, whole, std::move(info), scaler); });
}

optim::CheckpointInfo load_checkpoint(const ProcessGroup& group, const std::string& dir, nn::Module& module,
                                      optim::ZeroRedundancyOptimizer& optimizer, optim::GradScaler* scaler) {
  ProcessGroup pg = group;
  pg.barrier()->wait();
  return optim::load_checkpoint(
      dir, module, [&optimizer](const StateDict& whole) { optimizer.load_state_dict(whole); }, scaler);
}

}  // namespace mg::parallel
