// CheckpointManager: step checkpoints for a DDP job that must survive a lost rank or node.
//
//   parallel::CheckpointManager checkpoints(pg, "ckpt", {/*every_steps=*/50, /*keep_last=*/3});
//   if (auto resumed = checkpoints.load_latest(state)) { ...continue at resumed->info.step... }
//   for (...) {
//     ...one step...
//     if (checkpoints.due(step) || checkpoints.preempted()) checkpoints.save(state, position);
//   }
//   checkpoints.wait();
//
// One checkpoint is a directory <dir>/step-<8 digits>/ holding model.safetensors and
// optimizer.safetensors (optim/checkpoint.h: the GradScaler's state rides in the optimizer
// file) and lr_scheduler.safetensors. Every file checksums each tensor and its header
// (core/safetensors.h), and the manager refuses a file of its own without them. The metadata
// holds the step, epoch, the sampler's global position (samples of the epoch consumed by all
// ranks together), the world size, and EVERY rank's random generator state: rank r's dropout
// masks come from its own Philox stream (seed + rank), so restoring rank 0's state on every
// rank -- what a single-file checkpoint does -- resumes with different masks on the other
// ranks, and the run is no longer bit-identical to one that never stopped. (The CPU and CUDA
// kernels draw from the same generator, core/random.h, so this one state covers both.)
//
// Only rank 0's filesystem holds checkpoints: no shared filesystem is needed. `dir` may be a
// local directory on every node (the other ranks' copies stay empty).
//
// save() is a collective:
//   1. every rank's generator state is gathered to rank 0 (all-gather), a sharded optimizer
//      (ZeRO) is consolidated on rank 0, and rank 0 copies the tensors to host memory --
//      synchronously, so training may change them right after;
//   2. rank 0 writes the files on a background thread, so the ranks do not wait for the disk:
//      into a hidden ".partial-step-N" directory, each file atomically, then renamed to
//      "step-N" (a crash leaves the old checkpoints and at worst a partial directory, which
//      is never read), then only the newest keep_last checkpoints are kept. A "step-N" that
//      exists already (an earlier attempt saved that step) is replaced without a moment with no
//      complete "step-N": the two directories are swapped in one rename (Linux renameat2
//      RENAME_EXCHANGE) and the old one removed after; where the filesystem cannot swap, the old
//      one is renamed to ".old-step-N" first, and a crash between the two renames is undone by
//      the next load_latest (it renames ".old-step-N" back when "step-N" is missing);
//   3. the next save() (or wait()) first finishes the previous write; a failed write is an
//      error on every rank there, not a silent gap.
//
// load_latest() is a collective: rank 0 tries the checkpoints newest first and takes the first
// one whose files all verify and that loads completely into its own state: a truncated or
// corrupt newest one (a crash mid-write, a flipped byte, stripped checksums) is reported and the
// previous one is used. Rank 0 then broadcasts what it loaded (model, optimizer, scheduler,
// metadata with every rank's generator state; parallel/comm/object_collectives.h) and each rank
// loads that and its own generator state. The sampler's position is saved in samples, not
// batches, so a job may resume at another world size (data::DistributedSampler::set_start_sample
// re-shards the rest of the epoch), and a ZeRO optimizer's state is saved consolidated, so it
// re-shards over the new ranks on load. Cost: the whole checkpoint crosses the CPU backend once
// (a resume happens once per restart, not per step).
//
// preempted(): with save_on_sigterm, SIGTERM (what Slurm and mpirun send before killing a
// job) sets a flag; preempted() is a collective that is true on every rank once any rank got
// it, so all ranks save the same step and stop together.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/random.h"
#include "nn/module.h"
#include "optim/checkpoint.h"
#include "optim/grad_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel {

// A ZeRO-1 optimizer (parallel/zero/): the manager saves its consolidated state and loads it back;
// only checkpoint_manager.cpp needs its definition, so resilience/ does not hang on zero/ here.
class ZeroRedundancyOptimizer;

