// Counting a launch's warp instructions from nvcc's PTX (ptx_count.h says how and how exactly).
#include "cuda_emu/ptx_count.h"

#include <cxxabi.h>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <tuple>
#include <unordered_map>

namespace mg_emu::ptx {
namespace {

using profile::Space;

// ---- text -----------------------------------------------------------------------------------------
std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::vector<std::string> split(const std::string& s, char by) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == by) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

// Operands separated by commas outside [] and {}.
std::vector<std::string> operands_of(const std::string& s) {
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char c : s) {
    if (c == '[' || c == '{' || c == '(') ++depth;
    if (c == ']' || c == '}' || c == ')') --depth;
    if (c == ',' && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!trim(cur).empty()) out.push_back(trim(cur));
  return out;
}

// The registers named in an operand: "%f1", "[%rd4+16]", "{%f1, %f2}", "%p1|%p2".
std::vector<std::string> registers_in(const std::string& operand) {
  std::vector<std::string> out;
  for (size_t i = 0; i < operand.size(); ++i) {
    if (operand[i] != '%') continue;
    size_t j = i + 1;
    while (j < operand.size() && (std::isalnum(static_cast<unsigned char>(operand[j])) || operand[j] == '_'))
      ++j;
    out.push_back(operand.substr(i, j - i));
    i = j - 1;
  }
  return out;
}

bool is_special_register(const std::string& r) {
  static const char* names[] = {"%tid",    "%ntid",    "%ctaid",       "%nctaid",  "%laneid",
                                "%warpid", "%nwarpid", "%smid",        "%nsmid",   "%gridid",
                                "%clock",  "%clock64", "%globaltimer", "%lanemask"};
  for (const char* n : names)
    if (r.rfind(n, 0) == 0) return true;
  return false;
}

// ---- one instruction's kind and weight -------------------------------------------------------------
int type_bits(const std::string& t) {
  if (t == "pred") return 1;
  if (t.size() < 2) return 0;
  const char c = t[0];
  if (c != 's' && c != 'u' && c != 'b' && c != 'f') return 0;
  if (t == "f16x2" || t == "bf16x2") return 32;
  if (t == "bf16") return 16;
  if (t.find_first_not_of("0123456789", 1) != std::string::npos) return 0;
  return std::atoi(t.c_str() + 1);
}
bool is_type(const std::string& t) {
  return type_bits(t) > 0 || t == "bf16" || t == "bf16x2" || t == "f16x2";
}
bool is_float_type(const std::string& t) { return !t.empty() && (t[0] == 'f' || t.rfind("bf16", 0) == 0); }

struct Parts {
  std::string base;
  std::vector<std::string> mods;   // every dotted part after the base
  std::vector<std::string> types;  // the type parts, in order
  bool has(const char* m) const { return std::find(mods.begin(), mods.end(), m) != mods.end(); }
  std::string last_type() const { return types.empty() ? "" : types.back(); }
  int vector() const { return has("v8") ? 8 : has("v4") ? 4 : has("v2") ? 2 : 1; }
};
Parts parts_of(const std::string& opcode) {
  Parts p;
  std::vector<std::string> all = split(opcode, '.');
  p.base = all.front();
  for (size_t i = 1; i < all.size(); ++i) {
    p.mods.push_back(all[i]);
    if (is_type(all[i])) p.types.push_back(all[i]);
  }
  return p;
}
bool has_rounding(const Parts& p) { return p.has("rn") || p.has("rz") || p.has("rm") || p.has("rp"); }

// One PTX instruction as one or more counted pieces (an IEEE division is several SASS instructions
// of different kinds).
struct Piece {
  InstructionKind kind;
  double weight;
};

std::vector<Piece> pieces_of(const Parts& p, const std::vector<std::string>& operands, Instruction& in) {
  using K = InstructionKind;
  const std::string& b = p.base;
  const std::string t = p.last_type();
  const int bits = type_bits(t);
  auto space_kind = [&](K fallback) {
    if (p.has("shared")) return K::shared_memory;
    if (p.has("local")) return K::local_memory;
    if (p.has("global")) return K::global_memory;
    in.generic = true;
    return fallback;
  };
  if (b == "ld" || b == "ldu" || b == "st") {
    if (p.has("param")) return {{K::other, 0}};  // a constant-bank operand in SASS
    if (p.has("const")) return {{K::other, 1}};
    const K kind = space_kind(K::global_memory);
    if (kind != K::local_memory) in.access = b == "st" ? Access::store : Access::load;
    in.bytes_per_lane = p.vector() * std::max(1, bits / 8);
    return {{kind, 1}};
  }
  if (b == "atom" || b == "red") {
    in.access = Access::atomic;
    in.bytes_per_lane = std::max(1, bits / 8);
    return {{space_kind(K::global_memory), 1}};
  }
  if (b == "cp") {
    if (p.has("commit_group") || p.has("wait_group") || p.has("wait_all")) return {{K::barrier, 1}};
    if (p.has("async") && !p.has("bulk")) {
      in.access = Access::cp_async;
      in.bytes_per_lane = operands.size() >= 3 ? std::atoi(operands[2].c_str()) : 16;
    }
    return {{K::global_memory, 1}};
  }
  if (b == "ldmatrix" || b == "stmatrix") {
    if (b == "ldmatrix") in.access = Access::ldmatrix;
    in.bytes_per_lane = 16;
    return {{K::shared_memory, 1}};
  }
  if (b == "mma" || b == "wmma" || b == "wgmma") {
    if (b == "mma") in.access = Access::mma;
    return {{K::tensor, 1}};
  }
  if (b == "mov") {
    for (size_t i = 1; i < operands.size(); ++i)
      for (const std::string& r : registers_in(operands[i]))
        if (is_special_register(r)) return {{K::integer, 1}};  // S2R
    return {{K::other, 0}};  // a register or an immediate: an operand after allocation
  }
  if (b == "cvta" || b == "prefetchu") return {{K::other, 0}};
  if (b == "cvt") {
    const std::string to = p.types.size() >= 2 ? p.types[p.types.size() - 2] : t, from = t;
    if (!is_float_type(to) && !is_float_type(from)) {
      if (type_bits(to) > type_bits(from) && from[0] == 'u') return {{K::other, 0}};  // zero extension
      if (type_bits(to) < type_bits(from)) return {{K::other, 0}};                    // the low half
      return {{K::integer, 1}};
    }
    if (to == "f32" && from == "bf16") return {{K::integer, 1}};  // a shift: bf16 is f32's top half
    return {{K::conversion, 1}};
  }
  if (b == "shfl" || b == "match" || b == "redux") return {{K::warp, 1}};
  if (b == "vote" || b == "activemask") return {{K::integer, 1}};
  if (b == "bar" || b == "barrier")
    return {{p.has("warp") ? K::other : K::barrier, p.has("warp") ? 0.0 : 1.0}};
  if (b == "membar" || b == "fence") return {{K::barrier, 1}};
  if (b == "bra" || b == "brx" || b == "ret" || b == "exit") return {{K::branch, 1}};
  if (b == "call") return {{K::branch, 2}};
  if (b == "prefetch") return {{K::global_memory, 1}};

  // Arithmetic, by the type it works on.
  if (t == "f32" || t == "f64") {
    const K kind = t == "f32" ? K::fp32 : K::fp64;
    const bool approx = p.has("approx");
    if (b == "abs" || b == "neg") return {{kind, 0}};  // operand modifiers of the instruction using them
    if (b == "div") {
      if (approx || p.has("full")) return {{K::special, 1}, {kind, 1}};           // MUFU.RCP, FMUL
      return {{K::special, 1}, {kind, t == "f32" ? 8.0 : 12.0}, {K::branch, 1}};  // IEEE: Newton steps
    }
    if (b == "sqrt" || b == "rcp" || b == "rsqrt") {
      if (approx) return {{K::special, 1}};
      return {{K::special, 1}, {kind, 5}, {K::branch, 1}};
    }
    if (b == "ex2" || b == "lg2" || b == "sin" || b == "cos" || b == "tanh") return {{K::special, 1}};
    if (b == "selp" || b == "slct" || b == "mov") return {{K::integer, 1}};
    return {{kind, 1}};
  }
  if (t == "f16" || t == "f16x2" || t == "bf16" || t == "bf16x2") {
    if (b == "ex2" || b == "tanh" || b == "rcp" || b == "rsqrt" || b == "sqrt") return {{K::special, 1}};
    return {{K::fp16, 1}};
  }
  if (bits == 64) {
    if (b == "mul" && p.has("wide")) return {{K::integer, 1}};  // never: wide names the source type
    if (b == "mul" || b == "mad") return {{K::integer, 3}};
    if (b == "div" || b == "rem") return {{K::integer, 40}, {K::conversion, 2}, {K::special, 1}};
    if (b == "shl" || b == "shr") return {{K::integer, 2}};
    return {{K::integer, 2}};  // add, sub, setp, selp, min, max, and, or, xor: one per 32-bit half
  }
  if ((b == "div" || b == "rem") && bits > 0) return {{K::integer, 18}, {K::conversion, 2}, {K::special, 1}};
  if (bits > 0 || b == "setp" || b == "selp" || b == "lop3" || b == "shf" || b == "prmt")
    return {{K::integer, 1}};
  return {{K::other, 1}};
}

bool writes_first_operand(const std::string& base) {
  static const char* none[] = {"st",        "red",     "bra",      "brx",   "ret", "exit",
                               "bar",       "barrier", "membar",   "fence", "cp",  "prefetch",
                               "prefetchu", "call",    "stmatrix", "trap"};
  for (const char* n : none)
    if (base == n) return false;
  return true;
}

// ---- the contraction ptxas makes: mul.f32 feeding one add.f32 is one FFMA ----------------------------
void contract_multiplies(Function& f) {
  std::unordered_map<std::string, int> uses;
  for (const Block& b : f.blocks)
    for (const Instruction& in : b.instructions)
      for (const std::string& r : in.sources) ++uses[r];
  auto contractible = [](const Instruction& in, const char* base) {
    const Parts p = parts_of(in.opcode);
    return p.base == base && p.last_type() == "f32" && !has_rounding(p) && !p.has("sat");
  };
  for (Block& b : f.blocks)
    for (size_t i = 0; i < b.instructions.size(); ++i) {
      Instruction& mul = b.instructions[i];
      if (!contractible(mul, "mul") || mul.dest.empty() || uses[mul.dest] != 1) continue;
      for (size_t j = i + 1; j < b.instructions.size(); ++j) {
        const Instruction& user = b.instructions[j];
        if (std::find(user.sources.begin(), user.sources.end(), mul.dest) == user.sources.end()) continue;
        if (contractible(user, "add") || contractible(user, "sub")) mul.weight = 0;
        break;
      }
    }
}

std::string basename_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

bool parse_integer(const std::string& s, long long* v) {
  if (s.empty()) return false;
  char* end = nullptr;
  *v = std::strtoll(s.c_str(), &end, 0);
  return end != nullptr && *end == '\0';
}

}  // namespace

