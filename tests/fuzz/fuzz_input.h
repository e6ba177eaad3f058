// The structured harnesses' way of reading their input (fuzz_checkpoint_dir.cpp,
// fuzz_safetensors_writer.cpp, fuzz_optimizer_state.cpp, fuzz_fsdp_checkpoint.cpp): the bytes are
// consumed front to back as choices -- which edit, which key, which value -- and past the end
// every read gives zeros, so any input, even an empty one, is a valid sequence of choices. Also
// what those harnesses compare and pick with.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>

#include "core/state_dict.h"
#include "multigrad.h"

namespace mg::fuzz {

struct Input {
  const uint8_t* data;
  size_t size;
  size_t pos = 0;

  bool done() const { return pos >= size; }
  uint8_t byte() { return pos < size ? data[pos++] : 0; }

  // A length byte (% max_length), then that many raw bytes (7-bit ones with seven_bit: every ASCII
  // byte, control characters included, is valid UTF-8, so JSON headers can hold it).
  std::string text(size_t max_length, bool seven_bit) {
    const size_t n = byte() % max_length;
    std::string s;
    for (size_t i = 0; i < n && pos < size; ++i)
      s.push_back(static_cast<char>(seven_bit ? data[pos++] & 0x7f : data[pos++]));
    return s;
  }

  // One of `values`, chosen by the next byte.
  template <class T, size_t N>
  const T& one_of(const T (&values)[N]) {
    return values[byte() % N];
  }

  // A count byte (% max_words), then that many of `words` joined: names made of a layout's own
  // words ("state.", digits, "exp_avg", ...) reach the checks behind the key parsers.
  template <size_t N>
  std::string words(const char* const (&list)[N], int max_words) {
    std::string s;
    const int count = byte() % max_words;
    for (int i = 0; i < count; ++i) s += one_of(list);
    return s;
  }

  // A tensor of any dtype with up to 3 dims of up to 4, its bytes from the input (a bool byte other
  // than 0 or 1 is not a bool: masked).
  Tensor tensor() {
    static const DType kDTypes[] = {DType::f32, DType::f64, DType::f16,    DType::bf16,
                                    DType::i32, DType::i64, DType::boolean};
    const DType dtype = kDTypes[byte() % 7];
    Shape shape(byte() % 4);
    for (int64_t& dim : shape) dim = byte() % 5;
    Tensor t = zeros(shape, TensorOptions{dtype});
    auto* bytes = static_cast<uint8_t*>(t.data_ptr());
    for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] = byte();
    if (dtype == DType::boolean)
      for (size_t i = 0; i < t.nbytes(); ++i) bytes[i] &= 1;
    return t;
  }
};

// The entry `choice` % size of a map (end() when it is empty).
template <class Map>
typename Map::iterator pick(Map& map, uint8_t choice) {
  if (map.empty()) return map.end();
  auto it = map.begin();
  std::advance(it, choice % map.size());
  return it;
}

// The same keys, dtypes, shapes and bytes.
inline bool same_state(const StateDict& a, const StateDict& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
    if (ia->first != ib->first || ia->second.dtype() != ib->second.dtype() ||
        ia->second.shape() != ib->second.shape())
      return false;
    const Tensor x = ia->second.contiguous(), y = ib->second.contiguous();
    if (x.nbytes() != y.nbytes() || std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace mg::fuzz
