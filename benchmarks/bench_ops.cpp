// bench_ops: CPU op throughput against ceilings measured in the same run.
//
//   build/benchmarks/bench_ops [--quick] [--repeats N] [--json PATH]
//
// Default: 16M floats, [4096, 4096] and 1024^3, 2 warmup + 21 timed rounds. --quick: 4M floats,
// [2048, 2048] and 512^3, 1 + 5 rounds. The exit status is 1 when a result check fails.
//
// Ceilings (measured here, never assumed):
//   memcpy   copy bandwidth of a 16M-float (64 MiB) buffer, counting bytes read + written,
//            split across the same number of threads the OpenMP kernels use (a 1-thread
//            memcpy row is printed beside it for reference).
//   sgemm    OpenBLAS cblas_sgemm at 1024^3, called through mg::kernels::cpu::gemm with f32
//            arguments (which is the blocked fallback when the build has no OpenBLAS; the
//            binary says which).
//
// Rows: matmul through the public mg::matmul and the hand-written gemm_blocked (GFLOP/s,
// ratio to sgemm); elementwise ops, a sum, a row softmax and a strided copy through the public
// API (GB/s of the bytes that must move, each stream counted once; ratio to memcpy). Public ops
// allocate their output on every call; the CPU caching allocator hands back the block freed by
// the previous call, so after warmup that is a free-list lookup, not fresh page faults. Rows
// named "ref:" are plain loops, not multigrad code, that show what bounds an op: the same map
// calling libm's expf / tanhf per element, x*2 with ordinary and with streaming stores, a
// vectorised sum, and a 32x32-tiled transpose. The "ld N" rows
// transpose a matrix whose rows are N floats apart, not a multiple of 4 KiB.
//
// Method: the machine is noisy. Every case runs once per round, the rounds interleave all
// cases (the starting case rotates each round), and after the warmup rounds a case's time is
// the median over its rounds. Each non-ceiling case runs right after its ceiling; its ratio is
// the median over rounds of those two back-to-back rates, so drifts in what the machine
// delivers cancel. The memcpy ceiling has buffers of its own, so it warms no case's inputs.
//
// JSON goes to --json PATH, or else to $MG_BENCH_OUT_DIR/bench_ops.json when that is set
// (scripts/gpu-check sets it).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "kernels/cpu/gemm.h"
#include "multigrad.h"

#ifdef MG_HAS_CLI11
#include <CLI/CLI.hpp>
#endif
#ifdef MG_HAS_NLOHMANN_JSON
#include <nlohmann/json.hpp>
#endif
#ifdef MG_HAS_OPENBLAS
#include <cblas.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef __SSE2__
#include <immintrin.h>
#endif

using mg::bench::cpu_model;
using mg::bench::load_average;
using mg::bench::median;
using mg::bench::utc_now;

namespace {

using Clock = std::chrono::steady_clock;
namespace kcpu = mg::kernels::cpu;

struct Flags {
  bool quick = false;
  int repeats = 0;  // 0: the default for the mode
  std::string json_path;
};

struct Case {
  std::string name;
  std::string size;
  double work;          // bytes (memory-bound rows) or flops (GEMM rows)
  bool flops;           // unit: GFLOP/s when true, GB/s otherwise
  std::string ceiling;  // "memcpy" or "sgemm"
  std::function<void()> run;
  std::vector<double> seconds;  // one per timed round (ceilings: also one per paired run)
  std::vector<double> ratios;   // per round: this case's rate / its ceiling's rate just before
};

struct Row {
  std::string name, size, unit, ceiling;
  double time_ms, value, ratio;
};

int omp_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// memcpy split into one contiguous chunk per thread (the kernels' parallelism).
void parallel_memcpy(float* dst, const float* src, int64_t n, int threads) {
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t chunk = (n + nt - 1) / nt, lo = std::min<int64_t>(n, t * chunk),
                  hi = std::min<int64_t>(n, lo + chunk);
    if (hi > lo) std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo) * sizeof(float));
  }
#else
  (void)threads;
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
#endif
}