std::vector<Function> parse(const std::string& ptx) {
  std::vector<Function> out;
  std::map<int, std::string> files;
  std::vector<std::string> lines = split(ptx, '\n');
  Function* f = nullptr;
  bool in_function = false, skip_function = false;
  int depth = 0, file = 0, line = 0;
  std::string pending;  // an instruction continued over several lines
  for (const std::string& raw : lines) {
    std::string text = raw;
    const size_t comment = text.find("//");
    if (comment != std::string::npos) text = text.substr(0, comment);
    std::replace(text.begin(), text.end(), '\t', ' ');
    text = trim(text);
    if (text.empty()) continue;
    if (text.rfind(".file", 0) == 0) {
      std::vector<std::string> t = split(text, ' ');
      const size_t q1 = text.find('"'), q2 = text.find('"', q1 + 1);
      if (t.size() >= 2 && q1 != std::string::npos && q2 != std::string::npos)
        files[std::atoi(t[1].c_str())] = text.substr(q1 + 1, q2 - q1 - 1);
      continue;
    }
    if (!in_function) {
      const size_t entry = text.find(".entry ");
      const size_t func = text.find(".func ");
      if (entry != std::string::npos || func != std::string::npos) {
        in_function = true;
        skip_function = entry == std::string::npos;
        depth = 0;
        if (!skip_function) {
          out.emplace_back();
          f = &out.back();
          std::string name = trim(text.substr(entry + 7));
          f->mangled = name.substr(0, name.find_first_of("( "));
          f->blocks.emplace_back();
        }
      }
      if (!in_function || text.find('{') == std::string::npos) continue;
    }
    // Inside a function (its parameter list first: no brace yet).
    for (char c : text) depth += c == '{' ? 1 : c == '}' ? -1 : 0;
    if (depth <= 0 && text.find('}') != std::string::npos) {
      in_function = false;
      f = nullptr;
      continue;
    }
    if (skip_function || f == nullptr || depth == 0) continue;
    if (text == "{" || text == "}") continue;
    if (text.rfind(".loc", 0) == 0) {
      std::vector<std::string> nums = split(trim(text.substr(4)), ' ');
      if (nums.size() >= 2) {
        file = std::atoi(nums[0].c_str());
        line = std::atoi(nums[1].c_str());
      }
      continue;
    }
    if (text[0] == '.') continue;                 // .reg, .shared, .local, .pragma, ...
    if (text.back() == ':' && pending.empty()) {  // a label: a new block
      Block& last = f->blocks.back();
      if (!last.instructions.empty() || !last.label.empty()) f->blocks.emplace_back();
      f->blocks.back().label = text.substr(0, text.size() - 1);
      continue;
    }
    pending += (pending.empty() ? "" : " ") + text;
    if (pending.back() != ';') continue;
    std::string ins = trim(pending.substr(0, pending.size() - 1));
    pending.clear();
    std::string guard;
    if (ins[0] == '@') {
      const size_t sp = ins.find_first_of(" \t");
      guard = ins.substr(0, sp);
      ins = trim(ins.substr(sp));
    }
    const size_t sp = ins.find_first_of(" \t");
    Instruction in;
    in.opcode = ins.substr(0, sp);
    in.file = file;
    in.line = line;
    const std::vector<std::string> operands =
        sp == std::string::npos ? std::vector<std::string>{} : operands_of(ins.substr(sp + 1));
    const Parts p = parts_of(in.opcode);
    const std::vector<Piece> pieces = pieces_of(p, operands, in);
    for (size_t i = 0; i < operands.size(); ++i) {
      const std::vector<std::string> regs = registers_in(operands[i]);
      const bool dest = i == 0 && writes_first_operand(p.base) && operands[i].find('[') == std::string::npos;
      if (dest) {
        if (regs.size() == 1) in.dest = regs[0];
      } else {
        in.sources.insert(in.sources.end(), regs.begin(), regs.end());
      }
    }
    if (!guard.empty()) in.sources.push_back(guard.substr(guard[1] == '!' ? 2 : 1));
    Block* block = &f->blocks.back();
    for (size_t i = 0; i < pieces.size(); ++i) {
      Instruction piece = in;
      piece.kind = pieces[i].kind;
      piece.weight = pieces[i].weight;
      if (i > 0) piece.access = Access::none;  // the memory side is the first piece only
      block->instructions.push_back(piece);
    }
    Instruction& kept = block->instructions.back();
    kept.guard = guard;
    if (p.base == "bra" || p.base == "setp" || p.base == "add" || p.base == "sub" || p.base == "mov")
      kept.operands = operands;
    if (p.base == "bra" || p.base == "ret" || p.base == "exit" || p.base == "brx") {
      if (p.base == "bra" && !operands.empty()) {
        for (size_t k = 0; k < f->blocks.size(); ++k)
          if (f->blocks[k].label == operands[0]) block->loops_back_to = static_cast<int>(k);
      }
      f->blocks.emplace_back();
    }
  }
  if (in_function) throw std::runtime_error("PTX: a function without its closing brace");
  for (Function& fn : out) {
    while (!fn.blocks.empty() && fn.blocks.back().instructions.empty() && fn.blocks.back().label.empty())
      fn.blocks.pop_back();
    int max_file = 0;
    for (const auto& [i, path] : files) max_file = std::max(max_file, i);
    fn.files.assign(static_cast<size_t>(max_file) + 1, "");
    for (const auto& [i, path] : files) fn.files[static_cast<size_t>(i)] = path;
    contract_multiplies(fn);
    int status = 0;
    char* d = abi::__cxa_demangle(fn.mangled.c_str(), nullptr, nullptr, &status);
    fn.demangled = d != nullptr && status == 0 ? std::string(d) : fn.mangled;
    std::free(d);
  }
  return out;
}

