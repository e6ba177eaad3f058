// Catch2's implementation (its test registry, reporters, command line, matchers), compiled once per
// build as the static library mg_catch_impl. It is the slowest file of the suite to compile (about
// 14 s), and every test executable needs it: the runners only write main() (catch_main.cpp,
// gpu_main.cpp, tests with a main of their own) and start the session through catch_session.h.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "tests/catch_session.h"

int mg::testing::run_catch_session(int argc, char** argv) { return Catch::Session().run(argc, argv); }
