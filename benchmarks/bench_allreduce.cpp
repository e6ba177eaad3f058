// bench_allreduce: the hand-written ring all-reduce against the native one, like nccl-tests'
// all_reduce_perf. Run it under the MPI launcher, one process per rank:
//
//   mpirun -np 2 build/benchmarks/bench_allreduce [--min-bytes 8] [--max-bytes 64M]
//          [--dtype f32|f64|bf16|f16] [-w 5] [-n 20] [--chunk-bytes 1M] [--json PATH] [--quick]
//          [--latency] [--verify]
//
// (as root, and with more ranks than cores: mpirun --allow-run-as-root --oversubscribe ...).
// Launched without mpirun it runs as a world of one, where every all-reduce is a no-op, and says
// how to launch it properly.
//
// For each size, from --min-bytes doubling up to --max-bytes, three all-reduces (op sum) of the
// same buffer, side by side:
//   ring    parallel::ring_allreduce: the hand-written ring over the group's send/recv, reduced
//           by our own kernels, run on the group's ring thread (the path DDP takes).
//   native  ProcessGroup::allreduce: MPI_Allreduce run by the MPI backend's collective thread
//           (the other path DDP can take).
//   mpi     MPI_Allreduce called directly on MPI_COMM_WORLD from this thread: the library's
//           own blocking collective with no framework in between; the ceiling (f32/f64 only:
//           MPI has no bf16/f16 datatype).
// Columns, per algorithm (as nccl-tests): time(us), algbw = bytes / time, busbw = algbw *
// 2(N-1)/N (the bytes each rank's link carried per second; see parallel/comm/ring_allreduce.h), and
// #wrong, then the ratios of the ring's busbw to the native and the mpi busbw.
//
// Method. The machine may be shared and noisy, so each timed iteration is measured on its own:
// barrier, start clock, one all-reduce, stop clock; algorithms alternate iteration by iteration
// (the first one rotates), and a time is the median over the -n iterations of each rank's
// times, then the maximum over ranks (the slowest rank is when the collective is done). The
// timed iterations reduce the buffer in place again and again (its values grow, which changes
// no timing); correctness is checked separately, like nccl-tests' check pass: every rank fills
// the buffer with known data (rank r, element i: 1 + (r + i) mod 7, so every sum is a small
// integer, exact in every dtype), runs each algorithm once, and counts the elements that differ
// from the closed-form sum; #wrong is the total over ranks. The exit status is 1 if any is wrong.
//
// Measurement settings: the group's timeout is one hour and verify_collectives is off (it adds a
// small signature exchange before each native collective; --verify turns it on to measure that).
//
// --latency: the small-message view, where a framework's own overhead shows (thread hand-offs,
// the signature exchange, the heartbeat's MPI traffic): native and mpi only, 8 B to 64 KB, -w 20
// -n 300 (explicit flags still win). The native/mpi time ratio is printed per size. Compare runs
// with MG_FAILURE_DETECTION_S=0 (heartbeat off) and --verify to see what each costs.
//
// JSON goes to --json PATH, or else to $MG_BENCH_OUT_DIR/bench_allreduce.json when that is set.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "bench_common.h"
#include "core/tensor.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/ring_allreduce.h"

#ifdef MG_HAS_MPI
#include <mpi.h>
#endif

using mg::bench::median;

