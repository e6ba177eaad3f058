// A tensor's elements as floats, for checks such as REQUIRE(values(t) == std::vector<float>{...}).
// One copy for the test files that use it: they compile as unity builds (tests/CMakeLists.txt).
#pragma once

#include <vector>

#include "core/tensor.h"

namespace mg::testing {

inline std::vector<float> values(const Tensor& t) { return t.to_vector<float>(); }

}  // namespace mg::testing
