// The tracer: lane accesses -> warp requests -> sectors, wavefronts and DRAM bytes (profiler.h).
//
// How a request is formed. The emulator runs the threads of a block one after another between
// barriers, so the 32 accesses a warp makes at once on a GPU arrive here one lane at a time, far
// apart. What ties them together is the instruction and its dynamic instance: lane 7's 5th
// execution of the load at pc P is the same warp instruction as lane 0's 5th execution of it (the
// lanes of a warp run in lock step through convergent code). So each lane counts its executions
// per call site, and (site, occurrence) names a request of its warp:
//
//   lane 0:  P#0  P#1  Q#0 ...        request (P,#0) <- lane 0, lane 1, ..., lane 31
//   lane 1:  P#0  P#1  Q#0 ...        request (P,#1) <- lane 0, lane 1, ..., lane 31
//
// A request is complete once every lane has gone past it; all are at a __syncthreads() and at the
// block's end, where the open ones are flushed into the counters.
//
//   global: sectors = distinct 32-byte sectors any lane's bytes fall in; the request joins the
//           block's request list, which the cache models (cache_model.h) replay at the end.
//   shared: 32 banks of 4-byte words (bank = word % 32). A bank serves one word per wavefront, so
//           a request needs max over banks of the distinct words it must serve; lanes reading the
//           same word share it (a broadcast). 16-byte accesses cover 4 words each: 4 wavefronts
//           at best, as on the hardware (ideal_wavefronts = ceil(distinct words / 32)).
#include "cuda_emu/trace.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda_emu/cache_model.h"
#include "cuda_emu/gpu_model.h"
#include "cuda_emu/runtime_internal.h"

namespace mg_emu {
[[noreturn]] void device_fault(const char* what, const char* file, int line);  // block_scheduler.cpp
}