namespace {

using Clock = std::chrono::steady_clock;
using mg::DType;
using mg::Tensor;
namespace par = mg::parallel;

struct Flags {
  int64_t min_bytes = 8;
  int64_t max_bytes = int64_t{64} << 20;
  DType dtype = DType::f32;
  int warmup = 5;
  int iters = 20;
  size_t chunk_bytes = par::RingOptions{}.chunk_bytes;
  std::string json_path;
  bool quick = false;
  bool latency = false;                        // small sizes, native vs mpi, many iterations
  bool verify = false;                         // InitOptions::verify_collectives
  std::string algorithms = "ring,native,mpi";  // which columns to run (investigation aid)
};

const char* usage =
    "usage: mpirun -np N bench_allreduce [--min-bytes B] [--max-bytes B] [--dtype f32|f64|bf16|f16]\n"
    "                                    [-w|--warmup N] [-n|--iters N] [--chunk-bytes B] [--json PATH]\n"
    "                                    [--algos ring,native,mpi] [--quick] [--latency] [--verify]\n"
    "  sizes accept K, M, G suffixes (powers of 1024); defaults: 8 B to 64M, f32, -w 5 -n 20,\n"
    "  chunk 1M; --quick: up to 4M, -w 2 -n 5; --latency: native,mpi, up to 64K, -w 20 -n 300;\n"
    "  --verify: verify_collectives on (the signature exchange before each native collective)\n";

// "64M" -> 67108864. Suffixes K, M, G (powers of 1024), optional trailing B.
int64_t parse_bytes(const std::string& text, const char* flag) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  MG_CHECK(end != text.c_str(), flag, ": '", text, "' is not a size (e.g. 8, 1K, 64M)");
  std::string suffix(end);
  if (!suffix.empty() && (suffix.back() == 'B' || suffix.back() == 'b')) suffix.pop_back();
  double scale = 1;
  if (suffix == "K" || suffix == "k") {
    scale = 1024.0;
  } else if (suffix == "M" || suffix == "m") {
    scale = 1024.0 * 1024;
  } else if (suffix == "G" || suffix == "g") {
    scale = 1024.0 * 1024 * 1024;
  } else {
    MG_CHECK(suffix.empty(), flag, ": unknown size suffix in '", text, "' (use K, M or G)");
  }
  MG_CHECK(value >= 0, flag, ": '", text, "' is negative");
  return static_cast<int64_t>(value * scale);
}

DType parse_dtype(const std::string& text) {
  if (text == "f32" || text == "float") return DType::f32;
  if (text == "f64" || text == "double") return DType::f64;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  if (text == "f16" || text == "half") return DType::f16;
  throw mg::Error(mg::str_cat("--dtype: '", text, "' is not one of f32, f64, bf16, f16"));
}

// nccl-tests' names for the type column.
const char* type_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "float";
    case DType::f64: return "double";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "half";
    default: return mg::dtype_name(dtype);
  }
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  bool iters_set = false, warmup_set = false, max_set = false, algos_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      MG_CHECK(i + 1 < argc, arg, " needs a value\n", usage);
      return argv[++i];
    };
    if (arg == "--min-bytes" || arg == "-b") {
      f.min_bytes = parse_bytes(value(), "--min-bytes");
    } else if (arg == "--max-bytes" || arg == "-e") {
      f.max_bytes = parse_bytes(value(), "--max-bytes");
      max_set = true;
    } else if (arg == "--dtype" || arg == "-d") {
      f.dtype = parse_dtype(value());
    } else if (arg == "--warmup" || arg == "-w") {
      f.warmup = std::atoi(value().c_str());
      warmup_set = true;
    } else if (arg == "--iters" || arg == "-n") {
      f.iters = std::atoi(value().c_str());
      iters_set = true;
    } else if (arg == "--chunk-bytes") {
      f.chunk_bytes = static_cast<size_t>(parse_bytes(value(), "--chunk-bytes"));
    } else if (arg == "--algos") {
      f.algorithms = value();
      algos_set = true;
    } else if (arg == "--json") {
      f.json_path = value();
    } else if (arg == "--quick") {
      f.quick = true;
    } else if (arg == "--latency") {
      f.latency = true;
    } else if (arg == "--verify") {
      f.verify = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage);
      std::exit(0);
    } else {
      throw mg::Error(mg::str_cat("unknown flag '", arg, "'\n", usage));
    }
  }
  if (f.quick) {
    if (!max_set) f.max_bytes = int64_t{4} << 20;
    if (!warmup_set) f.warmup = 2;
    if (!iters_set) f.iters = 5;
  }
  if (f.latency) {
    if (!max_set) f.max_bytes = int64_t{64} << 10;
    if (!warmup_set) f.warmup = 20;
    if (!iters_set) f.iters = 300;
    if (!algos_set) f.algorithms = "native,mpi";
  }
  MG_CHECK(f.min_bytes >= 1, "--min-bytes must be >= 1, got ", f.min_bytes);
  MG_CHECK(f.max_bytes >= f.min_bytes, "--max-bytes (", f.max_bytes, ") is below --min-bytes (", f.min_bytes,
           ")");
  MG_CHECK(f.iters >= 1, "--iters must be >= 1, got ", f.iters);
  MG_CHECK(f.warmup >= 0, "--warmup must be >= 0, got ", f.warmup);
  if (f.json_path.empty()) {
    if (const char* dir = std::getenv("MG_BENCH_OUT_DIR"); dir != nullptr && *dir != '\0')
      f.json_path = std::string(dir) + "/bench_allreduce.json";
  }
  return f;
}

