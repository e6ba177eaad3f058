#include "parallel/comm/object_collectives.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "base/checked_size.h"
#include "base/error.h"

namespace mg::parallel {
namespace {

// `bytes` in a CPU i64 tensor of at least `words` elements, zero-padded.
Tensor pack(const std::string& bytes, int64_t words) {
  Tensor packed = zeros({std::max<int64_t>(words, 1)}, TensorOptions{DType::i64});
  if (!bytes.empty()) std::memcpy(packed.data_ptr(), bytes.data(), bytes.size());
  return packed;
}

int64_t capacity_bytes(const Tensor& packed) { return packed.numel() * 8; }

void check_root(const ProcessGroup& group, int root, const char* op) {
  MG_CHECK(root >= 0 && root < group.size(), op, ": root ", root, " is not a rank of this group of ",
           group.size());
}

}  // namespace

int64_t object_words(int64_t length, const char* op) {
  constexpr int64_t kMaxObjectBytes = int64_t(1) << 40;
  MG_CHECK(length >= 0 && length <= kMaxObjectBytes, op, ": a received object length of ", length,
           " bytes is corrupt (not in [0, 2^40])");
  return std::max<int64_t>((length + 7) / 8, 1);
}

std::string unpack_object(const void* packed, int64_t capacity, int64_t length, const char* op) {
  object_words(length, op);
  MG_CHECK(capacity >= 0 && length <= capacity, op, ": a received object announces ", length,
           " bytes but only ", capacity, " arrived");
  const char* begin = static_cast<const char*>(packed);
  return std::string(begin, begin + length);
}

std::vector<std::string> unpack_objects(const void* packed, int64_t capacity,
                                        const std::vector<int64_t>& lengths, int64_t stride, const char* op) {
  MG_CHECK(stride >= 0 && capacity >= 0, op, ": bad layout (stride ", stride, ", capacity ", capacity, ")");
  std::vector<std::string> out;
  out.reserve(lengths.size());
  for (size_t r = 0; r < lengths.size(); ++r) {
    object_words(lengths[r], op);
    MG_CHECK(lengths[r] <= stride, op, ": rank ", r, "'s object announces ", lengths[r],
             " bytes, more than its slot of ", stride);
    const std::optional<int64_t> offset = try_mul(static_cast<int64_t>(r), stride);
    MG_CHECK(offset && *offset <= capacity, op, ": rank ", r, "'s slot lies past the ", capacity,
             " bytes received");
    out.push_back(
        unpack_object(static_cast<const char*>(packed) + *offset, capacity - *offset, lengths[r], op));
  }
  return out;
}

std::string broadcast_object(ProcessGroup& group, const std::string& bytes, int root) {
  check_root(group, root, "broadcast_object");
  Tensor length =
      full({1}, group.rank() == root ? static_cast<double>(bytes.size()) : 0.0, TensorOptions{DType::i64});
  group.broadcast(length, root)->wait();
  const int64_t n = length.item<int64_t>();
  Tensor packed = pack(group.rank() == root ? bytes : std::string(), object_words(n, "broadcast_object"));
  group.broadcast(packed, root)->wait();
  return unpack_object(packed.data_ptr(), capacity_bytes(packed), n, "broadcast_object");
}

std::vector<std::string> gather_object(ProcessGroup& group, const std::string& bytes, int root) {
  check_root(group, root, "gather_object");
  const int tag = 0x6f6a;  // "oj": apart from user tags only by convention, like PyTorch's
  if (group.rank() != root) {
    Tensor length = full({1}, static_cast<double>(bytes.size()), TensorOptions{DType::i64});
    group.send(length, root, tag)->wait();
    group.send(pack(bytes, object_words(static_cast<int64_t>(bytes.size()), "gather_object")), root, tag)
        ->wait();
    return {};
  }
  std::vector<std::string> all(static_cast<size_t>(group.size()));
  all[static_cast<size_t>(root)] = bytes;
  for (int r = 0; r < group.size(); ++r) {
    if (r == root) continue;
    Tensor length = zeros({1}, TensorOptions{DType::i64});
    group.recv(length, r, tag)->wait();
    const int64_t n = length.item<int64_t>();
    Tensor packed = zeros({object_words(n, "gather_object")}, TensorOptions{DType::i64});
    group.recv(packed, r, tag)->wait();
    all[static_cast<size_t>(r)] =
        unpack_object(packed.data_ptr(), capacity_bytes(packed), n, "gather_object");
  }
  return all;
}

std::vector<std::string> all_gather_object(ProcessGroup& group, const std::string& bytes) {
  const int world = group.size();
  Tensor mine = full({1}, static_cast<double>(bytes.size()), TensorOptions{DType::i64});
  Tensor lengths = zeros({world}, TensorOptions{DType::i64});
  group.allgather(lengths, mine)->wait();
  const std::vector<int64_t> n = lengths.to_vector<int64_t>();
  int64_t words = 1;
  for (int64_t length : n) words = std::max(words, object_words(length, "all_gather_object"));
  Tensor all = zeros({checked_mul(world, words, "all_gather_object")}, TensorOptions{DType::i64});
  group.allgather(all, pack(bytes, words))->wait();
  return unpack_objects(all.data_ptr(), capacity_bytes(all), n, words * 8, "all_gather_object");
}

bool any_rank(ProcessGroup& group, bool flag) {
  Tensor value = full({1}, flag ? 1.0 : 0.0, TensorOptions{DType::i32});
  group.allreduce(value, ReduceOp::Max)->wait();
  return value.item<int32_t>() != 0;
}

}  // namespace mg::parallel
