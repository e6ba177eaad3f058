// The flight recorder's ring buffer, its dumps and the SIGUSR1 path (flight_recorder.h says why).
//
// One process-wide buffer of fixed-size slots under one mutex: recording a call fills the next
// slot (no allocation: names are string literals, a CollectiveCaller label is copied into a fixed
// array), a transition finds its slot by id (id % capacity) and changes it only if the slot still
// holds that id (a newer record may have taken it). Everything that allocates or formats -- the
// caller's symbol from its return address, the JSON -- happens when a dump is written.
#include "parallel/comm/flight_recorder.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "base/env.h"
#include "base/error.h"

namespace mg::parallel {

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::Queued: return "queued";
    case FlightState::Started: return "started";
    case FlightState::Completed: return "completed";
    case FlightState::Failed: return "failed";
  }
  return "?";
}

namespace {

constexpr size_t kDefaultEntries = 2000;
constexpr const char* kDefaultDir = "flight-recorder";

// One recorded call, fixed size (a slot is reused when the ring wraps).
struct Slot {
  int64_t id = -1;  // -1: empty
  detail::FlightCall call;
  FlightState state = FlightState::Queued;
  int64_t queued_ns = 0, started_ns = 0, finished_ns = 0;
  char caller[64] = {};  // a CollectiveCaller's label ("" : use call.return_address)
  char error[200] = {};
};

struct GroupInfo {
  std::string name;
  int size = 1, rank = 0;
  std::string cpu_backend, cuda_backend;
};

// Process-wide and never destroyed: backends' threads and the SIGUSR1 thread may record or dump
// while static destructors run.
struct Recorder {
  std::mutex mutex;  // guards everything but the atomics
  bool configured = false;
  std::vector<Slot> slots;
  int64_t next_id = 0;
  std::string dir = kDefaultDir;
  std::vector<GroupInfo> groups;
  int rank = 0, world_size = 1;
  std::atomic<bool> on{false};  // configured with a capacity > 0
  std::atomic<int32_t> dumps_asking_peers{0};
  std::mutex dump_mutex;  // one dump at a time
};
Recorder& recorder() {
  static Recorder* instance = new Recorder();
  return *instance;
}

thread_local const char* t_caller = nullptr;  // the innermost CollectiveCaller's label

void copy_text(char* out, size_t capacity, const char* text) {
  size_t n = std::min(std::strlen(text), capacity - 1);
  std::memcpy(out, text, n);
  out[n] = '\0';
}

// Reads MG_FLIGHT_RECORDER_* once, unless configure_flight_recorder came first. Caller holds the mutex.
void configure_from_env_locked(Recorder& r) {
  if (r.configured) return;
  size_t entries = kDefaultEntries;
  if (auto value = env::integer("MG_FLIGHT_RECORDER_ENTRIES", 0, 10'000'000, "entries (0 = off)"))
    entries = static_cast<size_t>(*value);
  if (const char* text = std::getenv("MG_FLIGHT_RECORDER_DIR"); text != nullptr && *text != '\0')
    r.dir = text;
  r.slots.assign(entries, Slot{});
  r.configured = true;
  r.on = entries > 0;
}

Slot* find_locked(Recorder& r, int64_t id) {
  if (id < 0 || r.slots.empty()) return nullptr;
  Slot& slot = r.slots[static_cast<size_t>(id) % r.slots.size()];
  return slot.id == id ? &slot : nullptr;
}

// "mg::parallel::Reducer::launch_ready_buckets()+0x8c", or "libfoo.so+0x1234" without a symbol.
std::string symbolize(const void* address) {
  if (address == nullptr) return "";
  Dl_info info{};
  if (dladdr(address, &info) == 0) return str_cat(address);
  const auto offset_from = [&](const void* base) {
    return reinterpret_cast<uintptr_t>(address) - reinterpret_cast<uintptr_t>(base);
  };
  if (info.dli_sname != nullptr) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> demangled(
        abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status), std::free);
    const char* name = status == 0 && demangled ? demangled.get() : info.dli_sname;
    char offset[32];
    std::snprintf(offset, sizeof(offset), "+0x%zx", static_cast<size_t>(offset_from(info.dli_saddr)));
    return std::string(name) + offset;
  }
  const char* module = info.dli_fname != nullptr ? info.dli_fname : "?";
  if (const char* slash = std::strrchr(module, '/')) module = slash + 1;
  char offset[32];
  std::snprintf(offset, sizeof(offset), "+0x%zx", static_cast<size_t>(offset_from(info.dli_fbase)));
  return std::string(module) + offset;  // addr2line -e <module> <offset> names the line
}

std::string op_text(const detail::FlightCall& call) {
  std::string text = call.op;
  if (call.reduce != nullptr && call.root >= 0)
    return str_cat(text, "(", call.reduce, ", root ", call.root, ")");
  if (call.reduce != nullptr) return str_cat(text, "(", call.reduce, ")");
  if (call.root >= 0) return str_cat(text, "(root ", call.root, ")");
  return text;
}

