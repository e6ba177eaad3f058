// The host of the tests' precompiled header (tests/CMakeLists.txt: mg_test_pch): CMake builds the
// PCH of <catch2/catch.hpp> and multigrad.h while compiling this file, and every C++ test target
// reuses it. An executable only so that it compiles with the tests' flags; it is never run.
int main() { return 0; }
