// bench_kernels: every CUDA kernel family against a ceiling measured in the same run, in the
// manner of llm.c's dev/cuda kernel lab and nccl-tests' tables.
//
//   build/benchmarks/bench_kernels [--quick|--check] [--device N] [--family NAME[,NAME...]]... [--list]
//                                  [-w|--warmup N] [-n|--repeats N] [--json PATH]
//
// What it does, in order:
//   1. Finds the CUDA device (--device N, default 0). Without a usable one it prints
//      "no CUDA device: <reason>" and exits 0: it is a benchmark, not a test.
//   2. Measures the copy ceiling: cudaMemcpyAsync device -> device of one large buffer (256 MiB;
//      --quick: 64 MiB), median of -n timed copies after -w warm-up ones, counted as bytes read +
//      bytes written: copy GB/s = 2 * bytes / time. Every memory-bound row is a ratio to it. The
//      spec bandwidth (2 x memory clock x bus width, from the device's attributes) is printed
//      beside it for orientation only; nothing is compared with it.
//   3. Runs every registered family (bench_kernels.h: each *.cpp|*.cu here registers itself) in
//      ascending `order`, or only those named by --family (repeatable, or a comma list; --list
//      prints the names). A family that throws is reported and the others still run.
//   4. Prints one table, a row per measured kernel, as each family finishes:
//        family, kernel, dtype, shape   what ran (shape as the family writes it; "16M" = 16 Mi
//                                       elements)
//        time(us)                       median over the -n timed calls (CUDA events)
//        achieved, unit                 the row's throughput: GB/s of the bytes the kernel must
//                                       move, TFLOP/s, or us for latency rows
//        ceiling, ref                   the same-run reference it is judged against
//        ratio                          achieved / ceiling (for "us" rows ceiling / achieved): above
//                                       1 is better than the reference
//        floor                          the ratio the issue asks of this row, or "-" for none
//        max_rel_err, check             the result against its reference (the family says how it
//                                       measures it); check is ok, WRONG (above the row's
//                                       tolerance, or flagged by the family), "below" (ratio under
//                                       the floor) or "-" (not checked)
//      then one summary line per family (rows, wrong, below floor, the worst ratio to floor).
//   5. Writes JSON: --json PATH, else $MG_BENCH_OUT_DIR/bench_kernels.json when that is set, else
//      ./bench_kernels.json. It holds the device (name, SM count, compute capability, memory), the
//      ceilings, every family's status and every row. It is rewritten after each family, so a run
//      cut short by a timeout still leaves the rows measured so far.
//
// Exit status: 0; 1 if any row is WRONG or any family threw; 2 for bad flags or a failure before
// the families run (the ceiling, the JSON path). A ratio below its
// floor is reported (table, summary, JSON) but does not change the exit status: the floors are
// targets for a tuned kernel on an idle GPU, and scripts/gpu-check shows them per family.
//
// --quick (what scripts/gpu-check runs): a 64 MiB ceiling, -w 2 -n 10, and each family's own
// short list of sizes. Defaults otherwise: -w 3 -n 20.
// --check (what ctest runs in the CUDA emulation build): correctness only -- a 1 MiB ceiling,
// -w 0 -n 1 and each family's smallest sizes; rows are judged WRONG or ok as always, and the
// times and ratios mean nothing (the emulator says nothing about speed).
//
// Flags are parsed by hand, like bench_allreduce's, so the binary builds where CLI11 is absent
// (the GPU machine may have nothing but CUDA, cmake and python3). JSON uses nlohmann_json when
// the build found it (MG_HAS_NLOHMANN_JSON) and an equivalent hand-written writer otherwise.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "bench_kernels.h"
#include "core/cuda_allocator.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"

#ifdef MG_HAS_NLOHMANN_JSON
#include <nlohmann/json.hpp>
#endif