struct CheckpointManagerOptions {
  int64_t every_steps = 0;      // due(step) every this many steps (0: never; save when you like)
  int keep_last = 3;            // older checkpoints are deleted once a newer one is complete
  bool background = true;       // rank 0 writes the files on a thread of its own
  bool save_on_sigterm = true;  // install the SIGTERM flag that preempted() reads
};

// What a checkpoint holds: the module and one optimizer (plain or ZeRO) are required.
struct TrainingState {
  nn::Module* module = nullptr;
  optim::Optimizer* optimizer = nullptr;              // or
  parallel::ZeroRedundancyOptimizer* zero = nullptr;  // (exactly one of the two)
  optim::LRScheduler* scheduler = nullptr;            // optional
  optim::GradScaler* scaler = nullptr;                // optional
};

// Where the data stream stood.
struct TrainingPosition {
  int64_t step = 0;                // optimizer steps taken so far
  int64_t epoch = 0;               // the epoch in progress (or the next one, at an epoch's end)
  int64_t samples_into_epoch = 0;  // samples of that epoch all ranks together have consumed
};

struct ResumePoint {
  std::string dir;  // the checkpoint directory loaded
  TrainingPosition position;
  int world_size = 1;          // the world size it was saved at
  optim::CheckpointInfo info;  // everything else (user metadata in info.extra)
};

class CheckpointManager {
 public:
  // A collective: rank 0 creates `dir` and its parents (an error there throws on every rank).
  CheckpointManager(const ProcessGroup& group, std::string dir, CheckpointManagerOptions options = {});
  ~CheckpointManager();  // finishes a background write (errors are printed: a destructor cannot throw)
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  bool due(int64_t step) const {
    return options_.every_steps > 0 && step > 0 && step % options_.every_steps == 0;
  }
  bool preempted();  // a collective (see above)

  // A collective. `extra` goes into the metadata (info.extra on load).
  void save(const TrainingState& state, const TrainingPosition& position,
            const std::map<std::string, std::string>& extra = {});
  // A collective: loads the newest valid checkpoint in rank 0's `dir` into `state` on every rank,
  // restores this rank's generator (a rank beyond the saved world size seeds a fresh stream: seed
  // of rank 0 + rank), and returns where it stood (`dir` is rank 0's path); nullopt on every rank
  // when rank 0's `dir` holds no valid checkpoint (state untouched).
  std::optional<ResumePoint> load_latest(const TrainingState& state);
  // A collective: rank 0's background write has finished; a failure throws on every rank.
  void wait();

  const std::string& dir() const { return dir_; }
  // The complete checkpoint directories in this rank's `dir`, oldest first (rank 0's are the ones
  // that count; ".partial-" and ".old-" leftovers are not listed).
  std::vector<std::string> checkpoints() const;
  static std::string step_dir_name(int64_t step);  // "step-00000012"

 private:
  void finish_background_write();  // rank 0: joins the writer, keeps its error
  void raise_write_error_everywhere();

  ProcessGroup group_;
  std::string dir_;
  CheckpointManagerOptions options_;
  struct Writer;
  std::unique_ptr<Writer> writer_;
};

// For tests of the crash safety above: `hook` runs at each stage of a write -- "written" (the
// new ".partial-step-N" is complete), "exchanged" (swapped in by renameat2), "old-aside" and
// "new-in" (the portable swap's two renames) -- and one that throws stops the write there, as a
// crash would (the error surfaces at wait()). use_rename_exchange(false) forces the portable
// swap. Process-wide; reset with set_replace_hook({}) and use_rename_exchange(true).
namespace checkpoint_testing {
void set_replace_hook(std::function<void(const std::string& stage)> hook);
void use_rename_exchange(bool enabled);
}  // namespace checkpoint_testing

}  // namespace mg::parallel
