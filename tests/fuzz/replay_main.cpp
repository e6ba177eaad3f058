// The replay driver: the same harness sources as libFuzzer's (fuzz_<target>.cpp), compiled by
// the project's own compiler without libFuzzer, into an executable that runs every file of the
// given directories through LLVMFuzzerTestOneInput once. ctest runs it on tests/fuzz/corpus/<target>
// and tests/fuzz/crashes/<target> (label cpu), so ./scripts/test replays the seed corpus, what the
// fuzzers added to it, and every crash ever found -- in build-asan/ under ASan + UBSan.
//
//   fuzz_replay_<target> <dir or file>...     a missing path is skipped (crashes/<target> exists
//                                             only once a crash was found); no input at all fails
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path path = argv[i];
    if (fs::is_directory(path)) {
      for (const fs::directory_entry& entry : fs::directory_iterator(path))
        if (entry.is_regular_file()) inputs.push_back(entry.path());
    } else if (fs::is_regular_file(path)) {
      inputs.push_back(path);
    } else {
      std::printf("replay: %s does not exist, skipped\n", path.c_str());
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "replay: no inputs found (an empty corpus would make this test pass vacuously)\n");
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());  // a fixed order: a failure reproduces as it was seen
  const auto start = std::chrono::steady_clock::now();
  for (const fs::path& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Named before it runs: if it crashes, the last line printed says which input did it.
    std::printf("replay: %s (%zu bytes)\n", path.c_str(), bytes.size());
    std::fflush(stdout);
    // A heap copy of exactly its size, as libFuzzer passes it: a read one past the end is caught.
    std::vector<uint8_t> copy(bytes.begin(), bytes.end());
    LLVMFuzzerTestOneInput(copy.empty() ? nullptr : copy.data(), copy.size());
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("replay: %zu inputs, no finding, %.2f s\n", inputs.size(), seconds);
  return 0;
}