// Reference loops: what the same work costs written directly, to tell what bounds an op.
// dst[i] = f(src[i]) with libm called per element, one contiguous range per thread, as the
// elementwise kernels split a contiguous tensor.
template <class F>
void parallel_map(float* dst, const float* src, int64_t n, const F& f) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = f(src[i]);
}

// Sum of n floats: OpenMP splits the range, `simd` lets the compiler vectorise the float sum.
float parallel_sum(const float* src, int64_t n) {
  float total = 0;
#ifdef _OPENMP
#pragma omp parallel for simd reduction(+ : total) schedule(static)
#endif
  for (int64_t i = 0; i < n; ++i) total += src[i];
  return total;
}

#ifdef __SSE2__
// dst[i] = 2 * src[i] with non-temporal stores: the destination lines are written without
// first being read into cache (no read-for-ownership). dst and src 16-byte aligned.
void parallel_scale_streaming(float* dst, const float* src, int64_t n) {
  const __m128 two = _mm_set1_ps(2.0f);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t i = 0; i < n / 4; ++i) _mm_stream_ps(dst + 4 * i, _mm_mul_ps(_mm_load_ps(src + 4 * i), two));
  for (int64_t i = n / 4 * 4; i < n; ++i) dst[i] = 2.0f * src[i];
  _mm_sfence();
}
#endif

// dst[j][i] = src[i][j] for a side x side matrix, in kTile x kTile tiles: a tile's source rows
// and destination rows both stay in L1, so every cache line fetched is used whole.
void tiled_transpose(float* dst, const float* src, int64_t side, int64_t ld_src) {
  constexpr int64_t kTile = 32;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
  for (int64_t j0 = 0; j0 < side; j0 += kTile) {
    for (int64_t i0 = 0; i0 < side; i0 += kTile) {
      const int64_t j1 = std::min(side, j0 + kTile), i1 = std::min(side, i0 + kTile);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) dst[j * side + i] = src[i * ld_src + j];
    }
  }
}

double max_abs_diff(const float* x, const float* y, int64_t n) {
  double d = 0;
  for (int64_t i = 0; i < n; ++i) d = std::max(d, static_cast<double>(std::fabs(x[i] - y[i])));
  return d;
}

// CPU seconds spent by the whole machine (busy, all cpus) and by this process so far. Their
// difference over the timed rounds is what other processes took from us.
struct CpuTimes {
  double machine_busy_s = -1, self_s = 0;
};
CpuTimes cpu_times() {
  CpuTimes t;
  std::ifstream f("/proc/stat");
  std::string cpu;
  double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (f >> cpu >> v[0] >> v[1] >> v[2] >> v[3] >> v[4] >> v[5] >> v[6] >> v[7] && cpu == "cpu") {
    const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
    t.machine_busy_s = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / tick;  // all but idle, iowait
  }
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  t.self_s = r.ru_utime.tv_sec + r.ru_stime.tv_sec + 1e-6 * (r.ru_utime.tv_usec + r.ru_stime.tv_usec);
  return t;
}

std::string blas_info() {
#ifdef MG_HAS_OPENBLAS
  std::ostringstream s;
  // The core is OpenBLAS's runtime CPU detection (DYNAMIC_ARCH builds): it picks the kernels,
  // so an unrecognised CPU (e.g. a new one under a hypervisor) falls back to older, slower ones.
  // OPENBLAS_CORETYPE=<core> overrides it.
  s << "OpenBLAS (" << openblas_get_config() << "), core " << openblas_get_corename() << ", "
    << openblas_get_num_threads() << " threads";
  return s.str();
#else
  return "none: mg::kernels::cpu::gemm runs gemm_blocked, so the sgemm ceiling is the blocked fallback";
#endif
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
#ifdef MG_HAS_CLI11
  CLI::App app{"CPU op throughput vs memcpy bandwidth and OpenBLAS sgemm, measured in the same run"};
  app.add_flag("--quick", f.quick, "smaller sizes, fewer repeats (< 20 s)");
  app.add_option("--repeats", f.repeats, "timed rounds per case (median reported)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--json", f.json_path, "write the table as JSON here");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
#else
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw mg::Error("missing value after " + arg);
      return argv[++i];
    };
    if (arg == "--quick")
      f.quick = true;
    else if (arg == "--repeats") {
      f.repeats = std::stoi(value());
      if (f.repeats < 1) throw mg::Error("--repeats must be at least 1");
    } else if (arg == "--json")
      f.json_path = value();
    else if (arg == "--help" || arg == "-h") {
      std::printf("usage: bench_ops [--quick] [--repeats N] [--json PATH]\n");
      std::exit(0);
    } else
      throw mg::Error("unknown flag " + arg + " (expected --quick, --repeats N, --json PATH)");
  }
