// Counting a launch's warp instructions from nvcc's PTX (ptx_count.h says how and how exactly).
#include "cuda_emu/ptx_count.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <tuple>

namespace mg_emu::ptx {

namespace {
bool debug_blocks() {
  static const bool on = [] {
    const char* v = std::getenv("MG_EMU_PTX_BLOCKS");
    return v != nullptr && *v != '\0' && *v != '0';
  }();
  return on;
}
}  // namespace

using profile::Space;

// ---- what the tracer saw, by source line ---------------------------------------------------------
std::vector<LineAccesses> line_accesses(const std::vector<profile::SiteCounts>& sites) {
  std::map<std::tuple<std::string, std::string, Access, Space>, LineAccesses> by;  // (where, outer, ...)
  for (const profile::SiteCounts& s : sites) {
    const size_t cut = s.where.find(" < ");
    const std::string where = s.where.substr(0, cut);
    const std::string outer = cut == std::string::npos ? std::string() : s.where.substr(cut + 3);
    Access a = Access::load;
    switch (s.op) {
      case profile::Op::load: a = Access::load; break;
      case profile::Op::store: a = Access::store; break;
      case profile::Op::atomic: a = Access::atomic; break;
      case profile::Op::ldmatrix: a = Access::ldmatrix; break;
      case profile::Op::mma: a = Access::mma; break;
      case profile::Op::cp_async: a = Access::cp_async; break;
    }
    LineAccesses& l = by[{where, outer, a, s.space}];
    l.where = where;
    l.outer = outer;
    l.access = a;
    l.space = s.space;
    l.requests += s.counts.requests;
    l.lane_bytes += s.counts.lane_bytes;
    l.lanes += s.counts.lanes;
  }
  std::vector<LineAccesses> out;
  for (auto& [key, l] : by) out.push_back(l);
  return out;
}

// ---- the count ------------------------------------------------------------------------------------------
namespace {

// Continue a do-while loop of one block: its counter starts at `init`, steps by `step` before or
// after the compare, and the loop goes on while `cmp` holds. Trips, or 0 when not constant.
double trips_of(long long init, long long step, long long bound, const std::string& cmp, bool step_first) {
  if (step == 0) return 0;
  auto holds = [&](long long v) {
    if (cmp == "lt" || cmp == "lo") return v < bound;
    if (cmp == "le" || cmp == "ls") return v <= bound;
    if (cmp == "gt" || cmp == "hi") return v > bound;
    if (cmp == "ge" || cmp == "hs") return v >= bound;
    if (cmp == "ne") return v != bound;
    if (cmp == "eq") return v == bound;
    return false;
  };
  long long v = init;
  for (long long trips = 1; trips <= 100000000; ++trips) {
    if (step_first) v += step;
    const bool again = holds(v);
    if (!step_first) v += step;
    if (!again) return static_cast<double>(trips);
  }
  return 0;
}

std::string negated(const std::string& cmp) {
  static const std::map<std::string, std::string> n = {{"eq", "ne"}, {"ne", "eq"}, {"lt", "ge"}, {"ge", "lt"},
                                                       {"le", "gt"}, {"gt", "le"}, {"lo", "hs"}, {"hs", "lo"},
                                                       {"ls", "hi"}, {"hi", "ls"}};
  const auto it = n.find(cmp);
  return it == n.end() ? "" : it->second;
}

// The constant value a register holds when the block `before` ends, following moves back.
bool constant_before(const Function& f, int before, std::string reg, long long* value) {
  for (int hops = 0; hops < 4; ++hops) {
    bool found = false;
    for (int b = before; b >= 0 && !found; --b) {
      const std::vector<Instruction>& ins = f.blocks[static_cast<size_t>(b)].instructions;
      for (auto it = ins.rbegin(); it != ins.rend(); ++it) {
        if (it->dest() != reg) continue;
        if (it->opcode.rfind("mov.", 0) != 0 || it->operands.size() != 2 || !it->guard.empty()) return false;
        if (parse_integer(it->operands[1], value)) return true;
        reg = it->operands[1];
        before = b;
        found = true;
        break;
      }
    }
    if (!found) return false;
  }
  return false;
}

// Trips of a loop of the one block `b` (it branches back to itself) with a constant counter, else 0.
double constant_trips(const Function& f, int b) {
  const std::vector<Instruction>& ins = f.blocks[static_cast<size_t>(b)].instructions;
  if (ins.empty() || ins.back().opcode != "bra" || ins.back().guard.empty()) return 0;
  const std::string guard = ins.back().guard;
  const bool negate = guard[1] == '!';
  const std::string pred = guard.substr(negate ? 2 : 1);
  int setp = -1, add = -1;
  for (int i = static_cast<int>(ins.size()) - 1; i >= 0; --i)
    if (ins[static_cast<size_t>(i)].dest() == pred &&
        ins[static_cast<size_t>(i)].opcode.rfind("setp.", 0) == 0) {
      setp = i;
      break;
    }
  if (setp < 0) return 0;
  const Instruction& s = ins[static_cast<size_t>(setp)];
  if (s.operands.size() != 3) return 0;
  const std::string counter = s.operands[1];
  long long bound = 0, step = 0, init = 0;
  if (!parse_integer(s.operands[2], &bound)) return 0;
  for (int i = 0; i < static_cast<int>(ins.size()); ++i) {
    const Instruction& a = ins[static_cast<size_t>(i)];
    if (a.dest() != counter) continue;
    const bool is_add = a.opcode.rfind("add.", 0) == 0, is_sub = a.opcode.rfind("sub.", 0) == 0;
    if ((!is_add && !is_sub) || a.operands.size() != 3 || a.operands[1] != counter ||
        !parse_integer(a.operands[2], &step) || add >= 0)
      return 0;
    if (is_sub) step = -step;
    add = i;
  }
  if (add < 0 || !constant_before(f, b - 1, counter, &init)) return 0;
  std::string cmp = split(s.opcode, '.').size() > 1 ? split(s.opcode, '.')[1] : "";
  if (negate) cmp = negated(cmp);
  return trips_of(init, step, bound, cmp, add < setp);
}

}  // namespace

namespace {

// "file.cu:line" of an instruction, and of the .cu line a header's line was inlined into ("" when
// none: Instruction::call_line).
std::string line_of(const Function& f, const Instruction& in) {
  const std::string& path =
      in.file > 0 && static_cast<size_t>(in.file) < f.files.size() ? f.files[in.file] : "";
  return basename_of(path) + ":" + std::to_string(in.line);
}
std::string call_of(const Function& f, const Instruction& in) {
  if (in.call_file <= 0 || static_cast<size_t>(in.call_file) >= f.files.size()) return std::string();
  return basename_of(f.files[in.call_file]) + ":" + std::to_string(in.call_line);
}

// What the tracer saw of a kernel's memory lines, matched to its PTX instructions. Both sides name
// an access in a header by its line and the first .cu line of its inlining chain: the tracer's site
// "row_packs.cuh:87 < layer_norm.cu:110", the PTX's .loc line and its inlined_at walked up
// (Instruction::call_line). An instruction is matched, per access kind, by its line and call where
// the tracer saw that pair (one helper line called for a row in global memory and for weights
// staged in shared memory is two keys, each with its own counts and space), else by its line, with
// the tracer's requests on that line that no instruction matched by its call.
//
// A generic access whose line the tracer did not see at all takes the space the tracer saw most in
// its call: nvcc and the CPU build can put one access on different lines of a helper (a load
// folded into a memcpy: 89 in the PTX, 87 in the CPU build). Its counts are not matched so: a
// call's lines are often a vector path and a scalar one, and the call alone cannot tell which ran.
class SeenLines {
 public:
  using Key = std::pair<std::string, Access>;  // "a.cuh:87 < b.cu:110" or "a.cuh:87"

