// mg::Error: the one exception type multigrad throws for bad input or a failed
// library call. Messages name both sides of a mismatch ("shape [2, 3] vs [4]")
// so the user can fix the call without a debugger.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mg {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
inline void append_all(std::ostringstream&) {}
template <class First, class... Rest>
void append_all(std::ostringstream& os, const First& first, const Rest&... rest) {
  os << first;
  append_all(os, rest...);
}
}  // namespace detail

// Concatenates every argument with operator<< into one string.
template <class... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  detail::append_all(os, args...);
  return os.str();
}

// Throws mg::Error with the message when `condition` is false.
template <class... Args>
void check(bool condition, const Args&... message) {
  if (!condition) throw Error(str_cat(message...));
}

}  // namespace mg
