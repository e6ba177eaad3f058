// The L1s and the L2 of cache_model.h.
#include "cuda_emu/cache_model.h"

#include <algorithm>
#include <optional>
#include <stdexcept>

namespace mg_emu {

namespace {

constexpr double kSectorBytes = 32;

// An LRU set of sectors, each with a dirty bit. capacity 0: unbounded.
//
// A replay pushes every traced sector through it (millions per launch), so it allocates nothing
// per sector: the lines live in one array, linked most recent first by index, and an
// open-addressing table (linear probing, a power of two at most half full) maps a sector to its
// line. Freed lines are reused; a deletion shifts the entries after it back, so no tombstones.
class LruSectors {
 public:
  explicit LruSectors(uint64_t capacity) : capacity_(capacity) {
    if (capacity > kMaxLines) throw std::length_error("cache model: more than 2^31 sectors in one cache");
    grow_table(1024);  // and doubled as it fills: most launches touch far fewer sectors than fit
  }

  // Whether `sector` is held; if so it becomes the most recent.
  bool touch(uint64_t sector) {
    const uint32_t line = find(sector);
    if (line == kNone) return false;
    unlink(line);
    push_front(line);
    return true;
  }
  // Inserts `sector` (not held) as the most recent, evicting the least recent when full.
  void insert(uint64_t sector, bool dirty) {
    uint32_t line;
    if (!free_.empty()) {
      line = free_.back();
      free_.pop_back();
    } else {
      if (lines_.size() >= kMaxLines)
        throw std::length_error("cache model: more than 2^31 sectors in one cache");
      line = static_cast<uint32_t>(lines_.size());
      lines_.emplace_back();
    }
    lines_[line] = Line{sector, kNone, kNone, dirty};
    push_front(line);
    if (2 * held() > table_.size()) grow_table(2 * held());  // held() counts the new line
    table_[slot_for(sector)] = line + 1;
    if (capacity_ > 0 && held() > capacity_) remove(tail_);
  }
  // Marks a held sector dirty; true when it was clean (a new write-back is owed).
  bool make_dirty(uint64_t sector) {
    const uint32_t line = find(sector);
    if (line == kNone) throw std::logic_error("cache model: make_dirty of a sector not held");
    const bool was_clean = !lines_[line].dirty;
    lines_[line].dirty = true;
    return was_clean;
  }
  void erase(uint64_t sector) {
    const uint32_t line = find(sector);
    if (line != kNone) remove(line);
  }

 private:
  static constexpr uint32_t kNone = 0xffffffffu;
  uint64_t held() const { return lines_.size() - free_.size(); }  // the sectors held
  static constexpr uint64_t kMaxLines = uint64_t{1} << 31;
  struct Line {
    uint64_t sector;
    uint32_t newer, older;  // neighbours in recency order (kNone at the ends)
    bool dirty;
  };

