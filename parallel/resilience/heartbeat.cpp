// The heartbeat's thread: beats to every peer, watches for silence (heartbeat.h says why).
//
// One loop, every ~10 ms:
//   1. test each peer's posted receive; a beat that arrived refreshes the peer's "last heard"
//      time (and is re-posted), a "leaving" beat retires the peer;
//   2. every interval (bound / 10, at least 20 ms), post a beat to each peer whose previous beat has gone out
//      (a peer that stopped reading gets no pile of beats, just silence);
//   3. a peer silent for longer than the bound, or whose request reported an MPI error, is lost:
//      one report, and every registered callback (the process groups' poison) runs once.
// Beats keep going after a loss, so the other survivors do not take this rank for lost too.
#include "parallel/resilience/heartbeat.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/base/error.h"

#ifdef MG_HAS_MPI
#include <mpi.h>
#endif

namespace mg::parallel::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Process-wide and never destroyed: process groups and MPI's own teardown may use them from
// static destructors, in any order.
struct Registry {
  std::mutex callbacks_mutex;  // held while callbacks run, so forget_peer_lost waits for them
  std::map<int, std::function<void(const std::string&)> > callbacks;
  int next_id = 1;
  std::mutex operation_mutex;
  std::string operation = "none yet";
};
Registry& registry() {
  static Registry* instance = new Registry();
  return *instance;
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

void note_operation(const std::string& description) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.operation_mutex);
  r.operation = description;
}

#ifndef MG_HAS_MPI

void start_heartbeat(std::chrono::milliseconds) {}
void stop_heartbeat() {}

#else

namespace {

std::string last_operation() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.operation_mutex);
  return r.operation;
}

// One beat on the wire: 192 bytes, sent as MPI_BYTE (every rank runs the same binary).
struct Beat {
  int64_t sequence = 0;
  int32_t pid = 0;
  int32_t leaving = 0;
  char host[56] = {};
  char operation[120] = {};
};
static_assert(sizeof(Beat) == 192, "a beat is 192 bytes");

void copy_text(char* out, size_t capacity, const std::string& text) {
  size_t n = std::min(text.size(), capacity - 1);
  std::memcpy(out, text.data(), n);
  out[n] = '\0';
}

