// One block of a kernel, run as fibers on one OS thread.
//
// A CUDA block is a set of threads that share shared memory and meet at __syncthreads(); a warp
// is 32 of them that exchange registers in collectives (__shfl_*_sync, __ballot_sync, ldmatrix,
// mma). Between those meeting points the threads are independent, so the emulator runs them one
// after another on one OS thread and switches only where a thread must wait for others.
//
// The model: one fiber per CUDA thread (Boost.Context: a context switch is a few register moves,
// no system call). __syncthreads() and the warp collectives (cuda_emulated.h) are ordinary
// functions that record where the thread waits and switch back to the block's scheduler, which
// resumes the next ready thread; when every live thread waits at the barrier, it opens:
//
//   scheduler ──resume──▶ thread 0 … runs to __syncthreads ──yield──▶ scheduler
//             ──resume──▶ thread 1 … runs to __syncthreads ──yield──▶ scheduler   (order varies)
//             …  every live thread waits: the barrier opens, all become ready  …
//
// The optimisation: fibers are made only for threads that wait. A *runner* fiber starts unstarted
// threads one after another; a thread that never waits finishes on it, and the runner goes on
// with the next thread, so a kernel without barriers costs one fiber per block, not per thread. A
// thread that waits keeps the runner as its own fiber, and the scheduler starts a new runner for
// the next unstarted thread.
//
// Strictness (what a GPU leaves undefined becomes an error naming kernel, block and thread):
// every thread of a block must reach a __syncthreads() (one that exits early while others wait at
// a barrier is an error); threads waiting at calls on different lines are one barrier, as on the
// GPU (barrier 0, opened by every live thread's arrival), with a warning naming both lines
// (MG_EMU_STRICT_BARRIERS=1: an error); a warp collective must name only lanes that exist, have
// not exited and arrive at the same operation with the same mask; a block in which nobody can
// proceed is reported with what each thread waits for. "The same" collective means the same call:
// the same file:line, which the call passes. The order in which threads run between barriers is
// forward, reverse or shuffled, chosen anew for every phase (the stretch between two barrier
// openings) of every block from a seed (MG_EMU_SEED), so a missing barrier gives a wrong answer,
// not a lucky one.
#include "cuda_emu/block_scheduler.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "cuda_emu/cuda_emulated.h"
#include "cuda_emu/runtime_internal.h"
#include "cuda_emu/trace.h"

thread_local uint3 threadIdx MG_EMU_TLS;
thread_local uint3 blockIdx MG_EMU_TLS;
thread_local dim3 blockDim MG_EMU_TLS;
thread_local dim3 gridDim MG_EMU_TLS;