namespace {

namespace bench = mg::bench;

struct Flags {
  bench::BenchOptions options;
  std::vector<std::string> families;  // empty: all
  std::string json_path;
  bool list = false;
};

const char* usage =
    "usage: bench_kernels [--quick|--check] [--device N] [--family NAME[,NAME...]]... [--list]\n"
    "                     [-w|--warmup N] [-n|--repeats N] [--json PATH]\n"
    "                     [--profile [--gpu NAME] [--profile-blocks N] [--profile-sites] "
    "[--no-instructions]]\n"
    "  defaults: device 0, every family, -w 3 -n 20, a 256 MiB copy ceiling;\n"
    "  --quick: -w 2 -n 10, a 64 MiB ceiling and each family's short list of sizes;\n"
    "  JSON: --json PATH, else $MG_BENCH_OUT_DIR/bench_kernels.json, else ./bench_kernels.json\n"
    "  --profile (CUDA emulation build): the families memory, layers, lab, attention, gemm and step traced, "
    "one call "
    "per row,\n"
    "    and predicted on a GPU (profile.cpp); --gpu NAME: which one, h200 (default), h100, a100 or\n"
    "    a6000 (cuda_emu/gpu_spec.h); --profile-blocks N: blocks traced per launch (132);\n"
    "    --profile-sites: also every launch, every instruction it traced and every limit, before its row;\n"
    "    each launch's warp instructions are counted from nvcc's PTX and priced in the issue limit\n"
    "    (docs/performance-model.md; without nvcc each launch says so and the limit uses the traced\n"
    "    requests); --no-instructions: the plain model, without the count (--instructions: the default)\n";

int parse_int(const std::string& text, const std::string& flag, int lo) {
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  MG_CHECK(end != text.c_str() && *end == '\0', flag, ": '", text, "' is not an integer\n", usage);
  MG_CHECK(v >= lo && v <= 1000000, flag, ": ", v, " is out of range (", lo, "..1000000)");
  return static_cast<int>(v);
}

Flags parse_flags(int argc, char** argv) {
  Flags f;
  bool warmup_set = false, repeats_set = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      MG_CHECK(i + 1 < argc, arg, " needs a value\n", usage);
      return argv[++i];
    };
    if (arg == "--quick") {
      f.options.quick = true;
    } else if (arg == "--check") {
      f.options.quick = f.options.check = true;
    } else if (arg == "--device" || arg == "-d") {
      f.options.device = parse_int(value(), arg, 0);
    } else if (arg == "--family" || arg == "-f") {
      std::stringstream names(value());
      for (std::string name; std::getline(names, name, ',');) {
        if (!name.empty()) f.families.push_back(name);
      }
    } else if (arg == "--warmup" || arg == "-w") {
      f.options.warmup = parse_int(value(), arg, 0);
      warmup_set = true;
    } else if (arg == "--repeats" || arg == "-n" || arg == "--iters") {
      f.options.repeats = parse_int(value(), arg, 1);
      repeats_set = true;
    } else if (arg == "--profile") {
      f.options.profile = true;
    } else if (arg == "--instructions") {
      f.options.profile = f.options.profile_instructions = true;
    } else if (arg == "--no-instructions") {
      f.options.profile = true;
      f.options.profile_instructions = false;
    } else if (arg == "--profile-sites") {
      f.options.profile = f.options.profile_sites = true;
    } else if (arg == "--gpu") {
      f.options.profile_gpu = value();
    } else if (arg == "--profile-blocks") {
      f.options.profile_blocks = parse_int(value(), arg, 1);
    } else if (arg == "--json") {
      f.json_path = value();
    } else if (arg == "--list") {
      f.list = true;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("%s", usage);
      std::exit(0);
    } else {
      throw mg::Error(mg::str_cat("unknown flag '", arg, "'\n", usage));
    }
  }
  if (f.options.profile) {  // one traced call per row: nothing to warm up or repeat
    f.options.warmup = 0;
    f.options.repeats = 1;
    if (f.families.empty()) f.families = {"memory", "layers", "lab", "attention", "gemm", "step"};
  }
  if (f.options.quick) {
    if (!warmup_set) f.options.warmup = f.options.check ? 0 : 2;
    if (!repeats_set) f.options.repeats = f.options.check ? 1 : 10;
  }
  if (f.json_path.empty()) {
    const char* dir = std::getenv("MG_BENCH_OUT_DIR");
    f.json_path =
        dir != nullptr && *dir != '\0' ? std::string(dir) + "/bench_kernels.json" : "bench_kernels.json";
  }
  return f;
}

void cuda_ok(cudaError_t e, const char* what) {
  MG_CHECK(e == cudaSuccess, "bench_kernels: ", what, ": ", cudaGetErrorString(e));
}

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_count = 0;
  int major = 0, minor = 0;
  double memory_gib = 0;
  double spec_gbps = 0;  // 2 x memory clock x bus width; 0 when the attributes are missing
};

DeviceInfo describe(int physical) {
  DeviceInfo d;
  d.index = physical;
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, physical), "cudaGetDeviceProperties");
  d.name = prop.name;
  d.sm_count = prop.multiProcessorCount;
  d.major = prop.major;
  d.minor = prop.minor;
  d.memory_gib = static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024 * 1024);
  int clock_khz = 0, bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, physical) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, physical) == cudaSuccess) {
    d.spec_gbps = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  }
  cudaGetLastError();  // an unsupported attribute must not linger as the "last error"
  return d;
}

