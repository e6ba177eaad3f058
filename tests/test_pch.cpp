// The host of the tests' precompiled header (tests/CMakeLists.txt: mg_test_pch): CMake builds the
// PCH of <catch2/catch.hpp> and multigrad.h while compiling this file, and every C++ test target
// reuses it. Nothing here is linked anywhere.