// This process's host name and the CPUs it may run on ("node0 cpus 0-1"): the benchmark prints
// every rank's, because where the ranks run decides small-message latency (see --latency).
[[maybe_unused]] std::string placement() {
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  std::string list;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &cpus)) continue;
      int last = c;
      while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &cpus)) ++last;
      list += (list.empty() ? "" : ",") + (last > c ? mg::str_cat(c, "-", last) : mg::str_cat(c));
      c = last;
    }
  }
  return mg::str_cat(host, " cpus ", list.empty() ? "?" : list);
}

// Rank r's check data at element i, and the closed-form sum over N ranks.
double pattern(int rank, int64_t i) { return 1.0 + static_cast<double>((rank + i) % 7); }
double pattern_sum(int world, int64_t i) {
  double sum = 0;
  for (int r = 0; r < world; ++r) sum += pattern(r, i);
  return sum;
}

void fill_pattern(Tensor& buffer, int rank) {
  std::vector<double> values(static_cast<size_t>(buffer.numel()));
  for (int64_t i = 0; i < buffer.numel(); ++i) values[static_cast<size_t>(i)] = pattern(rank, i);
  buffer.copy_(mg::tensor(values, mg::Shape{buffer.numel()}));
}

struct Algorithm {
  std::string name;
  std::function<void(Tensor&)> run;  // one in-place sum all-reduce, finished on return
};

struct Result {
  double time_us = 0;  // median over iterations, max over ranks
  double mean_us = 0;  // mean over iterations, max over ranks
  double algbw = 0;    // GB/s
  double busbw = 0;    // GB/s
  int64_t wrong = 0;   // over all ranks
  bool measured = false;
};

struct Row {
  int64_t bytes = 0;
  int64_t count = 0;
  std::vector<Result> results;  // one per algorithm
};

// The maximum of `value` over ranks (bookkeeping only, through the native collective).
double max_over_ranks(par::ProcessGroup& pg, double value) {
  Tensor t = mg::tensor(std::vector<double>{value});
  pg.allreduce(t, par::ReduceOp::Max)->wait();
  return t.item<double>();
}
int64_t sum_over_ranks(par::ProcessGroup& pg, int64_t value) {
  Tensor t = mg::tensor(std::vector<int64_t>{value});
  pg.allreduce(t, par::ReduceOp::Sum)->wait();
  return t.item<int64_t>();
}

std::string fixed(double v, int precision) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", precision, v);
  return text;
}