namespace mg_emu {
namespace {

namespace ctx = boost::context;

// ---- fiber stacks: pooled per OS thread, with a guard page below each --------------------------
size_t stack_bytes() {
  static const size_t bytes = [] {
    const char* kb = std::getenv("MG_EMU_STACK_KB");
    const long v = kb ? std::atol(kb) : 0;
    return static_cast<size_t>(v > 16 ? v : 256) * 1024;
  }();
  return bytes;
}

struct StackPool {
  std::vector<void*> free;  // the usable (top) ends' base addresses, each stack_bytes() long
  ~StackPool() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    for (void* p : free) munmap(static_cast<char*>(p) - page, stack_bytes() + page);
  }
};
thread_local StackPool t_stacks;

struct PooledStack {
  ctx::stack_context allocate() {
    void* base = nullptr;
    if (!t_stacks.free.empty()) {
      base = t_stacks.free.back();
      t_stacks.free.pop_back();
    } else {
      const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
      void* m =
          mmap(nullptr, stack_bytes() + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) throw std::bad_alloc();
      mprotect(m, page, PROT_NONE);  // a stack overflow faults instead of corrupting a neighbour
      base = static_cast<char*>(m) + page;
    }
    ctx::stack_context sc;
    sc.size = stack_bytes();
    sc.sp = static_cast<char*>(base) + stack_bytes();
    return sc;
  }
  void deallocate(ctx::stack_context& sc) noexcept {
    t_stacks.free.push_back(static_cast<char*>(sc.sp) - sc.size);
  }
};

// ---- the state of one block ------------------------------------------------------------------
enum class State : uint8_t { unstarted, ready, at_block_barrier, at_warp_op, done };

struct PendingCopy {
  unsigned char* dst;
  unsigned char bytes[16];
};

struct EmuThread {
  uint3 idx{};
  State state = State::unstarted;
  ctx::fiber fiber;  // its suspended fiber while it waits
  int barriers_passed = 0;
  const char* wait_op = "";  // where it waits
  const char* wait_file = "";
  int wait_line = 0;
  std::vector<PendingCopy> open_copies;                    // cp.async not yet committed
  std::vector<std::vector<PendingCopy>> committed_copies;  // committed groups, oldest first
  size_t landed_groups = 0;                                // committed_copies[0 .. landed) are done
};

struct WarpOp {  // a collective some lanes of a warp have arrived at
  const char* name;
  uint32_t mask, arrived;
  WarpOpArgs args;
  const char* file;
  int line;
};

struct Warp {
  std::vector<WarpOp> pending;
  WarpLane lanes[32];
};

struct KernelFault {
  std::string what;
};

struct Block {
  const Launch* launch = nullptr;
  uint3 index{};
  int size = 0;
  std::vector<EmuThread> threads;
  std::vector<int> order;
  ThreadOrder order_kind = ThreadOrder::forward;  // vary: chosen per phase from `seed`
  uint64_t seed = 0;
  size_t next_unstarted = 0;  // position in `order`
  std::vector<Warp> warps;
  int live = 0, at_barrier = 0, barrier_epoch = 0;
  EmuThread* current = nullptr;
  ctx::fiber scheduler;  // held by the running fiber: the way back
  std::string fault;
  uint64_t serial = 0;             // unique per block run: a __shared__ array is poisoned once per block
  size_t static_shared_bytes = 0;  // claimed by __shared__ arrays so far
};

std::atomic<uint64_t> g_block_serial{0};

thread_local Block* t_block = nullptr;
thread_local std::vector<unsigned char> t_dynamic_shared;

std::string coords(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}
std::string where(const char* file, int line) {
  if (line < 0) return file;  // already "file:line" (the memcheck's resolved instruction)
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

Block& block() {
  if (t_block == nullptr || t_block->current == nullptr)
    throw std::logic_error("cuda_emu: a device function was called outside a kernel");
  return *t_block;
}

int linear_of(const EmuThread& t) { return static_cast<int>(&t - t_block->threads.data()); }

void enter(EmuThread& t) {
  t_block->current = &t;
  threadIdx = t.idx;
  trace_switch_thread(static_cast<int>(&t - t_block->threads.data()));
}

// From a thread: give the OS thread back to the scheduler until someone makes this thread ready.
void wait_here() {
  Block& b = *t_block;
  EmuThread* self = b.current;
  b.scheduler = std::move(b.scheduler).resume();
  enter(*self);  // resumed by the scheduler, which set current already; keep it explicit
}

void run_thread(Block& b, EmuThread& t) {
  enter(t);
  t.state = State::ready;
  try {
    b.launch->body();
  } catch (const KernelFault& f) {
    if (b.fault.empty()) b.fault = "thread " + coords(t.idx) + ": " + f.what;
  } catch (const std::exception& e) {
    if (b.fault.empty()) b.fault = "thread " + coords(t.idx) + ": " + e.what();
  }
  t.state = State::done;
  --b.live;
}

// A runner fiber: starts unstarted threads in order until one of them has to wait (then this
// fiber belongs to that thread) or none are left.
ctx::fiber runner(ctx::fiber&& scheduler) {
  Block& b = *t_block;
  b.scheduler = std::move(scheduler);
  while (b.fault.empty()) {
    while (b.next_unstarted < b.order.size() &&
           b.threads[b.order[b.next_unstarted]].state != State::unstarted)
      ++b.next_unstarted;
    if (b.next_unstarted == b.order.size()) break;
    run_thread(b, b.threads[b.order[b.next_unstarted++]]);
  }
  return std::move(b.scheduler);
}

void switch_to(Block& b, ctx::fiber&& f) {
  ctx::fiber back = std::move(f).resume();
  if (back) b.current->fiber = std::move(back);  // the fiber now waits on behalf of `current`
}

std::string describe_waits(const Block& b) {
  std::ostringstream s;
  int shown = 0;
  for (const EmuThread& t : b.threads) {
    if (t.state == State::done || shown == 6) continue;
    s << (shown++ ? "; " : "") << "thread " << coords(t.idx) << " waits at " << t.wait_op << " ("
      << where(t.wait_file, t.wait_line) << ")";
  }
  return s.str();
}

bool same_line(const char* file_a, int line_a, const char* file_b, int line_b) {
  return line_a == line_b && (file_a == file_b || std::strcmp(file_a, file_b) == 0);
}

void make_order(std::vector<int>& v, int n, ThreadOrder order, uint64_t seed);
uint64_t mix(uint64_t a, uint64_t b);

// The order of the next phase (vary: forward, reverse or a shuffle, drawn per block and phase).
void reorder_for_phase(Block& b) {
  if (b.order_kind == ThreadOrder::forward || b.order_kind == ThreadOrder::reverse) return;
  const uint64_t phase_seed = mix(b.seed, static_cast<uint64_t>(b.barrier_epoch));
  const ThreadOrder kind =
      b.order_kind == ThreadOrder::vary ? static_cast<ThreadOrder>(phase_seed % 3) : ThreadOrder::shuffled;
  make_order(b.order, b.size, kind, phase_seed);
}

// MG_EMU_STRICT_BARRIERS=1: threads of a block waiting at __syncthreads() calls on different
// lines are an error, not a warning. Read when it matters (rarely), so a test can set it.
bool strict_barriers() {
  const char* v = std::getenv("MG_EMU_STRICT_BARRIERS");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// Threads waiting at two different __syncthreads() calls: on the GPU both are `bar.sync 0`, which
// opens once every live thread of the block has arrived, whichever call it came from (a double-
// buffered loop whose halves wait on different lines relies on it; the CUDA guide calls it
// undefined). The emulator does the same and warns once per pair of lines, or, strict, fails.
void warn_different_barriers(const std::string& a, const std::string& b) {
  static std::mutex mutex;
  static std::set<std::pair<std::string, std::string>> warned;
  std::lock_guard<std::mutex> lock(mutex);
  if (!warned.insert({std::min(a, b), std::max(a, b)}).second) return;
  std::fprintf(stderr,
               "cuda_emu: warning: threads of one block wait at __syncthreads() on different lines (%s and "
               "%s): both are barrier 0 and open together, as on the GPU (the CUDA guide leaves it "
               "undefined); MG_EMU_STRICT_BARRIERS=1 makes this an error\n",
               a.c_str(), b.c_str());
}

void open_block_barrier(Block& b) {
  const EmuThread* first = nullptr;
  for (const EmuThread& t : b.threads) {
    if (t.state == State::at_block_barrier) {
      if (first == nullptr) {
        first = &t;
      } else if (!same_line(t.wait_file, t.wait_line, first->wait_file, first->wait_line)) {
        if (strict_barriers()) {
          b.fault = "thread " + coords(first->idx) + " waits at __syncthreads() (" +
                    where(first->wait_file, first->wait_line) + ") but thread " + coords(t.idx) +
                    " at another __syncthreads() (" + where(t.wait_file, t.wait_line) +
                    "): a divergent barrier under MG_EMU_STRICT_BARRIERS=1 (every thread of a block "
                    "must reach the same barriers)";
          return;
        }
        warn_different_barriers(where(first->wait_file, first->wait_line), where(t.wait_file, t.wait_line));
      }
    }
  }
  for (const EmuThread& t : b.threads) {
    if (t.state == State::done && t.barriers_passed <= b.barrier_epoch) {
      b.fault = "thread " + coords(t.idx) + " exited without reaching the __syncthreads() (" +
                where(first->wait_file, first->wait_line) + ") that thread " + coords(first->idx) +
                " and others wait at: a divergent barrier (every thread of a block must reach it)";
      return;
    }
  }
  for (EmuThread& t : b.threads) {
    if (t.state == State::at_block_barrier) {
      t.state = State::ready;
      ++t.barriers_passed;
    }
  }
  b.at_barrier = 0;
  ++b.barrier_epoch;
  reorder_for_phase(b);
  trace_barrier_opened();  // the profiler: every request made before the barrier is complete
}

// splitmix64's finaliser over a ^ b: a cheap, well-mixed seed for a block or a phase.
uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

void make_order(std::vector<int>& v, int n, ThreadOrder order, uint64_t seed) {
  v.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  if (order == ThreadOrder::vary) order = static_cast<ThreadOrder>(seed % 3);
  if (order == ThreadOrder::reverse) std::reverse(v.begin(), v.end());
  if (order == ThreadOrder::shuffled) {  // Fisher-Yates on splitmix64 (no 2.5 KB mt19937 state per phase)
    uint64_t state = seed;
    for (size_t i = v.size(); i > 1; --i) {
      state += 0x9e3779b97f4a7c15ull;
      const uint64_t r = mix(state, 0) >> 32;
      std::swap(v[i - 1], v[static_cast<size_t>((r * i) >> 32)]);
    }
  }
}

}  // namespace

std::string run_block(const Launch& launch, uint3 block_index, ThreadOrder order, uint64_t seed,
                      LaunchTrace* trace, uint64_t linear_block, size_t* static_shared_bytes) {
  Block b;
  b.launch = &launch;
  b.index = block_index;
  const dim3 bd = launch.block;
  b.size = static_cast<int>(bd.x * bd.y * bd.z);
  b.threads.resize(static_cast<size_t>(b.size));
  for (int i = 0; i < b.size; ++i) {
    const unsigned u = static_cast<unsigned>(i);
    b.threads[static_cast<size_t>(i)].idx = uint3{u % bd.x, (u / bd.x) % bd.y, u / (bd.x * bd.y)};
  }
  b.order_kind = order;
  b.seed = seed;
  make_order(b.order, b.size, order, mix(seed, 0xb10c));
  b.warps.resize(static_cast<size_t>((b.size + 31) / 32));
  b.live = b.size;
  t_dynamic_shared.assign(launch.dynamic_shared_bytes, 0xff);  // a NaN in every float format
  b.serial = ++g_block_serial;
  BlockTraceScope traced(trace, linear_block, b.size, t_dynamic_shared.data(), t_dynamic_shared.size());

  Block* outer = t_block;
  t_block = &b;
  const bool memcheck_outer = t_memcheck;
  t_memcheck = memcheck_enabled();
  blockIdx = block_index;
  blockDim = launch.block;
  gridDim = launch.grid;
  while (b.fault.empty() && b.live > 0) {
    bool progressed = false;
    for (int i : b.order) {
      EmuThread& t = b.threads[static_cast<size_t>(i)];
      if (t.state == State::unstarted) {
        b.current = &t;
        switch_to(b, ctx::fiber(std::allocator_arg, PooledStack{}, runner));
      } else if (t.state == State::ready) {
        enter(t);
        switch_to(b, std::move(t.fiber));
      } else {
        continue;
      }
      progressed = true;
      if (!b.fault.empty()) break;
    }
    if (!b.fault.empty() || b.live == 0) break;
    if (b.at_barrier == b.live) {
      open_block_barrier(b);
    } else if (!progressed) {
      b.fault =
          "no thread of the block can proceed (a collective waits for lanes that wait elsewhere or "
          "have exited): " +
          describe_waits(b);
    }
  }
  t_block = outer;
  t_memcheck = memcheck_outer;
  if (static_shared_bytes != nullptr) *static_shared_bytes = b.static_shared_bytes;
  if (b.fault.empty()) traced.finish(b.static_shared_bytes);
  // Fibers still suspended (after a fault) are unwound here, as `b` goes away.
  return b.fault.empty() ? std::string() : "block " + coords(block_index) + ", " + b.fault;
}

// ---- called from kernels ----------------------------------------------------------------------
void device_fault(const char* what, const char* file, int line) {
  throw KernelFault{std::string(what) + " (" + where(file, line) + ")"};
}

void sync_block(const char* file, int line) {
  Block& b = block();
  EmuThread& t = *b.current;
  t.state = State::at_block_barrier;
  t.wait_op = "__syncthreads()";
  t.wait_file = file;
  t.wait_line = line;
  ++b.at_barrier;
  wait_here();
}

void warp_collective(const char* op, uint32_t mask, WarpOpArgs args, const uint32_t* in, int in_words,
                     uint32_t* out, int out_words, WarpCompletion complete, const char* file, int line) {
  Block& b = block();
  EmuThread& t = *b.current;
  const int linear = linear_of(t), lane = linear % 32, warp_index = linear / 32;
  const int lanes_here = std::min(32, b.size - warp_index * 32);
  const uint32_t existing = lanes_here == 32 ? 0xffffffffu : ((1u << lanes_here) - 1u);
  char text[256];
  if ((mask & (1u << lane)) == 0) {
    std::snprintf(text, sizeof text, "%s with mask 0x%08x called by lane %d, which the mask does not name",
                  op, mask, lane);
    device_fault(text, file, line);
  }
  if ((mask & ~existing) != 0) {
    std::snprintf(text, sizeof text,
                  "%s with mask 0x%08x names lanes that do not exist (warp %d of a %d-thread block has lanes "
                  "0x%08x)",
                  op, mask, warp_index, b.size, existing);
    device_fault(text, file, line);
  }
  Warp& w = b.warps[static_cast<size_t>(warp_index)];
  // The same collective means the same call (the file:line it passes), except for __syncwarp: on
  // sm_70 and later the lanes of a mask may meet at different __syncwarp() calls.
  const bool by_call_site = std::strcmp(op, "__syncwarp") != 0;
  WarpOp* group = nullptr;
  for (WarpOp& g : w.pending) {
    const bool same_call = !by_call_site || same_line(g.file, g.line, file, line);
    if (g.mask == mask && g.name == op && g.args == args && same_call) {
      group = &g;
    } else if (g.mask & mask) {
      std::snprintf(
          text, sizeof text,
          "lanes of warp %d disagree: %s with mask 0x%08x (variant %d, width %d) here, %s with mask "
          "0x%08x (variant %d, width %d) at %s",
          warp_index, op, mask, args.variant, args.width, g.name, g.mask, g.args.variant, g.args.width,
          where(g.file, g.line).c_str());
      std::string what = text;
      if (!same_call) what += " (another call site: the lanes of a mask must meet at the same call)";
      device_fault(what.c_str(), file, line);
    }
  }
  if (group == nullptr) {  // the first lane to arrive: every lane it names must still be there
    for (int l = 0; l < 32; ++l) {
      if ((mask >> l & 1u) && b.threads[static_cast<size_t>(warp_index * 32 + l)].state == State::done) {
        std::snprintf(text, sizeof text, "%s with mask 0x%08x names lane %d, which has exited", op, mask, l);
        device_fault(text, file, line);
      }
    }
    w.pending.push_back(WarpOp{op, mask, 0, args, file, line});
    group = &w.pending.back();
  }
  if (in_words > kWarpLaneInWords || out_words > kWarpLaneOutWords)
    throw std::logic_error("cuda_emu: a warp collective moves more words than WarpLane holds");
  std::memcpy(w.lanes[lane].in, in, sizeof(uint32_t) * static_cast<size_t>(in_words));
  group->arrived |= 1u << lane;
  if (group->arrived == mask) {
    for (int l = 0; l < 32; ++l) w.lanes[l].read_outside_mask = -1;
    complete(w.lanes, mask, args);
    for (int l = 0; l < 32; ++l)  // the mask names existing lanes only (checked above)
      if ((mask >> l & 1u) && l != lane)
        b.threads[static_cast<size_t>(warp_index * 32 + l)].state = State::ready;
    w.pending.erase(w.pending.begin() + (group - w.pending.data()));
  } else {
    t.state = State::at_warp_op;
    t.wait_op = op;
    t.wait_file = file;
    t.wait_line = line;
    wait_here();
  }
  std::memcpy(out, w.lanes[lane].out, sizeof(uint32_t) * static_cast<size_t>(out_words));
  if (w.lanes[lane].read_outside_mask >= 0) {
    std::snprintf(text, sizeof text, "%s with mask 0x%08x reads lane %d, which the mask does not name", op,
                  mask, w.lanes[lane].read_outside_mask);
    device_fault(text, file, line);
  }
}

namespace {

void complete_shuffle(WarpLane (&lanes)[32], uint32_t mask, WarpOpArgs args) {
  const ShuffleKind kind = static_cast<ShuffleKind>(args.variant);
  const int width = args.width;
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    const int a = static_cast<int>(lanes[l].in[2]);
    const int segment = l / width * width;
    int src = l;
    switch (kind) {
      case ShuffleKind::index: src = segment + ((a % width) + width) % width; break;
      case ShuffleKind::up: src = l - segment >= a ? l - a : l; break;
      case ShuffleKind::down: src = l - segment + a < width ? l + a : l; break;
      case ShuffleKind::bfly: src = (l ^ a) < segment + width ? (l ^ a) : l; break;
    }
    if (!(mask >> src & 1u)) {
      // Reading a lane that does not take part is undefined on the GPU: a fault of the reading lane.
      lanes[l].out[0] = 0x7fffffffu;
      lanes[l].out[1] = 0x7fffffffu;
      lanes[l].read_outside_mask = src;
      continue;
    }
    lanes[l].out[0] = lanes[src].in[0];
    lanes[l].out[1] = lanes[src].in[1];
  }
}

void complete_ballot(WarpLane (&lanes)[32], uint32_t mask, WarpOpArgs) {
  uint32_t bits = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && lanes[l].in[0] != 0) bits |= 1u << l;
  for (int l = 0; l < 32; ++l) lanes[l].out[0] = bits;
}

}  // namespace