// The copy ceiling: one device -> device cudaMemcpyAsync of `bytes`, read + written.
double measure_copy_gbps(size_t bytes, const bench::BenchOptions& o, cudaStream_t stream) {
  void* src = nullptr;
  void* dst = nullptr;
  cuda_ok(cudaMalloc(&src, bytes), "cudaMalloc (copy ceiling)");
  cuda_ok(cudaMalloc(&dst, bytes), "cudaMalloc (copy ceiling)");
  cuda_ok(cudaMemsetAsync(src, 0x3c, bytes, stream), "cudaMemsetAsync");
  cuda_ok(cudaMemsetAsync(dst, 0, bytes, stream), "cudaMemsetAsync");
  double seconds = 0;
  try {
    seconds = bench::median_seconds(
        [&] {
          cuda_ok(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
        },
        o, stream);
  } catch (...) {
    cudaFree(src);
    cudaFree(dst);
    throw;
  }
  cuda_ok(cudaFree(src), "cudaFree");
  cuda_ok(cudaFree(dst), "cudaFree");
  return 2.0 * static_cast<double>(bytes) / seconds / 1e9;
}

// ---- verdicts ----------------------------------------------------------------------------------
bool is_wrong(const bench::KernelResult& r) {
  return r.failed || (r.tolerance >= 0 && !(r.max_rel_error <= r.tolerance));
}
bool is_below_floor(const bench::KernelResult& r) { return r.floor > 0 && !(r.ratio >= r.floor); }
const char* verdict(const bench::KernelResult& r) {
  if (is_wrong(r)) return "WRONG";
  if (is_below_floor(r)) return "below";
  if (r.tolerance >= 0 || r.floor > 0) return "ok";
  return "-";
}

struct FamilyRun {
  std::string name;
  int order = 0;
  bool ran = false;
  std::string error;  // empty: it returned normally
  double seconds = 0;
  std::vector<bench::KernelResult> rows;
};

// ---- the table -----------------------------------------------------------------------------------
std::string num(double v, int precision) {
  if (!std::isfinite(v)) return v != v ? "nan" : (v > 0 ? "inf" : "-inf");
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", precision, v);
  return text;
}
// Throughputs and times with 3-4 significant digits.
std::string sig(double v) {
  if (!std::isfinite(v)) return num(v, 0);
  const double a = std::fabs(v);
  return num(v, a >= 1000 ? 0 : (a >= 100 ? 1 : (a >= 10 ? 2 : 3)));
}
std::string err_text(double e) {
  if (e < 0) return "-";
  if (!std::isfinite(e)) return num(e, 0);
  char text[32];
  std::snprintf(text, sizeof text, "%.1e", e);
  return text;
}

void print_header() {
  std::printf("%-10s %-34s %-8s %-18s %10s %10s %-7s %10s %-10s %6s %5s %9s %s\n", "family", "kernel",
              "dtype", "shape", "time(us)", "achieved", "unit", "ceiling", "ref", "ratio", "floor", "max_err",
              "check");
  std::printf("%s\n", std::string(154, '-').c_str());
}

void print_row(const bench::KernelResult& r) {
  std::printf("%-10s %-34s %-8s %-18s %10s %10s %-7s %10s %-10s %6s %5s %9s %s\n", r.family.c_str(),
              r.kernel.c_str(), r.dtype.c_str(), r.shape.c_str(), sig(r.seconds * 1e6).c_str(),
              sig(r.achieved).c_str(), r.unit.c_str(), sig(r.ceiling).c_str(), r.reference.c_str(),
              num(r.ratio, 3).c_str(), r.floor > 0 ? num(r.floor, 2).c_str() : "-",
              err_text(r.max_rel_error).c_str(), verdict(r));
}

struct FamilySummary {
  int rows = 0, wrong = 0, below = 0, floors = 0;
  double worst_floor_margin = INFINITY;  // min over rows with a floor of ratio / floor
  std::string worst_row;
};
FamilySummary summarise(const FamilyRun& f) {
  FamilySummary s;
  for (const bench::KernelResult& r : f.rows) {
    ++s.rows;
    s.wrong += is_wrong(r) ? 1 : 0;
    if (r.floor > 0) {
      ++s.floors;
      s.below += is_below_floor(r) ? 1 : 0;
      const double margin = std::isfinite(r.ratio) ? r.ratio / r.floor : 0.0;
      if (margin < s.worst_floor_margin) {
        s.worst_floor_margin = margin;
        s.worst_row = r.kernel + " " + r.dtype + " " + r.shape + ": ratio " + num(r.ratio, 3) + " vs floor " +
                      num(r.floor, 2);
      }
    }
  }
  return s;
}

// ---- JSON ----------------------------------------------------------------------------------------
struct Report {
  DeviceInfo device;
  bench::BenchOptions options;
  size_t copy_bytes = 0;
  bench::Ceilings ceilings;
  std::vector<FamilyRun> families;
};

// --profile's numbers for a row's JSON (profile.cpp; every time a PREDICTION for the --gpu GPU).
std::vector<std::pair<const char*, double>> profile_fields(const bench::ProfileRow& p) {
  return {{"launches", p.launches},
          {"blocks", p.blocks},
          {"traced_blocks", p.traced_blocks},
          {"load_requests", p.load_requests},
          {"load_sectors", p.load_sectors},
          {"load_bytes", p.load_bytes},
          {"store_requests", p.store_requests},
          {"store_sectors", p.store_sectors},
          {"store_bytes", p.store_bytes},
          {"atomic_lanes", p.atomic_lanes},
          {"shared_requests", p.shared_requests},
          {"shared_wavefronts", p.shared_wavefronts},
          {"shared_ideal_wavefronts", p.shared_ideal_wavefronts},
          {"mma", p.mma},
          {"dram_bytes_lru_l2", p.dram_bytes},
          {"dram_bytes_first_touch", p.dram_bytes_first_touch},
          {"l1_hit_sectors", p.l1_hit_sectors},
          {"l1_pending_sectors", p.l1_pending_sectors},
          {"l2_sectors", p.l2_sectors},
          {"warp_instructions", p.warp_instructions},
          {"issued_instructions", p.issued_instructions},
          {"instruction_counted_launches", p.counted_launches},
          {"ideal_bytes", p.ideal_bytes},
          {"fp32_flops", p.fp32_flops},
          {"tensor_flops", p.tensor_flops},
          {"host_syncs", p.host_syncs},
          {"predicted_seconds", p.predicted_seconds},
          {"predicted_roofline_fraction", p.roofline_fraction}};
}

#ifdef MG_HAS_NLOHMANN_JSON
nlohmann::json number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string to_json(const Report& rep) {
  nlohmann::json j;
  j["benchmark"] = "bench_kernels";
  j["device"] = {
      {"index", rep.device.index},
      {"name", rep.device.name},
      {"sm_count", rep.device.sm_count},
      {"compute_capability", std::to_string(rep.device.major) + "." + std::to_string(rep.device.minor)},
      {"memory_GiB", number(rep.device.memory_gib)},
      {"spec_bandwidth_GB_per_s", number(rep.device.spec_gbps)}};
  j["quick"] = rep.options.quick;
  j["warmup"] = rep.options.warmup;
  j["repeats"] = rep.options.repeats;
  j["time"] = "median of the timed calls, CUDA events";
  if (rep.options.profile) j["predicted_for"] = rep.options.profile_gpu;  // --gpu: whose predictions
  if (rep.options.profile) j["instructions_counted"] = rep.options.profile_instructions;
  j["ceilings"] = {{"copy_GB_per_s", number(rep.ceilings.copy_gbps)},
                   {"copy_bytes", rep.copy_bytes},
                   {"copy_method", "cudaMemcpyAsync device to device; bytes read + written per second"}};
  j["families"] = nlohmann::json::array();
  j["rows"] = nlohmann::json::array();
  int wrong = 0, below = 0, errors = 0;
  for (const FamilyRun& f : rep.families) {
    const FamilySummary s = summarise(f);
    wrong += s.wrong;
    below += s.below;
    errors += f.error.empty() ? 0 : 1;
    j["families"].push_back({{"name", f.name},
                             {"order", f.order},
                             {"status", !f.ran ? "not run" : (f.error.empty() ? "ok" : "error")},
                             {"error", f.error},
                             {"seconds", number(f.seconds)},
                             {"rows", s.rows},
                             {"wrong", s.wrong},
                             {"rows_with_floor", s.floors},
                             {"below_floor", s.below},
                             {"worst_ratio_to_floor", number(s.floors ? s.worst_floor_margin : NAN)},
                             {"worst_row", s.worst_row}});
    for (const bench::KernelResult& r : f.rows) {
      j["rows"].push_back({{"family", r.family},
                           {"kernel", r.kernel},
                           {"dtype", r.dtype},
                           {"shape", r.shape},
                           {"seconds", number(r.seconds)},
                           {"time_us", number(r.seconds * 1e6)},
                           {"achieved", number(r.achieved)},
                           {"unit", r.unit},
                           {"ceiling", number(r.ceiling)},
                           {"reference", r.reference},
                           {"ratio", number(r.ratio)},
                           {"floor", number(r.floor > 0 ? r.floor : NAN)},
                           {"max_rel_error", number(r.max_rel_error >= 0 ? r.max_rel_error : NAN)},
                           {"tolerance", number(r.tolerance >= 0 ? r.tolerance : NAN)},
                           {"failed", r.failed},
                           {"check", verdict(r)},
                           {"note", r.note}});
      if (r.profile.valid) {
        nlohmann::json p = {{"binding", r.profile.binding},
                            {"worst_sites", r.profile.worst_sites},
                            {"kernels", r.profile.kernels}};
        for (const auto& [key, value] : profile_fields(r.profile)) p[key] = number(value);
        j["rows"].back()["profile"] = p;
      }
    }
  }
  j["wrong_rows"] = wrong;
  j["below_floor_rows"] = below;
  j["family_errors"] = errors;
  return j.dump(2) + "\n";
}
#else
// The same document written by hand.
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char esc[8];
          std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += esc;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}
