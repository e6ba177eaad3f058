// The CUDA caching allocator and copy routine, registered as mg's DeviceBackend.
//
// Why cache: cudaMalloc and cudaFree are slow (tens of microseconds up to
// milliseconds) and cudaFree synchronises the whole device, so a training step
// that allocated and freed every activation through them would crawl and lose
// all overlap. Instead a freed block goes to a free list and the next request
// of a similar size takes it back.
//
// The rules, in the order a request meets them:
//   1. Round the size up: to a multiple of 512 bytes below 1 MiB (small blocks),
//      to a multiple of 1 MiB above (large blocks). Rounding is what lets
//      slightly different sizes (a last, shorter batch) share blocks.
//   2. Look for a cached block of the same logical device and the same stream
//      whose size is at least the request and at most 2x (small) or the
//      request + 1/8 (large, at least 1 MiB): best fit, smallest first (blocks
//      still waiting for other streams included, see below).
//      Same stream: work queued on that stream that used the block is ordered
//      before any new work on it, so reusing it needs no synchronisation.
//   3. Otherwise cudaMalloc. If that fails for lack of memory, free every cached
//      block of the device (cudaFree; blocks waiting for other streams are
//      waited for first) and try once more; if it still fails, throw an
//      mg::Error saying what was asked and what is held.
//
// Other streams (record_stream). Stream order protects a block only on the
// stream it was allocated on. When a tensor is also used by work on another
// stream (a communication stream, a prefetch stream), record_stream(t, s) notes
// that stream on the block. Freeing such a block records an event on each noted
// stream, and the block joins its free list once all of those events have
// completed (checked with cudaEventQuery at the next allocation, never waited
// for); until then it counts as reserved, not allocated. This is what PyTorch's
// CUDACachingAllocator does; the alternative, a device-wide sync at every free,
// would serialise the streams the block was shared between. One step beyond
// PyTorch (rule 2 in allocate): such a pending block of the requesting stream
// competes with the free ones by size, and is taken with that stream made to
// wait on the device (cudaStreamWaitEvent) for those events -- the new
// tensor's work is ordered after the old users', exactly as safe, and which
// block a request gets no longer depends on when the host happens to query
// the events. A steady state that allocates nothing (FSDP's, whose gradient
// buffers the NCCL streams use) thus stays so under any load, instead of
// calling cudaMalloc whenever a communication stream runs late.
// Blocks are never split or merged; that keeps the bookkeeping readable at the
// cost of some fragmentation (PyTorch's allocator splits large blocks).
//
// Pinned host memory (PinnedHostPool below) is cached the same way, because
// cudaHostAlloc/cudaFreeHost are slower still (they map pages for the GPU).
// A host->device copy from a pinned block is asynchronous, so the block may
// still be read by the GPU after its tensor is gone: each such copy records
// an event on its stream, and a freed block is handed out again only when all
// of its events have completed (what PyTorch's CachingHostAllocator does).
// Also runs on the CPU under the emulator (MG_CUDA=EMULATE): see docs/cuda-emulation.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/cuda_check.cuh"
#include "base/error.h"
#include "core/allocator.h"
#include "core/cuda_allocator.h"
#include "core/cuda_device_checks.h"
#include "core/cuda_runtime.h"
#include "core/cuda_stream.h"
#include "core/tensor.h"