uint64_t shuffle(ShuffleKind kind, uint32_t mask, uint64_t value, int lane_arg, int width, const char* name,
                 const char* file, int line) {
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    device_fault(
        (std::string(name) + ": width " + std::to_string(width) + " is not a power of 2 in 1..32").c_str(),
        file, line);
  }
  const uint32_t in[3] = {static_cast<uint32_t>(value), static_cast<uint32_t>(value >> 32),
                          static_cast<uint32_t>(lane_arg)};
  uint32_t out[2];
  warp_collective(name, mask, WarpOpArgs{static_cast<int>(kind), width}, in, 3, out, 2, complete_shuffle,
                  file, line);
  return uint64_t(out[0]) | (uint64_t(out[1]) << 32);
}

uint32_t vote_ballot(uint32_t mask, int predicate, const char* name, const char* file, int line) {
  const uint32_t in[1] = {predicate != 0 ? 1u : 0u};
  uint32_t out[1];
  warp_collective(name, mask, WarpOpArgs{}, in, 1, out, 1, complete_ballot, file, line);
  return out[0] & mask;
}

// ---- shared memory and cp.async ------------------------------------------------------------------
void claim_static_shared(uint64_t* claimed_by, void* storage, size_t bytes, const char* file, int line) {
  Block& b = block();
  if (*claimed_by == b.serial) return;  // another thread of this block got there first
  *claimed_by = b.serial;
  std::memset(storage, 0xff, bytes);  // a NaN in every float format, as dynamic shared memory
  b.static_shared_bytes += bytes;
  trace_static_shared(storage, bytes);
  // A GPU refuses the launch ("too many resources requested"): static arrays may have 48 KiB, and
  // static + dynamic 48 KiB unless the kernel opted in (cudaFuncSetAttribute), then 227 KiB. The
  // emulator sees the static arrays only as they are first used, so it stops the grid here; the
  // kernel's later launches are refused up front (note_static_shared, launch() in streams.cpp).
  const size_t dynamic = b.launch->dynamic_shared_bytes, total = b.static_shared_bytes + dynamic;
  const bool opted_in = b.launch->shared_opt_in;
  std::string what;
  if (b.static_shared_bytes > 48 * 1024) {
    what = std::to_string(b.static_shared_bytes) +
           " bytes of static shared memory per block, over 48 KiB (more must be dynamic shared memory, with "
           "cudaFuncSetAttribute): the launch fails on a GPU";
  } else if (total > (opted_in ? 227 : 48) * 1024) {
    what = std::to_string(b.static_shared_bytes) + " bytes of static shared memory + " +
           std::to_string(dynamic) + " dynamic = " + std::to_string(total) + " per block, over " +
           (opted_in
                ? "the 227 KiB a block can have"
                : "48 KiB (cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize) opts in to 227 "
                  "KiB): the launch fails on a GPU");
  }
  if (!what.empty()) device_fault(what.c_str(), file, line);
}