  // Where `sector` is looked for first: Fibonacci hashing (the top bits of a multiplication).
  size_t home_slot(uint64_t sector) const {
    return static_cast<size_t>((sector * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  // The table slot that holds `sector`, or the empty one where it would go.
  size_t slot_for(uint64_t sector) const {
    size_t slot = home_slot(sector);
    while (table_[slot] != 0 && lines_[table_[slot] - 1].sector != sector) slot = (slot + 1) & mask_;
    return slot;
  }
  uint32_t find(uint64_t sector) const { return table_[slot_for(sector)] - 1; }  // kNone when empty
  void grow_table(uint64_t entries) {
    size_t size = 16;
    while (size < 2 * entries) size *= 2;
    if (size <= table_.size()) return;
    table_.assign(size, 0);
    mask_ = size - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(size));
    for (uint32_t line = head_; line != kNone; line = lines_[line].older) {
      table_[slot_for(lines_[line].sector)] = line + 1;
    }
  }
  void push_front(uint32_t line) {
    lines_[line].newer = kNone;
    lines_[line].older = head_;
    if (head_ != kNone) lines_[head_].newer = line;
    head_ = line;
    if (tail_ == kNone) tail_ = line;
  }
  void unlink(uint32_t line) {
    const Line& l = lines_[line];
    (l.newer != kNone ? lines_[l.newer].older : head_) = l.older;
    (l.older != kNone ? lines_[l.older].newer : tail_) = l.newer;
  }
  // Drops `line` from the order and the table (backward-shift deletion), and frees it.
  void remove(uint32_t line) {
    unlink(line);
    size_t hole = slot_for(lines_[line].sector);
    for (size_t next = (hole + 1) & mask_; table_[next] != 0; next = (next + 1) & mask_) {
      const size_t home = home_slot(lines_[table_[next] - 1].sector);
      // The entry at `next` may fill the hole when its home is not in (hole, next] (cyclically).
      const bool stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
      if (!stays) {
        table_[hole] = table_[next];
        hole = next;
      }
    }
    table_[hole] = 0;
    free_.push_back(line);
  }

  uint64_t capacity_;
  std::vector<Line> lines_;
  std::vector<uint32_t> free_;   // lines to reuse
  std::vector<uint32_t> table_;  // line + 1, or 0 for an empty slot
  size_t mask_ = 0;
  unsigned shift_ = 64;
  uint32_t head_ = kNone, tail_ = kNone;  // most and least recent
};

// A GPU's L2 as a set-associative cache of 128-byte lines, each holding up to four 32-byte sectors
// (a miss fetches the sector, not the line), LRU within a set. A line's set is a hash of its
// address, as the GPU's address-to-slice hash spreads lines over its L2 slices. The hash is why a
// working set a little under the capacity already loses hits: its lines land on the sets
// unevenly (about Poisson with a mean of ways x working set / capacity), and a set given more lines
// than it has ways thrashes under a cyclic sweep while the others hit. A fully associative LRU
// (LruSectors) turns from all hits to all misses at exactly the capacity instead.
//
// Each access scans the `ways` slots of one set, so it costs no allocation and no table.
class HashedSets {
 public:
  HashedSets(uint64_t capacity_bytes, int ways) : ways_(static_cast<size_t>(ways)) {
    const uint64_t lines = std::max<uint64_t>(capacity_bytes / kLineBytes, 1);
    if (ways < 1 || static_cast<uint64_t>(ways) > lines)
      throw std::invalid_argument("cache model: an L2 needs 1 to capacity / 128 ways");
    sets_ = lines / ways_;
    slots_.assign(sets_ * ways_, Slot{});
  }

  // Whether `sector` is held; if so its line becomes the most recent of its set.
  bool touch(uint64_t sector) {
    Slot* slot = find(sector / kSectorsPerLine);
    if (slot == nullptr || !(slot->valid & bit(sector))) return false;
    slot->last_use = ++clock_;
    return true;
  }
  // Brings in `sector` (not held): into its line when the line is there, else into the set's
  // least recent (or empty) slot, whose sectors are dropped.
  void insert(uint64_t sector, bool dirty) {
    const uint64_t line = sector / kSectorsPerLine;
    Slot* slot = find(line);
    if (slot == nullptr) {
      Slot* first = &slots_[set_of(line) * ways_];
      slot = std::min_element(first, first + ways_,
                              [](const Slot& a, const Slot& b) { return a.last_use < b.last_use; });
      *slot = Slot{line, 0, 0, 0};
    }
    slot->valid |= bit(sector);
    if (dirty) slot->dirty |= bit(sector);
    slot->last_use = ++clock_;
  }
  // Marks a held sector dirty; true when it was clean (a new write-back is owed).
  bool make_dirty(uint64_t sector) {
    Slot* slot = find(sector / kSectorsPerLine);
    if (slot == nullptr || !(slot->valid & bit(sector)))
      throw std::logic_error("cache model: make_dirty of a sector not held");
    const bool was_clean = !(slot->dirty & bit(sector));
    slot->dirty |= bit(sector);
    return was_clean;
  }

 private:
  static constexpr uint64_t kLineBytes = 128, kSectorsPerLine = 4;
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t line = kEmpty;
    uint64_t last_use = 0;         // 0: never used (an empty slot is the first victim)
    uint8_t valid = 0, dirty = 0;  // one bit per sector of the line
  };
  static uint8_t bit(uint64_t sector) { return static_cast<uint8_t>(1u << (sector % kSectorsPerLine)); }
  // A mixing hash of the line number (splitmix64's finaliser), its top 32 bits scaled onto
  // [0, sets). Not a plain multiplication: that spreads consecutive lines almost perfectly evenly
  // (Fibonacci hashing), which is the sharp edge again.
  size_t set_of(uint64_t line) const {
    uint64_t h = line;
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    return static_cast<size_t>(((h >> 32) * sets_) >> 32);
  }
  Slot* find(uint64_t line) {
    Slot* first = &slots_[set_of(line) * ways_];
    for (size_t w = 0; w < ways_; ++w)
      if (first[w].line == line) return &first[w];
    return nullptr;
  }

  size_t ways_;
  uint64_t sets_ = 1;
  uint64_t clock_ = 0;
  std::vector<Slot> slots_;
};

// The L2 a replay uses: the GPU's hashed sets, or a fully associative LRU (the hand-worked cases'
// exact one, and the unbounded L2 of the first-touch count).
class L2 {
 public:
  explicit L2(const CacheConfig& c) {
    if (c.l2_bytes > 0 && c.l2_ways > 0)
      sets_.emplace(c.l2_bytes, c.l2_ways);
    else
      lru_.emplace(c.l2_bytes / 32 + (c.l2_bytes > 0 && c.l2_bytes < 32 ? 1 : 0));
  }
  bool touch(uint64_t sector) { return sets_ ? sets_->touch(sector) : lru_->touch(sector); }
  void insert(uint64_t sector, bool dirty) {
    if (sets_)
      sets_->insert(sector, dirty);
    else
      lru_->insert(sector, dirty);
  }
  bool make_dirty(uint64_t sector) { return sets_ ? sets_->make_dirty(sector) : lru_->make_dirty(sector); }

