// Catch2's main(), compiled once (OBJECT library mg_catch_main) and linked into
// every CPU test executable. Test files only include <catch2/catch.hpp>.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