namespace mg::cuda {
namespace {

constexpr size_t kSmallLimit = size_t(1) << 20;  // 1 MiB
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t(1) << 20;
constexpr int kMaxDevices = 64;

size_t round_size(size_t nbytes) {
  if (nbytes == 0) nbytes = 1;
  const size_t unit = nbytes < kSmallLimit ? kSmallRound : kLargeRound;
  return (nbytes + unit - 1) / unit * unit;
}

bool fits(size_t block, size_t request) {
  if (block < request) return false;
  if (request < kSmallLimit) return block <= 2 * request;
  return block <= request + std::max(kLargeRound, request / 8);
}

// "4 PiB", "1.5 GiB", "512 bytes": the largest binary unit the size reaches, 4 significant digits.
std::string bytes_str(int64_t n) {
  static const char* const units[] = {"PiB", "TiB", "GiB", "MiB", "KiB"};
  for (int i = 0; i < 5; ++i) {
    const int64_t unit = int64_t(1) << (10 * (5 - i));
    if (n >= unit) {
      std::ostringstream os;
      os << std::setprecision(4) << static_cast<double>(n) / static_cast<double>(unit) << " " << units[i];
      return os.str();
    }
  }
  return str_cat(n, " bytes");
}

struct Block {
  size_t size = 0;
  int device = 0;             // logical
  void* stream = nullptr;     // the stream it was allocated on: the free list it returns to
  std::vector<Stream> users;  // other streams that use it (record_stream)
};

// MG_CUDA_NO_CACHING=1 (as PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING): every allocation is its
// own cudaMalloc of exactly the bytes asked for, every free a cudaFree. Slow, but a kernel that
// writes past a tensor then writes past an allocation, which the CUDA emulation's guard bytes,
// compute-sanitizer and AddressSanitizer all see (inside a cached block they cannot).
bool caching_disabled() {
  static const bool off = [] {
    const char* v = std::getenv("MG_CUDA_NO_CACHING");
    return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
  }();
  return off;
}

class CudaCachingAllocator {
 public:
  void* allocate(size_t nbytes, int device) {
    const size_t size = caching_disabled() ? std::max<size_t>(nbytes, 1) : round_size(nbytes);
    DeviceGuard guard(device);
    void* stream = current_stream(device).handle;
    std::lock_guard<std::mutex> lock(mutex_);
    collect_finished_frees();
    // 2. the smallest fitting block of this device and stream, free or pending. A pending block
    // was freed while other streams still used it (record_stream): this stream waits for what
    // they had queued at the free, on the device (no host wait), and takes it. Free and pending
    // blocks compete by size alone, so which block a request gets never depends on when the
    // host happens to see another stream finish -- a steady state that allocates nothing stays
    // so under any load. A tie goes to the free block (no wait).
    auto& pool = free_[device];
    auto free_block = pool.end();
    for (auto it = pool.lower_bound(size); it != pool.end() && fits(it->first, size); ++it)
      if (it->second.stream == stream) {
        free_block = it;
        break;
      }
    auto pending_block = pending_.end();
    for (auto it = pending_.begin(); it != pending_.end(); ++it)
      if (it->device == device && it->stream == stream && fits(it->size, size) &&
          (pending_block == pending_.end() || it->size < pending_block->size))
        pending_block = it;
    if (pending_block != pending_.end() &&
        (free_block == pool.end() || pending_block->size < free_block->first)) {
      for (const auto& entry : pending_block->events)
        MG_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), entry.first, 0));
      // A wait captures the event as recorded now: it may be recorded again for another block.
      for (const auto& [event, physical] : pending_block->events) spare_events_[physical].push_back(event);
      void* ptr = pending_block->ptr;
      take_cached(ptr, pending_block->size, device, stream);
      pending_.erase(pending_block);
      return ptr;
    }
    if (free_block != pool.end()) {
      void* ptr = free_block->second.ptr;
      take_cached(ptr, free_block->first, device, stream);
      pool.erase(free_block);
      return ptr;
    }
    // 3. cudaMalloc, once more after emptying this device's cache
    void* ptr = nullptr;
    cudaError_t err = cudaMalloc(&ptr, size);
    int64_t released = 0;
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      // Every logical device on this physical GPU (all of them under MG_VIRTUAL_GPUS) holds
      // cached blocks of the same memory: give all of those back, not only this device's.
      const int physical = physical_device(device);
      for (int d = 0; d < kMaxDevices; ++d) {
        if (free_[d].empty() && !has_pending_frees(d)) continue;  // (d is then a valid index)
        if (d != device && physical_device(d) != physical) continue;
        released += cached_[d];
        wait_for_pending_frees(d);
        release_cached(d);
      }
      err = cudaMalloc(&ptr, size);
    }
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      cudaGetLastError();
      throw Error(str_cat("CUDA out of memory on cuda:", device, " (physical GPU ", physical_device(device),
                          "): asked for ", bytes_str(int64_t(nbytes)), " (", nbytes, " bytes, rounded to ",
                          size, "); this process's caching allocator holds ",
                          bytes_str(stats_[device].allocated_bytes), " in live tensors (peak ",
                          bytes_str(stats_[device].peak_allocated_bytes), ") and had ", bytes_str(released),
                          " cached, which it returned to the driver (empty_cache) before ",
                          "retrying; the GPU reports ", bytes_str(int64_t(free_bytes)), " free of ",
                          bytes_str(int64_t(total_bytes)),
                          ". Free tensors that are no longer needed, or use a smaller batch"));
    }
    MG_CUDA_CHECK(err);
    ++stats_[device].system_allocations;
    live_[ptr] = Block{size, device, stream, {}};
    note_allocated(device, size);
    return ptr;
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = live_.find(ptr);
    if (found == live_.end()) return;
    const Block b = std::move(found->second);
    live_.erase(found);
    stats_[b.device].allocated_bytes -= static_cast<int64_t>(b.size);
    if (caching_disabled()) {  // cudaFree waits for the device: no stream still uses the block after
      DeviceGuard guard(b.device);
      MG_CUDA_CHECK(cudaFree(ptr));
      return;
    }
    cached_[b.device] += static_cast<int64_t>(b.size);
    if (b.users.empty()) {
      free_[b.device].emplace(b.size, Cached{ptr, b.stream});
      return;
    }
    // Used on other streams too: free it once what they have queued so far is done.
    PendingFree pending{ptr, b.size, b.device, b.stream, {}};
    for (const Stream& s : b.users) {
      DeviceGuard guard(s.device);
      const int physical = physical_device(s.device);
      cudaEvent_t event = take_event(physical);
      MG_CUDA_CHECK(cudaEventRecord(event, static_cast<cudaStream_t>(s.handle)));
      pending.events.emplace_back(event, physical);
    }
    pending_.push_back(std::move(pending));
  }

  // record_stream: the live block at `ptr` (of logical device `device`) is used by `stream` too.
  void record_stream(void* ptr, int device, Stream stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = live_.find(ptr);
    MG_CHECK(found != live_.end(), "record_stream: the tensor's memory on cuda:", device,
             " was not handed out by the CUDA caching allocator (or is already freed)");
    Block& b = found->second;
    if (stream.handle == b.stream && physical_device(stream.device) == physical_device(b.device)) return;
    for (const Stream& s : b.users)
      if (s == stream) return;
    b.users.push_back(stream);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int d = 0; d < kMaxDevices; ++d) {
      wait_for_pending_frees(d);
      if (!free_[d].empty()) release_cached(d);
    }
  }

  AllocatorStats stats(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    collect_finished_frees();
    AllocatorStats s = stats_[device];
    s.reserved_bytes = s.allocated_bytes + cached_[device];
    return s;
  }

  void reset_peak(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_[device].peak_allocated_bytes = stats_[device].allocated_bytes;
  }

 private:
  struct Cached {
    void* ptr;
    void* stream;
  };

  // A freed block that other streams may still use, with an event recorded on each of them at
  // free time (and the physical GPU each event belongs to, for the spare-event pool).
  struct PendingFree {
    void* ptr;
    size_t size;
    int device;  // logical
    void* stream;
    std::vector<std::pair<cudaEvent_t, int>> events;
  };

  // Caller holds mutex_. An event of physical GPU `physical` (the current device), from the
  // spares when there is one: creating events costs microseconds, and a training step with a
  // communication stream frees many shared blocks.
  cudaEvent_t take_event(int physical) {
    std::vector<cudaEvent_t>& spare = spare_events_[physical];
    if (!spare.empty()) {
      cudaEvent_t e = spare.back();
      spare.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // Caller holds mutex_. Moves each pending block whose events have all completed to its
  // free list. Never waits.
  void collect_finished_frees() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      bool done = true;
      for (const auto& [event, physical] : it->events) {
        const cudaError_t status = cudaEventQuery(event);
        if (status == cudaErrorNotReady) {
          cudaGetLastError();
          done = false;
          break;
        }
        MG_CUDA_CHECK(status);
      }
      if (!done) {
        ++it;
        continue;
      }
      finish_pending(*it);
      it = pending_.erase(it);
    }
  }

  // Caller holds mutex_.
  bool has_pending_frees(int device) const {
    for (const PendingFree& p : pending_)
      if (p.device == device) return true;
    return false;
  }

  // Caller holds mutex_. Waits for the events of every pending block of logical device
  // `device` and moves those blocks to their free lists (empty_cache and the out-of-memory
  // retry: a block still in use elsewhere cannot be given back to the driver).
  void wait_for_pending_frees(int device) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->device != device) {
        ++it;
        continue;
      }
      for (const auto& entry : it->events) MG_CUDA_CHECK(cudaEventSynchronize(entry.first));
      finish_pending(*it);
      it = pending_.erase(it);
    }
  }

  void finish_pending(PendingFree& p) {
    for (const auto& [event, physical] : p.events) spare_events_[physical].push_back(event);
    free_[p.device].emplace(p.size, Cached{p.ptr, p.stream});
  }

  // Caller holds mutex_. A cached block handed out again.
  void take_cached(void* ptr, size_t size, int device, void* stream) {
    live_[ptr] = Block{size, device, stream, {}};
    note_allocated(device, size);
    cached_[device] -= static_cast<int64_t>(size);
    ++stats_[device].cache_hits;
  }

  void note_allocated(int device, size_t size) {
    AllocatorStats& s = stats_[device];
    s.allocated_bytes += static_cast<int64_t>(size);
    if (s.allocated_bytes > s.peak_allocated_bytes) s.peak_allocated_bytes = s.allocated_bytes;
  }

  // Caller holds mutex_. cudaFree waits for the device, so queued work that
  // still used a cached block finishes before the block goes back.
  void release_cached(int device) {
    DeviceGuard guard(device);
    for (auto& entry : free_[device]) MG_CUDA_CHECK(cudaFree(entry.second.ptr));
    free_[device].clear();
    cached_[device] = 0;
  }

  std::mutex mutex_;
  std::array<std::multimap<size_t, Cached>, kMaxDevices> free_;
  std::list<PendingFree> pending_;  // freed, waiting for other streams (usually empty)
  std::array<std::vector<cudaEvent_t>, kMaxDevices> spare_events_;  // by physical GPU
  std::unordered_map<void*, Block> live_;
  std::array<int64_t, kMaxDevices> cached_{};
  std::array<AllocatorStats, kMaxDevices> stats_{};
};

