// The emulated runtime's streams, events and kernel launches.
//
// A stream is an in-order queue of tasks (kernel grids, copies, fills, library calls, event
// records and waits) run by a thread of its own, so everything a real GPU does asynchronously
// happens asynchronously here too: a host that reads a result before synchronising reads it too
// early, and ThreadSanitizer sees the race. Each device has a legacy default stream (stream 0)
// with the legacy semantics: work on it waits for earlier work on every blocking stream of its
// device, and work on a blocking stream waits for earlier work on it (cudaStreamNonBlocking
// streams are independent of it).
//
// A kernel grid runs its blocks on the stream's thread and on a pool of block workers
// (MG_EMU_WORKERS, default: cores - 1), each block start to end on one OS thread
// (block_scheduler.cpp). A block fault stops the grid; the stream then reports
// cudaErrorLaunchFailure at its next synchronisation and the fault's text goes to stderr and to
// mg_emu::last_fault().
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu/block_scheduler.h"
#include "cuda_emu/emulator.h"
#include "cuda_emu/profile_report.h"
#include "cuda_emu/runtime_internal.h"
#include "cuda_emu/trace.h"

// The runtime's opaque handle types, defined here (no driver is ever involved).
struct CUstream_st {
  int device = 0;
  bool blocking = true;  // synchronises with the legacy default stream
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::pair<const char*, std::function<void()>>> queue;
  uint64_t enqueued = 0, completed = 0;
  uint64_t waited = 0;              // `enqueued` when the host last waited for this stream
  cudaError_t error = cudaSuccess;  // a task's failure, reported by the next synchronisation
  std::thread worker;
};

// An event is its newest record. Each cudaEventRecord makes a record of its own, completed by
// its stream: a wait holds on to the record it saw, so recording the event again elsewhere (and
// that record finishing first) never releases it early, as on a GPU.
struct CUevent_st {
  struct Record {
    bool done = false;
    std::chrono::steady_clock::time_point when{};
  };
  std::mutex mutex;
  std::condition_variable changed;
  std::shared_ptr<Record> latest;  // null until first recorded
  bool timing = true;
};

