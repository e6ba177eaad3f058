// The heartbeat's thread: beats to every peer, watches for silence and stalled progress
// (heartbeat.h says why and what exactly is detected).
//
// One loop, every ~10 ms:
//   1. sample this rank's own progress (ops started, ops in flight, step);
//   2. test each peer's posted receive; a beat that arrived refreshes the peer's "last heard"
//      time (and is re-posted) and, if its progress differs from the previous beat, its
//      "progress changed" time; a "leaving" beat retires the peer -- unless it carries a non-zero
//      exit status (the peer is exiting after an error of its own): then it is lost at once;
//   3. a peer silent for longer than the bound, or whose request reported an MPI error, is lost;
//      a peer that keeps this rank waiting without progress for longer than the stall bound is
//      stuck;
//   4. every interval (bound / 10, at least 20 ms), post a beat to each peer whose previous beat
//      has gone out (a peer that stopped reading gets no pile of beats, just silence);
//   5. one report for the peers newly lost or stuck, and every registered callback (the process
//      groups' poison) runs once.
// Beats keep going after a loss, so the other survivors do not take this rank for lost too.
#include "parallel/comm/heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/env.h"
#include "base/error.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/work.h"

#ifdef MG_HAS_MPI
#include <mpi.h>
#endif

namespace mg::parallel {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// Process-wide and never destroyed: process groups and MPI's own teardown may use them from
// static destructors, in any order.
struct Registry {
  std::mutex callbacks_mutex;  // held while callbacks run, so forget_peer_lost waits for them
  std::map<int, std::function<void(const std::string&)> > callbacks;
  int next_id = 1;

  // This rank's progress, written by the training thread and the backends' threads, read by
  // the heartbeat's.
  std::mutex progress_mutex;
  std::string operation = "none yet";
  int64_t ops_started = 0;
  std::vector<std::weak_ptr<Work> > in_flight;  // started, perhaps not finished yet
  int64_t step = -1;                            // the last one note_step was given
  int64_t steps_noted = 0;                      // how many times note_step ran
  Clock::time_point last_step_at;
  Clock::duration slowest_step{0};  // the longest time between two note_step calls
  int slow_phases = 0;              // SlowPhase objects alive
  std::string slow_phase;           // the newest one's description
};
Registry& registry() {
  static Registry* instance = new Registry();
  return *instance;
}

// Drops the ops that have finished (or whose Work is gone). Caller holds progress_mutex.
void prune_finished(Registry& r) {
  auto finished = [](const std::weak_ptr<Work>& weak) {
    std::shared_ptr<Work> work = weak.lock();
    return work == nullptr || work->is_completed();
  };
  r.in_flight.erase(std::remove_if(r.in_flight.begin(), r.in_flight.end(), finished), r.in_flight.end());
}

}  // namespace

int on_peer_lost(std::function<void(const std::string&)> callback) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.callbacks_mutex);
  r.callbacks[r.next_id] = std::move(callback);
  return r.next_id++;
}

void forget_peer_lost(int id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.callbacks_mutex);
  r.callbacks.erase(id);
}

void note_operation(const std::shared_ptr<Work>& work) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.progress_mutex);
  r.operation = work->description();
  ++r.ops_started;
  prune_finished(r);  // also keeps the list short when no heartbeat thread samples it
  r.in_flight.push_back(work);
}

}  // namespace detail

void note_step(int64_t step) {
  detail::Registry& r = detail::registry();
  const auto now = detail::Clock::now();
  std::lock_guard<std::mutex> lock(r.progress_mutex);
  if (r.steps_noted > 0) r.slowest_step = std::max(r.slowest_step, now - r.last_step_at);
  r.last_step_at = now;
  r.step = step;
  ++r.steps_noted;
}

SlowPhase::SlowPhase(const std::string& what) {
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.progress_mutex);
  ++r.slow_phases;
  r.slow_phase = what;
}

SlowPhase::~SlowPhase() {
  detail::Registry& r = detail::registry();
  std::lock_guard<std::mutex> lock(r.progress_mutex);
  --r.slow_phases;
}

