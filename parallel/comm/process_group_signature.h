// The call signature both multi-process backends exchange before a collective
// (InitOptions::verify_collectives): four int64 numbers that say which collective this rank is
// about to run. Every rank allgathers every rank's signature, so a mismatch fails the op on every
// rank with the same message, naming both sides, instead of corrupting memory or hanging.
//
// Internal to parallel/ (process_group_mpi.cpp, process_group_nccl.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "core/base/dtype.h"
#include "core/base/error.h"
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
  // "allreduce(sum) f32[1024]", "broadcast(root 0) f32[10]", "barrier"
  std::string str() const {
    auto op_kind = static_cast<OpKind>(kind);
    std::string text = op_kind_name(op_kind);
    if (op_kind == OpKind::Barrier) return text;
    if (op_kind == OpKind::NewGroup) return str_cat(text, "(", count, " ranks, id ", detail, ")");
    if (op_kind == OpKind::Broadcast || op_kind == OpKind::Gather || op_kind == OpKind::Scatter)
      text += str_cat("(root ", detail, ")");
    else if (op_kind == OpKind::Reduce)
      text += str_cat("(", reduce_op_name(static_cast<ReduceOp>(detail % 16)), ", root ", detail / 16, ")");
    else if (op_kind != OpKind::Allgather && op_kind != OpKind::AllToAll)
      text += str_cat("(", reduce_op_name(static_cast<ReduceOp>(detail)), ")");
    return str_cat(text, " ", dtype_name(static_cast<DType>(dtype)), "[", count, "]");
  }
};
static_assert(sizeof(Signature) == 4 * sizeof(int64_t), "Signature travels as four int64");

// The message every rank reports when the signatures it gathered differ from its own.
inline std::string mismatch_message(const std::string& description, int rank, const Signature& mine,
                                    int other, const Signature& theirs) {
  return str_cat(
      description, ": the ranks' calls do not match: rank ", rank, " called ", mine.str(), ", rank ", other,
      " called ", theirs.str(),
      " (collectives must be called in the same order with the same dtype and element count on every "
      "rank)");
}

}  // namespace mg::parallel::detail
