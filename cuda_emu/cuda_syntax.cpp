// The part of cuda_syntax.h that is not a template: a launch's kernel name.
#include "cuda_emu/cuda_syntax.h"

#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace mg_emu {

namespace {

// "void f(...) [with auto Kernel = ns::name<float>; Args = {...}]", "Kernel" -> "ns::name<float>"
std::string template_argument(const std::string& pretty, const std::string& parameter) {
  const std::string key = parameter + " = ";
  size_t start = pretty.find("[with ");
  while (start != std::string::npos) {
    start = pretty.find(key, start);
    if (start == std::string::npos) return "";
    const char before = pretty[start - 1];
    if (before == ' ' || before == '[' || before == ';') break;  // the whole parameter name
    start += key.size();
  }
  if (start == std::string::npos) return "";
  size_t end = start + key.size();
  int depth = 0;
  for (; end < pretty.size(); ++end) {
    const char c = pretty[end];
    if (c == '<' || c == '(' || c == '[' || c == '{') ++depth;
    if (c == '>' || c == ')' || c == ']' || c == '}') --depth;
    if (depth < 0 || (depth == 0 && c == ';')) break;
  }
  return pretty.substr(start + key.size(), end - start - key.size());
}

}  // namespace

const char* kernel_launch_name(const char* expression, const char* enclosing_function) {
  static std::mutex mutex;
  static auto* names = new std::map<std::pair<const void*, const void*>, std::string>;  // never freed
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = names->try_emplace({expression, enclosing_function});
  if (fresh) {
    const std::string argument = template_argument(enclosing_function, expression);
    it->second = argument.empty() ? expression : argument;
  }
  return it->second.c_str();
}

}  // namespace mg_emu