  SeenLines(const Function& f, const std::vector<LineAccesses>& seen) : f_(f) {
    std::set<std::tuple<std::string, std::string, Access>> traced;
    for (const LineAccesses& l : seen) traced.insert({l.where, l.outer, l.access});
    for (const Block& b : f.blocks)
      for (const Instruction& in : b.instructions) {
        const std::string call = call_of(f, in);
        if (in.access != Access::none && !call.empty() &&
            traced.count({line_of(f, in), call, in.access}) != 0)
          calls_.insert({line_of(f, in), call, in.access});
      }
    // Request-bytes per lane per key, summed over the spaces (a helper's line called with a global
    // and a shared pointer) but the largest for a cp.async (a global read and a shared write of the
    // same instruction), and the space with the most of them; per call, the space with the most.
    std::map<std::tuple<Key, Space>, double> per_space, per_call_space;
    for (const LineAccesses& l : seen) {
      const double width = l.lanes > 0 && l.lane_bytes > 0 ? l.lane_bytes / l.lanes : 1;
      const bool by_call = calls_.count({l.where, l.outer, l.access}) != 0;
      per_space[{Key{by_call ? l.where + " < " + l.outer : l.where, l.access}, l.space}] +=
          l.requests * width;
      if (!l.outer.empty()) per_call_space[{Key{l.outer, l.access}, l.space}] += l.requests * width;
    }
    std::map<Key, double> most;
    for (const auto& [key_space, b] : per_space) {
      const auto& [key, space] = key_space;
      bytes_[key] = key.second == Access::cp_async ? std::max(bytes_[key], b) : bytes_[key] + b;
      if (b > most[key]) {
        most[key] = b;
        space_[key] = space;
      }
    }
    most.clear();
    for (const auto& [key_space, b] : per_call_space) {
      const auto& [key, space] = key_space;
      if (b > most[key]) {
        most[key] = b;
        call_space_[key] = space;
      }
    }
  }

