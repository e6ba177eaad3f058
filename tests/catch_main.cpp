// The CPU tests' main() (OBJECT library mg_catch_main), linked into every CPU test executable with
// Catch2's implementation (mg_catch_impl). Test files only include <catch2/catch.hpp>.
#include "tests/catch_session.h"

int main(int argc, char* argv[]) { return mg::testing::run_catch_session(argc, argv); }