class Heartbeat {
 public:
  explicit Heartbeat(std::chrono::milliseconds bound)
      : bound_(bound),
        interval_(std::max<std::chrono::milliseconds>(bound / 10, std::chrono::milliseconds(20))) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    char host[sizeof(Beat::host)] = {};
    gethostname(host, sizeof(host) - 1);
    hostname_ = host;
    peers_.resize(static_cast<size_t>(size_));
    // Who is who, once (a collective): a peer lost before its first beat arrived is still named.
    Beat me = make_beat();
    std::vector<Beat> everyone(static_cast<size_t>(size_));
    MPI_Allgather(&me, sizeof(Beat), MPI_BYTE, everyone.data(), sizeof(Beat), MPI_BYTE, comm_);
    for (int r = 0; r < size_; ++r) {
      peers_[static_cast<size_t>(r)].host = everyone[static_cast<size_t>(r)].host;
      peers_[static_cast<size_t>(r)].pid = everyone[static_cast<size_t>(r)].pid;
    }
    const auto now = Clock::now();
    for (int r = 0; r < size_; ++r) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      peer.last_heard = now;
      peer.retired = r == rank_;
      if (!peer.retired) post_receive(r);
    }
    thread_ = std::thread([this] { loop(); });
  }

  ~Heartbeat() {
    stop_ = true;
    thread_.join();
    // The "leaving" beat, so no peer reports this rank lost while it finishes its own work.
    Beat goodbye = make_beat();
    goodbye.leaving = 1;
    std::vector<MPI_Request> sent;
    for (int r = 0; r < size_; ++r) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      if (r == rank_ || peer.lost) continue;
      peer.outgoing = goodbye;
      if (peer.send != MPI_REQUEST_NULL) continue;  // the previous beat never went out: a slow peer
      MPI_Isend(&peer.outgoing, sizeof(Beat), MPI_BYTE, r, 0, comm_, &peer.send);
    }
    // Small messages go out eagerly: give them a moment, then cancel what is left (a receive
    // never matched because its peer left first), so MPI_Finalize finds nothing pending.
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    for (Peer& peer : peers_) {
      while (peer.send != MPI_REQUEST_NULL && Clock::now() < deadline) {
        int done = 0;
        if (MPI_Test(&peer.send, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) break;
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      for (MPI_Request* request : {&peer.receive, &peer.send}) {
        if (*request == MPI_REQUEST_NULL) continue;
        MPI_Cancel(request);
        MPI_Request_free(request);
      }
    }
    if (!any_lost_) MPI_Comm_free(&comm_);
  }

 private:
  struct Peer {
    MPI_Request receive = MPI_REQUEST_NULL, send = MPI_REQUEST_NULL;
    Beat incoming{}, outgoing{};
    Beat last{};       // the last beat received
    std::string host;  // from the start-up exchange
    int pid = 0;
    Clock::time_point last_heard;
    bool retired = false;  // itself, or left normally
    bool lost = false;
    bool reported = false;
    std::string failure;  // why it is lost
  };

  Beat make_beat() {
    Beat beat;
    beat.sequence = ++sequence_;
    beat.pid = static_cast<int32_t>(getpid());
    copy_text(beat.host, sizeof(beat.host), hostname_);
    copy_text(beat.operation, sizeof(beat.operation), last_operation());
    return beat;
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
    peer.failure = why;
  }

  void loop() {
    auto next_beat = Clock::now();
    while (!stop_) {
      const auto now = Clock::now();
      for (int r = 0; r < size_; ++r) {
        Peer& peer = peers_[static_cast<size_t>(r)];
        if (peer.retired || peer.lost) continue;
        int done = 0;
        if (MPI_Test(&peer.receive, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
          declare_lost(r, "its connection failed (MPI error on the beat receive)");
          continue;
        }
        if (done) {
          peer.last = peer.incoming;
          peer.last_heard = now;
          if (peer.last.leaving) {
            peer.retired = true;
            continue;
          }
          post_receive(r);
        } else if (now - peer.last_heard > bound_) {
          declare_lost(r, str_cat("no beat for ", seconds(now - peer.last_heard), " s"));
        }
      }
      if (now >= next_beat) {
        next_beat = now + interval_;
        const Beat beat = make_beat();
        for (int r = 0; r < size_; ++r) {
          Peer& peer = peers_[static_cast<size_t>(r)];
          if (peer.retired || peer.lost) continue;
          int done = 1;
          if (peer.send != MPI_REQUEST_NULL &&
              MPI_Test(&peer.send, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            declare_lost(r, "its connection failed (MPI error on a beat send)");
            continue;
          }
          if (!done) continue;  // it has not taken the last one yet
          peer.outgoing = beat;
          if (MPI_Isend(&peer.outgoing, sizeof(Beat), MPI_BYTE, r, 0, comm_, &peer.send) != MPI_SUCCESS)
            declare_lost(r, "its connection failed (MPI error posting a beat)");
        }
      }
      report_new_losses();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  static double seconds(Clock::duration d) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) / 1000.0;
  }

  // One line for all peers found lost in this round; the process groups are poisoned with it.
  void report_new_losses() {
    std::string lost;
    for (int r = 0; r < size_; ++r) {
      Peer& peer = peers_[static_cast<size_t>(r)];
      if (!peer.lost || peer.reported) continue;
      peer.reported = true;
      const bool ever_heard = peer.last.sequence > 0;
      lost += str_cat(lost.empty() ? "" : "; ", "rank ", r, " (node ", peer.host, ", pid ", peer.pid,
                      ") is lost: ", peer.failure,
                      ", last operation: ", ever_heard ? peer.last.operation : "none heard of");
    }
    if (lost.empty()) return;
    any_lost_ = true;
    const std::string message =
        str_cat(lost, " [rank ", rank_, " on node ", hostname_, " was in: ", last_operation(),
                "; failure detection bound ", seconds(bound_), " s]");
    std::fprintf(stderr, "[multigrad rank %d] peer lost: %s\n", rank_, message.c_str());
    std::fflush(stderr);
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.callbacks_mutex);
    for (auto& [id, callback] : r.callbacks) callback(message);
  }

  const std::chrono::milliseconds bound_, interval_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string hostname_;
  std::vector<Peer> peers_;
  int64_t sequence_ = 0;
  bool any_lost_ = false;  // then the communicator is not freed: the job is aborted at exit
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::mutex heartbeat_mutex;      // a plain global: its destructor does nothing on Linux
Heartbeat* heartbeat = nullptr;  // destroyed by stop_heartbeat only, before MPI_Finalize

}  // namespace

void start_heartbeat(std::chrono::milliseconds bound) {
  std::lock_guard<std::mutex> lock(heartbeat_mutex);
  if (heartbeat != nullptr || bound.count() <= 0) return;
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size > 1) heartbeat = new Heartbeat(bound);
}

void stop_heartbeat() {
  std::lock_guard<std::mutex> lock(heartbeat_mutex);
  delete heartbeat;
  heartbeat = nullptr;
}

#endif  // MG_HAS_MPI

}  // namespace mg::parallel::detail
