// Where a traced launch's PTX comes from: its kernel's source file compiled by nvcc to PTX for
// sm_90 with -lineinfo, registers and stack frame per thread from ptxas -v, and the launch's instruction
// count (ptx_count.h) filled in when the profile ends.
//
// The kernel is found from the address the launch was made with: addr2line names its function
// (demangled, with its parameters) and the file it is defined in, which is compiled as it is in a
// CUDA build (-I the source tree, and third_party/ for the tests' Catch2). The PTX of one source
// file is kept in a cache directory (MG_EMU_PTX_CACHE, else $TMPDIR/mg-ptx-cache-<uid>) under the
// name of the file, its size and the newest modification time among the files of its directory,
// so a second profile of the same tree compiles nothing; an edited header elsewhere is not seen
// (delete the directory); older versions of a file are removed when a new one is compiled. nvcc
// is MG_EMU_NVCC, else the one found at configure time; an empty MG_EMU_NVCC switches the count
// off; MG_EMU_PTX_FLAGS adds flags (a program's own -I). Without nvcc the launch's InstructionMix
// says why not.
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>

#include "cuda_emu/ptx_count.h"
#include "cuda_emu/trace.h"

#ifndef MG_EMU_NVCC_DEFAULT
#define MG_EMU_NVCC_DEFAULT ""
#endif
#ifndef MG_EMU_SOURCE_DIR
#define MG_EMU_SOURCE_DIR "."
#endif

namespace mg_emu {
namespace {

struct Module {
  std::string why;  // empty: compiled
  std::vector<ptx::Function> functions;
};

std::string nvcc_path() {
  if (const char* v = std::getenv("MG_EMU_NVCC")) return v;
  return MG_EMU_NVCC_DEFAULT;
}

std::string run(const std::string& command, int* status) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    *status = -1;
    return out;
  }
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) out.append(buffer, n);
  *status = pclose(pipe);
  return out;
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Every version of a source file in the cache starts with this: "softmax.cu-<hash of path and nvcc>-".
std::string cache_prefix(const std::string& source) {
  const std::string base = source.substr(source.rfind('/') + 1);
  return base + "-" + std::to_string(std::hash<std::string>{}(source + "|" + nvcc_path())) + "-";
}

// The cache key of a source file: its path, size and the newest change in its directory.
std::string cache_key(const std::string& source) {
  struct stat st {};
  if (stat(source.c_str(), &st) != 0) return "";
  long long newest = static_cast<long long>(st.st_mtime);
  const std::string dir = source.substr(0, source.rfind('/'));
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      struct stat fs {};
      if (stat((dir + "/" + e->d_name).c_str(), &fs) == 0 && S_ISREG(fs.st_mode))
        newest = std::max(newest, static_cast<long long>(fs.st_mtime));
    }
    closedir(d);
  }
  return cache_prefix(source) + std::to_string(st.st_size) + "-" + std::to_string(newest);
}

// Removes the cache's older versions of the same source file (same name and hash, another key).
void remove_stale(const std::string& dir, const std::string& prefix, const std::string& key) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind(prefix, 0) == 0 && name.rfind(key, 0) != 0) std::remove((dir + "/" + name).c_str());
  }
  closedir(d);
}

std::string cache_dir() {
  if (const char* v = std::getenv("MG_EMU_PTX_CACHE"); v != nullptr && *v != '\0') return v;
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/mg-ptx-cache-" +
         std::to_string(getuid());
}

// What ptxas -v says of one entry function.
struct Resources {
  int registers = 0;    // "Used N registers"
  int stack_bytes = 0;  // "N bytes stack frame": local memory every thread of the kernel has
};

