// Reading nvcc's PTX: functions, basic blocks and each instruction's kind and weight (ptx_count.h).
#include "cuda_emu/ptx_count.h"

#include <cxxabi.h>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
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
      if (!contractible(mul, "mul") || mul.dest().empty() || uses[mul.dest()] != 1) continue;
      for (size_t j = i + 1; j < b.instructions.size(); ++j) {
        const Instruction& user = b.instructions[j];
        if (std::find(user.sources.begin(), user.sources.end(), mul.dest()) == user.sources.end()) continue;
        if (contractible(user, "add") || contractible(user, "sub")) mul.weight = 0;
        break;
      }
    }
}

}  // namespace

// ---- shared with ptx_count.cpp ------------------------------------------------------------------
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

namespace {

bool is_header(const std::string& path) {  // as the tracer's site names have it (site_names.cpp)
  auto ends = [&](const char* tail) {
    const size_t n = std::strlen(tail);
    return path.size() > n && path.compare(path.size() - n, n, tail) == 0;
  };
  return ends(".h") || ends(".cuh");
}

// Each instruction of a header's line gets the first line of a .cu file its inlining chain passes
// through, walked up the .loc records' inlined_at; one whose own line is in a .cu file, or whose
// chain names none or passes a line inlined at two places, gets none. The tracer names a header's
// access so ("row_packs.cuh:87 < layer_norm.cu:167").
void name_calls(Function& fn, const std::map<std::pair<int, int>, std::pair<int, int>>& inlined_at) {
  auto header = [&](int file) {
    return file > 0 && static_cast<size_t>(file) < fn.files.size() &&
           is_header(fn.files[static_cast<size_t>(file)]);
  };
  for (Block& b : fn.blocks)
    for (Instruction& in : b.instructions) {
      std::pair<int, int> at{in.call_file, in.call_line};
      for (int up = 0; up < 32 && header(at.first); ++up) {
        const auto it = inlined_at.find(at);
        if (it == inlined_at.end()) break;
        at = it->second;
      }
      const bool named = header(in.file) && at.first > 0 && !header(at.first);
      in.call_file = named ? at.first : 0;
      in.call_line = named ? at.second : 0;
    }
}

}  // namespace

std::vector<Function> parse(const std::string& ptx) {
  std::vector<Function> out;
  std::map<int, std::string> files;
  std::vector<std::string> lines = split(ptx, '\n');
  Function* f = nullptr;
  bool in_function = false, skip_function = false;
  int depth = 0, file = 0, line = 0, caller_file = 0, caller_line = 0;
  // Per function: where each inlined (file, line) was inlined at, from its .loc records.
  std::vector<std::map<std::pair<int, int>, std::pair<int, int>>> inlined_at;
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
          inlined_at.emplace_back();
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
      // ".loc 3 87 5, function_name $L__info_string2, inlined_at 1 137 5": the call it was inlined at.
      caller_file = caller_line = 0;
      const size_t at = text.find("inlined_at");
      if (at != std::string::npos) {
        const std::vector<std::string> c = split(trim(text.substr(at + 10)), ' ');
        if (c.size() >= 2) {
          caller_file = std::atoi(c[0].c_str());
          caller_line = std::atoi(c[1].c_str());
          // A line inlined at two places (a helper's line in a header function the kernel calls
          // twice) leads nowhere: which call an instruction came through is not written down.
          const auto [it, added] = inlined_at.back().insert({{file, line}, {caller_file, caller_line}});
          if (!added && it->second != std::make_pair(caller_file, caller_line)) it->second = {0, 0};
        }
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
    in.call_file = caller_file;  // the immediate caller; made the first .cu line below
    in.call_line = caller_line;
    const std::vector<std::string> operands =
        sp == std::string::npos ? std::vector<std::string>{} : operands_of(ins.substr(sp + 1));
    const Parts p = parts_of(in.opcode);
    const std::vector<Piece> pieces = pieces_of(p, operands, in);
    for (size_t i = 0; i < operands.size(); ++i) {
      const std::vector<std::string> regs = registers_in(operands[i]);
      const bool dest = i == 0 && writes_first_operand(p.base) && operands[i].find('[') == std::string::npos;
      if (dest) {
        in.dests = regs;
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
      if (i > 0) {
        piece.access = Access::none;  // the memory side is the first piece only
        piece.continues = true;       // and each piece waits for the one before
      }
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
  for (size_t n = 0; n < out.size(); ++n) {
    Function& fn = out[n];
    while (!fn.blocks.empty() && fn.blocks.back().instructions.empty() && fn.blocks.back().label.empty())
      fn.blocks.pop_back();
    int max_file = 0;
    for (const auto& [i, path] : files) max_file = std::max(max_file, i);
    fn.files.assign(static_cast<size_t>(max_file) + 1, "");
    for (const auto& [i, path] : files) fn.files[static_cast<size_t>(i)] = path;
    name_calls(fn, inlined_at[n]);
    contract_multiplies(fn);
    int status = 0;
    char* d = abi::__cxa_demangle(fn.mangled.c_str(), nullptr, nullptr, &status);
    fn.demangled = d != nullptr && status == 0 ? std::string(d) : fn.mangled;
    std::free(d);
  }
  return out;
}

}  // namespace mg_emu::ptx