namespace mg_emu {

using profile::AccessCounts;
using profile::Op;
using profile::Space;

thread_local bool t_memcheck __attribute__((tls_model("initial-exec"))) = false;
thread_local BlockTrace* t_block_trace __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {

constexpr uint64_t kSector = 32;
constexpr uintptr_t kEmulatedSite = uintptr_t(1) << 63;  // file:line sites; pcs are below

// A site's identity in the counters: its kind of access and where it is.
struct SiteTotals {
  Space space = Space::none;
  Op op = Op::load;
  AccessCounts counts;
};

// file:line of the emulated instructions, interned (ids stable for the process).
std::mutex g_sites_mutex;
std::map<std::pair<const char*, int>, uintptr_t> g_site_ids;
std::vector<std::pair<const char*, int>> g_site_names;

uintptr_t emulated_site(const char* file, int line, int part) {
  std::lock_guard<std::mutex> lock(g_sites_mutex);
  auto [it, fresh] = g_site_ids.try_emplace({file, line}, g_site_names.size());
  if (fresh) g_site_names.emplace_back(file, line);
  return kEmulatedSite | (it->second << 1) | uintptr_t(part & 1);
}

struct Profiling {
  std::mutex mutex;
  std::atomic<bool> active{false};  // read without the mutex first: every launch asks
  bool instrumented = false;
  profile::Options options;
  std::vector<std::shared_ptr<LaunchTrace>> launches;
};
bool instructions_from_env() {
  static const bool on = [] {
    const char* v = std::getenv("MG_EMU_INSTRUCTIONS");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

Profiling& profiling() {
  static Profiling* p = new Profiling;  // never destroyed: block workers may outlive main
  return *p;
}

}  // namespace

struct LaunchTrace {
  profile::LaunchProfile result;
  profile::Options options;
  const void* kernel = nullptr;  // the launched function (ptx_compile.cpp finds its PTX)
  std::vector<std::pair<uintptr_t, uintptr_t>> global;  // device allocations at the launch
  std::mutex mutex;                                     // guards what blocks merge in below
  std::unordered_map<uintptr_t, SiteTotals> sites;
  std::vector<BlockRequests> blocks;
  uint64_t static_shared_bytes = 0;
  double round_trips = 0;
  double async_round_trips = 0;                      // of those, cp.async waits'
  double barriers = 0;                               // __syncthreads() the traced blocks passed
  bool count_blocks = false;                         // with the instruction count: CPU blocks run
  std::unordered_map<uintptr_t, double> blocks_run;  // pc of a CPU basic block -> warp executions
  // With the instruction count: the widest shared access nvcc emitted per line (the PTX), and
  // what each site of the traced build turned out to be (its line's id, those widths).
  std::map<std::string, SharedWidths> shared_widths;
  std::map<std::string, int> line_ids;
  struct SiteWidth {
    int line = -1;  // -1: no vector access on its line
    SharedWidths widths;
  };
  std::unordered_map<uintptr_t, SiteWidth> site_widths;

  // The widths of these sites (new ones resolved with one addr2line call, outside the lock).
  void widths_of(const std::vector<uintptr_t>& sites, std::unordered_map<uintptr_t, SiteWidth>& into) {
    std::vector<uintptr_t> fresh;
    {
      std::lock_guard<std::mutex> lock(mutex);
      for (uintptr_t site : sites) {
        const auto it = site_widths.find(site);
        if (it != site_widths.end()) {
          into[site] = it->second;
        } else if (std::find(fresh.begin(), fresh.end(), site) == fresh.end()) {
          fresh.push_back(site);
        }
      }
    }
    if (fresh.empty()) return;
    const std::vector<std::string> lines = site_lines(fresh);
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < fresh.size(); ++i) {
      SiteWidth w;
      const auto it = shared_widths.find(lines[i]);
      if (it != shared_widths.end()) {
        w.line = line_ids.emplace(lines[i], static_cast<int>(line_ids.size())).first->second;
        w.widths = it->second;
      }
      into[fresh[i]] = site_widths[fresh[i]] = w;
    }
  }

  bool is_global(uintptr_t a) const {
    auto it = std::upper_bound(global.begin(), global.end(), std::make_pair(a, UINTPTR_MAX));
    return it != global.begin() && a < std::prev(it)->second;
  }
};

class BlockTrace {
 public:
  BlockTrace(LaunchTrace* launch, uint64_t linear, int threads, const void* dynamic_shared,
             size_t dynamic_bytes)
      : launch_(launch),
        linear_(linear),
        threads_(static_cast<size_t>(threads)),
        pending_(static_cast<size_t>((threads + 31) / 32)) {
    if (dynamic_bytes > 0) {
      const uintptr_t d = reinterpret_cast<uintptr_t>(dynamic_shared);
      shared_.emplace_back(d, d + dynamic_bytes);
    }
  }

  void set_thread(int linear) { current_ = linear; }

  // Round trips (profiler.h: LaunchProfile::load_round_trips), per thread.
  void async_wait(double round_trips) {
    ThreadState& thread = threads_[static_cast<size_t>(current_)];
    thread.round_trips += round_trips;
    thread.async_round_trips += round_trips;
  }
  // A CPU basic block of the kernel began (-fsanitize-coverage=trace-pc), with the instruction count on.
  void entered(uintptr_t pc) {
    if (launch_->count_blocks) ++threads_[static_cast<size_t>(current_)].blocks[pc];
  }
  void barrier_passed() {
    ++barriers_;
    for (ThreadState& t : threads_) t.batch.clear();
  }
  void add_shared(const void* p, size_t bytes) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    shared_.emplace_back(a, a + bytes);
  }

  void access(uintptr_t address, unsigned bytes, Op op, uintptr_t site, bool emulated_op) {
    Space space = Space::none;
    if (!emulated_op || bytes > 0) {
      if (is_shared(address)) {
        space = Space::shared;
      } else if (launch_->is_global(address)) {
        space = Space::global;
      } else {
        return;  // a register spill, the stack, the kernel's arguments: not memory a GPU kernel sees
      }
    }
    ThreadState& thread = threads_[static_cast<size_t>(current_)];
    if (space == Space::global && op == Op::load) {  // a synchronous load: a new round trip?
      if (thread.batch.empty() ||
          std::find(thread.batch.begin(), thread.batch.end(), site) != thread.batch.end()) {
        thread.batch.clear();
        thread.round_trips += 1;
      }
      thread.batch.push_back(site);
    }
    const uint32_t occurrence = thread.occurrences[site]++;
    Pending& p = pending_[static_cast<size_t>(current_ / 32)][Key{site, occurrence}];
    if (p.lanes.empty()) p.order = thread.accesses;  // program order, as the first lane saw it
    ++thread.accesses;
    p.space = space;
    p.op = op;
    p.lanes.push_back(LaneAccess{address, bytes, static_cast<uint32_t>(current_ % 32)});
  }

  // Every request so far is complete (a barrier, or the block's end). Each warp's requests are
  // put in program order (a load of a sector before the store to it is a DRAM read; the other way
  // round it is not), and the warps are interleaved by it: step i is every warp's i-th request, as
  // warps running the same code together issue them (the L1 then sees one warp fetch a line the
  // others use at the same step: cache_model.h's pending hits). The order is reproducible, and so
  // is the first-touch order the L2 model sees.
  void flush() {
    std::vector<std::vector<std::pair<Key, Pending*>>> open(pending_.size());
    size_t steps = 0;
    for (size_t w = 0; w < pending_.size(); ++w) {
      for (auto& [key, p] : pending_[w]) open[w].emplace_back(key, &p);
      std::sort(open[w].begin(), open[w].end(), [](const auto& a, const auto& b) {
        return a.second->order != b.second->order ? a.second->order < b.second->order
                                                  : a.first.site < b.first.site;
      });
      if (!launch_->shared_widths.empty()) merge_vector_accesses(open[w]);
      open[w].erase(
          std::remove_if(open[w].begin(), open[w].end(), [](const auto& e) { return e.second->merged; }),
          open[w].end());
      steps = std::max(steps, open[w].size());
    }
    for (size_t i = 0; i < steps; ++i, ++step_)
      for (auto& warp : open)
        if (i < warp.size()) count(warp[i].first.site, *warp[i].second);
    for (auto& warp : pending_) warp.clear();
  }

  void finish(size_t static_shared_bytes) {
    flush();
    double round_trips = 0, async_round_trips = 0;  // per warp, its slowest lane
    for (size_t w = 0; w < threads_.size(); w += 32) {
      double slowest = 0, slowest_async = 0;
      for (size_t l = w; l < std::min(threads_.size(), w + 32); ++l) {
        slowest = std::max(slowest, threads_[l].round_trips);
        slowest_async = std::max(slowest_async, threads_[l].async_round_trips);
      }
      round_trips += slowest;
      async_round_trips += slowest_async;
    }
    std::unordered_map<uintptr_t, double> blocks_run;  // per warp, its lane that ran a block most
    for (size_t w = 0; w < threads_.size() && launch_->count_blocks; w += 32) {
      std::unordered_map<uintptr_t, uint32_t> warp;
      for (size_t l = w; l < std::min(threads_.size(), w + 32); ++l)
        for (const auto& [pc, n] : threads_[l].blocks) warp[pc] = std::max(warp[pc], n);
      for (const auto& [pc, n] : warp) blocks_run[pc] += n;
    }
    std::lock_guard<std::mutex> lock(launch_->mutex);
    launch_->round_trips += round_trips;
    launch_->async_round_trips += async_round_trips;
    launch_->barriers += barriers_;
    for (const auto& [pc, n] : blocks_run) launch_->blocks_run[pc] += n;
    for (auto& [site, t] : sites_) {
      SiteTotals& into = launch_->sites[site];
      into.space = t.space;
      into.op = t.op;
      into.counts.add(t.counts);
    }
    requests_.block = linear_;
    launch_->blocks.push_back(std::move(requests_));
    launch_->static_shared_bytes = std::max<uint64_t>(launch_->static_shared_bytes, static_shared_bytes);
  }

 private:
  struct Key {
    uintptr_t site;
    uint32_t occurrence;
    bool operator==(const Key& o) const { return site == o.site && occurrence == o.occurrence; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<uintptr_t>()(k.site * 31 + k.occurrence); }
  };
  struct LaneAccess {
    uintptr_t address;
    unsigned bytes;
    uint32_t lane;
  };
  struct Pending {
    uint64_t order = 0;  // the first lane's count of its accesses before this one
    Space space = Space::none;
    Op op = Op::load;
    bool merged = false;  // folded into an earlier request's vector access
    std::vector<LaneAccess> lanes;
  };

  // Vector shared accesses. nvcc loads a thread's contiguous shared floats with one
  // ld.shared.v4.f32 (or .v2) where it can prove them aligned; the CPU build makes four 4-byte
  // accesses of them. So where the PTX has a vector access of W bytes on a line, a lane's
  // accesses on that line that follow one another, each continuing the last inside one W-aligned
  // chunk, become one access of the request that began the chunk -- every lane of it alike, or
  // none. The alignment is checked on the addresses; whether nvcc could prove it is the PTX's
  // word (the width on that line), so a tile declared without __align__ stays scalar.
  void merge_vector_accesses(std::vector<std::pair<Key, Pending*>>& open) {
    std::vector<uintptr_t> sites;
    for (const auto& [key, p] : open)
      if (p->space == Space::shared && (p->op == Op::load || p->op == Op::store) &&
          !(key.site & kEmulatedSite) && widths_.find(key.site) == widths_.end())
        sites.push_back(key.site);
    if (!sites.empty()) launch_->widths_of(sites, widths_);
    struct Group {
      Pending* head = nullptr;
      unsigned width = 0;
      unsigned taken = 0;  // bytes per lane so far
    };
    // (line, op) -> the vector access being formed; a kernel has few such lines, so a short list
    std::vector<std::pair<std::pair<int, Op>, Group>> groups;
    const auto group_of = [&groups](int line, Op op) -> Group& {
      for (auto& [where, g] : groups)
        if (where == std::make_pair(line, op)) return g;
      return groups.emplace_back(std::make_pair(line, op), Group{}).second;
    };
    for (auto& [key, p] : open) {
      if (p->space != Space::shared || (p->op != Op::load && p->op != Op::store)) continue;
      const auto it = widths_.find(key.site);
      if (it == widths_.end() || it->second.line < 0) continue;
      const unsigned width = p->op == Op::load ? it->second.widths.load : it->second.widths.store;
      Group& g = group_of(it->second.line, p->op);
      const unsigned bytes = p->lanes.front().bytes;
      const bool uniform = std::all_of(p->lanes.begin(), p->lanes.end(),
                                       [&](const LaneAccess& l) { return l.bytes == bytes; });
      if (!uniform || width <= bytes || width % bytes != 0) {
        g = Group{};
        continue;
      }
      if (g.head != nullptr && g.taken + bytes <= g.width && continues(*g.head, *p, g.taken)) {
        for (LaneAccess& l : g.head->lanes) l.bytes += bytes;
        g.taken += bytes;
        p->merged = true;
        continue;
      }
      const bool aligned = std::all_of(p->lanes.begin(), p->lanes.end(),
                                       [&](const LaneAccess& l) { return l.address % width == 0; });
      g = aligned ? Group{p, width, bytes} : Group{};
    }
  }
  // Does every lane of `next` continue the same lane's access in `head`, `taken` bytes on?
  static bool continues(const Pending& head, const Pending& next, unsigned taken) {
    if (head.lanes.size() != next.lanes.size()) return false;
    for (size_t i = 0; i < head.lanes.size(); ++i)
      if (next.lanes[i].lane != head.lanes[i].lane || next.lanes[i].address != head.lanes[i].address + taken)
        return false;
    return true;
  }

  bool is_shared(uintptr_t a) const {
    for (const auto& [begin, end] : shared_)
      if (a >= begin && a < end) return true;
    return false;
  }

  // Distinct bytes the lanes asked for (overlaps, as in a broadcast, counted once).
  static uint64_t distinct_bytes(std::vector<LaneAccess>& lanes) {
    std::sort(lanes.begin(), lanes.end(),
              [](const LaneAccess& a, const LaneAccess& b) { return a.address < b.address; });
    uint64_t total = 0;
    uintptr_t covered = 0;  // bytes below this address are counted
    for (const LaneAccess& l : lanes) {
      const uintptr_t begin = std::max(l.address, covered), end = l.address + l.bytes;
      if (end > begin) total += end - begin;
      covered = std::max(covered, end);
    }
    return total;
  }

  void count(uintptr_t site, Pending& p) {
    SiteTotals& t = sites_[site];
    t.space = p.space;
    t.op = p.op;
    AccessCounts& c = t.counts;
    c.requests += 1;
    c.lanes += static_cast<double>(p.lanes.size());
    for (const LaneAccess& l : p.lanes) c.lane_bytes += l.bytes;
    if (p.space == Space::none) return;  // mma: an instruction, no memory
    c.bytes += static_cast<double>(distinct_bytes(p.lanes));
    if (p.space == Space::global) {
      std::vector<uint64_t> sectors;
      for (const LaneAccess& l : p.lanes)
        for (uint64_t s = l.address / kSector; s <= (l.address + std::max(l.bytes, 1u) - 1) / kSector; ++s)
          sectors.push_back(s);
      std::sort(sectors.begin(), sectors.end());
      sectors.erase(std::unique(sectors.begin(), sectors.end()), sectors.end());
      c.sectors += static_cast<double>(sectors.size());
      // The request's passes through the L1 data array, shared with shared memory: 32 banks of 4
      // bytes, 128 bytes a clock. A cached sector sits in the 8 banks of its place in its 128-byte
      // line (sector index mod 4), so one pass reads at most one sector of each place: sectors of
      // different lines in the same place conflict, as shared words in one bank do. A coalesced
      // request takes sectors / 4 passes; a warp reading down a column (every lane a line of its
      // own, at the same offset) one per lane.
      size_t per_place[4] = {};
      for (uint64_t s : sectors) ++per_place[s % 4];
      c.wavefronts += static_cast<double>(std::max<size_t>(1, *std::max_element(per_place, per_place + 4)));
      requests_.add(p.op == Op::load       ? RequestKind::load
                    : p.op == Op::cp_async ? RequestKind::load_bypassing_l1
                    : p.op == Op::store    ? RequestKind::store
                                           : RequestKind::atomic,
                    sectors, step_);
    } else {
      std::vector<uint64_t> words;
      for (const LaneAccess& l : p.lanes)
        for (uint64_t w = l.address / 4; w <= (l.address + std::max(l.bytes, 1u) - 1) / 4; ++w)
          words.push_back(w);
      std::sort(words.begin(), words.end());
      words.erase(std::unique(words.begin(), words.end()), words.end());
      int per_bank[32] = {};
      for (uint64_t w : words) ++per_bank[w % 32];
      c.wavefronts += *std::max_element(per_bank, per_bank + 32);
      c.ideal_wavefronts += static_cast<double>((words.size() + 31) / 32);
    }
  }

  struct ThreadState {
    std::unordered_map<uintptr_t, uint32_t> occurrences;  // site -> executions so far
    std::vector<uintptr_t> batch;                         // the load sites of the open round trip
    double round_trips = 0;
    double async_round_trips = 0;                    // of those, cp.async.wait_group's
    uint64_t accesses = 0;                           // made so far: program order
    std::unordered_map<uintptr_t, uint32_t> blocks;  // CPU basic blocks entered (count_blocks)
  };

  LaunchTrace* launch_;
  uint64_t linear_;
  int current_ = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> shared_;
  std::vector<ThreadState> threads_;
  std::vector<std::unordered_map<Key, Pending, KeyHash>> pending_;  // per warp: open requests
  std::unordered_map<uintptr_t, SiteTotals> sites_;
  std::unordered_map<uintptr_t, LaunchTrace::SiteWidth> widths_;  // the launch's, as far as seen
  BlockRequests requests_;
  uint32_t step_ = 0;  // the step (flush()) of the requests being counted
  double barriers_ = 0;
};

// ---- the launch path -----------------------------------------------------------------------------
std::shared_ptr<LaunchTrace> trace_new_launch(const Launch& launch) {
  Profiling& p = profiling();
  if (!p.active.load(std::memory_order_relaxed)) return nullptr;  // not profiling: no lock
  std::lock_guard<std::mutex> lock(p.mutex);
  if (!p.active) return nullptr;
  auto t = std::make_shared<LaunchTrace>();
  t->options = p.options;
  t->kernel = launch.kernel;
  t->count_blocks = p.options.count_instructions || instructions_from_env();
  if (t->count_blocks) t->shared_widths = shared_access_widths(launch.kernel);
  t->global = device_ranges();
  profile::LaunchProfile& r = t->result;
  r.kernel = launch.kernel_name;
  r.grid = launch.grid;
  r.block = launch.block;
  r.blocks = uint64_t(launch.grid.x) * launch.grid.y * launch.grid.z;
  r.traced_blocks =
      p.options.max_traced_blocks == 0 ? r.blocks : std::min(r.blocks, p.options.max_traced_blocks);
  if (r.traced_blocks < r.blocks && r.blocks > launch.grid.x)
    r.traced_blocks =
        std::min(r.blocks, std::max(r.traced_blocks, p.options.min_traced_rows * launch.grid.x));
  r.shared_bytes_per_block = launch.dynamic_shared_bytes;
  p.launches.push_back(t);
  return t;
}

bool trace_block_is_traced(const LaunchTrace& trace, uint64_t linear_block) {
  return linear_block < trace.result.traced_blocks;
}
bool trace_skips_untraced_blocks(const LaunchTrace& trace) { return trace.options.skip_untraced_blocks; }

void trace_launch_done(LaunchTrace& t) {
  std::lock_guard<std::mutex> lock(t.mutex);
  profile::LaunchProfile& r = t.result;
  std::sort(t.blocks.begin(), t.blocks.end(),
            [](const BlockRequests& a, const BlockRequests& b) { return a.block < b.block; });
  r.traced_blocks = t.blocks.size();
  r.scale = r.traced_blocks > 0 ? double(r.blocks) / double(r.traced_blocks) : 0;
  r.shared_bytes_per_block += t.static_shared_bytes;
  r.load_round_trips = t.round_trips * r.scale;
  r.async_round_trips = t.async_round_trips * r.scale;
  r.barriers = t.barriers * r.scale;
  // The caches: the GPU's L1s (what the resident blocks' shared memory leaves of each SM's array)
  // and L2, and the same requests through an unbounded L2 for the first-touch bytes.
  const GpuSpec& gpu = t.options.gpu ? *t.options.gpu : default_gpu_spec();
  CacheConfig caches;
  caches.sms = gpu.sms;
  caches.all_blocks = r.blocks;
  const int threads = static_cast<int>(r.block.x * r.block.y * r.block.z);
  try {
    caches.blocks_per_sm = blocks_per_sm(threads, r.shared_bytes_per_block, 0, gpu);
  } catch (const std::invalid_argument&) {
    caches.blocks_per_sm = 1;  // a launch the GPU would refuse: the model says so when it prices it
  }
  const uint64_t shared_taken =
      r.shared_bytes_per_block > 0
          ? uint64_t(caches.blocks_per_sm) * (r.shared_bytes_per_block + gpu.shared_reserved_per_block)
          : 0;
  caches.l1_bytes_per_sm =
      gpu.l1_shared_bytes_per_sm > shared_taken ? gpu.l1_shared_bytes_per_sm - shared_taken : 0;
  // A test's own L2 size is a fully associative LRU (its counts worked by hand); the GPU's is hashed.
  caches.l2_bytes =
      t.options.l2_bytes > 0 ? t.options.l2_bytes : static_cast<uint64_t>(gpu.l2_capacity_bytes);
  caches.l2_ways = t.options.l2_bytes > 0 ? 0 : gpu.l2_ways;
  const CacheTraffic lru = simulate_caches(t.blocks, caches);
  CacheConfig unbounded = caches;
  unbounded.l2_bytes = 0;
  const CacheTraffic first_touch = simulate_caches(t.blocks, unbounded);
  r.dram_read_first_touch = first_touch.dram_read;
  r.dram_write_first_touch = first_touch.dram_written;
  r.dram_read_lru = lru.dram_read;
  r.dram_write_lru = lru.dram_written;
  r.l1_hit_sectors = lru.l1_hit_sectors;
  r.l1_pending_sectors = lru.l1_pending_sectors;
  r.l2_sectors = lru.l2_sectors;
  t.blocks.clear();
  t.blocks.shrink_to_fit();
  for (const auto& [site, s] : t.sites) {
    profile::SiteCounts sc;
    sc.space = s.space;
    sc.op = s.op;
    sc.counts = s.counts;
    sc.where = std::to_string(site);  // resolved in profile::end()
    r.sites.push_back(sc);
    AccessCounts scaled = s.counts;
    for (double* v : {&scaled.requests, &scaled.lanes, &scaled.bytes, &scaled.sectors, &scaled.wavefronts,
                      &scaled.ideal_wavefronts, &scaled.lane_bytes})
      *v *= r.scale;
    if (s.op == Op::mma) {
      r.mma += scaled.requests;
      r.tensor_flops += scaled.requests * 2.0 * 16 * 8 * 16;
    } else if (s.op == Op::ldmatrix) {
      r.ldmatrix += scaled.requests;
      r.shared_load.add(scaled);
    } else if (s.op == Op::cp_async) {
      if (s.space == Space::global) {
        r.cp_async += scaled.requests;
        r.global_load.add(scaled);
      } else {
        r.shared_store.add(scaled);
      }
    } else {
      const bool global = s.space == Space::global;
      AccessCounts& into = s.op == Op::load    ? (global ? r.global_load : r.shared_load)
                           : s.op == Op::store ? (global ? r.global_store : r.shared_store)
                                               : (global ? r.global_atomic : r.shared_atomic);
      into.add(scaled);
    }
  }
}

// ---- the block scheduler ----------------------------------------------------------------------------
BlockTraceScope::BlockTraceScope(LaunchTrace* trace, uint64_t linear_block, int threads,
                                 const void* dynamic_shared, size_t dynamic_shared_bytes) {
  outer_ = t_block_trace;
  if (trace == nullptr || !trace_block_is_traced(*trace, linear_block)) {
    t_block_trace = nullptr;
    return;
  }
  block_ = std::make_unique<BlockTrace>(trace, linear_block, threads, dynamic_shared, dynamic_shared_bytes);
  t_block_trace = block_.get();
}
BlockTraceScope::~BlockTraceScope() { t_block_trace = outer_; }
void BlockTraceScope::finish(size_t static_shared_bytes) {
  if (block_) block_->finish(static_shared_bytes);
}

void trace_switch_thread(int linear_thread) {
  if (t_block_trace != nullptr) t_block_trace->set_thread(linear_thread);
}
void trace_barrier_opened() {
  if (t_block_trace != nullptr) {
    t_block_trace->flush();
    t_block_trace->barrier_passed();
  }
}
void trace_block_entered(uintptr_t pc) {
  if (t_block_trace != nullptr) t_block_trace->entered(pc);
}

void trace_async_wait(double round_trips) {
  if (t_block_trace != nullptr) t_block_trace->async_wait(round_trips);
}
void trace_static_shared(const void* storage, size_t bytes) {
  if (t_block_trace != nullptr) t_block_trace->add_shared(storage, bytes);
}

void trace_access(const void* address, unsigned bytes, Op op, uintptr_t site) {
  if (t_block_trace != nullptr)
    t_block_trace->access(reinterpret_cast<uintptr_t>(address), bytes, op, site, false);
}

void trace_emulated(const void* address, unsigned bytes, Op op, const char* file, int line, int part) {
  if (t_block_trace != nullptr)
    t_block_trace->access(reinterpret_cast<uintptr_t>(address), bytes, op, emulated_site(file, line, part),
                          true);
}

void trace_library_call(const char* name, double flops, bool tensor_cores, double ideal_bytes) {
  Profiling& p = profiling();
  if (!p.active.load(std::memory_order_relaxed)) return;  // not profiling: no lock
  std::lock_guard<std::mutex> lock(p.mutex);
  if (!p.active) return;
  auto t = std::make_shared<LaunchTrace>();
  profile::LaunchProfile& r = t->result;
  r.kernel = name;
  r.library = true;
  (tensor_cores ? r.tensor_flops : r.fp32_flops) = flops;
  r.dram_read_first_touch = r.dram_read_lru = ideal_bytes;
  p.launches.push_back(t);
}

void trace_note_instrumented_code() {
  Profiling& p = profiling();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.instrumented = true;
}

// ---- the public side ----------------------------------------------------------------------------------
namespace profile {

const char* name_of(Op op) {
  switch (op) {
    case Op::load: return "load";
    case Op::store: return "store";
    case Op::atomic: return "atomic";
    case Op::ldmatrix: return "ldmatrix";
    case Op::mma: return "mma";
    case Op::cp_async: return "cp.async";
  }
  return "?";
}

void AccessCounts::add(const AccessCounts& o) {
  requests += o.requests;
  lanes += o.lanes;
  bytes += o.bytes;
  sectors += o.sectors;
  wavefronts += o.wavefronts;
  ideal_wavefronts += o.ideal_wavefronts;
  lane_bytes += o.lane_bytes;
}

bool available() {
  Profiling& p = profiling();
  std::lock_guard<std::mutex> lock(p.mutex);
  return p.instrumented;
}

void begin(const Options& options) {
  Profiling& p = profiling();
  std::lock_guard<std::mutex> lock(p.mutex);
  p.active = true;
  p.options = options;
  p.launches.clear();
}

namespace {

std::string basename_line(const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  return std::string(slash ? slash + 1 : file) + ":" + std::to_string(line);
}

}  // namespace

std::vector<LaunchProfile> end() {
  cudaDeviceSynchronize();
  int devices = 0;
  cudaGetDeviceCount(&devices);
  int current = 0;
  cudaGetDevice(&current);
  for (int d = 0; d < devices; ++d) {
    cudaSetDevice(d);
    cudaDeviceSynchronize();
  }
  cudaSetDevice(current);
  std::vector<std::shared_ptr<LaunchTrace>> launches;
  {
    Profiling& p = profiling();
    std::lock_guard<std::mutex> lock(p.mutex);
    p.active = false;
    launches.swap(p.launches);
  }
  std::vector<uintptr_t> pcs;
  for (const auto& t : launches) {
    for (const SiteCounts& s : t->result.sites) {
      const uintptr_t site = std::stoull(s.where);
      if (!(site & kEmulatedSite)) pcs.push_back(site);
    }
    for (const auto& [pc, n] : t->blocks_run) pcs.push_back(pc);
  }
  const std::map<uintptr_t, std::string> names = site_names(pcs);
  std::vector<LaunchProfile> out;
  for (const auto& t : launches) {
    LaunchProfile r = std::move(t->result);
    for (SiteCounts& s : r.sites) {
      const uintptr_t site = std::stoull(s.where);
      if (site & kEmulatedSite) {
        std::lock_guard<std::mutex> lock(g_sites_mutex);
        const auto& [file, line] = g_site_names[(site & ~kEmulatedSite) >> 1];
        s.where = basename_line(file, line);
      } else {
        auto it = names.find(site);
        s.where = it != names.end() ? it->second : "?";
      }
    }
    std::sort(r.sites.begin(), r.sites.end(), [](const SiteCounts& a, const SiteCounts& b) {
      return a.counts.sectors + a.counts.wavefronts > b.counts.sectors + b.counts.wavefronts;
    });
    if (!r.library && t->count_blocks) {
      std::map<std::string, double> lines_run;  // innermost "file:line" -> warp executions
      for (const auto& [pc, n] : t->blocks_run) {
        const auto it = names.find(pc);
        if (it == names.end()) continue;
        double& into = lines_run[it->second.substr(0, it->second.find(" <"))];
        into = std::max(into, n);
      }
      count_launch_instructions(r, t->kernel, lines_run);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace profile
// ---- the memcheck ------------------------------------------------------------------------------
bool memcheck_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MG_EMU_MEMCHECK");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return on;
}

void memcheck_access(const void* address, unsigned bytes, Op op, uintptr_t site) {
  uintptr_t start = 0;
  size_t size = 0;
  if (!past_end_of_allocation(address, bytes, &start, &size)) return;
  const std::map<uintptr_t, std::string> names = site_names({site});
  const auto it = names.find(site);
  const std::string offset = std::to_string(reinterpret_cast<uintptr_t>(address) - start);
  const std::string what = std::string("out-of-bounds ") + (op == Op::store ? "write" : "read") + " of " +
                           std::to_string(bytes) + " bytes at byte " + offset + " of a " +
                           std::to_string(size) + "-byte device allocation (MG_EMU_MEMCHECK)";
  device_fault(what.c_str(), it == names.end() ? "an instrumented kernel" : it->second.c_str(), -1);
}

}  // namespace mg_emu