  bool empty() const { return bytes_.empty(); }

  Key key_of(const Instruction& in) const {
    const std::string line = line_of(f_, in), call = call_of(f_, in);
    if (!call.empty() && calls_.count({line, call, in.access}) != 0) return {line + " < " + call, in.access};
    return {line, in.access};
  }

  // Request-bytes per lane the tracer saw for `key`; < 0: none.
  double bytes(const Key& key) const {
    const auto it = bytes_.find(key);
    return it == bytes_.end() ? -1 : it->second;
  }

  // Where a generic access went: its key's space (the most bytes' where the tracer saw two); for a
  // line the tracer never saw, its call's; else global.
  Space space_of(const Instruction& in) const {
    const auto it = space_.find(key_of(in));
    if (it != space_.end()) return it->second;
    const auto at = call_space_.find({call_of(f_, in), in.access});
    return at != call_space_.end() ? at->second : Space::global;
  }

 private:
  const Function& f_;
  std::set<std::tuple<std::string, std::string, Access>> calls_;  // (line, call, access) the tracer saw
  std::map<Key, double> bytes_;
  std::map<Key, Space> space_;
  std::map<Key, Space> call_space_;
};

}  // namespace

profile::InstructionMix count(const Function& f, const std::vector<LineAccesses>& seen, double warps,
                              const std::map<std::string, double>& lines_run) {
  const SeenLines seen_lines(f, seen);
  auto key_of = [&](const Instruction& in) { return seen_lines.key_of(in); };
  // Where each line's accesses are: bytes per lane of its PTX instructions, per block.
  using Key = std::pair<std::string, Access>;
  std::map<Key, std::map<size_t, double>> block_bytes;
  for (size_t k = 0; k < f.blocks.size(); ++k)
    for (const Instruction& in : f.blocks[k].instructions)
      if (in.access != Access::none) block_bytes[key_of(in)][k] += std::max(1, in.bytes_per_lane);

  profile::InstructionMix mix;
  mix.counted = true;
  mix.load_round_trips = 0;
  std::vector<double> runs(f.blocks.size(), 0), reached(f.blocks.size(), 0);
  std::vector<std::vector<InstructionKind>> block_kinds(f.blocks.size());
  std::map<std::string, int> label_of;
  for (size_t k = 0; k < f.blocks.size(); ++k)
    if (!f.blocks[k].label.empty()) label_of[f.blocks[k].label] = static_cast<int>(k);
  // What the CPU build saw of a block's own lines: the most warp executions of a basic block that
  // began at one of them, or of a memory access on one of them; -1 when none was seen.
  std::map<std::string, double> accessed;
  {
    std::map<std::tuple<std::string, Access, Space>, double> requests;  // over the chains' outer lines
    for (const LineAccesses& l : seen) requests[{l.where, l.access, l.space}] += l.requests;
    for (const auto& [key, n] : requests)
      accessed[std::get<0>(key)] = std::max(accessed[std::get<0>(key)], n);
  }
  auto activity = [&](size_t b) {
    double most = -1;
    for (const Instruction& in : f.blocks[b].instructions) {
      const std::string line = line_of(f, in);
      if (const auto it = lines_run.find(line); it != lines_run.end()) most = std::max(most, it->second);
      if (const auto it = accessed.find(line); it != accessed.end()) most = std::max(most, it->second);
    }
    return most;
  };
  // Whether block k ran, from its memory instructions alone: 1 when the tracer saw one of their
  // lines; 0 when the launch traced accesses but none on any of them (a store or load the CPU
  // build never made: the block did not run); -1 when no memory instruction says (none, or only
  // generic ones, which may be a stack frame the tracer does not see).
  std::vector<int> evidence(f.blocks.size(), -1);
  if (!seen_lines.empty()) {
    for (size_t k = 0; k < f.blocks.size(); ++k) {
      for (const Instruction& in : f.blocks[k].instructions) {
        if (in.access == Access::none) continue;
        if (seen_lines.bytes(key_of(in)) >= 0) {
          evidence[k] = 1;
        } else if (!in.generic) {
          evidence[k] = std::max(evidence[k], 0);
        }
      }
    }
  }
  // How each block ends, read once: its branch target (-1: none, or a label not in the function),
  // whether the branch is conditional, and whether control stops there (ret, exit, an indirect or
  // unconditional branch) instead of falling through to the next block.
  struct Exit {
    int to = -1;
    bool conditional = false;
    bool stops = false;
  };
  std::vector<Exit> exits(f.blocks.size());
  for (size_t k = 0; k < f.blocks.size(); ++k) {
    const std::vector<Instruction>& ins = f.blocks[k].instructions;
    const std::string op = ins.empty() ? "" : ins.back().opcode;
    const bool branch = op == "bra" || op == "bra.uni";
    exits[k].conditional = branch && !ins.back().guard.empty();
    exits[k].stops =
        op == "ret" || op == "exit" || op.rfind("brx", 0) == 0 || (branch && !exits[k].conditional);
    if (branch && !ins.back().operands.empty()) {
      const auto t = label_of.find(ins.back().operands[0]);
      if (t != label_of.end()) exits[k].to = t->second;
    }
  }
  // The blocks reachable from `from` by forward edges only (a loop's way back leads to blocks
  // already counted): the branch target when it lies ahead, and the fall-through.
  auto reachable = [&](size_t from) {
    std::vector<char> in(f.blocks.size(), 0);
    std::vector<size_t> pending = {from};
    in[from] = 1;
    auto visit = [&](size_t next) {
      if (next < f.blocks.size() && !in[next]) {
        in[next] = 1;
        pending.push_back(next);
      }
    };
    while (!pending.empty()) {
      const size_t k = pending.back();
      pending.pop_back();
      if (exits[k].to > static_cast<int>(k)) visit(static_cast<size_t>(exits[k].to));
      if (!exits[k].stops) visit(k + 1);
    }
    return in;
  };
  // A conditional branch at the end of block p splits its runs between the way taken (to `to`)
  // and the fall-through. The share taken, from what the tracer saw:
  //   1. the memory instructions of the blocks only one way reaches (blocks both ways reach say
  //      nothing about the choice; `evidence`): a way whose own accesses were never made, when the
  //      other's were or are not known, is not taken;
  //   2. else the lines of the two blocks the branch goes to (`activity`): as often as each ran,
  //      all to one way when only its lines ran (a `switch` over an op's kind counts the case
  //      taken, not every case);
  //   3. else evenly.
  auto taken_share = [&](size_t p, int to) {
    const std::vector<char> reach_taken = reachable(static_cast<size_t>(to)), reach_fall = reachable(p + 1);
    int m_taken = -1, m_fall = -1;
    for (size_t k = 0; k < f.blocks.size(); ++k) {
      if (reach_taken[k] && !reach_fall[k]) m_taken = std::max(m_taken, evidence[k]);
      if (reach_fall[k] && !reach_taken[k]) m_fall = std::max(m_fall, evidence[k]);
    }
    if (m_taken == 0 && m_fall != 0) return 0.0;
    if (m_fall == 0 && m_taken != 0) return 1.0;
    if (lines_run.empty()) return 0.5;  // a build without the CPU's basic blocks
    const double a_taken = activity(static_cast<size_t>(to)), a_fall = activity(p + 1);
    if (a_taken > 0 && a_fall > 0) return a_taken / (a_taken + a_fall);
    if (a_taken > 0 && a_fall < 0) return 1.0;
    if (a_fall > 0 && a_taken < 0) return 0.0;
    return 0.5;
  };
  // How often control reaches block k from the blocks before it: each forward edge carries its
  // source's count; a conditional branch splits it between its two ways by what the tracer saw of
  // the blocks only that way reaches (taken_share, above); the way out of a loop (a latch's
  // fall-through) carries the count the loop was entered with.
  std::vector<double> share_of(f.blocks.size(), -1);  // taken_share of each branch, once
  auto reach = [&](size_t k) {
    if (k == 0) return warps;
    double n = 0;
    for (size_t p = 0; p < k; ++p) {
      const int to = exits[p].to;
      const bool conditional = exits[p].conditional, stops = exits[p].stops;
      const bool forward = to > static_cast<int>(p);
      if (conditional && forward && p + 1 < f.blocks.size() && share_of[p] < 0)
        share_of[p] = taken_share(p, to);
      const double share = conditional && forward && p + 1 < f.blocks.size() ? share_of[p] : 1.0;
      if (to == static_cast<int>(k) && forward) n += runs[p] * share;
      if (p + 1 == k && !stops) {
        if (to >= 0 && !forward) {
          n += reached[static_cast<size_t>(to)];  // leaving a loop: once per entry
        } else {
          n += runs[p] * (conditional ? 1.0 - share : 1.0);
        }
      }
    }
    return n;
  };
  // How often each block holding a line's accesses ran, from what the tracer saw of the line. One
  // block: seen / its bytes. Several with as many copies each (both arms of a branch): evenly.
  // An unrolled loop and its remainder (the main block has U times the copies): the remainder
  // loop runs (U - 1) / 2 times per entry (trip counts spread evenly modulo U), entered as often
  // as the block before the first of them ran; the main loop gets the rest.
  std::map<Key, std::map<size_t, double>> allocation;
  auto allocate = [&](const Key& key, double seen_total) {
    const std::map<size_t, double>& blocks = block_bytes[key];
    double smallest = 1e300, largest = 0, all = 0;
    for (const auto& [k, bytes] : blocks) {
      smallest = std::min(smallest, bytes);
      largest = std::max(largest, bytes);
      all += bytes;
    }
    std::map<size_t, double> out;
    if (largest == smallest) {
      for (const auto& [k, bytes] : blocks) out[k] = seen_total / all;
      return out;
    }
    const double entry = reached[blocks.begin()->first];
    double left = seen_total, main_bytes = 0;
    for (const auto& [k, bytes] : blocks) {
      if (bytes == largest) {
        main_bytes += bytes;
        continue;
      }
      out[k] = std::min(seen_total / all, entry * (largest / bytes - 1) / 2);
      left -= out[k] * bytes;
    }
    for (const auto& [k, bytes] : blocks)
      if (bytes == largest) out[k] = std::max(0.0, left) / main_bytes;
    return out;
  };
  for (size_t k = 0; k < f.blocks.size(); ++k) {
    const Block& b = f.blocks[k];
    reached[k] = reach(k);
    std::vector<double> votes;
    for (const Instruction& in : b.instructions) {
      if (in.access == Access::none) continue;
      const Key key = key_of(in);
      const double bytes = seen_lines.bytes(key);
      if (bytes < 0) continue;
      if (allocation.find(key) == allocation.end()) allocation[key] = allocate(key, bytes);
      votes.push_back(allocation[key][k]);
    }
    bool inherited = false;
    if (!votes.empty()) {
      std::sort(votes.begin(), votes.end());
      runs[k] = votes[votes.size() / 2];
    } else {
      const double trips =
          b.loops_back_to == static_cast<int>(k) ? constant_trips(f, static_cast<int>(k)) : 0;
      runs[k] = trips > 0 ? reached[k] * trips : reached[k];
      inherited = trips == 0;
    }
    if (debug_blocks()) {  // MG_EMU_PTX_BLOCKS=1: where each block's count came from
      double weight = 0;
      std::set<std::string> listed;
      std::string lines;
      for (const Instruction& in : b.instructions) {
        weight += in.weight;
        const std::string line = line_of(f, in);
        if (in.line > 0 && listed.insert(line).second) lines += (lines.empty() ? "" : " ") + line;
      }
      std::fprintf(stderr, "ptx %s block %zu %s: %.0f instructions x %.4g runs (%s) %s\n",
                   f.demangled.c_str(), k, b.label.c_str(), weight, runs[k] / warps,
                   !votes.empty() ? "anchored" : (inherited ? "reached" : "trip count"), lines.c_str());
    }
    std::vector<InstructionKind>& kinds = block_kinds[k];
    for (const Instruction& in : b.instructions) {
      InstructionKind kind = in.kind;
      if (in.generic && in.access != Access::none && seen_lines.space_of(in) == Space::shared)
        kind = InstructionKind::shared_memory;
      kinds.push_back(kind);
      const double n = in.weight * runs[k];
      mix.warp_instructions[static_cast<size_t>(kind)] += n;
      if (inherited) mix.inherited += n;
    }
    if (runs[k] > 0) mix.warp_cycles += runs[k] * block_cycles(b, kinds);
  }
  mix.load_round_trips = load_round_trips(f.blocks, block_kinds, runs);
  mix.registers_per_thread = f.registers_per_thread;
  mix.stack_bytes = f.stack_bytes;
  return mix;
}

std::string normalise_name(std::string s) {
  for (const char* anon : {"(anonymous namespace)", "{anonymous}"}) {
    for (size_t at = s.find(anon); at != std::string::npos; at = s.find(anon))
      s.replace(at, std::string(anon).size(), "(anon)");
  }
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

}  // namespace mg_emu::ptx

namespace mg_emu::profile {

const char* name_of(InstructionKind kind) {
  static const char* names[kInstructionKinds] = {"fp32",    "fp16",    "fp64",   "integer", "conversion",
                                                 "special", "global",  "shared", "local",   "tensor",
                                                 "warp",    "barrier", "branch", "other"};
  return names[static_cast<size_t>(kind)];
}

double InstructionMix::total() const {
  double t = 0;
  for (double v : warp_instructions) t += v;
  return t;
}

}  // namespace mg_emu::profile