namespace mg_emu {
namespace {

std::mutex g_streams_mutex;
std::vector<CUstream_st*> g_streams;   // every stream ever created (streams are never freed)
std::map<int, CUstream_st*> g_legacy;  // device -> its legacy default stream
std::atomic<uint64_t> g_launch_number{0};
std::atomic<int> g_order{-2};  // -2: not read from MG_EMU_ORDER yet
std::atomic<uint64_t> g_seed{0};
std::atomic<bool> g_seed_read{false};  // MG_EMU_SEED read (or set_thread_order_seed called)

void run_stream(CUstream_st* s) {
  cudaSetDevice(s->device);
  for (;;) {
    std::pair<const char*, std::function<void()>> task;
    {
      std::unique_lock<std::mutex> lock(s->mutex);
      s->changed.wait(lock, [&] { return !s->queue.empty(); });
      task = std::move(s->queue.front());
      s->queue.pop_front();
    }
    std::string failure;
    try {
      task.second();
    } catch (const std::exception& e) {  // a kernel's fault already names the kernel
      failure = std::strcmp(task.first, "kernel") == 0 ? std::string(e.what())
                                                       : std::string(task.first) + ": " + e.what();
    }
    std::lock_guard<std::mutex> lock(s->mutex);
    if (!failure.empty()) {
      record_fault(failure);
      if (s->error == cudaSuccess) s->error = cudaErrorLaunchFailure;
    }
    ++s->completed;
    s->changed.notify_all();
  }
}

CUstream_st* new_stream(int device, bool blocking) {
  auto* s = new CUstream_st;
  s->device = device;
  s->blocking = blocking;
  s->worker = std::thread(run_stream, s);
  s->worker.detach();
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  g_streams.push_back(s);
  return s;
}

CUstream_st* legacy_stream(int device) {
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    auto it = g_legacy.find(device);
    if (it != g_legacy.end()) return it->second;
  }
  CUstream_st* s = new_stream(device, true);
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  auto it = g_legacy.find(device);
  if (it != g_legacy.end()) return it->second;  // another thread made one first (ours stays idle)
  g_legacy[device] = s;
  return s;
}

CUstream_st* resolve(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return legacy_stream(current_device());
  return stream;
}

bool is_legacy(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  auto it = g_legacy.find(s->device);
  return it != g_legacy.end() && it->second == s;
}

// Waits until stream s has completed `ticket` tasks.
void wait_ticket(CUstream_st* s, uint64_t ticket) {
  std::unique_lock<std::mutex> lock(s->mutex);
  s->changed.wait(lock, [&] { return s->completed >= ticket; });
}

void push(CUstream_st* s, const char* what, std::function<void()> work) {
  std::lock_guard<std::mutex> lock(s->mutex);
  s->queue.emplace_back(what, std::move(work));
  ++s->enqueued;
  s->changed.notify_all();
}

uint64_t tail(CUstream_st* s) {
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->enqueued;
}

// ---- block workers ----------------------------------------------------------------------------
// A block's seed from its launch's: splitmix64's finaliser, so neighbouring blocks differ in every bit.
uint64_t block_seed(uint64_t launch_seed, uint64_t linear_block) {
  uint64_t z = launch_seed + 0x9e3779b97f4a7c15ull * (linear_block + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Grid {
  std::shared_ptr<const Launch> launch;
  std::shared_ptr<LaunchTrace> trace;  // when a profile is running (trace.h)
  ThreadOrder order;
  uint64_t seed;
  uint64_t blocks;
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> finished{0};
  std::atomic<bool> failed{false};
  std::atomic<size_t> static_shared_bytes{0};  // the most any block claimed (note_static_shared)
  std::mutex mutex;
  std::condition_variable done;
  std::string fault;
};

class BlockWorkers {
 public:
  BlockWorkers() {
    const char* v = std::getenv("MG_EMU_WORKERS");
    int n = v ? std::atoi(v) : static_cast<int>(std::thread::hardware_concurrency()) - 1;
    if (n < 0) n = 0;
    for (int i = 0; i < n; ++i) std::thread([this] { serve(); }).detach();
  }
  // Runs every block of `g`, with the calling thread taking part; returns when all are done.
  void run(const std::shared_ptr<Grid>& g) {
    if (g->blocks > 1) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        grids_.push_back(g);
      }
      wake_.notify_all();
    }
    work_on(*g);
    std::unique_lock<std::mutex> lock(g->mutex);
    g->done.wait(lock, [&] { return g->finished.load() == g->blocks; });
  }

 private:
  static void work_on(Grid& g) {
    const dim3 grid = g.launch->grid;
    for (;;) {
      const uint64_t b = g.next.fetch_add(1);
      if (b >= g.blocks) return;
      const bool skipped =
          g.trace && trace_skips_untraced_blocks(*g.trace) && !trace_block_is_traced(*g.trace, b);
      if (!g.failed.load() && !skipped) {
        const uint3 index{static_cast<unsigned>(b % grid.x), static_cast<unsigned>(b / grid.x % grid.y),
                          static_cast<unsigned>(b / (uint64_t(grid.x) * grid.y))};
        size_t claimed = 0;
        std::string fault =
            run_block(*g.launch, index, g.order, block_seed(g.seed, b), g.trace.get(), b, &claimed);
        size_t seen = g.static_shared_bytes.load();
        while (claimed > seen && !g.static_shared_bytes.compare_exchange_weak(seen, claimed)) {
        }
        if (!fault.empty()) {
          std::lock_guard<std::mutex> lock(g.mutex);
          if (!g.failed.exchange(true)) g.fault = std::move(fault);
        }
      }
      if (g.finished.fetch_add(1) + 1 == g.blocks) {
        std::lock_guard<std::mutex> lock(g.mutex);
        g.done.notify_all();
      }
    }
  }
  void serve() {
    for (;;) {
      std::shared_ptr<Grid> g;  // shared: the grid's owner may return while this worker looks
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] {
          while (!grids_.empty() && grids_.front()->next.load() >= grids_.front()->blocks) grids_.pop_front();
          return !grids_.empty();
        });
        g = grids_.front();
      }
      work_on(*g);
    }
  }
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Grid>> grids_;
};

BlockWorkers& workers() {
  static BlockWorkers* w = new BlockWorkers;  // never destroyed: detached threads use it
  return *w;
}

