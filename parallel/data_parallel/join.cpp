// Join: the notification all-reduce and the joined rank's loop (see join.h for the scheme).
#include "parallel/data_parallel/join.h"

#include <exception>

#include "base/error.h"
#include "parallel/comm/process_group_signature.h"

namespace mg::parallel {

// Shared by a Join and its joinables, on one rank.
struct JoinState {
  ProcessGroup group;
  bool throw_on_early_termination = false;
  Joinable* first = nullptr;    // the joinable that all-reduces the notification
  JoinRound round;              // the latest round
  JoinRound last_active_round;  // the latest round in which some rank was active
};

namespace {

// The notification: [1 at each active rank ..., how many active ranks will sync backward].
// Tagged, so that a rank meeting it with another collective learns it met a joined rank.
void exchange_notification(JoinState& state, bool active, bool will_sync_backward) {
  const int world = state.group.size(), rank = state.group.rank();
  Tensor flags = zeros({world + 1}, TensorOptions{DType::i64});
  if (active) {
    flags.data<int64_t>()[rank] = 1;
    flags.data<int64_t>()[world] = will_sync_backward ? 1 : 0;
  }
  WorkPtr work;
  {
    detail::SignatureTagScope tag(detail::kJoinNotificationTag);
    work = state.group.allreduce(flags, ReduceOp::Sum);
  }
  work->wait();
  const int64_t* sums = flags.data<int64_t>();
  JoinRound round;
  round.active.resize(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    round.active[static_cast<size_t>(r)] = sums[r] != 0;
    if (sums[r] == 0) continue;
    ++round.active_count;
    if (round.first_active < 0) round.first_active = r;
  }
  round.sync_count = static_cast<int>(sums[world]);
  state.round = round;
  if (round.active_count > 0) state.last_active_round = round;
}

std::string joined_ranks(const JoinRound& round) {
  std::string text;
  for (size_t r = 0; r < round.active.size(); ++r)
    if (!round.active[r]) text += str_cat(text.empty() ? "" : ", ", r);
  return text;
}

[[noreturn]] void throw_early_termination(const JoinRound& round, int rank) {
  throw Error(str_cat(
      "Join (throw_on_early_termination): rank(s) ", joined_ranks(round),
      " ran out of inputs while other ranks still had batches; every rank throws (this is rank ", rank, ")"));
}

}  // namespace

const JoinRound* Joinable::notify_join_context(bool will_sync_backward) {
  if (!join_state_) return nullptr;
  JoinState& state = *join_state_;
  if (state.first == this) {
    exchange_notification(state, /*active=*/true, will_sync_backward);
    if (state.throw_on_early_termination && state.round.someone_joined())
      throw_early_termination(state.round, state.group.rank());
  }
  return &state.round;
}

Join::Join(std::vector<Joinable*> joinables, bool enable, bool throw_on_early_termination,
           JoinHookOptions hook_options)
    : joinables_(std::move(joinables)), uncaught_at_start_(std::uncaught_exceptions()) {
  MG_CHECK(!joinables_.empty(), "Join: give it at least one joinable (e.g. the DistributedDataParallel)");
  for (Joinable* joinable : joinables_) MG_CHECK(joinable != nullptr, "Join: a joinable is null");
  if (!enable) {
    finished_ = true;  // a disabled Join does nothing at all
    return;
  }
  state_ = std::make_shared<JoinState>();
  state_->group = joinables_.front()->join_process_group();
  state_->throw_on_early_termination = throw_on_early_termination;
  state_->first = joinables_.front();
  for (Joinable* joinable : joinables_) {
    MG_CHECK(joinable->join_process_group().id() == state_->group.id(),
             "Join: every joinable must use the same process group");
    MG_CHECK(joinable->join_state_ == nullptr, "Join: a joinable is already inside another Join");
  }
  for (Joinable* joinable : joinables_) {
    hooks_.push_back(joinable->join_hook(hook_options));
    joinable->join_state_ = state_;
  }
}

Join::~Join() noexcept(false) {
  if (finished_) return;
  if (std::uncaught_exceptions() > uncaught_at_start_) {
    // An error is leaving the scope: joining now would only add a second failure to it.
    for (Joinable* joinable : joinables_) joinable->join_state_.reset();
    return;
  }
  finish();
}

void Join::finish() {
  if (finished_) return;
  finished_ = true;
  struct Detach {  // the joinables leave the Join however finish() ends
    std::vector<Joinable*>& joinables;
    ~Detach() {
      for (Joinable* joinable : joinables) joinable->join_state_.reset();
    }
  } detach{joinables_};
  JoinState& state = *state_;
  const int rank = state.group.rank();
  for (;;) {
    exchange_notification(state, /*active=*/false, /*will_sync_backward=*/false);
    if (state.round.active_count == 0) break;  // every rank has joined
    if (state.throw_on_early_termination) throw_early_termination(state.round, rank);
    for (auto& hook : hooks_) hook->main_hook(state.round);
  }
  const JoinRound& last = state.last_active_round;
  const bool is_last_joiner = !last.active.empty() && last.active[static_cast<size_t>(rank)];
  for (auto& hook : hooks_) hook->post_hook(is_last_joiner);
}

}  // namespace mg::parallel
