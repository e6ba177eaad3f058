// Pipeline parallelism: a model cut into consecutive stages, one per rank; each global batch cut
// into m micro-batches that flow through the stages, activations forward with send/recv, their
// gradients backward.
//
//   GPipe: every micro-batch forward, then every one backward. Simple; each stage holds the
//          activations of all m micro-batches at the peak.
//
//     rank 0  F1 F2 F3 F4 .  .  .  .  B1 B2 B3 B4
//     rank 1  .  F1 F2 F3 F4 .  .  B1 B2 B3 B4 .          (p = 3 stages, m = 4; one slot per
//     rank 2  .  .  F1 F2 F3 F4 B1 B2 B3 B4 .  .           forward or backward of a micro-batch)
//
//   1F1B:  after p - 1 - rank warm-up forwards, each stage alternates one forward and one
//          backward, so at most p - rank micro-batches are in flight: the same bubble, less
//          memory (PipeDream-flush, Megatron's default).
//
// Either way the idle share of a step (the bubble) is (p - 1) / (m + p - 1) when every stage
// takes the same time. Each micro-batch's loss is divided by m, so the accumulated gradients are
// those of the mean loss over the whole batch: after step() and the optimizer, the parameters
// equal single-device training with the same global batch (tests/parallel/pipeline/test_pipeline.cpp, 2 and 3
// stages, both schedules).
//
// Transport: each activation or gradient is preceded by its shape (a small i64 message), so
// stages need not know each other's shapes; sends are posted and waited for at the end of the
// step (a stage never blocks on a send, so the schedules cannot deadlock), receives are waited
// for when their data is needed. CPU tensors (the MPI backend) and CUDA tensors (NCCL) alike.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "nn/container.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

enum class PipelineSchedule { GPipe, OneForwardOneBackward };

// Layers [begin, end) of `model` as one stage (the same modules: parameters are shared), where
// the layers are split into `num_stages` runs of nearly equal length and this is run `stage`.
std::shared_ptr<nn::Sequential> pipeline_stage(const nn::Sequential& model, int stage, int num_stages);

struct PipelineStepResult {
  double loss = 0;        // the mean loss over the micro-batches (the last stage; 0 elsewhere)
  double step_ms = 0;     // this rank's wall time for the step
  double compute_ms = 0;  // of which forward and backward of its stage
  double bubble() const { return step_ms > 0 ? 1.0 - compute_ms / step_ms : 0.0; }
};

class Pipeline {
 public:
  // `stage` is this rank's part of the model (rank r of `group` runs stage r).
  // `loss` maps the last stage's output and the targets to a scalar loss.
  using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
  Pipeline(std::shared_ptr<nn::Module> stage, ProcessGroup group, LossFn loss,
           PipelineSchedule schedule = PipelineSchedule::OneForwardOneBackward);

  // One training step's forward and backward over `micro_batches` micro-batches: the first stage
  // passes the whole batch `input`, the last stage the whole `target` (other ranks may pass
  // undefined tensors); both are cut along dim 0. Gradients accumulate into the stage's
  // parameters; call the optimizer afterwards.
  PipelineStepResult train_step(const Tensor& input, const Tensor& target, int micro_batches);

  nn::Module& stage() { return *stage_; }
  bool is_first() const { return group_.rank() == 0; }
  bool is_last() const { return group_.rank() == group_.size() - 1; }

 private:
  void send_tensor(const Tensor& t, int dst, int tag);
  Tensor recv_tensor(int src, int tag);

  std::shared_ptr<nn::Module> stage_;
  ProcessGroup group_;
  LossFn loss_;
  PipelineSchedule schedule_;
  std::vector<WorkPtr> pending_sends_;
};

}  // namespace mg::parallel