unsigned char* dynamic_shared_base() {
  block();
  return t_dynamic_shared.data();
}

uint32_t shared_address_of(const void* p, const char* file, int line) {
  block();
  const unsigned char* c = static_cast<const unsigned char*>(p);
  if (c < t_dynamic_shared.data() || c >= t_dynamic_shared.data() + t_dynamic_shared.size()) {
    device_fault(
        "__cvta_generic_to_shared: the pointer is not in the block's dynamic shared memory (the emulator "
        "gives 32-bit shared addresses to dynamic shared memory only)",
        file, line);
  }
  return static_cast<uint32_t>(c - t_dynamic_shared.data());
}

unsigned char* shared_pointer_of(uint32_t address, int bytes, const char* file, int line) {
  block();
  if (static_cast<size_t>(address) + static_cast<size_t>(bytes) > t_dynamic_shared.size()) {
    char text[160];
    std::snprintf(text, sizeof text, "shared address 0x%x (+%d bytes) is outside the block's %zu bytes",
                  address, bytes, t_dynamic_shared.size());
    device_fault(text, file, line);
  }
  return t_dynamic_shared.data() + address;
}

namespace {

// The device allocation a thread's last cp.async read from: most copies of a kernel read one
// tensor, so the runtime's map (and its mutex) is asked again only for another allocation, or
// after a cudaFree (the generation changes).
struct KnownAllocation {
  uintptr_t start = 0, end = 0;
  uint64_t generation = ~uint64_t(0);
};
thread_local KnownAllocation t_known_source;

void check_global_source(const void* src, size_t bytes, const char* file, int line) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(src);
  const uint64_t generation = allocation_generation();
  KnownAllocation& k = t_known_source;
  if (k.generation == generation && a >= k.start && a + bytes <= k.end) return;
  uintptr_t start = 0;
  size_t size = 0;
  char text[256];
  if (!allocation_containing(src, &start, &size)) {
    std::snprintf(text, sizeof text, "cp.async (%zu bytes): the source %p is not inside a device allocation",
                  bytes, src);
    device_fault(text, file, line);
  }
  if (a + bytes > start + size) {
    std::snprintf(
        text, sizeof text,
        "cp.async (%zu bytes): the source bytes [%p, +%zu) run %zu bytes past the end of a %zu-byte "
        "device allocation",
        bytes, src, bytes, static_cast<size_t>(a + bytes - (start + size)), size);
    device_fault(text, file, line);
  }
  k = KnownAllocation{start, start + size, generation};
}

}  // namespace

