// The call signature both multi-process backends exchange before a collective
// (InitOptions::verify_collectives): four int64 numbers that say which collective this rank is
// about to run. Every rank allgathers every rank's signature, so a mismatch fails the op on every
// rank with the same message, naming both sides, instead of corrupting memory or hanging.
//
// Internal to parallel/ (process_group_mpi.cpp, process_group_nccl.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "base/dtype.h"
#include "base/error.h"
#include "parallel/comm/process_group.h"

namespace mg::parallel::detail {

enum class OpKind : int64_t {
  Allreduce = 1,
  Broadcast,
  Reduce,
  Allgather,
  ReduceScatter,
  Barrier,
  Send,
  Recv,
  Gather,
  Scatter,
  AllToAll,
  NewGroup
};

inline const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::Allreduce: return "allreduce";
    case OpKind::Broadcast: return "broadcast";
    case OpKind::Reduce: return "reduce";
    case OpKind::Allgather: return "allgather";
    case OpKind::ReduceScatter: return "reduce_scatter";
    case OpKind::Barrier: return "barrier";
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
    case OpKind::Gather: return "gather";
    case OpKind::Scatter: return "scatter";
    case OpKind::AllToAll: return "all_to_all";
    case OpKind::NewGroup: return "new_group";
  }
  return "?";
}

// A purpose stamped into a signature's `detail` (above bit 32) by the calling thread, so that a
// mismatch can say what the other side was doing. Join's "who is still training" all-reduce
// carries kJoinNotificationTag: a rank that has joined (parallel/data_parallel/join.h) answers only
// that and the collectives Join shadows, and a rank meeting it with anything else is told so.
// DDP's bucket all-reduces sent (as zeros) by a rank whose parameters got no gradient carry
// kUnusedParametersTag: the other ranks' all-reduces of those buckets fail at once instead of
// waiting, and all ranks then exchange the parameters' names (reducer.cpp).
// The NCCL backend's exchange of a GPU collective's signature travels over the CPU backend as an
// allgather tagged kSignatureCheckTag, so that a CPU collective meeting it says what it met.
constexpr int64_t kJoinNotificationTag = int64_t{1} << 32;
constexpr int64_t kUnusedParametersTag = int64_t{2} << 32;
constexpr int64_t kSignatureCheckTag = int64_t{3} << 32;
constexpr int64_t kSignatureTagMask = ~((int64_t{1} << 32) - 1);
inline thread_local int64_t current_signature_tag = 0;

// Stamps `tag` on the collectives this thread issues in its scope.
class SignatureTagScope {
 public:
  explicit SignatureTagScope(int64_t tag) : previous_(current_signature_tag) { current_signature_tag = tag; }
  ~SignatureTagScope() { current_signature_tag = previous_; }
  SignatureTagScope(const SignatureTagScope&) = delete;
  SignatureTagScope& operator=(const SignatureTagScope&) = delete;

 private:
  int64_t previous_;
};

// What a collective call looks like. Laid out as four int64 so it travels as one small array.
struct Signature {
  int64_t kind = 0;
  int64_t detail =
      0;  // the reduce op, the root, for reduce root * 16 + reduce op, for new_group a hash of the ranks
  int64_t dtype = 0;
  int64_t count = 0;

  bool operator==(const Signature& o) const {
    return kind == o.kind && detail == o.detail && dtype == o.dtype && count == o.count;
  }
  // The calling thread's SignatureTagScope tag (new_group's detail is a 62-bit hash, not a tag).
  int64_t tag() const {
    return static_cast<OpKind>(kind) == OpKind::NewGroup ? 0 : detail & kSignatureTagMask;
  }
  bool is_join_notification() const { return tag() == kJoinNotificationTag; }
  // "allreduce(sum) f32[1024]", "broadcast(root 0) f32[10]", "barrier"
  std::string str() const {
    auto op_kind = static_cast<OpKind>(kind);
    const int64_t op_detail = detail & ~tag();
    std::string text =
        is_join_notification() ? str_cat("Join's notification ", op_kind_name(op_kind))
        : tag() == kUnusedParametersTag
            ? str_cat("DDP's zeros for unused parameters: ", op_kind_name(op_kind))
        : tag() == kSignatureCheckTag
            ? str_cat("the signature check of a GPU collective (NCCL backend): ", op_kind_name(op_kind))
            : std::string(op_kind_name(op_kind));
    if (op_kind == OpKind::Barrier) return text;
    if (op_kind == OpKind::NewGroup) return str_cat(text, "(", count, " ranks, id ", op_detail, ")");
    if (op_kind == OpKind::Broadcast || op_kind == OpKind::Gather || op_kind == OpKind::Scatter)
      text += str_cat("(root ", op_detail, ")");
    else if (op_kind == OpKind::Reduce)
      text +=
          str_cat("(", reduce_op_name(static_cast<ReduceOp>(op_detail % 16)), ", root ", op_detail / 16, ")");
    else if (op_kind != OpKind::Allgather && op_kind != OpKind::AllToAll)
      text += str_cat("(", reduce_op_name(static_cast<ReduceOp>(op_detail)), ")");
    return str_cat(text, " ", dtype_name(static_cast<DType>(dtype)), "[", count, "]");
  }
};
static_assert(sizeof(Signature) == 4 * sizeof(int64_t), "Signature travels as four int64");

// The message every rank reports when the signatures it gathered differ from its own.
inline std::string mismatch_message(const std::string& description, int rank, const Signature& mine,
                                    int other, const Signature& theirs) {
  std::string explanation;
  if (theirs.is_join_notification() != mine.is_join_notification()) {
    const int joined_rank = theirs.is_join_notification() ? other : rank;
    explanation =
        str_cat(": rank ", joined_rank,
                " has joined (parallel::Join: it ran out of inputs) and answers only the collectives "
                "Join shadows (DDP's forward, buffer broadcast and gradient buckets), so a collective "
                "of your own cannot run while a rank has joined");
  } else if ((theirs.tag() == kUnusedParametersTag) != (mine.tag() == kUnusedParametersTag)) {
    const int lacking_rank = theirs.tag() == kUnusedParametersTag ? other : rank;
    explanation =
        str_cat(": on rank ", lacking_rank,
                " some parameters received no gradient in this backward pass (DistributedDataParallel "
                "names them next)");
  }
  return str_cat(
      description, ": the ranks' calls do not match: rank ", rank, " called ", mine.str(), ", rank ", other,
      " called ", theirs.str(), explanation,
      " (collectives must be called in the same order with the same dtype and element count on every "
      "rank)");
}

}  // namespace mg::parallel::detail
