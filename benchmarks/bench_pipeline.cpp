// bench_pipeline: the pipeline bubble, measured against its formula.
//
//   mpirun -np P build/benchmarks/bench_pipeline [--hidden 512] [--batch 256] [--steps 10]
//
// A model of P equal stages (each Linear(H, H) + ReLU, twice) trains with GPipe, with 1F1B, with
// interleaved 1F1B (2 chunks per rank, each one Linear + ReLU; m a multiple of P) and with
// zero-bubble ZB-H1 at m = 1, 2, 4, 8, 16 micro-batches. Per rank, the bubble is the share of the step the
// stage spent not computing (waiting for activations or gradients, sending); the table gives the mean over
// the ranks against the formula for equal stages and free communication -- (P - 1) / (m + P - 1), interleaved
// (P - 1) / (v m + P - 1), ZB-H1 (P - 1) / (3 m + P - 1) (a Linear's forward, input gradient and
// weight gradient are one GEMM each) -- the step time (the slowest rank's) relative to m = 1, and the bytes a
// rank sent per step (ProcessGroup::requested_traffic(), the mean over the ranks) beside their
// formula: 2 m (P v - 1) / P messages of a micro-batch's [B/m, H] f32 and a 64-byte header, and
// the activations a stage holds at its peak: the most its device (cpu:0 of each process) held
// during the timed steps above what it held before them (parameters, gradients, the batch), the
// largest over the ranks -- what GPipe's m micro-batches in flight cost against 1F1B's p - r. Each
// (schedule, m) pair runs after 2 warm-up steps; the schedules alternate per m so drift hits all
// alike.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "multigrad.h"
#include "parallel/pipeline/pipeline.h"

using namespace mg;
using namespace mg::parallel;

namespace {

struct Flags {
  int64_t hidden = 512, batch = 256;
  int steps = 10;
};

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* {
      MG_CHECK(i + 1 < argc, "bench_pipeline: ", arg, " needs a value");
      return argv[++i];
    };
    if (arg == "--hidden")
      f.hidden = std::atoll(value());
    else if (arg == "--batch")
      f.batch = std::atoll(value());
    else if (arg == "--steps")
      f.steps = std::atoi(value());
    else
      throw Error("bench_pipeline: unknown flag " + arg + " (--hidden, --batch, --steps)");
  }
  return f;
}

std::shared_ptr<nn::Sequential> make_model(int stages, int64_t hidden) {
  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>();
  for (int s = 0; s < stages * 2; ++s) {
    model->emplace_back<nn::Linear>(hidden, hidden);
    model->emplace_back<nn::ReLU>();
  }
  return model;
}