namespace detail {

namespace {

// MG_STALL_*: how the stall bound is chosen (heartbeat.h).
struct StallOptions {
  double step_factor = 5;  // 0: stall detection off
  int64_t warmup_steps = 3;
  std::chrono::milliseconds warmup_bound = std::chrono::minutes(5);
};

StallOptions stall_options_from_env() {
  StallOptions options;
  options.step_factor = env::number("MG_STALL_FACTOR", 0, 1000, "times the slowest step (0 = off)")
                            .value_or(options.step_factor);
  options.warmup_steps =
      env::integer("MG_STALL_WARMUP_STEPS", 0, 1'000'000'000, "steps").value_or(options.warmup_steps);
  options.warmup_bound = env::seconds("MG_STALL_WARMUP_S", 0, 30 * 24 * 3600).value_or(options.warmup_bound);
  return options;
}

}  // namespace

void check_heartbeat_env() { static_cast<void>(stall_options_from_env()); }

#ifndef MG_HAS_MPI

void start_heartbeat(std::chrono::milliseconds) {}
void stop_heartbeat(int) {}
void note_process_exiting() {}

#else

namespace {

// This rank's progress at one moment, as a beat carries it.
struct Progress {
  std::string operation;
  int64_t ops_started = 0;
  int32_t ops_in_flight = 0;
  int64_t step = -1;
  int64_t steps_noted = 0;
  int64_t slowest_step_us = 0;
  int32_t slow_phase = 0;
};

Progress own_progress() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.progress_mutex);
  prune_finished(r);
  Progress p;
  p.operation =
      r.slow_phases > 0 ? str_cat(r.slow_phase, " (a SlowPhase), after ", r.operation) : r.operation;
  p.ops_started = r.ops_started;
  p.ops_in_flight = static_cast<int32_t>(r.in_flight.size());
  p.step = r.step;
  p.steps_noted = r.steps_noted;
  p.slowest_step_us = std::chrono::duration_cast<std::chrono::microseconds>(r.slowest_step).count();
  p.slow_phase = r.slow_phases > 0 ? 1 : 0;
  return p;
}

// One beat on the wire: 224 bytes, sent as MPI_BYTE (every rank runs the same binary).
struct Beat {
  int64_t sequence = 0;
  int64_t ops_started = 0;
  int64_t step = -1;
  int64_t slowest_step_us = 0;
  int32_t pid = 0;
  int16_t leaving = 0;      // 1: the sender is leaving (its last beat)
  int16_t exit_status = 0;  // with leaving: the sender's exit status; not 0 = it left on an error
  int32_t ops_in_flight = 0;
  int32_t slow_phase = 0;
  int32_t flight_dumps = 0;  // the sender's flight-recorder dumps after a failure: more = "dump yours too"
  char host[56] = {};
  char operation[116] = {};
};
static_assert(sizeof(Beat) == 224, "a beat is 224 bytes");

// Has the sender made progress between two of its beats?
bool same_progress(const Beat& a, const Beat& b) {
  return a.ops_started == b.ops_started && a.ops_in_flight == b.ops_in_flight && a.step == b.step &&
         a.slow_phase == b.slow_phase;
}

void copy_text(char* out, size_t capacity, const std::string& text) {
  size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

std::atomic<bool> process_exiting{false};  // note_process_exiting(): this process's exit has begun

double seconds(Clock::duration d) {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) / 1000.0;
}

class Heartbeat {
 public:
  Heartbeat(std::chrono::milliseconds bound, StallOptions stall)
      : bound_(bound),
        interval_(std::max<std::chrono::milliseconds>(bound / 10, std::chrono::milliseconds(20))),
        stall_(stall) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    char host[sizeof(Beat::host)] = {};
    gethostname(host, sizeof(host) - 1);
    hostname_ = host;
    peers_.resize(static_cast<size_t>(size_));
    // Who is who, once (a collective): a peer lost before its first beat arrived is still named.
    own_ = own_progress();
    Beat me = make_beat();
    std::vector<Beat> everyone(static_cast<size_t>(size_));
    MPI_Allgather(&me, sizeof(Beat), MPI_BYTE, everyone.data(), sizeof(Beat), MPI_BYTE, comm_);
    const auto now = Clock::now();
    own_changed_at_ = now;
    for (int r = 0; r < size_; ++r) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      peer.last = everyone[static_cast<size_t>(r)];
      peer.host = peer.last.host;
      peer.pid = peer.last.pid;
      peer.last_heard = now;
      peer.progress_changed_at = now;
      peer.retired = r == rank_;
      if (!peer.retired) post_receive(r);
    }
    thread_ = std::thread([this] { loop(); });
  }

  // The "leaving" beat goes out with `exit_status`: 0 retires this rank quietly on every peer (a
  // normal end), anything else makes every peer report it lost at once (it left on an error).
  void set_exit_status(int exit_status) { exit_status_ = exit_status; }

  ~Heartbeat() {
    stop_ = true;
    thread_.join();
    // The "leaving" beat, so no peer reports this rank lost while it finishes its own work --
    // or, leaving on an error, so every peer reports it now instead of at its collective timeout.
    own_ = own_progress();
    Beat goodbye = make_beat();
    goodbye.leaving = 1;
    goodbye.exit_status = static_cast<int16_t>(exit_status_ == 0 ? 0 : std::clamp(exit_status_, 1, 32767));
    for (int r = 0; r < size_; ++r) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      if (r == rank_ || peer.lost) continue;
      // MPI may read a send buffer until its send completes: peer.outgoing is written only when
      // no MPI_Isend from it is in flight. A peer that has not taken the previous beat yet (slow,
      // or stopped) gets no goodbye.
      if (!send_finished(peer)) continue;
      peer.outgoing = goodbye;
      if (MPI_Isend(&peer.outgoing, sizeof(Beat), MPI_BYTE, r, 0, comm_, &peer.send) != MPI_SUCCESS)
        peer.send = MPI_REQUEST_NULL;
    }
    // Small messages go out eagerly: give them a moment, then cancel what is left (a receive
    // never matched because its peer left first), so MPI_Finalize finds nothing pending.
    auto deadline = Clock::now() + std::chrono::milliseconds(500);
    for (Peer& peer : peers_) wait_until(peer.send, deadline);
    deadline = Clock::now() + std::chrono::milliseconds(200);
    bool buffers_still_in_use = false;
    for (Peer& peer : peers_) {
      for (MPI_Request* request : {&peer.receive, &peer.send}) {
        if (*request == MPI_REQUEST_NULL) continue;
        MPI_Cancel(request);
        wait_until(*request, deadline);  // a cancelled request still has to complete
        if (*request == MPI_REQUEST_NULL) continue;
        MPI_Request_free(request);  // MPI may still use its buffer (a send that could not be cancelled)
        buffers_still_in_use = true;
      }
    }
    // The buffers of a request that never completed stay allocated for the rest of the process
    // (a few hundred bytes per peer), so MPI never reads or writes freed memory.
    if (buffers_still_in_use) static_cast<void>(new std::vector<Peer>(std::move(peers_)));
    if (!any_lost_) MPI_Comm_free(&comm_);
  }

 private:
  struct Peer {
    MPI_Request receive = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
    Beat incoming{}, outgoing{};  // MPI's buffers while a request on them is in flight
    Beat last{};                  // the last beat received (at first: the start-up exchange)
    std::string host;             // from the start-up exchange
    int pid = 0;
    Clock::time_point last_heard;
    Clock::time_point progress_changed_at;  // when a beat first showed its current progress
    bool retired = false;                   // itself, or left normally
    Clock::time_point left_on_error_at{};   // when its "leaving" beat with a non-zero status came
    bool lost = false;                      // silent or its connection failed: no more beats
    bool stuck = false;                     // alive but its progress stalled: beats go on
    bool reported = false;
    std::string failure;  // why it is lost or stuck
  };

  // Its "leaving" beat carried a non-zero exit status (no more beats to or from it).
  static bool left_on_error(const Peer& peer) { return peer.left_on_error_at != Clock::time_point{}; }

  Beat make_beat() {
    Beat beat;
    beat.sequence = ++sequence_;
    beat.ops_started = own_.ops_started;
    beat.ops_in_flight = own_.ops_in_flight;
    beat.step = own_.step;
    beat.slowest_step_us = own_.slowest_step_us;
    beat.slow_phase = own_.slow_phase;
    beat.pid = static_cast<int32_t>(getpid());
    beat.flight_dumps = detail::flight_dumps_asking_peers();
    copy_text(beat.host, sizeof(beat.host), hostname_);
    copy_text(beat.operation, sizeof(beat.operation), own_.operation);
    return beat;
  }

  // True when no MPI_Isend from peer.outgoing is in flight (MPI_Test completes a finished one).
  static bool send_finished(Peer& peer) {
    if (peer.send == MPI_REQUEST_NULL) return true;
    int done = 0;
    if (MPI_Test(&peer.send, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    return done != 0;
  }

  static void wait_until(MPI_Request& request, Clock::time_point deadline) {
    while (request != MPI_REQUEST_NULL && Clock::now() < deadline) {
      int done = 0;
      if (MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void post_receive(int r) {
    Peer& peer = peers_[static_cast<size_t>(r)];
    int code = MPI_Irecv(&peer.incoming, sizeof(Beat), MPI_BYTE, r, 0, comm_, &peer.receive);
    if (code != MPI_SUCCESS) declare_lost(r, "posting a receive for its beat failed (MPI error)");
  }

  void declare_lost(int r, const std::string& why) {
    Peer& peer = peers_[static_cast<size_t>(r)];
    if (peer.lost) return;
    peer.lost = true;
    if (!peer.reported) peer.failure = why;
  }

  // The stall bound now, and how it was chosen (for the report).
  std::pair<Clock::duration, std::string> stall_bound() const {
    if (own_.steps_noted < stall_.warmup_steps) {
      const Clock::duration bound = std::max<Clock::duration>(bound_, stall_.warmup_bound);
      return {bound,
              str_cat("warm-up: ", own_.steps_noted, " of ", stall_.warmup_steps,
                      " steps noted, so max(failure detection bound, ", seconds(stall_.warmup_bound), " s)")};
    }
    int64_t slowest_us = own_.slowest_step_us;
    for (const Peer& peer : peers_) slowest_us = std::max(slowest_us, peer.last.slowest_step_us);
    const auto adaptive = std::chrono::microseconds(static_cast<int64_t>(stall_.step_factor * slowest_us));
    return {std::max<Clock::duration>(bound_, adaptive),
            str_cat("max(failure detection bound, ", stall_.step_factor, " x slowest step ",
                    static_cast<double>(slowest_us / 1000) / 1000.0, " s)")};
  }

  // A peer whose "leaving" beat carried a non-zero exit status is lost -- unless this process is
  // itself exiting by the end of a short grace (min(bound / 4, 0.5 s)): ranks that all end with
  // the same status (a test's 77 for "skipped", a benchmark's verdict) end at about the same
  // moment, and one that is leaving anyway must not turn that into an MPI_Abort of the job.
  void check_left_on_error(Clock::time_point now) {
    const Clock::duration grace = std::min<Clock::duration>(bound_ / 4, std::chrono::milliseconds(500));
    for (Peer& peer : peers_) {
      if (peer.retired || peer.lost || !left_on_error(peer)) continue;
      if (process_exiting.load()) {
        peer.retired = true;
      } else if (now - peer.left_on_error_at >= grace) {
        declare_lost(static_cast<int>(&peer - peers_.data()),
                     str_cat("it is exiting with status ", peer.last.exit_status,
                             " after an error of its own (its output says which)"));
      }
    }
  }

  // heartbeat.h, "Stalled progress": this rank waits, peer r does not, it is behind, and as of
  // its latest beat neither it nor this rank has moved for longer than the stall bound.
  void check_for_stalls(Clock::time_point now) {
    if (stall_.step_factor <= 0 || own_.ops_in_flight == 0) return;
    const Clock::duration bound = stall_bound().first;
    for (int r = 0; r < size_; ++r) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      if (peer.retired || peer.lost || peer.stuck || left_on_error(peer)) continue;
      const Beat& theirs = peer.last;
      if (theirs.ops_in_flight > 0 || theirs.slow_phase != 0 || theirs.ops_started >= own_.ops_started)
        continue;
      const Clock::duration stalled = peer.last_heard - std::max(peer.progress_changed_at, own_changed_at_);
      if (stalled <= bound) continue;
      peer.stuck = true;
      peer.failure = str_cat("its progress (", theirs.ops_started, " ops started, none in flight, ",
                             theirs.step < 0 ? std::string("no step noted") : str_cat("step ", theirs.step),
                             ") has not changed for ", seconds(stalled), " s while rank ", rank_,
                             " waits for it in its op ", own_.ops_started, " (as of its beat ",
                             seconds(now - peer.last_heard), " s ago)");
    }
  }

  void loop() {
    auto next_beat = Clock::now();
    while (!stop_) {
      const auto now = Clock::now();
      const Progress previous = own_;
      own_ = own_progress();
      if (own_.ops_started != previous.ops_started || own_.ops_in_flight != previous.ops_in_flight ||
          own_.step != previous.step || own_.slow_phase != previous.slow_phase)
        own_changed_at_ = now;
      for (int r = 0; r < size_; ++r) {
        Peer& peer = peers_[static_cast<size_t>(r)];
        if (peer.retired || peer.lost || left_on_error(peer)) continue;
        int done = 0;
        if (MPI_Test(&peer.receive, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          declare_lost(r, "its connection failed (MPI error on the beat receive)");
          continue;
        }
        if (done) {
          if (!same_progress(peer.incoming, peer.last)) peer.progress_changed_at = now;
          // A peer that dumped its flight recorder after a failure asks for this rank's history too.
          if (peer.incoming.flight_dumps > peer.last.flight_dumps) flight_dump_for_peer(r, peer.host);
          peer.last = peer.incoming;
          peer.last_heard = now;
          if (peer.last.leaving) {
            peer.retired = peer.last.exit_status == 0;  // a normal end: no error, whatever this rank does
            if (!peer.retired) peer.left_on_error_at = now;  // declared lost below, after a grace
            continue;
          }
          post_receive(r);
        } else if (now - peer.last_heard > bound_) {
          declare_lost(r, str_cat("no beat for ", seconds(now - peer.last_heard), " s"));
        }
      }
      check_left_on_error(now);
      check_for_stalls(now);
      // A flight-recorder dump the peers must hear about goes out with the next round, not the next interval.
      const int32_t flight_dumps = flight_dumps_asking_peers();
      if (flight_dumps != flight_dumps_announced_) {
        flight_dumps_announced_ = flight_dumps;
        next_beat = now;
      }
      if (now >= next_beat) {
        next_beat = now + interval_;
        const Beat beat = make_beat();
        for (int r = 0; r < size_; ++r) {
          Peer& peer = peers_[static_cast<size_t>(r)];
          if (peer.retired || peer.lost || left_on_error(peer)) continue;
          int done = 1;
          if (peer.send != MPI_REQUEST_NULL &&
              MPI_Test(&peer.send, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            declare_lost(r, "its connection failed (MPI error on a beat send)");
            continue;
          }
          if (!done) continue;  // it has not taken the last one yet (and MPI may still read it)
          peer.outgoing = beat;
          if (MPI_Isend(&peer.outgoing, sizeof(Beat), MPI_BYTE, r, 0, comm_, &peer.send) != MPI_SUCCESS)
            declare_lost(r, "its connection failed (MPI error posting a beat)");
        }
      }
      report_new_failures();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // One line for all peers found lost or stuck in this round; the process groups are poisoned with it.
  void report_new_failures() {
    std::string lost;
    bool any_stuck = false;
    for (int r = 0; r < size_; ++r) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      if (!(peer.lost || peer.stuck) || peer.reported) continue;
      peer.reported = true;
      any_stuck = any_stuck || peer.stuck;
      lost +=
          str_cat(lost.empty() ? "" : "; ", "rank ", r, " (node ", peer.host, ", pid ", peer.pid, ") is ",
                  peer.stuck ? "stuck: " : "lost: ", peer.failure, ", last operation: ", peer.last.operation);
    }
    if (lost.empty()) return;
    any_lost_ = true;
    std::string bounds = str_cat("failure detection bound ", seconds(bound_), " s");
    if (any_stuck) {
      auto [bound, how] = stall_bound();
      bounds += str_cat("; stall bound ", seconds(bound), " s = ", how);
    }
    const std::string message = str_cat(lost, " [rank ", rank_, " on node ", hostname_,
                                        " was in: ", own_.operation, "; ", bounds, "]");
    std::fprintf(stderr, "[multigrad rank %d] peer lost: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    Registry& r = registry();
    {
      std::lock_guard<std::mutex> lock(r.callbacks_mutex);
      for (auto& [id, callback] : r.callbacks) callback(message);
    }
    // After the groups failed their ops, so the dump shows them failed; the peers are asked for theirs.
    flight_dump_on_failure(str_cat("peer lost: ", message), /*ask_peers=*/true);
  }

  const std::chrono::milliseconds bound_, interval_;
  const StallOptions stall_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string hostname_;
  std::vector<Peer> peers_;
  Progress own_;                      // sampled once per round, on the heartbeat's thread
  Clock::time_point own_changed_at_;  // when own_ last differed from the round before
  int64_t sequence_ = 0;
  int32_t flight_dumps_announced_ = 0;
  bool any_lost_ = false;  // then the communicator is not freed: the job is aborted at exit
  int exit_status_ = 0;    // sent in the "leaving" beat
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::mutex heartbeat_mutex;      // a plain global: its destructor does nothing on Linux
Heartbeat* heartbeat = nullptr;  // destroyed by stop_heartbeat only, before MPI_Finalize

}  // namespace

void start_heartbeat(std::chrono::milliseconds bound) {
  std::lock_guard<std::mutex> lock(heartbeat_mutex);
  if (heartbeat != nullptr || bound.count() <= 0) return;
  const StallOptions stall =
      stall_options_from_env();  // before the collective: a bad value throws on every rank
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) heartbeat = new Heartbeat(bound, stall);
}

void note_process_exiting() { process_exiting = true; }

void stop_heartbeat(int exit_status) {
  std::lock_guard<std::mutex> lock(heartbeat_mutex);
  if (heartbeat != nullptr) heartbeat->set_exit_status(exit_status);
  delete heartbeat;
  heartbeat = nullptr;
}

#endif  // MG_HAS_MPI

}  // namespace detail
}  // namespace mg::parallel