std::string number(double v) {
  if (!std::isfinite(v)) return "null";
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", v);
  return text;
}
std::string boolean(bool b) { return b ? "true" : "false"; }

std::string to_json(const Report& rep) {
  std::ostringstream j;
  const DeviceInfo& d = rep.device;
  j << "{\n  \"benchmark\": \"bench_kernels\",\n  \"device\": {\"index\": " << d.index
    << ", \"name\": " << quote(d.name) << ", \"sm_count\": " << d.sm_count
    << ", \"compute_capability\": " << quote(std::to_string(d.major) + "." + std::to_string(d.minor))
    << ", \"memory_GiB\": " << number(d.memory_gib)
    << ", \"spec_bandwidth_GB_per_s\": " << number(d.spec_gbps)
    << "},\n  \"quick\": " << boolean(rep.options.quick) << ",\n  \"warmup\": " << rep.options.warmup
    << ",\n  \"repeats\": " << rep.options.repeats
    << ",\n  \"time\": \"median of the timed calls, CUDA events\",\n  \"ceilings\": {\"copy_GB_per_s\": "
    << number(rep.ceilings.copy_gbps) << ", \"copy_bytes\": " << rep.copy_bytes
    << ", \"copy_method\": \"cudaMemcpyAsync device to device; bytes read + written per second\"},\n"
    << "  \"families\": [";
  int wrong = 0, below = 0, errors = 0;
  std::ostringstream rows;
  bool first_row = true;
  for (size_t i = 0; i < rep.families.size(); ++i) {
    const FamilyRun& f = rep.families[i];
    const FamilySummary s = summarise(f);
    wrong += s.wrong;
    below += s.below;
    errors += f.error.empty() ? 0 : 1;
    j << (i ? ",\n" : "\n") << "    {\"name\": " << quote(f.name) << ", \"order\": " << f.order
      << ", \"status\": " << quote(!f.ran ? "not run" : (f.error.empty() ? "ok" : "error"))
      << ", \"error\": " << quote(f.error) << ", \"seconds\": " << number(f.seconds)
      << ", \"rows\": " << s.rows << ", \"wrong\": " << s.wrong << ", \"rows_with_floor\": " << s.floors
      << ", \"below_floor\": " << s.below
      << ", \"worst_ratio_to_floor\": " << number(s.floors ? s.worst_floor_margin : NAN)
      << ", \"worst_row\": " << quote(s.worst_row) << "}";
    for (const bench::KernelResult& r : f.rows) {
      rows << (first_row ? "\n" : ",\n") << "    {\"family\": " << quote(r.family)
           << ", \"kernel\": " << quote(r.kernel) << ", \"dtype\": " << quote(r.dtype)
           << ", \"shape\": " << quote(r.shape) << ", \"seconds\": " << number(r.seconds)
           << ", \"time_us\": " << number(r.seconds * 1e6) << ", \"achieved\": " << number(r.achieved)
           << ", \"unit\": " << quote(r.unit) << ", \"ceiling\": " << number(r.ceiling)
           << ", \"reference\": " << quote(r.reference) << ", \"ratio\": " << number(r.ratio)
           << ", \"floor\": " << number(r.floor > 0 ? r.floor : NAN)
           << ", \"max_rel_error\": " << number(r.max_rel_error >= 0 ? r.max_rel_error : NAN)
           << ", \"tolerance\": " << number(r.tolerance >= 0 ? r.tolerance : NAN)
           << ", \"failed\": " << boolean(r.failed) << ", \"check\": " << quote(verdict(r))
           << ", \"note\": " << quote(r.note);
      if (r.profile.valid) {
        rows << ", \"profile\": {\"binding\": " << quote(r.profile.binding) << ", \"worst_sites\": [";
        for (size_t w = 0; w < r.profile.worst_sites.size(); ++w)
          rows << (w ? ", " : "") << quote(r.profile.worst_sites[w]);
        rows << "], \"kernels\": [";
        for (size_t k = 0; k < r.profile.kernels.size(); ++k)
          rows << (k ? ", " : "") << quote(r.profile.kernels[k]);
        rows << "]";
        for (const auto& [key, value] : profile_fields(r.profile))
          rows << ", " << quote(key) << ": " << number(value);
        rows << "}";
      }
      rows << "}";
      first_row = false;
    }
  }
  j << (rep.families.empty() ? "]" : "\n  ]") << ",\n  \"rows\": [" << rows.str()
    << (first_row ? "]" : "\n  ]") << ",\n  \"wrong_rows\": " << wrong
    << ",\n  \"below_floor_rows\": " << below << ",\n  \"family_errors\": " << errors << "\n}\n";
  return j.str();
}
#endif

