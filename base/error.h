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

namespace detail {
// Out of line and cold: the failure path builds the message, the passing path never reaches it.
template <class... Args>
[[noreturn]] __attribute__((noinline, cold)) void throw_error(const Args&... message) {
  throw Error(str_cat(message...));
}
}  // namespace detail

}  // namespace mg

// MG_CHECK(condition, message...): throws mg::Error(str_cat(message...)) when `condition` is
// false. A macro, not a function, so that the message's arguments -- a shape printed to a string,
// a JSON value dumped, a name looked up -- are evaluated only when the check fails: a passing
// check costs one branch, and an argument that would recurse on hostile input (a header nested a
// million levels deep) is never touched unless its check has already failed.
#define MG_CHECK(condition, ...)                                               \
  do {                                                                         \
    if (!static_cast<bool>(condition)) ::mg::detail::throw_error(__VA_ARGS__); \
  } while (0)
