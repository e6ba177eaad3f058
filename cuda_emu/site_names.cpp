// Call sites -> "file.cu:line" (trace.h): the return addresses of the instrumentation calls,
// through addr2line over each shared object's line table (libmultigrad_traced is built with -g1).
// An access inlined from a helper in a header names the kernel's line too:
// "common.cuh:66 < softmax.cu:120". addr2line is a process per call, so the tracer asks for a
// batch at a time: every site of a profile when it ends, a block's new shared-memory sites while
// it runs (site_lines, for the PTX's vector widths).
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_emu/trace.h"

namespace mg_emu {
namespace {

std::string short_location(std::string text) {
  text = text.substr(0, text.find_first_of(" \n"));
  const size_t slash = text.rfind('/');
  return slash == std::string::npos ? text : text.substr(slash + 1);
}
bool is_header(const std::string& location) {
  const size_t colon = location.rfind(':');
  const std::string file = location.substr(0, colon);
  return (file.size() > 2 && file.compare(file.size() - 2, 2, ".h") == 0) ||
         (file.size() > 4 && file.compare(file.size() - 4, 4, ".cuh") == 0);
}

}  // namespace

std::map<uintptr_t, std::string> site_names(const std::vector<uintptr_t>& pcs) {
  std::map<std::string, std::vector<std::pair<uintptr_t, uintptr_t>>> by_object;  // object -> (pc, offset)
  for (uintptr_t pc : pcs) {
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(pc), &info) == 0 || info.dli_fname == nullptr) continue;
    by_object[info.dli_fname].emplace_back(pc, pc - 1 - reinterpret_cast<uintptr_t>(info.dli_fbase));
  }
  std::map<uintptr_t, std::string> names;
  for (const auto& [object, list] : by_object) {
    for (size_t first = 0; first < list.size(); first += 200) {
      // -a: each address first, then its inlining chain (-i), innermost first.
      std::string command = "addr2line -a -i -e '" + object + "'";
      const size_t last = std::min(list.size(), first + 200);
      for (size_t i = first; i < last; ++i) {
        char hex[32];
        std::snprintf(hex, sizeof hex, " 0x%zx", static_cast<size_t>(list[i].second));
        command += hex;
      }
      FILE* pipe = popen(command.c_str(), "r");
      if (pipe == nullptr) continue;
      std::vector<std::vector<std::string>> chains;
      char text[4096];
      while (std::fgets(text, sizeof text, pipe) != nullptr) {
        if (std::strncmp(text, "0x", 2) == 0) {
          chains.emplace_back();
        } else if (!chains.empty()) {
          chains.back().push_back(short_location(text));
        }
      }
      pclose(pipe);
      for (size_t i = first; i < last && i - first < chains.size(); ++i) {
        const std::vector<std::string>& chain = chains[i - first];
        if (chain.empty()) continue;
        std::string name = chain.front();
        if (is_header(name)) {
          for (const std::string& outer : chain)
            if (!is_header(outer)) {
              name += " < " + outer;
              break;
            }
        }
        names[list[i].first] = name;
      }
    }
  }
  return names;
}

std::vector<std::string> site_lines(const std::vector<uintptr_t>& pcs) {
  static std::mutex mutex;
  static std::unordered_map<uintptr_t, std::string> known;  // pcs are stable for the process
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<uintptr_t> unknown;
  for (uintptr_t pc : pcs)
    if (known.find(pc) == known.end()) unknown.push_back(pc);
  if (!unknown.empty()) {
    const std::map<uintptr_t, std::string> names = site_names(unknown);
    for (uintptr_t pc : unknown) {
      const auto it = names.find(pc);
      known[pc] = it == names.end() ? std::string() : it->second.substr(0, it->second.find(" <"));
    }
  }
  std::vector<std::string> out;
  out.reserve(pcs.size());
  for (uintptr_t pc : pcs) out.push_back(known[pc]);
  return out;
}

}  // namespace mg_emu