// ---- what the tracer saw, by source line ---------------------------------------------------------
std::vector<LineAccesses> line_accesses(const std::vector<profile::SiteCounts>& sites) {
  std::map<std::tuple<std::string, Access, Space>, LineAccesses> by;
  for (const profile::SiteCounts& s : sites) {
    const std::string where = s.where.substr(0, s.where.find(" <"));
    Access a = Access::load;
    switch (s.op) {
      case profile::Op::load: a = Access::load; break;
      case profile::Op::store: a = Access::store; break;
      case profile::Op::atomic: a = Access::atomic; break;
      case profile::Op::ldmatrix: a = Access::ldmatrix; break;
      case profile::Op::mma: a = Access::mma; break;
      case profile::Op::cp_async: a = Access::cp_async; break;
    }
    LineAccesses& l = by[{where, a, s.space}];
    l.where = where;
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
        if (it->dest != reg) continue;
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
    if (ins[static_cast<size_t>(i)].dest == pred &&
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
    if (a.dest != counter) continue;
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

profile::InstructionMix count(const Function& f, const std::vector<LineAccesses>& seen, double warps,
                              const std::map<std::string, double>& lines_run) {
  // What the tracer saw per (line, access): request-bytes per lane, the largest over the spaces (a
  // cp.async is a global read and a shared write of the same instruction).
  std::map<std::pair<std::string, Access>, double> seen_bytes;
  std::map<std::pair<std::string, Access>, Space> seen_space;
  {
    std::map<std::tuple<std::string, Access, Space>, double> per_space;
    for (const LineAccesses& l : seen) {
      const double width = l.lanes > 0 && l.lane_bytes > 0 ? l.lane_bytes / l.lanes : 1;
      per_space[{l.where, l.access, l.space}] += l.requests * width;
    }
    for (const auto& [key, bytes] : per_space) {
      const auto k = std::make_pair(std::get<0>(key), std::get<1>(key));
      if (bytes > seen_bytes[k]) {
        seen_bytes[k] = bytes;
        seen_space[k] = std::get<2>(key);
      }
    }
  }
  auto key_of = [&](const Instruction& in) {
    const std::string& path =
        in.file > 0 && static_cast<size_t>(in.file) < f.files.size() ? f.files[in.file] : "";
    return std::make_pair(basename_of(path) + ":" + std::to_string(in.line), in.access);
  };
  // Where each line's accesses are: bytes per lane of its PTX instructions, per block.
  using Key = std::pair<std::string, Access>;
  std::map<Key, std::map<size_t, double>> block_bytes;
  for (size_t k = 0; k < f.blocks.size(); ++k)
    for (const Instruction& in : f.blocks[k].instructions)
      if (in.access != Access::none) block_bytes[key_of(in)][k] += std::max(1, in.bytes_per_lane);

  profile::InstructionMix mix;
  mix.counted = true;
  std::vector<double> runs(f.blocks.size(), 0), reached(f.blocks.size(), 0);
  std::map<std::string, int> label_of;
  for (size_t k = 0; k < f.blocks.size(); ++k)
    if (!f.blocks[k].label.empty()) label_of[f.blocks[k].label] = static_cast<int>(k);
  // What the CPU build saw of a block's lines: the most warp executions of a basic block that
  // began at one of them, or of a memory access on one of them; -1 when none was seen.
  std::map<std::string, double> accessed;
  for (const LineAccesses& l : seen) accessed[l.where] = std::max(accessed[l.where], l.requests);
  auto activity = [&](size_t b) {
    double most = -1;
    for (const Instruction& in : f.blocks[b].instructions) {
      const std::string line = key_of(in).first;
      if (const auto it = lines_run.find(line); it != lines_run.end()) most = std::max(most, it->second);
      if (const auto it = accessed.find(line); it != accessed.end()) most = std::max(most, it->second);
    }
    return most;
  };
  // How often control reaches block k from the blocks before it: each forward edge carries its
  // source's count; a conditional branch splits it between its two ways as the CPU build ran their
  // lines (all of it to one way when only that one's lines ran: a switch over an op's kind counts
  // the case taken, not every case), evenly when nothing is known; the way out of a loop (a
  // latch's fall-through) carries the count the loop was entered with.
  auto taken_share = [&](size_t p, int to) {
    if (lines_run.empty()) return 0.5;
    const double a_taken = activity(static_cast<size_t>(to)), a_fall = activity(p + 1);
    if (a_taken > 0 && a_fall > 0) return a_taken / (a_taken + a_fall);
    if (a_taken > 0 && a_fall < 0) return 1.0;
    if (a_fall > 0 && a_taken < 0) return 0.0;
    return 0.5;
  };
  auto reach = [&](size_t k) {
    if (k == 0) return warps;
    double n = 0;
    for (size_t p = 0; p < k; ++p) {
      const Block& from = f.blocks[p];
      const Instruction* last = from.instructions.empty() ? nullptr : &from.instructions.back();
      const std::string op = last != nullptr ? last->opcode : "";
      const bool branch = op == "bra" || op == "bra.uni";
      const bool conditional = branch && !last->guard.empty();
      const bool stops = op == "ret" || op == "exit" || op.rfind("brx", 0) == 0 || (branch && !conditional);
      const auto target =
          branch && !last->operands.empty() ? label_of.find(last->operands[0]) : label_of.end();
      const int to = target != label_of.end() ? target->second : -1;
      const bool forward = to > static_cast<int>(p);
      const double share = conditional && forward && p + 1 < f.blocks.size() ? taken_share(p, to) : 1.0;
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
      const auto it = seen_bytes.find(key);
      if (it == seen_bytes.end()) continue;
      if (allocation.find(key) == allocation.end()) allocation[key] = allocate(key, it->second);
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
    for (const Instruction& in : b.instructions) {
      InstructionKind kind = in.kind;
      if (in.generic && in.access != Access::none) {
        const auto it = seen_space.find(key_of(in));
        if (it != seen_space.end() && it->second == Space::shared) kind = InstructionKind::shared_memory;
      }
      const double n = in.weight * runs[k];
      mix.warp_instructions[static_cast<size_t>(kind)] += n;
      if (inherited) mix.inherited += n;
    }
  }
  mix.registers_per_thread = f.registers_per_thread;
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