void write_json(const std::string& path, const Flags& f, int world, const std::string& mpi_library,
                const std::vector<Algorithm>& algorithms, const std::vector<Row>& rows,
                const std::vector<double>& avg_busbw) {
  std::ofstream out(path);
  MG_CHECK(out.good(), "--json: cannot write '", path, "'");
  out << "{\n  \"benchmark\": \"bench_allreduce\",\n  \"world_size\": " << world << ",\n  \"dtype\": \""
      << mg::dtype_name(f.dtype) << "\",\n  \"op\": \"sum\",\n  \"warmup\": " << f.warmup
      << ",\n  \"iters\": " << f.iters << ",\n  \"ring_chunk_bytes\": " << f.chunk_bytes
      << ",\n  \"mpi_library\": \"" << mpi_library
      << "\",\n  \"time\": \"median per iteration, max over ranks\",\n"
      << "  \"avg_busbw_GB_per_s\": {";
  for (size_t a = 0; a < algorithms.size(); ++a)
    out << (a ? ", " : "") << "\"" << algorithms[a].name << "\": " << fixed(avg_busbw[a], 4);
  out << "},\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    out << "    {\"bytes\": " << row.bytes << ", \"count\": " << row.count;
    for (size_t a = 0; a < algorithms.size(); ++a) {
      const Result& r = row.results[a];
      out << ", \"" << algorithms[a].name << "\": ";
      if (!r.measured) {
        out << "null";
        continue;
      }
      out << "{\"time_us\": " << fixed(r.time_us, 2) << ", \"mean_time_us\": " << fixed(r.mean_us, 2)
          << ", \"algbw_GB_per_s\": " << fixed(r.algbw, 4) << ", \"busbw_GB_per_s\": " << fixed(r.busbw, 4)
          << ", \"wrong\": " << r.wrong << "}";
    }
    out << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  out << "  ]\n}\n";
}

int run(int argc, char** argv) {
  const Flags f = parse_flags(argc, argv);

  par::InitOptions init;
  init.timeout = std::chrono::hours(1);  // a 64 MiB ring on oversubscribed cores is slow, not dead
  init.verify_collectives = f.verify;    // off: no signature exchange in front of each native collective
  init.device = mg::Device::cpu();
  par::ProcessGroup pg = par::init_process_group(init);
  const int world = pg.size();
  const int rank = pg.rank();
  const bool main_rank = rank == 0;

  std::string mpi_library = "none (world of one, MPI not initialised)";
  bool mpi_direct = false;
  std::vector<std::string> placements;  // every rank's host and CPUs (rank 0 only)
#ifdef MG_HAS_MPI
  int mpi_up = 0;
  MPI_Initialized(&mpi_up);
  if (mpi_up) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    mpi_library = std::string(version, static_cast<size_t>(length));
    mpi_library = mpi_library.substr(0, mpi_library.find_first_of(",\n"));
    mpi_direct = f.dtype == DType::f32 || f.dtype == DType::f64;
  }
  // Every rank's host and CPUs, printed by rank 0. Ranks on different host names bound to the
  // same single CPU are one core's worth of ranks when those hosts are network namespaces of one
  // machine (scripts/cluster): Open MPI busy-polls, so each message then waits for a scheduler
  // time slice (~8 ms measured, against ~20 us with --bind-to none).
  if (mpi_up && world > 1) {
    constexpr int kWidth = 128;
    std::string mine = placement();
    mine.resize(kWidth - 1);
    std::vector<char> all(static_cast<size_t>(kWidth) * static_cast<size_t>(world), '\0');
    MPI_Gather(mine.c_str(), kWidth, MPI_CHAR, all.data(), kWidth, MPI_CHAR, 0, MPI_COMM_WORLD);
    for (int r = 0; r < world; ++r) placements.emplace_back(all.data() + static_cast<size_t>(r) * kWidth);
  }
#endif

  if (main_rank) {
    if (world == 1) {
      std::printf(
          "# bench_allreduce is running as a world of one (no MPI launcher found), where an all-reduce\n"
          "# has nothing to exchange: the times below are only the call overheads and busbw is 0.\n"
          "# Launch one process per rank instead, e.g.\n"
          "#   mpirun -np 2 %s            (as root: mpirun --allow-run-as-root --oversubscribe ...)\n",
          argv[0]);
    }
    std::printf("# bench_allreduce: world size %d, %s, op sum, -w %d -n %d, ring chunk %zu B\n", world,
                mg::dtype_name(f.dtype), f.warmup, f.iters, f.chunk_bytes);
    std::printf("# backend %s; MPI: %s\n", pg.backend_name().c_str(), mpi_library.c_str());
    const char* detection = std::getenv("MG_FAILURE_DETECTION_S");
    std::printf("# verify_collectives %s; heartbeat: MG_FAILURE_DETECTION_S=%s\n", f.verify ? "on" : "off",
                detection != nullptr && *detection != '\0' ? detection : "(unset: default on)");
    bool shared_single_cpu = false;
    for (size_t r = 0; r < placements.size(); ++r) {
      std::printf("# rank %zu: %s\n", r, placements[r].c_str());
      for (size_t q = 0; q < r; ++q) {
        const std::string& a = placements[q];
        const std::string& b = placements[r];
        const size_t cut_a = a.find(" cpus "), cut_b = b.find(" cpus ");
        const std::string cpus = a.substr(cut_a);
        shared_single_cpu =
            shared_single_cpu || (a.substr(0, cut_a) != b.substr(0, cut_b) && cpus == b.substr(cut_b) &&
                                  cpus.find_first_of(",-") == std::string::npos);
      }
    }
    if (shared_single_cpu) {
      std::printf(
          "# note: ranks on different hosts are bound to the same single CPU; if those hosts are\n"
          "# namespaces of one machine (scripts/cluster), they share that core and every message waits\n"
          "# for a time slice (milliseconds): launch with --bind-to none or --mca mpi_yield_when_idle 1\n");
    }
    std::printf(
        "# time = median per iteration (barrier before each), max over ranks; busbw = algbw * 2(N-1)/N\n#\n");
  }

  par::RingOptions ring_options;
  ring_options.chunk_bytes = f.chunk_bytes;
  std::vector<Algorithm> algorithms = {
      {"ring", [&](Tensor& t) { par::ring_allreduce(pg, t, par::ReduceOp::Sum, ring_options); }},
      {"native", [&](Tensor& t) { pg.allreduce(t, par::ReduceOp::Sum)->wait(); }},
  };
#ifdef MG_HAS_MPI
  if (mpi_direct) {
    const MPI_Datatype type = f.dtype == DType::f32 ? MPI_FLOAT : MPI_DOUBLE;
    algorithms.push_back({"mpi", [type](Tensor& t) {
                            const int code =
                                MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), static_cast<int>(t.numel()), type,
                                              MPI_SUM, MPI_COMM_WORLD);
                            MG_CHECK(code == MPI_SUCCESS, "MPI_Allreduce failed with code ", code);
                          }});
  }
