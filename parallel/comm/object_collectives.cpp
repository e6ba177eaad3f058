#include "parallel/comm/object_collectives.h"

#include <algorithm>
#include <cstring>

#include "core/base/error.h"

namespace mg::parallel {
namespace {

int64_t words_for(int64_t bytes) { return (bytes + 7) / 8; }

// `bytes` in a CPU i64 tensor of at least `words` elements, zero-padded.
Tensor pack(const std::string& bytes, int64_t words) {
  Tensor packed = zeros({std::max<int64_t>(words, 1)}, TensorOptions{DType::i64});
  if (!bytes.empty()) std::memcpy(packed.data_ptr(), bytes.data(), bytes.size());
  return packed;
}

std::string unpack(const Tensor& packed, int64_t offset_words, int64_t length) {
  const char* begin = static_cast<const char*>(packed.data_ptr()) + offset_words * 8;
  return std::string(begin, begin + length);
}

void check_root(const ProcessGroup& group, int root, const char* op) {
  MG_CHECK(root >= 0 && root < group.size(), op, ": root ", root, " is not a rank of this group of ",
        group.size());
}

}  // namespace

std::string broadcast_object(ProcessGroup& group, const std::string& bytes, int root) {
  check_root(group, root, "broadcast_object");
  Tensor length =
      full({1}, group.rank() == root ? static_cast<double>(bytes.size()) : 0.0, TensorOptions{DType::i64});
  group.broadcast(length, root)->wait();
  const int64_t n = length.item<int64_t>();
  Tensor packed = pack(group.rank() == root ? bytes : std::string(), words_for(n));
  group.broadcast(packed, root)->wait();
  return unpack(packed, 0, n);
}

std::vector<std::string> gather_object(ProcessGroup& group, const std::string& bytes, int root) {
  check_root(group, root, "gather_object");
  const int tag = 0x6f6a;  // "oj": apart from user tags only by convention, like PyTorch's
  if (group.rank() != root) {
    Tensor length = full({1}, static_cast<double>(bytes.size()), TensorOptions{DType::i64});
    group.send(length, root, tag)->wait();
    group.send(pack(bytes, words_for(static_cast<int64_t>(bytes.size()))), root, tag)->wait();
    return {};
  }
  std::vector<std::string> all(static_cast<size_t>(group.size()));
  all[static_cast<size_t>(root)] = bytes;
  for (int r = 0; r < group.size(); ++r) {
    if (r == root) continue;
    Tensor length = zeros({1}, TensorOptions{DType::i64});
    group.recv(length, r, tag)->wait();
    const int64_t n = length.item<int64_t>();
    Tensor packed = zeros({std::max<int64_t>(words_for(n), 1)}, TensorOptions{DType::i64});
    group.recv(packed, r, tag)->wait();
    all[static_cast<size_t>(r)] = unpack(packed, 0, n);
  }
  return all;
}

std::vector<std::string> all_gather_object(ProcessGroup& group, const std::string& bytes) {
  const int world = group.size();
  Tensor mine = full({1}, static_cast<double>(bytes.size()), TensorOptions{DType::i64});
  Tensor lengths = zeros({world}, TensorOptions{DType::i64});
  group.allgather(lengths, mine)->wait();
  const std::vector<int64_t> n = lengths.to_vector<int64_t>();
  const int64_t words = std::max<int64_t>(words_for(*std::max_element(n.begin(), n.end())), 1);
  Tensor all = zeros({world * words}, TensorOptions{DType::i64});
  group.allgather(all, pack(bytes, words))->wait();
  std::vector<std::string> out;
  for (int r = 0; r < world; ++r) out.push_back(unpack(all, r * words, n[static_cast<size_t>(r)]));
  return out;
}

bool any_rank(ProcessGroup& group, bool flag) {
  Tensor value = full({1}, flag ? 1.0 : 0.0, TensorOptions{DType::i32});
  group.allreduce(value, ReduceOp::Max)->wait();
  return value.item<int32_t>() != 0;
}

}  // namespace mg::parallel