 private:
  std::optional<HashedSets> sets_;
  std::optional<LruSectors> lru_;
};

// A block running on an SM: which one, and how far it has got.
struct Running {
  size_t block;                    // index into `blocks`
  size_t request;                  // its next request
  size_t wait;                     // rounds before its first request (the staggered start of a long grid)
  uint32_t step = 0;               // the step of its last request
  std::vector<uint64_t> fetching;  // sectors its L1 misses of that step brought in
};

}  // namespace

void BlockRequests::add(RequestKind kind, const std::vector<uint64_t>& request_sectors, uint32_t step) {
  if (step == kOwnStep) step = static_cast<uint32_t>(kinds.size());
  if (!steps.empty() && step < steps.back())
    throw std::invalid_argument("cache model: a block's request steps must not decrease");
  sectors.insert(sectors.end(), request_sectors.begin(), request_sectors.end());
  ends.push_back(static_cast<uint32_t>(sectors.size()));
  kinds.push_back(kind);
  steps.push_back(step);
}

CacheTraffic simulate_caches(const std::vector<BlockRequests>& blocks, const CacheConfig& config) {
  const size_t sms = static_cast<size_t>(std::max(1, config.sms));
  const size_t per_sm = static_cast<size_t>(std::max(1, config.blocks_per_sm));
  const uint64_t l1_sectors = config.l1_bytes_per_sm / 32;
  std::vector<LruSectors> l1(sms, LruSectors(l1_sectors));
  L2 l2(config);
  std::vector<CacheTraffic> per_block(blocks.size());

  // Each SM's blocks, in order, and the ones resident now.
  std::vector<std::vector<size_t>> queue(sms);
  for (size_t b = 0; b < blocks.size(); ++b) queue[b % sms].push_back(b);
  std::vector<size_t> next(sms, 0);
  std::vector<std::vector<Running>> resident(sms);
  // A grid longer than one wave runs in a steady state where the resident blocks are at different
  // points of their work: block b starts about b / (SMs x blocks_per_sm) of a block's length after
  // block 0, each taking the slot of one that finished. The first resident blocks are started so
  // (block b waits b x mean length / resident capacity rounds) and the refills follow by
  // themselves. A grid of one wave or less starts every block at once, as a GPU does.
  const size_t capacity = sms * per_sm;
  size_t mean_length = 0;
  for (const BlockRequests& b : blocks) mean_length += b.kinds.size();
  mean_length = blocks.empty() ? 0 : mean_length / blocks.size();
  const bool staggered = config.all_blocks > capacity;
  // When each block started and finished (in rounds), the round the last of the first resident
  // blocks started (from then on every slot is busy), and the round an SM first found no traced
  // block to start (from then on fewer blocks run at once than on the GPU, where the grid's
  // untraced blocks would follow).
  constexpr size_t kNever = ~size_t{0};
  std::vector<size_t> started(blocks.size(), kNever), finished(blocks.size(), kNever);
  size_t now = 0, ramped = 0, first_idle = kNever;
  auto refill = [&](size_t sm, bool first) {
    while (resident[sm].size() < per_sm && next[sm] < queue[sm].size()) {
      const size_t b = queue[sm][next[sm]++];
      const size_t wait = first && staggered ? b * mean_length / capacity : 0;
      resident[sm].push_back(Running{b, 0, wait, 0, {}});
      started[b] = now + wait;
      if (first) ramped = std::max(ramped, started[b]);
    }
  };
  for (size_t sm = 0; sm < sms; ++sm) refill(sm, true);

  auto to_l2 = [&](CacheTraffic& t, uint64_t sector, bool reads, bool writes) {
    t.l2_sectors += 1;
    if (l2.touch(sector)) {
      if (writes && l2.make_dirty(sector)) t.dram_written += kSectorBytes;
      return;
    }
    if (reads) t.dram_read += kSectorBytes;
    if (writes) t.dram_written += kSectorBytes;
    l2.insert(sector, writes);
  };

  bool any = true;
  for (; any; ++now) {  // one round: every resident block issues one request
    any = false;
    for (size_t sm = 0; sm < sms; ++sm) {
      for (size_t slot = 0; slot < resident[sm].size();) {
        Running& run = resident[sm][slot];
        const BlockRequests& b = blocks[run.block];
        if (run.wait > 0) {  // not started yet
          --run.wait;
          any = true;
          ++slot;
          continue;
        }
        if (run.request >= b.kinds.size()) {  // finished: the SM's next block takes the slot
          finished[run.block] = now;
          resident[sm].erase(resident[sm].begin() + static_cast<std::ptrdiff_t>(slot));
          refill(sm, false);
          if (resident[sm].size() < per_sm && first_idle == kNever) first_idle = now;
          continue;
        }
        any = true;
        CacheTraffic& t = per_block[run.block];
        const RequestKind kind = b.kinds[run.request];
        const uint32_t begin = run.request == 0 ? 0 : b.ends[run.request - 1], end = b.ends[run.request];
        if (b.steps[run.request] != run.step) {  // a new step: last step's fetches have landed
          run.step = b.steps[run.request];
          run.fetching.clear();
        }
        for (uint32_t i = begin; i < end; ++i) {
          const uint64_t s = b.sectors[i];
          switch (kind) {
            case RequestKind::load:
              if (l1_sectors > 0 && l1[sm].touch(s)) {
                t.l1_hit_sectors += 1;
                if (std::find(run.fetching.begin(), run.fetching.end(), s) != run.fetching.end())
                  t.l1_pending_sectors += 1;
              } else {
                to_l2(t, s, true, false);
                if (l1_sectors > 0) {
                  l1[sm].insert(s, false);
                  run.fetching.push_back(s);
                }
              }
              break;
            case RequestKind::load_bypassing_l1: to_l2(t, s, true, false); break;
            case RequestKind::store: to_l2(t, s, false, true); break;
            case RequestKind::atomic:
              l1[sm].erase(s);
              to_l2(t, s, true, true);
              break;
          }
        }
        ++run.request;
        ++slot;
      }
    }
  }

  // The steady state: the traced blocks that ran while every slot was busy -- started once the
  // first resident blocks all had, finished before an SM ran out of traced blocks to start. Those
  // before ran beside fewer blocks than on the GPU (the first ones replace predecessors that were
  // never traced), and so did those after, so less data passed through the caches between two uses
  // of a sector. A trace needs three waves or so to hold one SM's worth of them; a shorter one
  // takes the second half of its blocks (in block order; the first half warmed the caches).
  size_t full = 0;
  for (size_t b = 0; b < blocks.size(); ++b) full += started[b] >= ramped && finished[b] <= first_idle;
  const bool from_full = full >= sms;
  auto is_steady = [&](size_t b) {
    return from_full ? started[b] >= ramped && finished[b] <= first_idle : b >= blocks.size() / 2;
  };
  CacheTraffic total, steady;
  double steady_blocks = 0;
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (is_steady(b)) steady_blocks += 1;
    for (auto [into, from] : {std::pair{&total, &per_block[b]}, std::pair{&steady, &per_block[b]}}) {
      if (into == &steady && !is_steady(b)) continue;
      into->l1_hit_sectors += from->l1_hit_sectors;
      into->l1_pending_sectors += from->l1_pending_sectors;
      into->l2_sectors += from->l2_sectors;
      into->dram_read += from->dram_read;
      into->dram_written += from->dram_written;
    }
  }
  const double untraced = config.all_blocks > blocks.size() ? double(config.all_blocks - blocks.size()) : 0;
  if (untraced > 0 && steady_blocks > 0) {
    const double f = untraced / steady_blocks;
    total.l1_hit_sectors += steady.l1_hit_sectors * f;
    total.l1_pending_sectors += steady.l1_pending_sectors * f;
    total.l2_sectors += steady.l2_sectors * f;
    total.dram_read += steady.dram_read * f;
    total.dram_written += steady.dram_written * f;
  }
  return total;
}

}  // namespace mg_emu