void write_json(const std::string& path, const Report& rep) {
  std::ofstream out(path);
  MG_CHECK(out.good(), "--json: cannot write '", path, "'");
  out << to_json(rep);
  MG_CHECK(out.good(), "--json: writing '", path, "' failed");
}

// ---- the run -------------------------------------------------------------------------------------
std::vector<bench::Family> selected_families(const Flags& f) {
  std::vector<bench::Family> all = bench::registered_families();
  std::stable_sort(all.begin(), all.end(), [](const bench::Family& a, const bench::Family& b) {
    return a.order != b.order ? a.order < b.order : a.name < b.name;
  });
  if (f.families.empty()) return all;
  std::vector<bench::Family> picked;
  std::string names;
  for (const bench::Family& fam : all) names += (names.empty() ? "" : ", ") + fam.name;
  for (const std::string& want : f.families) {
    const auto it =
        std::find_if(all.begin(), all.end(), [&](const bench::Family& fam) { return fam.name == want; });
    MG_CHECK(it != all.end(), "--family: no family named '", want,
             "' (registered: ", names.empty() ? "none" : names, ")");
  }
  for (const bench::Family& fam : all) {  // in order, each once
    if (std::find(f.families.begin(), f.families.end(), fam.name) != f.families.end()) picked.push_back(fam);
  }
  return picked;
}