// ptxas -v's "Compiling entry function 'X'", then "N bytes stack frame, ..." and "Used N registers".
std::map<std::string, Resources> resources_of(const std::string& ptxas_log) {
  std::map<std::string, Resources> out;
  std::string current, properties;  // the entry being compiled; whose "Function properties" follow
  std::istringstream in(ptxas_log);
  for (std::string line; std::getline(in, line);) {
    const size_t fn = line.find("Compiling entry function '");
    if (fn != std::string::npos) {
      const size_t start = fn + 26;
      current = line.substr(start, line.find('\'', start) - start);
    }
    const size_t props = line.find("Function properties for ");
    if (props != std::string::npos) properties = line.substr(props + 24);
    if (current.empty()) continue;
    const size_t used = line.find("Used ");
    if (used != std::string::npos && line.find(" registers") != std::string::npos)
      out[current].registers = std::atoi(line.c_str() + used + 5);
    // A called (not inlined) device function has a frame of its own: only the entry's counts here.
    const size_t stack = line.find(" bytes stack frame");
    if (stack != std::string::npos && properties == current) {
      const size_t start = line.find_last_of(" \t", stack - 1);
      out[current].stack_bytes = std::atoi(line.c_str() + (start == std::string::npos ? 0 : start + 1));
    }
  }
  return out;
}

Module compile(const std::string& source) {
  Module m;
  const std::string nvcc = nvcc_path();
  if (nvcc.empty()) {
    m.why = "no nvcc (MG_EMU_NVCC is empty and none was found at configure time): instructions not counted";
    return m;
  }
  const std::string key = cache_key(source);
  if (key.empty()) {
    m.why = "cannot read " + source;
    return m;
  }
  const std::string dir = cache_dir();
  mkdir(dir.c_str(), 0700);
  const std::string ptx = dir + "/" + key + ".ptx", regs = dir + "/" + key + ".ptxas";
  struct stat st {};
  if (stat(ptx.c_str(), &st) != 0 || stat(regs.c_str(), &st) != 0) {
    const std::string root = MG_EMU_SOURCE_DIR;
    const std::string tmp = ptx + ".tmp" + std::to_string(getpid());
    const char* extra = std::getenv("MG_EMU_PTX_FLAGS");  // e.g. -I a program's own headers
    int status = 0;
    const std::string log =
        run(quoted(nvcc) + " -std=c++17 -arch=sm_90 --extended-lambda --expt-relaxed-constexpr " +
                "-lineinfo -ptx -I" + quoted(root) + " -I" + quoted(root + "/third_party") + " " +
                (extra != nullptr ? extra : "") + " -o " + quoted(tmp) + " " + quoted(source) + " 2>&1",
            &status);
    if (status != 0) {
      std::remove(tmp.c_str());
      m.why = "nvcc -ptx failed on " + source + ": " + log.substr(0, 300);
      return m;
    }
    const std::string ptxas = nvcc.substr(0, nvcc.rfind('/') + 1) + "ptxas";
    const std::string v =
        run(quoted(ptxas) + " -arch=sm_90 -v " + quoted(tmp) + " -o /dev/null 2>&1", &status);
    const std::string regs_tmp = regs + ".tmp" + std::to_string(getpid());
    std::ofstream(regs_tmp) << (status == 0 ? v : "");
    std::rename(regs_tmp.c_str(), regs.c_str());
    std::rename(tmp.c_str(), ptx.c_str());
    remove_stale(dir, cache_prefix(source), key);
  }
  try {
    m.functions = ptx::parse(read_file(ptx));
  } catch (const std::exception& e) {
    m.why = std::string(e.what()) + " in " + ptx;
    return m;
  }
  const std::map<std::string, Resources> r = resources_of(read_file(regs));
  for (ptx::Function& f : m.functions) {
    const auto it = r.find(f.mangled);
    if (it == r.end()) continue;
    f.registers_per_thread = it->second.registers;
    f.stack_bytes = it->second.stack_bytes;
  }
  return m;
}

const Module& module_for(const std::string& source) {
  static std::mutex mutex;
  static std::map<std::string, Module> modules;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = modules.find(source);
  if (it == modules.end()) it = modules.emplace(source, compile(source)).first;
  return it->second;
}

// The kernel at `address`: its demangled name with parameters and its source file, from addr2line.
bool find_kernel(const void* address, std::string* symbol, std::string* file) {
  Dl_info info{};
  if (dladdr(address, &info) == 0 || info.dli_fname == nullptr) return false;
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%zx",
                static_cast<size_t>(reinterpret_cast<uintptr_t>(address) -
                                    reinterpret_cast<uintptr_t>(info.dli_fbase)));
  int status = 0;
  const std::string out =
      run("addr2line -f -C -e " + quoted(info.dli_fname) + " " + hex + " 2>/dev/null", &status);
  const size_t nl = out.find('\n');
  if (status != 0 || nl == std::string::npos) return false;
  *symbol = out.substr(0, nl);
  std::string where = out.substr(nl + 1);
  where = where.substr(0, where.find_first_of(": \n"));
  *file = where;
  return !symbol->empty() && *symbol != "??" && !file->empty() && *file != "??";
}

