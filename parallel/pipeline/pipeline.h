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
//   Interleaved 1F1B (Megatron-LM, Narayanan et al., 2021): the model cut into p v chunks, rank r
//          holding chunks r, r + p, ..., r + (v - 1) p (pipeline_chunks), so a micro-batch passes
//          every rank v times. Micro-batches go in groups of p; a rank runs its first chunk on a
//          group, then its second, ..., warms up with 2 (p - 1 - rank) + (v - 1) p forwards,
//          then alternates. Each unit is 1/v of a stage, so the fill and drain shrink by v:
//
//     rank 0 runs  F1 F2 f1 f2 F3 b1 F4 b2 f3 B1 f4 B2 b3 b4 B3 B4    (p = 2, v = 2, m = 4; F, B:
//     rank 1 runs  F1 F2 f1 b1 f2 b2 F3 B1 F4 B2 f3 b3 f4 b4 B3 B4     chunk 0; f, b: chunk 1; each
//                                                                       rank's order, not time slots)
//
//          The price: v times the point-to-point messages (a micro-batch crosses p v - 1
//          boundaries instead of p - 1) and m divisible by p.
//
//   Zero-bubble ZB-H1 (Qi et al., 2023): 1F1B's order, with each backward split into B (the
//          gradient of the stage's input, which the previous stage waits for) and W (its weights'
//          gradients, which nobody waits for; autograd::backward_input and DeferredWeightGrad).
//          Rank r lets up to r W's wait and runs them where 1F1B would wait for a gradient:
//
//     rank 0 runs  F1 F2 F3 B1 W1 F4 B2 W2 B3 W3 B4 W4       (p = 3, m = 4; each rank's order,
//     rank 1 runs  F1 F2 B1 F3 B2 W1 F4 B3 W2 B4 W3 W4        not time slots: rank r keeps up
//     rank 2 runs  F1 B1 F2 B2 F3 B3 W1 F4 B4 W2 W3 W4        to r W's waiting)
//
//          Only B's are on the critical path, so the fill and drain shrink from (p - 1)(F + B + W)
//          to (p - 1)(F + B - W): a third of 1F1B's idle time when the three take equal time.
//
// The idle share of a step (the bubble) is (p - 1) / (m + p - 1) for GPipe and 1F1B, and
// (p - 1) / (v m + p - 1) interleaved, when every stage takes the same time, and for ZB-H1
// (p - 1) / (3 m + p - 1) when F, B and W take one unit each. Each micro-batch's
// loss is divided by m, so the accumulated gradients are those of the mean loss over the whole
// batch: after step() and the optimizer, the parameters equal single-device training with the
// same global batch (tests/parallel/pipeline/test_pipeline.cpp, 2, 3 and 4 stages, the four
// schedules; test_pipeline_order.cpp runs each order on paper against its bubble formula).
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

enum class PipelineSchedule { GPipe, OneForwardOneBackward, Interleaved1F1B, ZeroBubbleH1 };

// One unit of a rank's schedule: a micro-batch's forward, its whole backward, or (ZB-H1) the
// backward's input-gradient half (B) or weight-gradient half (W), on one chunk of the rank's model.
struct PipelineUnit {
  enum Kind : char { Forward = 'F', Backward = 'b', InputGrad = 'B', WeightGrad = 'W' };
  Kind kind;
  int chunk, micro_batch;
};

// The order rank `rank` of `num_ranks` runs its units in for one step of `micro_batches`
// micro-batches (`chunks` per rank: the interleaved schedule; 1 otherwise). Both ends of every
// message derive it, so it also fixes the order of the messages.
std::vector<PipelineUnit> pipeline_order(PipelineSchedule schedule, int num_ranks, int rank,
                                         int micro_batches, int chunks = 1);

// Layers [begin, end) of `model` as one stage (the same modules: parameters are shared), where
// the layers are split into `num_stages` runs of nearly equal length and this is run `stage`.
std::shared_ptr<nn::Sequential> pipeline_stage(const nn::Sequential& model, int stage, int num_stages);

// This rank's v chunks for the interleaved schedule: the layers split into num_ranks * chunks runs
// of nearly equal length (as pipeline_stage), of which rank r holds runs r, r + num_ranks, ...
std::vector<std::shared_ptr<nn::Sequential>> pipeline_chunks(const nn::Sequential& model, int rank,
                                                             int num_ranks, int chunks);

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
  // The interleaved schedule over this rank's chunks (pipeline_chunks: chunk k is global stage
  // k p + rank); needs at least 2 ranks, micro_batches divisible by them, and CPU tensors (MPI):
  // over NCCL its crossing sends would wait for each other (pipeline.cpp).
  Pipeline(std::vector<std::shared_ptr<nn::Module>> chunks, ProcessGroup group, LossFn loss);

  // One training step's forward and backward over `micro_batches` micro-batches: the first stage
  // passes the whole batch `input`, the last stage the whole `target` (other ranks may pass
  // undefined tensors); both are cut along dim 0. Gradients accumulate into the stage's
  // parameters; call the optimizer afterwards.
  PipelineStepResult train_step(const Tensor& input, const Tensor& target, int micro_batches);

  nn::Module& stage() { return *chunks_.front(); }  // the first (or only) chunk
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  bool is_first() const { return group_.rank() == 0; }
  bool is_last() const { return group_.rank() == group_.size() - 1; }

 private:
  void send_tensor(const Tensor& t, int dst, int tag);
  Tensor recv_tensor(int src, int tag);
  std::vector<std::shared_ptr<nn::Module>> chunks_;
  ProcessGroup group_;
  LossFn loss_;
  PipelineSchedule schedule_;
  std::vector<WorkPtr> pending_sends_;
};

}  // namespace mg::parallel