// ---- --profile: the tracer's counters and the GPU predictions, one table ----------------------------
std::string pct(double part, double whole) { return whole > 0 ? num(100.0 * part / whole, 0) + "%" : "-"; }
std::string per(double a, double b) { return b > 0 ? num(a / b, 2) : "-"; }

void print_profile_header() {
  std::printf("%-7s %-26s %-5s %-16s %5s %6s %5s %6s %5s %7s %7s %8s %9s %10s %-32s %6s\n", "family",
              "kernel", "dtype", "shape", "ld", "ld", "st", "st", "smem", "smem", "DRAM", "FLOPs", "traced",
              "pred.", "bound by", "pred.");
  std::printf("%-7s %-26s %-5s %-16s %5s %6s %5s %6s %5s %7s %7s %8s %9s %10s %-32s %6s\n", "", "", "", "",
              "sec/r", "eff", "sec/r", "eff", "wf/r", "wf/idl", "/ideal", "", "blocks", "us", "(prediction)",
              "%roof");
  std::printf("%s\n", std::string(182, '-').c_str());
}

void print_profile_row(const bench::KernelResult& r) {
  const bench::ProfileRow& p = r.profile;
  if (!p.valid) {
    std::printf("%-7s %-26s %-5s %-16s (not profiled%s)\n", r.family.c_str(), r.kernel.c_str(),
                r.dtype.c_str(), r.shape.c_str(), r.note.empty() ? "" : (": " + r.note).c_str());
    return;
  }
  char flops[32];
  std::snprintf(flops, sizeof flops, "%.2g", p.fp32_flops + p.tensor_flops);
  std::printf(
      "%-7s %-26s %-5s %-16s %5s %6s %5s %6s %5s %7s %7s %8s %9s %10s %-32s %6s\n", r.family.c_str(),
      r.kernel.c_str(), r.dtype.c_str(), r.shape.c_str(), per(p.load_sectors, p.load_requests).c_str(),
      pct(p.load_bytes, 32 * p.load_sectors).c_str(), per(p.store_sectors, p.store_requests).c_str(),
      pct(p.store_bytes, 32 * p.store_sectors).c_str(), per(p.shared_wavefronts, p.shared_requests).c_str(),
      per(p.shared_wavefronts, p.shared_ideal_wavefronts).c_str(), per(p.dram_bytes, p.ideal_bytes).c_str(),
      flops, (sig(p.traced_blocks) + "/" + sig(p.blocks)).c_str(), sig(p.predicted_seconds * 1e6).c_str(),
      p.binding.c_str(), num(100 * p.roofline_fraction, 0).c_str());
  for (const std::string& site : p.worst_sites) std::printf("%-58s   %s\n", "", site.c_str());
  if (p.host_syncs > 0 || p.library_calls > 0)
    std::printf(
        "%-58s   %d launches (%.0f cuBLAS/cuDNN calls at their roofline): %.1f us of launch latency; "
        "%.0f host syncs: %.1f us\n",
        "", p.launches, p.library_calls, p.launch_seconds * 1e6, p.host_syncs, p.sync_seconds * 1e6);
}