class PinnedHostPool {
 public:
  void* allocate(size_t nbytes) {
    const size_t size = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.lower_bound(size); it != free_.end() && fits(it->first, size); ++it) {
      PinnedBlock& b = blocks_.at(it->second);
      if (!copies_finished(b)) continue;  // the GPU may still read it
      void* ptr = it->second;
      b.live = true;
      free_.erase(it);
      return ptr;
    }
    void* ptr = nullptr;
    const cudaError_t err = cudaHostAlloc(&ptr, size, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw Error(str_cat("pinned host memory: cudaHostAlloc of ", bytes_str(int64_t(size)), " failed (",
                          bytes_str(int64_t(live_bytes())), " pinned in live tensors, ", free_.size(),
                          " cached blocks)"));
    }
    MG_CUDA_CHECK(err);
    blocks_[ptr] = PinnedBlock{size, true, {}};
    return ptr;
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = blocks_.find(ptr);
    if (found == blocks_.end() || !found->second.live) return;
    found->second.live = false;
    free_.emplace(found->second.size, ptr);
  }

  // After queuing an async copy that reads `src` on `stream`: if `src` lies in a
  // pinned block, records an event there so the block is not reused before the
  // copy is done. The caller has made the stream's device current.
  void record_read(const void* src, cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto after = blocks_.upper_bound(const_cast<void*>(src));
    if (after == blocks_.begin()) return;
    auto block = std::prev(after);
    const char* begin = static_cast<const char*>(block->first);
    if (static_cast<const char*>(src) >= begin + block->second.size) return;  // not pinned
    // A block that stays live and is copied from again and again (a staging buffer) would
    // otherwise pile up one event per copy until it is freed: drop the finished ones first.
    drop_finished_copies(block->second);
    cudaEvent_t event = nullptr;
    MG_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    const cudaError_t recorded = cudaEventRecord(event, stream);
    if (recorded != cudaSuccess) cudaEventDestroy(event);  // not leaked when the record fails
    MG_CUDA_CHECK(recorded);
    block->second.pending.push_back(event);
  }

 private:
  struct PinnedBlock {
    size_t size = 0;
    bool live = false;
    std::vector<cudaEvent_t> pending;  // copies that read the block, not known to be finished
  };

  // Caller holds mutex_. Drops (and destroys) the events that have completed, whichever
  // stream they were on; never waits.
  static void drop_finished_copies(PinnedBlock& b) {
    for (auto it = b.pending.begin(); it != b.pending.end();) {
      const cudaError_t status = cudaEventQuery(*it);
      if (status == cudaErrorNotReady) {
        cudaGetLastError();
        ++it;
        continue;
      }
      MG_CUDA_CHECK(status);
      MG_CUDA_CHECK(cudaEventDestroy(*it));
      it = b.pending.erase(it);
    }
  }

  // Caller holds mutex_. Drops the events that have completed; true when none is left.
  static bool copies_finished(PinnedBlock& b) {
    drop_finished_copies(b);
    return b.pending.empty();
  }

  size_t live_bytes() const {
    size_t n = 0;
    for (const auto& entry : blocks_)
      if (entry.second.live) n += entry.second.size;
    return n;
  }

  std::mutex mutex_;
  std::map<void*, PinnedBlock> blocks_;  // every block, by address (ordered: record_read looks up ranges)
  std::multimap<size_t, void*> free_;    // the freed ones, by size
};