void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (unsigned char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

// ---- SIGUSR1: the handler writes a byte, this thread dumps ----------------------------------------

int g_signal_pipe[2] = {-1, -1};

void on_sigusr1(int) {
  const int saved = errno;
  const char byte = 'u';
  ssize_t ignored = write(g_signal_pipe[1], &byte, 1);  // async-signal-safe; full pipe: dropped
  static_cast<void>(ignored);
  errno = saved;
}

void signal_dump_loop(int fd) {
  for (;;) {
    char byte = 0;
    const ssize_t n = read(fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    detail::flight_dump_on_failure("SIGUSR1", /*ask_peers=*/false);
  }
}

}  // namespace

// ---- configuration and snapshots ------------------------------------------------------------------

void configure_flight_recorder(size_t entries, const std::string& dir) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.slots.assign(entries, Slot{});  // ids keep counting: a transition of an older record finds nothing
  r.dir = dir.empty() ? kDefaultDir : dir;
  r.configured = true;
  r.on = entries > 0;
}

size_t flight_recorder_capacity() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  configure_from_env_locked(r);
  return r.slots.size();
}

std::string flight_recorder_dir() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  configure_from_env_locked(r);
  return r.dir;
}

std::vector<FlightEntry> flight_recorder_entries() {
  Recorder& r = recorder();
  std::vector<Slot> slots;
  std::vector<GroupInfo> groups;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    configure_from_env_locked(r);
    const size_t capacity = r.slots.size();
    const int64_t first = std::max<int64_t>(0, r.next_id - static_cast<int64_t>(capacity));
    for (int64_t id = first; id < r.next_id; ++id) {
      const Slot& slot = r.slots[static_cast<size_t>(id) % capacity];
      if (slot.id == id) slots.push_back(slot);
    }
    groups = r.groups;
  }
  std::vector<FlightEntry> entries;
  entries.reserve(slots.size());
  for (const Slot& slot : slots) {
    FlightEntry e;
    const detail::FlightCall& call = slot.call;
    const GroupInfo& group = groups.at(static_cast<size_t>(call.group));
    e.id = slot.id;
    e.group = group.name;
    e.group_size = group.size;
    e.group_rank = group.rank;
    e.sequence = call.sequence;
    e.op = op_text(call);
    e.in_count = call.in_count;
    e.out_count = call.out_count;
    e.dtype = call.dtype;
    e.device = call.on_cuda ? "cuda" : "cpu";
    e.backend = call.on_cuda ? group.cuda_backend : group.cpu_backend;
    e.state = slot.state;
    e.queued_ns = slot.queued_ns;
    e.started_ns = slot.started_ns;
    e.finished_ns = slot.finished_ns;
    e.caller = slot.caller[0] != '\0' ? std::string(slot.caller) : symbolize(call.return_address);
    e.error = slot.error;
    entries.push_back(std::move(e));
  }
  return entries;
}

std::string dump_flight_recorder(const std::string& reason) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> dumping(r.dump_mutex);
  std::string dir;
  int rank = 0, world_size = 1;
  size_t capacity = 0;
  int64_t recorded = 0;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    configure_from_env_locked(r);
    if (!r.on) return "";
    dir = r.dir;
    rank = r.rank;
    world_size = r.world_size;
    capacity = r.slots.size();
    recorded = r.next_id;
  }
  const std::vector<FlightEntry> entries = flight_recorder_entries();
  std::string json = "{\"format\": \"multigrad-flight-recorder/1\", ";
  json +=
      str_cat("\"rank\": ", rank, ", \"world_size\": ", world_size, ", \"pid\": ", getpid(), ", \"host\": ");
  append_json_string(json, host_name());
  json += ", \"reason\": ";
  append_json_string(json, reason);
  json += str_cat(", \"dumped_ns\": ", detail::flight_now_ns(), ", \"capacity\": ", capacity,
                  ", \"recorded\": ", recorded, ",\n \"entries\": [");
  for (size_t i = 0; i < entries.size(); ++i) {
    const FlightEntry& e = entries[i];
    json += i == 0 ? "\n  {" : ",\n  {";
    json += str_cat("\"id\": ", e.id, ", \"group\": ");
    append_json_string(json, e.group);
    json += str_cat(", \"group_size\": ", e.group_size, ", \"group_rank\": ", e.group_rank,
                    ", \"sequence\": ", e.sequence, ", \"op\": ");
    append_json_string(json, e.op);
    json += str_cat(", \"in_count\": ", e.in_count, ", \"out_count\": ", e.out_count, ", \"dtype\": ");
    append_json_string(json, e.dtype);
    json += str_cat(", \"device\": \"", e.device, "\", \"backend\": ");
    append_json_string(json, e.backend);
    json +=
        str_cat(", \"state\": \"", flight_state_name(e.state), "\", \"queued_ns\": ", e.queued_ns,
                ", \"started_ns\": ", e.started_ns, ", \"finished_ns\": ", e.finished_ns, ", \"caller\": ");
    append_json_string(json, e.caller);
    json += ", \"error\": ";
    append_json_string(json, e.error);
    json += "}";
  }
  json += "\n]}\n";

  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  MG_CHECK(!ec, "dump_flight_recorder: cannot create the folder '", dir, "': ", ec.message());
  const std::string path = str_cat(dir, "/rank-", rank, ".json");
  const std::string temporary = str_cat(path, ".tmp-", getpid());
  FILE* file = std::fopen(temporary.c_str(), "wb");
  MG_CHECK(file != nullptr, "dump_flight_recorder: cannot write '", temporary, "': ", std::strerror(errno));
  const bool written = std::fwrite(json.data(), 1, json.size(), file) == json.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed || std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(temporary.c_str());
    throw Error(str_cat("dump_flight_recorder: writing '", path, "' failed: ", std::strerror(error)));
  }
  return path;
}