int run_profile(const Flags& flags, const std::vector<bench::Family>& families, Report& rep) {
  std::printf(
      "# PREDICTIONS for an %s from the CUDA emulator's access counts "
      "(docs/performance-model.md):\n"
      "# nothing here ran on a GPU. One traced call per row; the first %d blocks of each launch traced (at "
      "least\n"
      "# two rows of a 2-D grid), the rest skipped and their counts scaled.\n"
      "#   ld/st sec/r  global 32-byte sectors per warp request (4 = 4-byte lanes, coalesced; 16 = 16-byte "
      "lanes)\n"
      "#   ld/st eff    bytes the lanes asked for / sector bytes (100%% = no byte fetched in vain)\n"
      "#   smem wf/r    shared-memory wavefronts per request; wf/idl = wavefronts / the fewest the bytes "
      "need\n"
      "#                (1.00 = no bank conflict)\n"
      "#   DRAM/ideal   DRAM bytes of an LRU L2 of the GPU's size / every input read once and every output\n"
      "#                written once\n"
      "#   pred. us, bound by, %%roof   the model's time, its binding limit, ideal roofline time / time\n#\n",
      bench::set_profile_gpu(flags.options.profile_gpu).c_str(), flags.options.profile_blocks);
  bench::set_profile_instructions(flags.options.profile_instructions);
  print_profile_header();
  int errors = 0;
  for (const bench::Family& fam : families) {
    FamilyRun run;
    run.name = fam.name;
    run.order = fam.order;
    run.ran = true;
    try {
      run.rows = fam.run(flags.options, rep.ceilings);
    } catch (const std::exception& e) {
      run.error = e.what();
      ++errors;
    }
    for (bench::KernelResult& r : run.rows) {
      if (r.family.empty()) r.family = run.name;
      print_profile_row(r);
    }
    if (!run.error.empty()) std::printf("%-7s FAILED: %s\n", run.name.c_str(), run.error.c_str());
    std::fflush(stdout);
    rep.families.push_back(std::move(run));
  }
  write_json(flags.json_path, rep);
  std::printf("# JSON written to %s\n", flags.json_path.c_str());
  return errors == 0 ? 0 : 1;
}