PinnedHostPool& pinned_pool() {
  static PinnedHostPool* instance = new PinnedHostPool();  // leaked, as allocator()
  return *instance;
}

CudaCachingAllocator& allocator() {
  // Leaked on purpose: tensors in static objects may be freed after main returns,
  // when a destroyed allocator (or an unloaded runtime) would crash.
  static CudaCachingAllocator* instance = new CudaCachingAllocator();
  return *instance;
}

// Copies between host and device or two devices, ordered on the current streams.
//   host -> device    cudaMemcpyAsync on the destination's stream. From pageable
//                     host memory it returns once the bytes are staged, so the
//                     source may be reused right away. From pinned memory it
//                     returns at once; the pinned pool keeps the block from
//                     being reused until the copy's event completes.
//   device -> host    cudaMemcpyAsync, then wait for the stream: the caller reads
//                     the host buffer next.
//   device -> device  the destination's stream first waits for the source's
//                     (the data must be written), copies, and then the source's
//                     stream waits for the copy (the source block may be freed
//                     and reused on its own stream right after we return).
void copy(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (src_device.is_cpu()) {
    DeviceGuard guard(dst_device.index);
    const Stream s = current_stream(dst_device.index);
    MG_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(s.handle)));
    pinned_pool().record_read(src, static_cast<cudaStream_t>(s.handle));
    return;
  }
  if (dst_device.is_cpu()) {
    DeviceGuard guard(src_device.index);
    const Stream s = current_stream(src_device.index);
    MG_CUDA_CHECK(
        cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(s.handle)));
    MG_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));
    raise_device_check_errors();  // the host waited anyway: the kernels' deferred checks have landed
    return;
  }
  const Stream src_stream = current_stream(src_device.index);
  const Stream dst_stream = current_stream(dst_device.index);
  const bool same_stream =
      src_stream == dst_stream || (physical_device(src_device.index) == physical_device(dst_device.index) &&
                                   src_stream.handle == dst_stream.handle);
  if (!same_stream) {
    Event source_ready;
    source_ready.record(src_stream);
    source_ready.wait(dst_stream);
  }
  {
    DeviceGuard guard(dst_device.index);
    const int dst_phys = physical_device(dst_device.index), src_phys = physical_device(src_device.index);
    auto stream = static_cast<cudaStream_t>(dst_stream.handle);
    if (dst_phys == src_phys) {
      MG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream));
    } else {
      MG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_phys, src, src_phys, nbytes, stream));
    }
  }
  if (!same_stream) {
    Event copied;
    copied.record(dst_stream);
    copied.wait(src_stream);
  }
}

