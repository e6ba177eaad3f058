// mg-cu-rewrite: the plain-CUDA front end of the emulation build (cu_rewrite.h says what it does).
//
//   mg-cu-rewrite IN OUT                 rewrite one file (preprocessed or not)
//   mg-cu-rewrite --compile CMD...       a compiler launcher: CMD is the compile command of one
//                                        source (`[ccache] g++ ... -o x.o -c y.cu`)
//
// As a launcher (CMake's CXX_COMPILER_LAUNCHER in the emulation build) it passes every command
// whose source is not a .cu file through unchanged. For a .cu file it runs three steps:
//   1. preprocess: CMD with -c turned into -E, without ccache; the dependency file (-MD -MF) is
//      written by this step, so the build still sees every header;
//   2. rewrite the preprocessed text (<<<>>> launches, __shared__ declarations) into x.o.emu.ii;
//   3. compile x.o.emu.ii with CMD (ccache included), its preprocessing options dropped.
// The intermediate files are deleted unless MG_EMU_KEEP_REWRITE=1 (then x.o.emu.ii stays, to read
// what the host compiler was given).
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_emu/cu_rewrite/cu_rewrite.h"

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool read_file(const std::string& path, std::string& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream s;
  s << in.rdbuf();
  out = s.str();
  return true;
}

bool write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out.flush());
}

int run(const std::vector<std::string>& cmd) {
  std::vector<char*> argv;
  for (const std::string& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("mg-cu-rewrite: fork");
    return 1;
  }
  if (pid == 0) {
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "mg-cu-rewrite: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int rewrite_file(const std::string& in, const std::string& out, const std::string& name) {
  std::string text;
  if (!read_file(in, text)) {
    std::fprintf(stderr, "mg-cu-rewrite: cannot read %s\n", in.c_str());
    return 1;
  }
  const mg_emu::rewrite::Result r = mg_emu::rewrite::rewrite_cuda(text, name);
  if (!r.error.empty()) {
    std::fprintf(stderr, "%s [mg-cu-rewrite: the emulation build's CUDA front end]\n", r.error.c_str());
    return 1;
  }
  if (!write_file(out, r.text)) {
    std::fprintf(stderr, "mg-cu-rewrite: cannot write %s\n", out.c_str());
    return 1;
  }
  return 0;
}

int compile(std::vector<std::string> cmd) {
  // Find the source and the object.
  std::string source, object;
  for (size_t i = 0; i < cmd.size(); ++i) {
    if (cmd[i] == "-o" && i + 1 < cmd.size()) object = cmd[i + 1];
    if (cmd[i] == "-c" && i + 1 < cmd.size() && cmd[i + 1][0] != '-') source = cmd[i + 1];
  }
  if (source.empty())
    for (const std::string& a : cmd)
      if (ends_with(a, ".cu")) source = a;
  if (!ends_with(source, ".cu") || object.empty()) {  // not CUDA: the command itself, unchanged
    std::vector<char*> argv;
    for (std::string& a : cmd) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "mg-cu-rewrite: cannot run %s: %s\n", argv[0], std::strerror(errno));
    return 127;
  }

  const bool launcher_first = cmd[0].find("ccache") != std::string::npos;
  const std::string pre = object + ".emu-pre.ii", rewritten = object + ".emu.ii";

  // 1. preprocess (the dependency flags stay: -E writes the .d file too)
  std::vector<std::string> e(cmd.begin() + (launcher_first ? 1 : 0), cmd.end());
  for (size_t i = 0; i < e.size(); ++i) {
    if (e[i] == "-c") e[i] = "-E";
    if (e[i] == "-o" && i + 1 < e.size()) e[i + 1] = pre;
  }
  int rc = run(e);
  // 2. rewrite
  if (rc == 0) rc = rewrite_file(pre, rewritten, source);
  std::remove(pre.c_str());
  // 3. compile the rewritten text: preprocessing options dropped, the language from the .ii suffix
  if (rc == 0) {
    std::vector<std::string> c;
    for (size_t i = 0; i < cmd.size(); ++i) {
      const std::string& a = cmd[i];
      if (a == "-MD" || a == "-MMD" || a == "-MP" || a == "-xc++" || a == "-xcu") continue;
      if ((a == "-MT" || a == "-MF" || a == "-MQ" || a == "-include" || a == "-x") && i + 1 < cmd.size()) {
        ++i;
        continue;
      }
      c.push_back(a == source ? rewritten : a);
    }
    rc = run(c);
  }
  const char* keep = std::getenv("MG_EMU_KEEP_REWRITE");
  if (keep == nullptr || std::strcmp(keep, "1") != 0) std::remove(rewritten.c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() >= 2 && args[0] == "--compile") {
    args.erase(args.begin());
    if (args[0] == "--") args.erase(args.begin());
    return compile(args);
  }
  if (args.size() == 2 && args[0][0] != '-') return rewrite_file(args[0], args[1], args[0]);
  std::fprintf(stderr,
               "usage: mg-cu-rewrite IN OUT          rewrite <<<>>> launches and __shared__ declarations\n"
               "       mg-cu-rewrite --compile CMD... compile one source through the rewrite (a launcher)\n");
  return 2;
}