void cp_async_16(void* shared_dst, const void* global_src, const char* file, int line) {
  EmuThread& t = *block().current;
  unsigned char* dst = static_cast<unsigned char*>(shared_dst);
  if (reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(global_src) % 16)
    device_fault("cp.async (16 bytes): source and destination must be 16-byte aligned", file, line);
  const uint32_t address = shared_address_of(dst, file, line);        // the first byte is shared memory
  if (static_cast<size_t>(address) + 16 > t_dynamic_shared.size()) {  // and so are the other 15
    char text[200];
    std::snprintf(
        text, sizeof text,
        "cp.async (16 bytes): the destination bytes [%u, %u) run past the block's %zu bytes of dynamic "
        "shared memory",
        address, address + 16, t_dynamic_shared.size());
    device_fault(text, file, line);
  }
  check_global_source(global_src, 16, file, line);
  trace_emulated(global_src, 16, profile::Op::cp_async, file, line, 0);
  trace_emulated(dst, 16, profile::Op::cp_async, file, line, 1);
  PendingCopy c;
  c.dst = dst;
  std::memcpy(c.bytes, global_src, 16);
  std::memset(dst, 0xff, 16);  // poisoned until a wait_group lands the copy
  t.open_copies.push_back(c);
}

void cp_async_commit() {
  EmuThread& t = *block().current;
  t.committed_copies.push_back(std::move(t.open_copies));
  t.open_copies.clear();
}

void cp_async_wait(int pending_groups_allowed) {
  EmuThread& t = *block().current;
  const int in_flight = static_cast<int>(t.committed_copies.size() - t.landed_groups);
  if (in_flight > pending_groups_allowed)  // the profiler: this wait is (landed / in flight) round trips
    trace_async_wait(double(in_flight - std::max(pending_groups_allowed, 0)) / in_flight);
  while (static_cast<int>(t.committed_copies.size() - t.landed_groups) > pending_groups_allowed) {
    for (const PendingCopy& c : t.committed_copies[t.landed_groups]) std::memcpy(c.dst, c.bytes, 16);
    t.committed_copies[t.landed_groups++].clear();
  }
}

}  // namespace mg_emu
