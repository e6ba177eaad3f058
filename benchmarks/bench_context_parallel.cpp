// bench_context_parallel: ring attention's load balance and traffic, measured against their formulas.
//
//   OMP_NUM_THREADS=1 mpirun -np N build/benchmarks/bench_context_parallel [--seq 2048] [--heads 4]
//                                                                          [--dim 64] [--repeats 3]
//
// One causal attention forward + backward over a sequence of --seq positions split over the N
// ranks, in the contiguous and in the zigzag layout (alternated, after a warm-up of each). Per
// rank: the attention blocks it computed, the CPU time of its blocks (the calling thread's: with
// OMP_NUM_THREADS=1 that is all of their work, whatever else shares the cores), and the bytes it
// sent beside the formula -- forward 2 (N-1) C, backward 2 (N-1) C + 2 N C, with C the elements of
// one rank's K. The balance is the slowest rank's compute over the mean: 1 is perfect, and the
// whole ring waits for the slowest rank at every step. Memory: the most any rank held on cpu:0
// during a pass, above its inputs, against the same attention over the whole sequence on one
// process.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "multigrad.h"

#ifdef MG_HAS_CLI11
#include <CLI/CLI.hpp>
#endif

using namespace mg;
using namespace mg::parallel;

namespace {

struct Flags {
  int64_t seq = 2048, heads = 4, dim = 64;
  int repeats = 3;
};

// Every rank's value of `x`, in rank order.
std::vector<double> gathered(ProcessGroup& pg, double x) {
  Tensor all = zeros({pg.size()}, TensorOptions{DType::f64});
  pg.allgather(all, full({1}, x, TensorOptions{DType::f64}))->wait();
  return all.to_vector<double>();
}

struct Pass {
  RingAttentionStats stats;
  double peak_bytes = 0;  // the most held on cpu:0 during forward + backward, above the inputs
};

// One forward + backward of causal attention over `positions` positions: through the ring when
// `pg` is given, else on this process alone.
Pass one_pass(ProcessGroup* pg, const Flags& f, int64_t positions, ContextLayout layout) {
  manual_seed(uint64_t(7 + (pg != nullptr ? pg->rank() : 0)));
  const Shape shape{1, f.heads, positions, f.dim};
  Tensor q = randn(shape), k = randn(shape), v = randn(shape);
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  Pass pass;
  RingAttentionOptions options;
  options.causal = true;
  options.layout = layout;
  options.stats = &pass.stats;
  if (pg != nullptr) pg->barrier()->wait();
  const int64_t before = cpu_device_memory(0).live_bytes;
  reset_cpu_device_peak(0);
  if (pg != nullptr) {
    ring_attention(q, k, v, *pg, options).sum().backward();
  } else {
    AttentionOptions whole;
    whole.causal = true;
    scaled_dot_product_attention(q, k, v, whole).sum().backward();
  }
  pass.peak_bytes = double(cpu_device_memory(0).peak_bytes - before);
  return pass;
}

}  // namespace

int main(int argc, char** argv) {
#ifndef MG_HAS_CLI11
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "bench_context_parallel needs CLI11 (apt-get install libcli11-dev)\n");
  return 1;
#else
  Flags f;
  CLI::App app{"Ring attention per rank, contiguous vs zigzag: blocks, compute, waits, bytes sent"};
  app.add_option("--seq", f.seq, "sequence length, divisible by 2 x the ranks")->capture_default_str();
  app.add_option("--heads", f.heads, "attention heads")->capture_default_str();
  app.add_option("--dim", f.dim, "head dim")->capture_default_str();
  app.add_option("--repeats", f.repeats, "timed passes of each layout")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    InitOptions init;
    init.device = Device::cpu();
    ProcessGroup pg = init_process_group(init);
    const int n = pg.size();
    MG_CHECK(f.seq % (2 * n) == 0, "bench_context_parallel: --seq ", f.seq, " must divide into 2 x ", n,
             " chunks");
    const char* names[2] = {"contiguous", "zigzag"};
    const ContextLayout layouts[2] = {ContextLayout::contiguous, ContextLayout::zigzag};
    const int64_t local = f.seq / n;
    for (ContextLayout layout : layouts) one_pass(&pg, f, local, layout);  // warm-up
    RingAttentionStats total[2];
    double peak[2] = {0, 0};
    for (int r = 0; r < f.repeats; ++r)
      for (int which = 0; which < 2; ++which) {
        const Pass pass = one_pass(&pg, f, local, layouts[which]);
        const RingAttentionStats& s = pass.stats;
        total[which].blocks += s.blocks;
        total[which].compute_seconds += s.compute_seconds;
        total[which].wait_seconds += s.wait_seconds;
        total[which].bytes_sent += s.bytes_sent;
        peak[which] = std::max(peak[which], pass.peak_bytes);
      }
    // The same attention over the whole sequence on one process, for its memory.
    const double whole_peak = one_pass(nullptr, f, f.seq, ContextLayout::contiguous).peak_bytes;
    const double c = double(f.seq / n) * double(f.heads * f.dim);  // elements of one rank's K
    // f32 bytes: forward 2 (N-1) C, backward 2 (N-1) C + 2 N C
    const double formula = 4.0 * (2.0 * (n - 1) * c + 2.0 * (n - 1) * c + 2.0 * n * c);
    if (pg.is_main())
      std::printf(
          "bench_context_parallel: causal attention, T %lld over %d ranks, %lld heads x %lld, f32, forward + "
          "backward, mean of %d\n%-10s %5s %7s %12s %9s %12s %12s %7s\n",
          static_cast<long long>(f.seq), n, static_cast<long long>(f.heads), static_cast<long long>(f.dim),
          f.repeats, "layout", "rank", "blocks", "compute ms", "wait ms", "MB sent", "formula MB", "ratio");
    for (int which = 0; which < 2; ++which) {
      const RingAttentionStats& s = total[which];
      const std::vector<double> blocks = gathered(pg, double(s.blocks) / f.repeats);
      const std::vector<double> compute = gathered(pg, 1e3 * s.compute_seconds / f.repeats);
      const std::vector<double> wait = gathered(pg, 1e3 * s.wait_seconds / f.repeats);
      const std::vector<double> sent = gathered(pg, double(s.bytes_sent) / f.repeats);
      if (!pg.is_main()) continue;
      double mean = 0, slowest = 0;
      for (int r = 0; r < n; ++r) {
        std::printf("%-10s %5d %7.0f %12.1f %9.1f %12.3f %12.3f %7.3f\n", names[which], r, blocks[size_t(r)],
                    compute[size_t(r)], wait[size_t(r)], sent[size_t(r)] / 1e6, formula / 1e6,
                    sent[size_t(r)] / formula);
        mean += compute[size_t(r)] / n;
        slowest = std::max(slowest, compute[size_t(r)]);
      }
      std::printf("%-10s balance: slowest rank's compute / mean = %.3f\n", names[which], slowest / mean);
    }
    const std::vector<double> peaks = gathered(pg, std::max(peak[0], peak[1]));
    if (pg.is_main()) {
      const double top = *std::max_element(peaks.begin(), peaks.end());
      std::printf(
          "memory: the most any rank held during forward + backward, above its inputs: %.2f MB; one process "
          "over "
          "the whole sequence: %.2f MB; ratio %.3f (1/N = %.3f)\n",
          top / 1e6, whole_peak / 1e6, top / whole_peak, 1.0 / n);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_context_parallel: %s\n", e.what());
    return 1;
  }
#endif
}