std::once_flag g_register_once;

void register_now() {
  DeviceBackend backend;
  backend.allocate = [](size_t nbytes, Device device) { return allocator().allocate(nbytes, device.index); };
  backend.free = [](void* ptr, size_t, Device) { allocator().free(ptr); };
  backend.copy = copy;
  backend.allocate_pinned = [](size_t nbytes) { return pinned_pool().allocate(nbytes); };
  backend.free_pinned = [](void* ptr, size_t) { pinned_pool().free(ptr); };
  register_cuda_backend(backend);
}

// The backend is registered whenever a GPU is usable, as every framework does
// (core/cuda_allocator.h); MG_CUDA_BACKEND=0 opts out. Every op the examples and the model zoo
// use has a CUDA kernel, run by the gpu tests under the CUDA emulation in every CI run, and DDP
// on CUDA tensors goes over the NCCL process group. Not at library load: load only hands this
// finder to core/allocator.cpp, whose first cuda_backend() call runs it (lazy init, as PyTorch's).
// Done at load (cudaGetDeviceCount in a static initialiser), it kept compute-sanitizer from
// attaching on an H200: "CUDA initialized before the Sanitizer" in every test binary (2026-12-04).
void find_backend() {
  const char* env = std::getenv("MG_CUDA_BACKEND");
  if (env != nullptr && env[0] == '0' && env[1] == '\0') return;
  if (device_count() == 0) return;
  std::call_once(g_register_once, register_now);
}
[[maybe_unused]] const bool g_finder_registered_at_load = (register_cuda_backend_finder(find_backend), true);

void check_index(int device) {
  MG_CHECK(device >= 0 && device < kMaxDevices, "cuda memory stats: bad device index ", device);
}

}  // namespace

void enable_backend() {
  MG_CHECK(device_count() > 0, "mg::cuda::enable_backend: ", describe_devices());
  std::call_once(g_register_once, register_now);
}

bool backend_enabled() { return cuda_backend() != nullptr; }

AllocatorStats memory_stats(int device) {
  check_index(device);
  return allocator().stats(device);
}

void reset_peak_memory_stats(int device) {
  check_index(device);
  allocator().reset_peak(device);
}

void empty_cache() { allocator().empty_cache(); }

void record_stream(const Tensor& t, Stream stream) {
  MG_CHECK(t.defined(), "record_stream: the tensor is undefined");
  MG_CHECK(t.device().is_cuda(), "record_stream: the tensor is on ", t.device(),
           "; only CUDA tensors belong to the caching allocator");
  const int device = t.device().index;
  MG_CHECK(physical_device(stream.device) == physical_device(device),
           "record_stream: the tensor lives on cuda:", device,
           " but the stream belongs to cuda:", stream.device);
  allocator().record_stream(t.storage()->data(), device, stream);
}

}  // namespace mg::cuda