ThreadOrder next_order() {
  int o = g_order.load();
  if (o == -2) {
    const char* v = std::getenv("MG_EMU_ORDER");
    o = !v                               ? -1
        : std::strcmp(v, "forward") == 0 ? 0
        : std::strcmp(v, "reverse") == 0 ? 1
        : std::strcmp(v, "shuffle") == 0 ? 2
                                         : -1;
    g_order.store(o);
  }
  return o >= 0 ? static_cast<ThreadOrder>(o) : ThreadOrder::vary;
}

// The seed every launch's thread orders derive from: MG_EMU_SEED (decimal or 0x hex), default 0.
uint64_t base_seed() {
  if (!g_seed_read.load()) {
    const char* v = std::getenv("MG_EMU_SEED");
    g_seed.store(v ? std::strtoull(v, nullptr, 0) : 0);
    g_seed_read.store(true);
  }
  return g_seed.load();
}

const char* order_name(ThreadOrder o) {
  switch (o) {
    case ThreadOrder::forward: return "forward";
    case ThreadOrder::reverse: return "reverse";
    case ThreadOrder::shuffled: return "shuffle";
    default: return "vary";
  }
}

std::mutex g_attr_mutex;
std::map<const void*, int> g_max_dynamic_shared;  // cudaFuncAttributeMaxDynamicSharedMemorySize
std::map<const void*, size_t> g_static_shared;    // what the kernel's blocks claimed (note_static_shared)

std::string dims(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

}  // namespace

// ---- runtime_internal.h --------------------------------------------------------------------------
void enqueue(cudaStream_t stream, const char* what, std::function<void()> work) {
  CUstream_st* s = resolve(stream);
  // Legacy semantics: order against the other side's work enqueued so far.
  if (s->blocking) {
    std::vector<std::pair<CUstream_st*, uint64_t>> waits;
    const bool legacy = is_legacy(s);
    {
      std::lock_guard<std::mutex> lock(g_streams_mutex);
      for (CUstream_st* other : g_streams) {
        if (other == s || other->device != s->device || !other->blocking) continue;
        const bool other_legacy = g_legacy.count(other->device) && g_legacy[other->device] == other;
        if (legacy || other_legacy) waits.emplace_back(other, 0);
      }
    }
    for (auto& w : waits) w.second = tail(w.first);
    if (!waits.empty()) {
      push(s, "legacy stream order", [waits] {
        for (const auto& w : waits) wait_ticket(w.first, w.second);
      });
    }
  }
  push(s, what, std::move(work));
}

int stream_device(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
    return current_device();
  return stream_exists(stream) ? stream->device : -1;
}

bool stream_exists(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(g_streams_mutex);
  for (CUstream_st* s : g_streams)
    if (s == stream) return true;
  return false;
}

namespace {
// Waits for everything enqueued on s so far; true when work was enqueued since the last wait on
// s (the host then really synchronised with the device: what counters().host_syncs counts; a
// second wait with nothing new in between is free on a GPU too, and is not counted).
bool wait_for(CUstream_st* s, cudaError_t* error) {
  std::unique_lock<std::mutex> lock(s->mutex);
  const uint64_t ticket = s->enqueued;
  s->changed.wait(lock, [&] { return s->completed >= ticket; });
  *error = s->error;
  s->error = cudaSuccess;
  const bool new_work = ticket > s->waited;
  s->waited = ticket;
  return new_work;
}
}  // namespace

cudaError_t drain_stream(cudaStream_t stream) {
  cudaError_t e = cudaSuccess;
  if (wait_for(resolve(stream), &e)) count_host_sync();
  return e;
}

cudaError_t drain_device(int device) {
  std::vector<CUstream_st*> mine;
  {
    std::lock_guard<std::mutex> lock(g_streams_mutex);
    for (CUstream_st* s : g_streams)
      if (s->device == device) mine.push_back(s);
  }
  cudaError_t first = cudaSuccess;
  bool new_work = false;
  for (CUstream_st* s : mine) {
    cudaError_t e = cudaSuccess;
    new_work |= wait_for(s, &e);
    if (first == cudaSuccess) first = e;
  }
  if (new_work) count_host_sync();
  return first;
}

void set_thread_order(int order) { g_order.store(order < 0 ? -1 : order % 3); }

void set_thread_order_seed(uint64_t seed) {
  g_seed.store(seed);
  g_seed_read.store(true);
}

uint64_t thread_order_seed() { return base_seed(); }