// find_kernel once per kernel: a profile launches the same kernels many times.
bool kernel_at(const void* address, std::string* symbol, std::string* file) {
  struct Found {
    bool ok;
    std::string symbol, file;
  };
  static std::mutex mutex;
  static std::map<const void*, Found> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(address);
  if (it == known.end()) {
    Found f{};
    f.ok = find_kernel(address, &f.symbol, &f.file);
    it = known.emplace(address, std::move(f)).first;
  }
  *symbol = it->second.symbol;
  *file = it->second.file;
  return it->second.ok;
}

// The kernel's PTX function, or nullptr with `why` said.
const ptx::Function* kernel_function(const void* kernel, std::string* symbol, std::string* base,
                                     std::string* why) {
  std::string file;
  if (kernel == nullptr || !kernel_at(kernel, symbol, &file)) {
    symbol->clear();
    *why = "the kernel's function and source file were not found (addr2line)";
    return nullptr;
  }
  const Module& m = module_for(file);
  *base = file.substr(file.rfind('/') + 1);
  if (!m.why.empty()) {
    *why = m.why;
    return nullptr;
  }
  const std::string want = ptx::normalise_name(*symbol);
  const ptx::Function* f = nullptr;
  for (const ptx::Function& candidate : m.functions)
    if (ptx::normalise_name(candidate.demangled) == want) f = &candidate;
  if (f == nullptr) *why = "no PTX entry " + *symbol + " in " + *base;
  return f;
}

}  // namespace

std::map<std::string, SharedWidths> shared_access_widths(const void* kernel) {
  static std::mutex mutex;
  static std::map<const void*, std::map<std::string, SharedWidths>> known;
  {
    std::lock_guard<std::mutex> lock(mutex);
    const auto it = known.find(kernel);
    if (it != known.end()) return it->second;
  }
  std::map<std::string, SharedWidths> widths;
  std::string symbol, base, why;
  if (const ptx::Function* f = kernel_function(kernel, &symbol, &base, &why)) {
    for (const ptx::Block& b : f->blocks)
      for (const ptx::Instruction& in : b.instructions) {
        if (in.file <= 0 || in.file >= static_cast<int>(f->files.size())) continue;
        if (in.opcode.find(".shared") == std::string::npos) continue;
        const bool vector = in.opcode.find(".v2.") != std::string::npos ||
                            in.opcode.find(".v4.") != std::string::npos ||
                            in.opcode.find(".v8.") != std::string::npos;
        if (!vector) continue;
        if (in.access != ptx::Access::load && in.access != ptx::Access::store) continue;
        SharedWidths& w =
            widths[ptx::basename_of(f->files[static_cast<size_t>(in.file)]) + ":" + std::to_string(in.line)];
        unsigned& into = in.access == ptx::Access::load ? w.load : w.store;
        into = std::max(into, static_cast<unsigned>(in.bytes_per_lane));
      }
  }
  std::lock_guard<std::mutex> lock(mutex);
  return known.emplace(kernel, std::move(widths)).first->second;
}

void count_launch_instructions(profile::LaunchProfile& r, const void* kernel,
                               const std::map<std::string, double>& lines_run) {
  profile::InstructionMix& mix = r.instructions;
  std::string symbol, base;
  const ptx::Function* f = kernel_function(kernel, &symbol, &base, &mix.why);
  if (!symbol.empty()) r.kernel_symbol = symbol;
  if (f == nullptr) return;
  const double warps = static_cast<double>(r.traced_blocks) *
                       static_cast<double>((r.block.x * r.block.y * r.block.z + 31) / 32);
  mix = ptx::count(*f, ptx::line_accesses(r.sites), warps, lines_run);
  for (double& v : mix.warp_instructions) v *= r.scale;
  mix.inherited *= r.scale;
  mix.warp_cycles *= r.scale;
  mix.load_round_trips *= r.scale;
  mix.source = base + " (PTX for sm_90)";
}

}  // namespace mg_emu