CollectiveCaller::CollectiveCaller(std::string label) : label_(std::move(label)), outer_(t_caller) {
  t_caller = label_.c_str();
}

CollectiveCaller::~CollectiveCaller() { t_caller = outer_; }

namespace detail {

int64_t flight_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int flight_register_group(const std::string& name, int size, int rank, const std::string& cpu_backend,
                          const std::string& cuda_backend) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.groups.push_back(GroupInfo{name, size, rank, cpu_backend, cuda_backend});
  return static_cast<int>(r.groups.size() - 1);
}

int64_t flight_record(const FlightCall& call) {
  Recorder& r = recorder();
  if (!r.on.load(std::memory_order_relaxed)) {  // off, or not configured yet
    std::lock_guard<std::mutex> lock(r.mutex);
    configure_from_env_locked(r);
    if (!r.on) return -1;
  }
  const int64_t now = flight_now_ns();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.slots.empty()) return -1;  // turned off meanwhile
  const int64_t id = r.next_id++;
  Slot& slot = r.slots[static_cast<size_t>(id) % r.slots.size()];
  slot.id = id;
  slot.call = call;
  slot.state = FlightState::Queued;
  slot.queued_ns = now;
  slot.started_ns = slot.finished_ns = 0;
  if (t_caller != nullptr)
    copy_text(slot.caller, sizeof(slot.caller), t_caller);
  else
    slot.caller[0] = '\0';
  slot.error[0] = '\0';
  return id;
}

void flight_started(int64_t id, int64_t at_ns) {
  if (id < 0) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  Slot* slot = find_locked(r, id);
  if (slot == nullptr || slot->state != FlightState::Queued) return;
  slot->state = FlightState::Started;
  slot->started_ns = at_ns;
}

void flight_finished(int64_t id, bool ok, int64_t at_ns, const std::string& error) {
  if (id < 0) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  Slot* slot = find_locked(r, id);
  if (slot == nullptr || slot->state == FlightState::Completed || slot->state == FlightState::Failed) return;
  slot->state = ok ? FlightState::Completed : FlightState::Failed;
  slot->finished_ns = at_ns;
  if (!ok) copy_text(slot->error, sizeof(slot->error), error.c_str());
}

void flight_set_process(int rank, int world_size) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  configure_from_env_locked(r);  // a bad MG_FLIGHT_RECORDER_ENTRIES fails init_process_group
  r.rank = rank;
  r.world_size = world_size;
}

void flight_install_signal_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGUSR1, nullptr, &current) != 0) return;
    if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return;  // the program's own
    if (pipe(g_signal_pipe) != 0) return;
    fcntl(g_signal_pipe[0], F_SETFD, FD_CLOEXEC);
    fcntl(g_signal_pipe[1], F_SETFD, FD_CLOEXEC);
    fcntl(g_signal_pipe[1], F_SETFL, O_NONBLOCK);  // the handler must never block
    std::thread(signal_dump_loop, g_signal_pipe[0]).detach();
    struct sigaction action {};
    action.sa_handler = on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &action, nullptr);
  });
}

void flight_dump_on_failure(const std::string& reason, bool ask_peers) {
  Recorder& r = recorder();
  if (!r.on.load()) return;
  if (ask_peers) r.dumps_asking_peers.fetch_add(1);
  try {
    const std::string path = dump_flight_recorder(reason);
    if (path.empty()) return;
    std::string first_line = reason.substr(0, reason.find('\n')).substr(0, 160);
    std::fprintf(stderr, "[multigrad rank %d] flight recorder: wrote %s (%s)\n", r.rank, path.c_str(),
                 first_line.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[multigrad rank %d] flight recorder: %s\n", r.rank, e.what());
  }
  std::fflush(stderr);
}

int32_t flight_dumps_asking_peers() { return recorder().dumps_asking_peers.load(); }

void flight_dump_for_peer(int peer, const std::string& peer_host) {
  flight_dump_on_failure(str_cat("rank ", peer, " (node ", peer_host, ") dumped after a failure"),
                         /*ask_peers=*/false);
}

}  // namespace detail
}  // namespace mg::parallel
