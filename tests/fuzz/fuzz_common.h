// What every harness in tests/fuzz/ shares: the one expected outcome. A parser handed arbitrary
// bytes may accept them or refuse them with mg::Error (the error type multigrad promises for bad
// input); anything else -- another exception, a crash, a sanitizer report, an abort from a broken
// invariant -- is a finding. Another exception is left to escape on purpose: libFuzzer reports it
// as a crash ("deadly signal" from std::terminate), and so does the replay driver.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "base/error.h"

namespace mg::fuzz {

template <class Body>
int expect_only_mg_error(Body&& body) {
  try {
    body();
  } catch (const mg::Error&) {
    // the input was refused with a reason: fine
  }
  return 0;
}

// A property the harness checks on an accepted input (a round trip, a size): a violation is a
// bug even though nothing crashed, so it aborts like a crash would.
#define MG_FUZZ_ASSERT(condition, message)                                            \
  do {                                                                                \
    if (!(condition)) {                                                               \
      std::fprintf(stderr, "fuzz property violated: %s (%s)\n", message, #condition); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

// This process's scratch directory (one per process: the first call's prefix names it), on tmpfs
// when there is one (a harness that writes its input as files writes them per execution), removed
// at exit.
inline const std::string& scratch_dir(const char* prefix) {
  static const std::string dir = [prefix] {
    const char* base = ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    std::string pattern = std::string(base) + "/" + prefix + "_XXXXXX";
    MG_FUZZ_ASSERT(::mkdtemp(pattern.data()) != nullptr, "mkdtemp");
    // The command is built now: at exit this string may already be destroyed.
    static char remove_command[512];
    std::snprintf(remove_command, sizeof(remove_command), "rm -rf '%s'", pattern.c_str());
    std::atexit([] { std::system(remove_command); });
    return pattern;
  }();
  return dir;
}

}  // namespace mg::fuzz