#endif
  // --algos: keep the named ones (in the order above, so the ring stays first for the ratios).
  algorithms.erase(std::remove_if(algorithms.begin(), algorithms.end(),
                                  [&](const Algorithm& a) {
                                    return ("," + f.algorithms + ",").find("," + a.name + ",") ==
                                           std::string::npos;
                                  }),
                   algorithms.end());
  MG_CHECK(!algorithms.empty(), "--algos '", f.algorithms, "' names none of ring, native, mpi");
  const size_t n_alg = algorithms.size();
  const bool ratios = algorithms[0].name == "ring" && n_alg > 1;
  // The framework's overhead on a native collective: its time over the bare MPI_Allreduce's.
  auto index_of = [&](const char* name) {
    for (size_t a = 0; a < n_alg; ++a)
      if (algorithms[a].name == name) return static_cast<int>(a);
    return -1;
  };
  const int native_index = index_of("native"), mpi_index = index_of("mpi");
  const bool overhead = native_index >= 0 && mpi_index >= 0;

  if (main_rank) {
    std::string groups = "#                                     ";
    std::string heads = "#       size         count      type redop";
    std::string units = "#        (B)    (elements)                ";
    for (const Algorithm& a : algorithms) {
      char title[64];
      std::snprintf(title, sizeof title, "  %-34s", a.name.c_str());
      groups += title;
      heads += "      time   algbw   busbw #wrong";
      units += "      (us)  (GB/s)  (GB/s)       ";
    }
    for (size_t a = 1; ratios && a < n_alg; ++a) {
      char title[32];
      std::snprintf(title, sizeof title, "  %11s", ("ring/" + algorithms[a].name).c_str());
      heads += title;
    }
    if (overhead) heads += "  native/mpi";
    std::printf("%s\n%s\n%s\n", groups.c_str(), heads.c_str(), units.c_str());
    std::fflush(stdout);
  }

  const size_t item = mg::dtype_size(f.dtype);
  const double bus_factor = 2.0 * (world - 1) / world;
  std::vector<Row> rows;
  int64_t total_wrong = 0;
  for (int64_t bytes = f.min_bytes; bytes <= f.max_bytes; bytes *= 2) {
    const int64_t count = bytes / static_cast<int64_t>(item);
    if (count == 0) continue;
    Row row;
    row.count = count;
    row.bytes = count * static_cast<int64_t>(item);
    Tensor buffer = mg::empty({count}, mg::TensorOptions{f.dtype, mg::Device::cpu(), false});

    // Timing: warm-up, then one barrier-separated iteration per algorithm per round.
    fill_pattern(buffer, rank);
    for (int w = 0; w < f.warmup; ++w) {
      for (const Algorithm& a : algorithms) a.run(buffer);
    }
    std::vector<std::vector<double>> times(n_alg);
    for (int it = 0; it < f.iters; ++it) {
      for (size_t j = 0; j < n_alg; ++j) {
        const size_t a = (static_cast<size_t>(it) + j) % n_alg;
        pg.barrier()->wait();
        const auto start = Clock::now();
        algorithms[a].run(buffer);
        times[a].push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
      }
    }
    // Checking: fresh known data, one run, compare with the closed form.
    row.results.resize(n_alg);
    for (size_t a = 0; a < n_alg; ++a) {
      fill_pattern(buffer, rank);
      algorithms[a].run(buffer);
      const std::vector<double> got = buffer.to_vector<double>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < count; ++i)
        wrong += got[static_cast<size_t>(i)] == pattern_sum(world, i) ? 0 : 1;
      Result& r = row.results[a];
      r.measured = true;
      r.wrong = sum_over_ranks(pg, wrong);
      r.time_us = max_over_ranks(pg, median(times[a]));
      double mean = 0;
      for (double t : times[a]) mean += t / static_cast<double>(times[a].size());
      r.mean_us = max_over_ranks(pg, mean);
      r.algbw = static_cast<double>(row.bytes) / (r.time_us * 1e-6) / 1e9;
      r.busbw = r.algbw * bus_factor;
      total_wrong += r.wrong;
    }
    rows.push_back(row);

    if (main_rank) {
      std::printf("%12lld  %12lld  %8s   sum", static_cast<long long>(row.bytes),
                  static_cast<long long>(count), type_name(f.dtype));
      for (const Result& r : row.results)
        std::printf("  %8.1f  %6.3f  %6.3f  %5lld", r.time_us, r.algbw, r.busbw,
                    static_cast<long long>(r.wrong));
      auto ratio = [&](size_t other) {
        const double den = row.results[other].busbw;
        return den > 0 ? fixed(row.results[0].busbw / den, 3) : std::string("n/a");
      };
      for (size_t a = 1; ratios && a < n_alg; ++a) std::printf("  %11s", ratio(a).c_str());
      if (overhead) {
        const double mpi_time = row.results[static_cast<size_t>(mpi_index)].time_us;
        const double native_time = row.results[static_cast<size_t>(native_index)].time_us;
        std::printf("  %10s", mpi_time > 0 ? fixed(native_time / mpi_time, 2).c_str() : "n/a");
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }

  // Summary: nccl-tests' "Avg bus bandwidth" (mean over all sizes), and the ratios at >= 16 MB,
  // where the floor (ring >= 0.9x MPI_Allreduce) applies.
  std::vector<double> avg_busbw(n_alg, 0.0);
  for (const Row& row : rows) {
    for (size_t a = 0; a < n_alg; ++a)
      avg_busbw[a] += row.results[a].busbw / static_cast<double>(rows.size());
  }
  if (main_rank) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(total_wrong),
                total_wrong == 0 ? "OK" : "WRONG RESULTS");
    for (size_t a = 0; a < n_alg; ++a)
      std::printf("# Avg bus bandwidth    : %.4f GB/s (%s)\n", avg_busbw[a], algorithms[a].name.c_str());
    for (size_t other = 1; ratios && other < n_alg; ++other) {
      double lo = 0, sum = 0;
      int n = 0;
      for (const Row& row : rows) {
        if (row.bytes < (int64_t{16} << 20) || row.results[other].busbw <= 0) continue;
        const double ratio = row.results[0].busbw / row.results[other].busbw;
        lo = n == 0 ? ratio : std::min(lo, ratio);
        sum += ratio;
        ++n;
      }
      if (n > 0) {
        std::printf("# ring/%s busbw at >= 16 MB: mean %.3f, min %.3f over %d sizes\n",
                    algorithms[other].name.c_str(), sum / n, lo, n);
      }
    }
    if (!f.json_path.empty()) {
      write_json(f.json_path, f, world, mpi_library, algorithms, rows, avg_busbw);
      std::printf("# JSON written to %s\n", f.json_path.c_str());
    }
  }
  return total_wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    return 2;
  }
}