int run(int argc, char** argv) {
  const Flags flags = parse_flags(argc, argv);
  if (flags.list) {
    std::vector<bench::Family> all = selected_families(Flags{});
    for (const bench::Family& fam : all) std::printf("%-12s (order %d)\n", fam.name.c_str(), fam.order);
    return 0;
  }
  const std::vector<bench::Family> families = selected_families(flags);  // bad names fail before the device

  if (mg::cuda::device_count() == 0) {
    std::string reason = mg::cuda::describe_devices();  // "no CUDA device (<reason>)"
    const std::string prefix = "no CUDA device (";
    if (reason.compare(0, prefix.size(), prefix) == 0 && reason.back() == ')')
      reason = reason.substr(prefix.size(), reason.size() - prefix.size() - 1);
    std::printf("bench_kernels: no CUDA device: %s; nothing to measure\n", reason.c_str());
    return 0;
  }
  MG_CHECK(flags.options.device < mg::cuda::device_count(), "--device ", flags.options.device, ": only ",
           mg::cuda::device_count(), " CUDA device(s): ", mg::cuda::describe_devices());
  mg::cuda::enable_backend();  // families may build CUDA tensors
  mg::cuda::DeviceGuard guard(flags.options.device);
  const int physical = mg::cuda::physical_device(flags.options.device);
  const cudaStream_t stream =
      static_cast<cudaStream_t>(mg::cuda::current_stream(flags.options.device).handle);

  Report rep;
  rep.options = flags.options;
  rep.device = describe(physical);
  rep.copy_bytes = size_t{flags.options.check ? 1u : flags.options.quick ? 64u : 256u} << 20;
  std::printf("# bench_kernels: cuda:%d %s, sm_%d%d, %d SMs, %.0f GiB; %s, -w %d -n %d\n",
              flags.options.device, rep.device.name.c_str(), rep.device.major, rep.device.minor,
              rep.device.sm_count, rep.device.memory_gib,
              flags.options.check   ? "check"
              : flags.options.quick ? "quick"
                                    : "full",
              flags.options.warmup, flags.options.repeats);
  if (flags.options.profile) return run_profile(flags, families, rep);
  rep.ceilings.copy_gbps = measure_copy_gbps(rep.copy_bytes, flags.options, stream);
  std::printf("# ceiling: device-to-device cudaMemcpyAsync of %zu MiB: %.1f GB/s (bytes read + written)",
              rep.copy_bytes >> 20, rep.ceilings.copy_gbps);
  if (rep.device.spec_gbps > 0) {
    std::printf("; spec %.0f GB/s (2 x memory clock x bus width), copy/spec %.2f", rep.device.spec_gbps,
                rep.ceilings.copy_gbps / rep.device.spec_gbps);
  }
  std::printf(
      "\n# time = median of %d calls after %d warm-up; ratio = achieved / ceiling; check: see the header "
      "of benchmarks/bench_kernels/main.cpp\n#\n",
      flags.options.repeats, flags.options.warmup);
  for (const bench::Family& fam : families) {
    FamilyRun run;
    run.name = fam.name;
    run.order = fam.order;
    rep.families.push_back(run);
  }
  write_json(flags.json_path, rep);
  print_header();
  std::fflush(stdout);

  for (size_t i = 0; i < families.size(); ++i) {
    FamilyRun& run = rep.families[i];
    run.ran = true;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      run.rows = families[i].run(flags.options, rep.ceilings);
      for (bench::KernelResult& r : run.rows) {
        if (r.family.empty()) r.family = run.name;
      }
    } catch (const std::exception& e) {
      run.error = e.what();
    }
    // An asynchronous fault (an illegal address, say) surfaces here; a sticky one ends the run.
    const cudaError_t sync = cudaDeviceSynchronize();
    if (sync != cudaSuccess) {
      cudaGetLastError();
      run.error += (run.error.empty() ? "" : "; ") + std::string("CUDA error after the family: ") +
                   cudaGetErrorString(sync);
    }
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (const bench::KernelResult& r : run.rows) print_row(r);
    if (!run.error.empty()) std::printf("%-10s FAILED: %s\n", run.name.c_str(), run.error.c_str());
    std::fflush(stdout);
    write_json(flags.json_path, rep);
    if (sync != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess) {
      std::printf("# the CUDA context is unusable after family %s: the remaining families are not run\n",
                  run.name.c_str());
      break;
    }
  }

  // Notes, then one summary line per family.
  bool any_note = false;
  for (const FamilyRun& f : rep.families) {
    for (const bench::KernelResult& r : f.rows) {
      if (r.note.empty()) continue;
      if (!any_note) std::printf("#\n# notes:\n");
      any_note = true;
      std::printf("#   %s / %s %s %s: %s\n", f.name.c_str(), r.kernel.c_str(), r.dtype.c_str(),
                  r.shape.c_str(), r.note.c_str());
    }
  }
  std::printf("#\n# summary (worst = the row with the lowest ratio / floor):\n");
  int wrong = 0, errors = 0, below = 0;
  for (const FamilyRun& f : rep.families) {
    const FamilySummary s = summarise(f);
    wrong += s.wrong;
    below += s.below;
    errors += f.error.empty() ? 0 : 1;
    std::printf(
        "#   %-10s %s: %d rows, %d wrong, %d of %d below floor", f.name.c_str(),
        !f.ran ? "not run" : (!f.error.empty() ? "ERROR" : (s.wrong ? "WRONG" : (s.below ? "below" : "ok"))),
        s.rows, s.wrong, s.below, s.floors);
    if (s.floors > 0) std::printf(", worst %s", s.worst_row.c_str());
    std::printf(" (%.1f s)\n", f.seconds);
  }
  std::printf("# %d wrong rows, %d family errors, %d rows below their floor; JSON written to %s\n", wrong,
              errors, below, flags.json_path.c_str());
  return wrong == 0 && errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 2;
  }
}