void note_static_shared(const void* kernel, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  size_t& known = g_static_shared[kernel];
  known = std::max(known, bytes);
}

size_t known_static_shared(const void* kernel) {
  std::lock_guard<std::mutex> lock(g_attr_mutex);
  auto it = g_static_shared.find(kernel);
  return it == g_static_shared.end() ? 0 : it->second;
}

cudaError_t launch(Launch l) {
  const dim3 b = l.block, g = l.grid;
  const uint64_t threads = uint64_t(b.x) * b.y * b.z;
  std::string why;
  cudaError_t err = cudaSuccess;
  int max_dynamic = 48 * 1024;
  size_t static_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(g_attr_mutex);
    auto it = g_max_dynamic_shared.find(l.kernel);
    if (it != g_max_dynamic_shared.end()) max_dynamic = it->second;
    l.shared_opt_in = it != g_max_dynamic_shared.end();
    auto known = g_static_shared.find(l.kernel);  // a kernel not run yet: its first block checks
    if (known != g_static_shared.end()) static_bytes = known->second;
  }
  if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) {
    err = cudaErrorInvalidConfiguration;
    why = "a zero-sized grid " + dims(g) + " or block " + dims(b);
  } else if (threads > 1024 || b.x > 1024 || b.y > 1024 || b.z > 64) {
    err = cudaErrorInvalidConfiguration;
    why = "block " + dims(b) + " has " + std::to_string(threads) +
          " threads; at most 1024 per block (x, y <= 1024, z <= 64)";
  } else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) {
    err = cudaErrorInvalidConfiguration;
    why = "grid " + dims(g) + " exceeds (2^31-1, 65535, 65535)";
  } else if (l.dynamic_shared_bytes > static_cast<size_t>(max_dynamic)) {
    err = cudaErrorInvalidValue;
    why = std::to_string(l.dynamic_shared_bytes) + " bytes of dynamic shared memory, but the kernel allows " +
          std::to_string(max_dynamic) +
          (max_dynamic == 48 * 1024
               ? " (48 KiB unless cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) "
                 "raises it, up to 227 KiB)"
               : " (its cudaFuncAttributeMaxDynamicSharedMemorySize)");
  } else if (static_bytes + l.dynamic_shared_bytes > (l.shared_opt_in ? 227u : 48u) * 1024) {
    err = cudaErrorLaunchOutOfResources;
    why = std::to_string(static_bytes) + " bytes of static __shared__ memory + " +
          std::to_string(l.dynamic_shared_bytes) + " dynamic, over the " + (l.shared_opt_in ? "227" : "48") +
          " KiB a block may have" +
          (l.shared_opt_in ? ""
                           : " (cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) opts in "
                             "to 227 KiB)");
  } else if (!stream_exists(l.stream)) {
    err = cudaErrorInvalidResourceHandle;
    why = "unknown stream";
  }
  if (err != cudaSuccess) return fail(err, "kernel launch", std::string(l.kernel_name) + ": " + why);

  count_launch();
  const uint64_t number = g_launch_number.fetch_add(1);
  auto shared = std::make_shared<Launch>(std::move(l));
  const ThreadOrder order = next_order();
  const uint64_t seed = base_seed();
  profile::start_from_environment();  // MG_EMU_PROFILE: the first launch starts the profile
  std::shared_ptr<LaunchTrace> trace = trace_new_launch(*shared);
  enqueue(shared->stream, "kernel", [shared, order, seed, number, trace] {
    auto grid = std::make_shared<Grid>();
    grid->launch = shared;
    grid->trace = trace;
    grid->order = order;
    grid->seed = block_seed(seed, ~number);  // the launch's seed: the base seed and the launch number
    grid->blocks = uint64_t(shared->grid.x) * shared->grid.y * shared->grid.z;
    workers().run(grid);
    note_static_shared(shared->kernel, grid->static_shared_bytes.load());
    if (trace) trace_launch_done(*trace);
    if (grid->failed.load())  // the order and seed, to replay the fault with MG_EMU_ORDER / MG_EMU_SEED
      throw std::runtime_error("kernel " + std::string(shared->kernel_name) + ", " + grid->fault +
                               " [thread order " + order_name(order) + ", MG_EMU_SEED=" +
                               std::to_string(seed) + ", launch " + std::to_string(number) + "]");
    const std::string overflow = check_guards(current_device());
    if (!overflow.empty())
      throw std::runtime_error("kernel " + std::string(shared->kernel_name) + " " + overflow);
  });
  return cudaSuccess;
}

}  // namespace mg_emu

