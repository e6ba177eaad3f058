// Runs Catch2's test session: what the runners with a main() of their own call (gpu_main.cpp, and
// tests whose main() sets up something first). Catch2 declares its Session class only inside its
// implementation, which is compiled once per build (catch_impl.cpp, library mg_catch_impl).
#pragma once

namespace mg::testing {

// Catch::Session().run(argc, argv): the number of failed assertions (capped at 255), or 0.
int run_catch_session(int argc, char** argv);

}  // namespace mg::testing