// The mean over ranks of `value`, and the max.
std::pair<double, double> mean_and_max(ProcessGroup& pg, double value) {
  Tensor sum = full({1}, value, TensorOptions{DType::f64}), top = sum.clone();
  pg.allreduce(sum)->wait();
  pg.allreduce(top, ReduceOp::Max)->wait();
  return {sum.item<double>() / pg.size(), top.item<double>()};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Flags f = parse(argc, argv);
    InitOptions init;
    init.device = Device::cpu();
    ProcessGroup pg = init_process_group(init);
    const int p = pg.size();
    auto full_model = make_model(p, f.hidden);
    auto stage = pipeline_stage(*full_model, pg.rank(), p);
    constexpr int kChunks = 2;  // interleaved: 2 chunks of one Linear + ReLU per rank
    std::vector<std::shared_ptr<nn::Module> > chunks;
    for (auto& c : pipeline_chunks(*full_model, pg.rank(), p, kChunks)) chunks.push_back(c);
    optim::SGDOptions sgd;
    sgd.lr = 1e-3;
    optim::SGD opt(stage->parameters(), sgd);  // the same parameters as the chunks'
    auto loss = [](const Tensor& out, const Tensor& y) { return nn::cross_entropy(out, y); };
    manual_seed(2);
    Tensor x = randn({f.batch, f.hidden}), y = randint(0, f.hidden, {f.batch});

    if (pg.is_main())
      std::printf(
          "bench_pipeline: %d stages (ranks), each 2 x Linear(%lld, %lld) + ReLU, batch %lld, %d timed "
          "steps\n"
          "%-7s %3s %8s %8s %7s %9s %7s %10s %10s %9s\n",
          p, static_cast<long long>(f.hidden), static_cast<long long>(f.hidden),
          static_cast<long long>(f.batch), f.steps, "sched", "m", "bubble", "formula", "ratio", "step ms",
          "vs m=1", "MB sent", "formula", "act. MB");
    const char* names[4] = {"GPipe", "1F1B", "interl.", "ZB-H1"};
    const PipelineSchedule schedules[4] = {PipelineSchedule::GPipe, PipelineSchedule::OneForwardOneBackward,
                                           PipelineSchedule::Interleaved1F1B, PipelineSchedule::ZeroBubbleH1};
    double base_ms[4] = {0, 0, 0, 0};
    int pass = 0;
    for (int m : {1, 2, 4, 8, 16}) {
      const bool reversed = pass++ % 2 == 1;  // every other m in reverse order: drift hits all alike
      for (int k = 0; k < 4; ++k) {
        const int which = reversed ? 3 - k : k;
        const bool interleaved = which == 2, zero_bubble = which == 3;
        if (interleaved && m % p != 0) continue;  // micro-batches go in groups of p
        const int v = interleaved ? kChunks : 1;
        Pipeline pipe =
            interleaved ? Pipeline(chunks, pg, loss) : Pipeline(stage, pg, loss, schedules[which]);
        double step_ms = 0, compute_ms = 0, sent = 0;
        int64_t held_before = 0;
        for (int s = 0; s < 2 + f.steps; ++s) {
          pg.barrier()->wait();  // steps start together
          if (s == 2) {          // the timed steps: the peak above what the stage holds between steps
            held_before = cpu_device_memory(0).live_bytes;
            reset_cpu_device_peak(0);
          }
          const int64_t before = pg.requested_traffic().bytes;
          opt.zero_grad();
          PipelineStepResult r =
              pipe.train_step(pipe.is_first() ? x : Tensor(), pipe.is_last() ? y : Tensor(), m);
          opt.step();
          if (s < 2) continue;
          sent += static_cast<double>(pg.requested_traffic().bytes - before);
          step_ms += r.step_ms;
          compute_ms += r.compute_ms;
        }
        const double bubble = mean_and_max(pg, 1.0 - compute_ms / step_ms).first;
        const double slowest_ms = mean_and_max(pg, step_ms / f.steps).second;
        const double sent_mb = mean_and_max(pg, sent / f.steps).first / 1e6;
        const double activation_mb =
            mean_and_max(pg, static_cast<double>(cpu_device_memory(0).peak_bytes - held_before)).second / 1e6;
        const double message = 64.0 + static_cast<double>(f.batch / m * f.hidden) * 4.0;
        const double sent_formula_mb = 2.0 * m * (p * v - 1) / p * message / 1e6;
        if (interleaved ? m == p : m == 1) base_ms[which] = slowest_ms;
        const double theory = static_cast<double>(p - 1) / ((zero_bubble ? 3 : v) * m + p - 1);
        if (pg.is_main())
          std::printf("%-7s %3d %8.3f %8.3f %7.2f %9.2f %7.2f %10.3f %10.3f %9.2f\n", names[which], m, bubble,
                      theory, theory > 0 ? bubble / theory : 0.0, slowest_ms, slowest_ms / base_ms[which],
                      sent_mb, sent_formula_mb, activation_mb);
      }
    }
    if (pg.is_main())
      std::printf(
          "bubble = mean over ranks of 1 - (stage forward + backward time) / step time; formula = "
          "(p-1)/(m+p-1), "
          "interleaved (p-1)/(v m+p-1) with v = %d, ZB-H1 (p-1)/(3m+p-1); ratio = bubble / formula. "
          "Communication and the loss "
          "count "
          "as idle here. vs m=1: the step time against the schedule's first row (interleaved: m = p). MB "
          "sent: "
          "per rank per step. act. MB: the most a stage held above its between-steps bytes, the largest "
          "over the ranks.\n",
          kChunks);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
    return 1;
  }
}
