#include "kernels/cpu/index.h"

#include <cstring>

#include "base/error.h"

namespace mg::kernels::cpu {
namespace {
void check_indices(const IndexShape& shape, const int64_t* indices, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    MG_CHECK(indices[i] >= 0 && indices[i] < shape.size, "index_select: index ", indices[i], " at position ",
             i, " is out of range for a dimension of size ", shape.size);
}
}  // namespace

void index_select(DType dtype, const IndexShape& shape, const void* input, const int64_t* indices,
                  int64_t count, void* out) {
  check_indices(shape, indices, count);
  const size_t run = static_cast<size_t>(shape.inner) * dtype_size(dtype);
  const char* in = static_cast<const char*>(input);
  char* dst = static_cast<char*>(out);
  for (int64_t o = 0; o < shape.outer; ++o)
    for (int64_t i = 0; i < count; ++i)
      std::memcpy(dst + (o * count + i) * run, in + (o * shape.size + indices[i]) * run, run);
}

void index_add(DType dtype, const IndexShape& shape, const void* grad_out, const int64_t* indices,
               int64_t count, void* grad_input) {
  check_indices(shape, indices, count);
  visit_floating(dtype, "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* src = static_cast<const T*>(grad_out);
    T* dst = static_cast<T*>(grad_input);
    for (int64_t o = 0; o < shape.outer; ++o)
      for (int64_t i = 0; i < count; ++i) {
        const T* from = src + (o * count + i) * shape.inner;
        T* to = dst + (o * shape.size + indices[i]) * shape.inner;
        for (int64_t j = 0; j < shape.inner; ++j)
          to[j] = static_cast<T>(static_cast<acc_t<T>>(to[j]) + static_cast<acc_t<T>>(from[j]));
      }
  });
}

}  // namespace mg::kernels::cpu