using mg_emu::fail;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags");
  *stream = mg_emu::new_stream(mg_emu::current_device(), (flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!mg_emu::stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize");
  const cudaError_t e = mg_emu::drain_stream(stream);
  return e == cudaSuccess ? e : fail(e, "cudaStreamSynchronize");
}

// The stream's queued work still runs to its end, as on a GPU; the emulator keeps the stream's
// thread (streams are never freed), so a destroyed handle stays harmless.
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || !mg_emu::stream_exists(stream))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamDestroy");
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (!mg_emu::stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery");
  CUstream_st* s = mg_emu::resolve(stream);
  std::lock_guard<std::mutex> lock(s->mutex);
  return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  if (device == nullptr || !mg_emu::stream_exists(stream))
    return fail(cudaErrorInvalidValue, "cudaStreamGetDevice");
  *device = mg_emu::stream_device(stream);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  const cudaError_t e = mg_emu::drain_device(mg_emu::current_device());
  return e == cudaSuccess ? e : fail(e, "cudaDeviceSynchronize");
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (fn == nullptr) return fail(cudaErrorInvalidValue, "cudaLaunchHostFunc");
  if (!mg_emu::stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaLaunchHostFunc");
  mg_emu::enqueue(stream, "cudaLaunchHostFunc", [fn, user_data] { fn(user_data); });
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (func == nullptr) return fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute");
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > 227 * 1024)
      return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute",
                  std::to_string(value) +
                      " bytes of dynamic shared memory: an H200 allows at most 227 KiB per block");
    std::lock_guard<std::mutex> lock(mg_emu::g_attr_mutex);
    mg_emu::g_max_dynamic_shared[func] = value;
    return cudaSuccess;
  }
  if (attr == cudaFuncAttributePreferredSharedMemoryCarveout) {
    if (value < -1 || value > 100) return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute");
    return cudaSuccess;  // a performance hint: nothing to emulate
  }
  return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute", "attribute not emulated");
}

// ---- events --------------------------------------------------------------------------------------
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags");
  auto* e = new CUevent_st;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  *event = e;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy");
  // A record may still be queued: the event is left to it (a few dozen bytes, never reused).
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord");
  if (!mg_emu::stream_exists(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord");
  auto record = std::make_shared<CUevent_st::Record>();
  {
    std::lock_guard<std::mutex> lock(event->mutex);
    event->latest = record;
  }
  mg_emu::enqueue(stream, "cudaEventRecord", [event, record] {
    std::lock_guard<std::mutex> lock(event->mutex);
    record->done = true;
    record->when = std::chrono::steady_clock::now();
    event->changed.notify_all();
  });
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery");
  std::lock_guard<std::mutex> lock(event->mutex);
  return event->latest == nullptr || event->latest->done ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize");
  mg_emu::count_host_sync();
  std::unique_lock<std::mutex> lock(event->mutex);
  const std::shared_ptr<CUevent_st::Record> target = event->latest;
  if (target != nullptr) event->changed.wait(lock, [&] { return target->done; });
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  if (event == nullptr || !mg_emu::stream_exists(stream))
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent");
  std::shared_ptr<CUevent_st::Record> target;
  {
    std::lock_guard<std::mutex> lock(event->mutex);
    target = event->latest;
  }
  if (target == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  mg_emu::enqueue(stream, "cudaStreamWaitEvent", [event, target] {
    std::unique_lock<std::mutex> lock(event->mutex);
    event->changed.wait(lock, [&] { return target->done; });
  });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime");
  if (start == nullptr || end == nullptr) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime");
  if (!start->timing || !end->timing) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime");
  std::chrono::steady_clock::time_point a, b;
  for (auto [event, at] : {std::pair{start, &a}, std::pair{end, &b}}) {
    std::lock_guard<std::mutex> lock(event->mutex);
    if (event->latest == nullptr) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime");
    if (!event->latest->done) return fail(cudaErrorNotReady, "cudaEventElapsedTime");
    *at = event->latest->when;
  }
  *ms = std::chrono::duration<float, std::milli>(b - a).count();
  return cudaSuccess;
}

}  // extern "C"