#endif
  return f;
}

#ifndef MG_HAS_NLOHMANN_JSON
std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      o += ' ';
    else
      o += c;
  }
  return o + "\"";
}
std::string json_num(double v) {
  if (!std::isfinite(v)) return "null";
  std::ostringstream s;
  s.precision(6);
  s << v;
  return s.str();
}
#endif

struct Machine {
  int nproc, omp;
  bool openblas;
  std::string blas, cpu, date;
  double memcpy_gbs, sgemm_gflops;
  double load_before, other_cpu_share;
  bool checks_ok;
  int repeats, warmup;
  bool quick;
};

void write_json(const std::string& path, const Machine& m, const std::vector<Row>& rows) {
  std::ofstream f(path);
  if (!f) throw mg::Error("bench_ops: cannot write " + path);
#ifdef MG_HAS_NLOHMANN_JSON
  nlohmann::json j;
  j["benchmark"] = "bench_ops";
  j["date_utc"] = m.date;
  j["machine"] = {{"nproc", m.nproc},
                  {"omp_threads", m.omp},
                  {"cpu", m.cpu},
                  {"openblas", m.openblas},
                  {"blas", m.blas},
                  {"loadavg_before", m.load_before},
                  {"other_cpu_share", m.other_cpu_share}};
  j["settings"] = {{"quick", m.quick}, {"repeats", m.repeats}, {"warmup", m.warmup}};
  j["checks_ok"] = m.checks_ok;
  j["ceilings"] = {{"memcpy_GB_per_s", m.memcpy_gbs}, {"sgemm_GFLOP_per_s", m.sgemm_gflops}};
  j["rows"] = nlohmann::json::array();
  for (const Row& r : rows)
    j["rows"].push_back({{"name", r.name},
                         {"size", r.size},
                         {"time_ms", r.time_ms},
                         {"value", r.value},
                         {"unit", r.unit},
                         {"ceiling", r.ceiling},
                         {"ratio", r.ratio}});
  f << j.dump(2) << "\n";
#else
  f << "{\n  \"benchmark\": \"bench_ops\",\n  \"date_utc\": " << json_str(m.date) << ",\n"
    << "  \"machine\": {\"nproc\": " << m.nproc << ", \"omp_threads\": " << m.omp
    << ", \"cpu\": " << json_str(m.cpu) << ", \"openblas\": " << (m.openblas ? "true" : "false")
    << ", \"blas\": " << json_str(m.blas) << ", \"loadavg_before\": " << json_num(m.load_before)
    << ", \"other_cpu_share\": " << json_num(m.other_cpu_share) << "},\n"
    << "  \"settings\": {\"quick\": " << (m.quick ? "true" : "false") << ", \"repeats\": " << m.repeats
    << ", \"warmup\": " << m.warmup << "},\n  \"checks_ok\": " << (m.checks_ok ? "true" : "false") << ",\n"
    << "  \"ceilings\": {\"memcpy_GB_per_s\": " << json_num(m.memcpy_gbs)
    << ", \"sgemm_GFLOP_per_s\": " << json_num(m.sgemm_gflops) << "},\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    f << "    {\"name\": " << json_str(r.name) << ", \"size\": " << json_str(r.size)
      << ", \"time_ms\": " << json_num(r.time_ms) << ", \"value\": " << json_num(r.value)
      << ", \"unit\": " << json_str(r.unit) << ", \"ceiling\": " << json_str(r.ceiling)
      << ", \"ratio\": " << json_num(r.ratio) << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
#endif
}

int run(const Flags& flags) {
  const bool quick = flags.quick;
  const int repeats = flags.repeats > 0 ? flags.repeats : (quick ? 5 : 21);
  const int warmup = quick ? 1 : 2;
  const int64_t side = quick ? 2048 : 4096;  // [side, side] for softmax / transposed copy
  const int64_t numel = side * side;         // 4M (quick) or 16M floats for the elementwise rows
  const int64_t gn = quick ? 512 : 1024;     // GEMM m = n = k
  const int threads = omp_threads();

#ifdef MG_HAS_OPENBLAS
  const bool have_openblas = true;
#else
  const bool have_openblas = false;
#endif

  Machine machine{static_cast<int>(std::thread::hardware_concurrency()),
                  threads,
                  have_openblas,
                  blas_info(),
                  cpu_model(),
                  utc_now(),
                  0,
                  0,
                  load_average(),
                  -1,
                  false,
                  repeats,
                  warmup,
                  quick};
  std::printf("bench_ops  %s  nproc=%d  OpenMP threads=%d  load average %.2f  cpu: %s\n",
              machine.date.c_str(), machine.nproc, threads, machine.load_before, machine.cpu.c_str());
  std::printf("BLAS: %s\n", machine.blas.c_str());
  std::printf("mode: %s, %d warmup + %d timed rounds, every case once per round (interleaved), median\n\n",
              quick ? "--quick" : "default", warmup, repeats);

  mg::NoGradGuard no_grad;
  mg::manual_seed(0);

  // ---- inputs ----
  const mg::Tensor x = mg::randn({numel});
  const mg::Tensor y = mg::randn({numel});
  const mg::Tensor x2 = x.view({side, side});
  const mg::Tensor xt = x2.t();  // strided view: contiguous() must gather
  // The same transpose from a matrix whose rows are 16 floats longer than `side`: a row stride
  // that is not a multiple of 4 KiB, so the column walk does not keep hitting the same cache sets.
  const int64_t ld_pad = side + 16;
  const mg::Tensor xpad = mg::randn({side, ld_pad});
  const mg::Tensor xpt = xpad.narrow(1, 0, side).t();
  const mg::Tensor ga = mg::randn({gn, gn});
  const mg::Tensor gb = mg::randn({gn, gn});
  mg::Tensor copy_dst = mg::empty({numel});  // the reference loops write here
  // The memcpy ceiling has buffers of its own, so running it just before a case does not warm
  // that case's inputs in cache (an L3 may be larger than these buffers).
  const mg::Tensor memcpy_src = mg::randn({numel});
  mg::Tensor memcpy_dst = mg::empty({numel});
  mg::Tensor c_blas = mg::zeros({gn, gn}), c_blocked = mg::zeros({gn, gn});

  const float* xs = x.data<float>();
  float* dst = copy_dst.data<float>();
  const float* msrc = memcpy_src.data<float>();
  float* mdst = memcpy_dst.data<float>();
  const float* pa = ga.data<float>();
  const float* pb = gb.data<float>();
  const mg::kernels::GemmArgs args_blas = mg::kernels::gemm_args(mg::DType::f32, false, false, gn, gn, gn, pa,
                                                                 gn, pb, gn, c_blas.data<float>(), gn, 0.0);
  const mg::kernels::GemmArgs args_blocked = mg::kernels::gemm_args(
      mg::DType::f32, false, false, gn, gn, gn, pa, gn, pb, gn, c_blocked.data<float>(), gn, 0.0);

  // Each public-op case returns a fresh tensor; reading one element keeps the call from being
  // optimised away, and the tensor is dropped inside the timed region (its block goes back to
  // the caching allocator, which hands it to the next call), as in a training step.
  volatile float sink = 0;
  auto keep = [&](const mg::Tensor& t) { sink = sink + t.data<float>()[0]; };

  const double fbytes = static_cast<double>(numel) * sizeof(float);
  const double gflops = 2.0 * static_cast<double>(gn) * gn * gn;
  const std::string vec = std::to_string(numel >> 20) + "M f32";
  const std::string mat = "[" + std::to_string(side) + ", " + std::to_string(side) + "] f32";
  const std::string gsz = std::to_string(gn) + "^3 f32";

  std::vector<Case> cases;
  // `work` is bytes moved (rate in GB/s) or, when is_flops, flops (GFLOP/s); `ceiling` names the
  // ceiling case the ratio is taken against.
  auto add = [&](std::string name, std::string size, double work, bool is_flops, const char* ceiling,
                 std::function<void()> run) {
    cases.push_back(Case{std::move(name), std::move(size), work, is_flops, ceiling, std::move(run), {}, {}});
    return cases.size() - 1;
  };
  const double gelu_k = 0.7978845608028654;  // sqrt(2 / pi)
  auto gelu_ref = [gelu_k](float v) {
    return 0.5f * v * (1.0f + std::tanh(static_cast<float>(gelu_k) * (v + 0.044715f * v * v * v)));
  };

  // The ceilings. memcpy uses as many threads as the kernels; the 1-thread row is for reference.
  const size_t memcpy_case =
      add("memcpy (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)"), vec, 2 * fbytes,
          false, "memcpy", [&] { parallel_memcpy(mdst, msrc, numel, threads); });
  if (threads > 1)
    add("memcpy (1 thread)", vec, 2 * fbytes, false, "memcpy",
        [&] { parallel_memcpy(mdst, msrc, numel, 1); });
  const size_t sgemm_case = add(have_openblas ? "sgemm (OpenBLAS)" : "sgemm (no OpenBLAS: blocked)", gsz,
                                gflops, true, "sgemm", [&] { kcpu::gemm(args_blas); });

  // multigrad: GEMM, then the memory-bound ops through the public API.
  add("mg::matmul", gsz, gflops, true, "sgemm", [&] { keep(mg::matmul(ga, gb)); });
  add("gemm_blocked", gsz, gflops, true, "sgemm", [&] { kcpu::gemm_blocked(args_blocked); });
  add("add a+b", vec, 3 * fbytes, false, "memcpy", [&] { keep(x + y); });
  add("mul x*2.0", vec, 2 * fbytes, false, "memcpy", [&] { keep(x * 2.0); });
  add("relu", vec, 2 * fbytes, false, "memcpy", [&] { keep(mg::relu(x)); });
  add("exp", vec, 2 * fbytes, false, "memcpy", [&] { keep(mg::exp(x)); });
  add("gelu (tanh)", vec, 2 * fbytes, false, "memcpy", [&] { keep(mg::gelu(x)); });
  add("sum (all)", vec, fbytes, false, "memcpy", [&] { keep(mg::sum(x)); });
  add("softmax(dim=-1)", mat, 2 * fbytes, false, "memcpy", [&] { keep(mg::softmax(x2, -1)); });
  add("x.t().contiguous()", mat, 2 * fbytes, false, "memcpy", [&] { keep(xt.contiguous()); });

  // Reference loops (not multigrad code), written to copy_dst.
  add("ref: x*2 loop", vec, 2 * fbytes, false, "memcpy",
      [&] { parallel_map(dst, xs, numel, [](float v) { return 2.0f * v; }); });
#ifdef __SSE2__
  add("ref: x*2 loop, streaming stores", vec, 2 * fbytes, false, "memcpy",
      [&] { parallel_scale_streaming(dst, xs, numel); });
#endif
  add("ref: sum loop (omp simd)", vec, fbytes, false, "memcpy",
      [&] { sink = sink + parallel_sum(xs, numel); });
  add("ref: std::exp loop", vec, 2 * fbytes, false, "memcpy",
      [&] { parallel_map(dst, xs, numel, [](float v) { return std::exp(v); }); });
  add("ref: gelu std::tanh loop", vec, 2 * fbytes, false, "memcpy",
      [&] { parallel_map(dst, xs, numel, gelu_ref); });
  add("ref: tiled transpose 32x32", mat, 2 * fbytes, false, "memcpy",
      [&] { tiled_transpose(dst, xs, side, side); });
  const std::string ld = ", ld " + std::to_string(ld_pad);
  add("x.t().contiguous()" + ld, mat, 2 * fbytes, false, "memcpy", [&] { keep(xpt.contiguous()); });
  add("ref: tiled transpose 32x32" + ld, mat, 2 * fbytes, false, "memcpy",
      [&] { tiled_transpose(dst, xpad.data<float>(), side, ld_pad); });

  const CpuTimes cpu0 = cpu_times();
  const auto t_start = Clock::now();
  const int n = static_cast<int>(cases.size());
  auto time_once = [](Case& c) {
    const auto t0 = Clock::now();
    c.run();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  for (int round = 0; round < warmup + repeats; ++round) {
    const bool timed = round >= warmup;
    for (int j = 0; j < n; ++j) {
      const size_t ci = static_cast<size_t>((j + round) % n);
      Case& c = cases[ci];
      if (ci == memcpy_case || ci == sgemm_case) {
        const double s = time_once(c);
        if (timed) c.seconds.push_back(s);
        continue;
      }
      // Every other case runs right after its ceiling, so each round yields one ratio from two
      // back-to-back measurements: drifts in what the machine delivers cancel out of it.
      Case& ceiling = cases[c.ceiling == "memcpy" ? memcpy_case : sgemm_case];
      const double sc = time_once(ceiling);
      const double s = time_once(c);
      if (timed) {
        ceiling.seconds.push_back(sc);
        c.seconds.push_back(s);
        c.ratios.push_back((c.work / s) / (ceiling.work / sc));
      }
    }
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  const CpuTimes cpu1 = cpu_times();
  if (cpu0.machine_busy_s >= 0 && machine.nproc > 0)
    machine.other_cpu_share =
        std::max(0.0, (cpu1.machine_busy_s - cpu0.machine_busy_s) - (cpu1.self_s - cpu0.self_s)) /
        (total_s * machine.nproc);

  // ---- sanity: the numbers are about the right computation ----
  kcpu::gemm(args_blas);
  kcpu::gemm_blocked(args_blocked);
  const mg::Tensor c_mm = mg::matmul(ga, gb);
  const double d_mm = max_abs_diff(c_mm.data<float>(), c_blas.data<float>(), gn * gn);
  const double d_bl = max_abs_diff(c_blocked.data<float>(), c_blas.data<float>(), gn * gn);
  const double d_cp = max_abs_diff(mdst, msrc, numel);
  const mg::Tensor xtc = xt.contiguous();
  const float* tc = xtc.data<float>();
  bool t_ok = tc[1] == xs[side] && tc[side] == xs[1];
  tiled_transpose(dst, xs, side, side);
  t_ok = t_ok && std::memcmp(dst, tc, static_cast<size_t>(numel) * sizeof(float)) == 0;
  const mg::Tensor xptc = xpt.contiguous();
  tiled_transpose(dst, xpad.data<float>(), side, ld_pad);
  t_ok = t_ok && std::memcmp(dst, xptc.data<float>(), static_cast<size_t>(numel) * sizeof(float)) == 0;
#ifdef __SSE2__
  parallel_scale_streaming(dst, xs, numel);
  for (int64_t i = 0; i < numel && t_ok; ++i) t_ok = dst[i] == 2.0f * xs[i];
#endif
  const double tol = 1e-3 * std::sqrt(static_cast<double>(gn));  // entries ~ sqrt(gn), f32 rounding
  const bool checks_ok = d_mm <= tol && d_bl <= tol && d_cp == 0 && t_ok;
  machine.checks_ok = checks_ok;

  // ---- table ----
  double memcpy_gbs = 0, sgemm_gflops = 0;
  std::vector<double> med(n);
  for (int i = 0; i < n; ++i) {
    med[i] = median(cases[i].seconds);
    const double v = cases[i].work / med[i] / 1e9;
    if (static_cast<size_t>(i) == memcpy_case) memcpy_gbs = v;
    if (static_cast<size_t>(i) == sgemm_case) sgemm_gflops = v;
  }
  machine.memcpy_gbs = memcpy_gbs;
  machine.sgemm_gflops = sgemm_gflops;

  std::vector<Row> rows;
  for (int i = 0; i < n; ++i) {
    const Case& c = cases[i];
    const double v = c.work / med[i] / 1e9;
    const double ceiling = c.ceiling == "memcpy" ? memcpy_gbs : sgemm_gflops;
    const double ratio = c.ratios.empty() ? v / ceiling : median(c.ratios);
    rows.push_back({c.name, c.size, c.flops ? "GFLOP/s" : "GB/s", c.ceiling, med[i] * 1e3, v, ratio});
  }

  int wn = 2, ws = 4;  // column widths: the longest name and size
  for (const Row& r : rows) {
    wn = std::max(wn, static_cast<int>(r.name.size()));
    ws = std::max(ws, static_cast<int>(r.size.size()));
  }
  std::printf("%-*s | %-*s | %9s | %15s | %-21s | %5s\n", wn, "op", ws, "size", "time (ms)", "achieved",
              "ceiling", "ratio");
  std::printf("%s\n", std::string(wn + ws + 9 + 15 + 21 + 5 + 15, '-').c_str());
  char buf[64], cbuf[64];
  for (const Row& r : rows) {
    std::snprintf(buf, sizeof buf, "%.1f %s", r.value, r.unit.c_str());
    std::snprintf(cbuf, sizeof cbuf, "%s %.1f %s", r.ceiling.c_str(),
                  r.ceiling == "memcpy" ? memcpy_gbs : sgemm_gflops, r.unit.c_str());
    std::printf("%-*s | %-*s | %9.2f | %15s | %-21s | %5.2f\n", wn, r.name.c_str(), ws, r.size.c_str(),
                r.time_ms, buf, cbuf, r.ratio);
  }
  std::printf(
      "\nratio: median over the rounds of (this row's rate / its ceiling's rate measured just before\n"
      "it), so it can differ a little from achieved / ceiling (medians of the rates).\n");
  std::printf(
      "GB/s counts each stream once (add: 2 reads + 1 write; unary, softmax, copy: 1 read + 1 write;\n"
      "sum: 1 read); memcpy counts its read + write. \"ref:\" rows are plain loops, not multigrad\n"
      "code. Public ops allocate their output on every call (served by the caching allocator\n"
      "after warmup). \"ld N\": the source rows are N floats apart (not a multiple of 4 KiB).\n"
      "%d rounds in %.1f s.\n",
      warmup + repeats, total_s);
  if (machine.other_cpu_share >= 0)
    std::printf("other processes used %.0f%% of the %d cpus during the timed rounds\n",
                100 * machine.other_cpu_share, machine.nproc);
  if (machine.other_cpu_share > 0.2)
    std::printf(
        "WARNING: the machine was busy: multi-threaded rows (a parallel region waits for its slowest,\n"
        "descheduled thread) understate the kernels. Rerun on a quiet machine.\n");
  std::printf(
      "checks: matmul vs sgemm max|diff| %.2e, gemm_blocked vs sgemm %.2e, memcpy %s, copies %s -> %s\n",
      d_mm, d_bl, d_cp == 0 ? "exact" : "WRONG", t_ok ? "ok" : "WRONG", checks_ok ? "ok" : "FAILED");

  std::string json_path = flags.json_path;
  if (json_path.empty()) {
    if (const char* dir = std::getenv("MG_BENCH_OUT_DIR"); dir && *dir)
      json_path = std::string(dir) + "/bench_ops.json";
  }
  if (!json_path.empty()) {
    write_json(json_path, machine, rows);
    std::printf("json: %s\n", json_path.c_str());
  }
  (void)sink;
  return checks_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse_flags(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ops: %s\n", e.what());
    return 2;
  }
}
