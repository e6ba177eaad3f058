// Device = kind + index. CPU devices carry a *logical* index (cpu:0, cpu:1, ...):
// they share host memory, but ops refuse to mix indices exactly as they refuse to
// mix GPUs, so DataParallel's whole code path runs and is tested without a GPU.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "base/error.h"

namespace mg {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  static Device cpu(int index = 0) { return Device{DeviceType::CPU, index}; }
  static Device cuda(int index = 0) { return Device{DeviceType::CUDA, index}; }
  // Parses "cpu", "cpu:1", "cuda", "cuda:0".
  static Device parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const { return str_cat(is_cpu() ? "cpu:" : "cuda:", index); }

  friend bool operator==(const Device& a, const Device& b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
  friend std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }
};

inline Device Device::parse(const std::string& text) {
  std::string kind = text;
  int index = 0;
  auto colon = text.find(':');
  if (colon != std::string::npos) {
    kind = text.substr(0, colon);
    const std::string digits = text.substr(colon + 1);
    MG_CHECK(!digits.empty() && digits.find_first_not_of("0123456789") == std::string::npos,
             "Device::parse: bad index in '", text, "'");
    // At most 9 digits: any such index fits an int (std::stoi threw std::out_of_range beyond it,
    // which reached users as a bare "stoi").
    MG_CHECK(digits.size() <= 9, "Device::parse: the index in '", text,
             "' is out of range (at most 999999999)");
    index = std::stoi(digits);
  }
  if (kind == "cpu") return cpu(index);
  if (kind == "cuda") return cuda(index);
  throw Error(str_cat("Device::parse: unknown device '", text, "' (expected cpu[:N] or cuda[:N])"));
}

}  // namespace mg
