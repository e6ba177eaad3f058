// The rewrite of cu_rewrite.h: a small lexer over the source, a stack of the braces it is inside
// (is this a function body?), and two patterns: `<<<...>>>` after a kernel expression, and a
// declaration statement holding `__shared__`. Edits are collected and applied at the end, each
// replacing a span by text on one line plus the newlines the span held.
#include "cuda_emu/cu_rewrite/cu_rewrite.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace mg_emu::rewrite {
namespace {

enum class Kind { identifier, number, literal, punct };

struct Token {
  Kind kind;
  size_t begin, end;  // [begin, end) in the source
  std::string text;
};

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '$'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$'; }

// Tokens of C++ good enough to find declarations and launches: identifiers, numbers, string and
// character literals (raw strings too), `::` and `->` as one token, every other punctuator one
// character. Comments and preprocessor lines (the line markers of preprocessed text) are skipped.
std::vector<Token> lex(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  const size_t n = s.size();
  bool line_start = true;
  while (i < n) {
    const char c = s[i];
    if (c == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
    if (line_start && c == '#') {  // a directive or a line marker: to the end of the line
      while (i < n && s[i] != '\n') {
        if (s[i] == '\\' && i + 1 < n && s[i + 1] == '\n') ++i;
        ++i;
      }
      continue;
    }
    line_start = false;
    if (c == '/' && i + 1 < n && s[i + 1] == '/') {
      while (i < n && s[i] != '\n') ++i;
      continue;
    }
    if (c == '/' && i + 1 < n && s[i + 1] == '*') {
      const size_t close = s.find("*/", i + 2);
      i = close == std::string::npos ? n : close + 2;
      continue;
    }
    const size_t b = i;
    if (ident_start(c)) {
      while (i < n && ident_char(s[i])) ++i;
      // A raw string: R"delim( ... )delim", with an optional encoding prefix (u8R, LR, ...).
      if (i < n && s[i] == '"' && s[i - 1] == 'R') {
        const size_t open = s.find('(', i);
        if (open != std::string::npos) {
          const std::string delim = ")" + s.substr(i + 1, open - i - 1) + "\"";
          const size_t close = s.find(delim, open);
          i = close == std::string::npos ? n : close + delim.size();
          out.push_back({Kind::literal, b, i, s.substr(b, i - b)});
          continue;
        }
      }
      if (i < n && (s[i] == '"' || s[i] == '\'')) {  // an encoding prefix: u8"..", L'x'
        const std::string prefix = s.substr(b, i - b);
        if (prefix == "u8" || prefix == "u" || prefix == "U" || prefix == "L") goto literal;
      }
      out.push_back({Kind::identifier, b, i, s.substr(b, i - b)});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c)) ||
        (c == '.' && i + 1 < n && std::isdigit(static_cast<unsigned char>(s[i + 1])))) {
      while (i < n && (ident_char(s[i]) || s[i] == '.' || s[i] == '\'' ||
                       ((s[i] == '+' || s[i] == '-') &&
                        (s[i - 1] == 'e' || s[i - 1] == 'E' || s[i - 1] == 'p' || s[i - 1] == 'P'))))
        ++i;
      out.push_back({Kind::number, b, i, s.substr(b, i - b)});
      continue;
    }
    if (c == '"' || c == '\'') {
    literal:
      while (i < n && s[i] != '"' && s[i] != '\'') ++i;
      const char quote = s[i++];
      while (i < n && s[i] != quote) {
        if (s[i] == '\\') ++i;
        ++i;
      }
      i = std::min(n, i + 1);
      out.push_back({Kind::literal, b, i, s.substr(b, i - b)});
      continue;
    }
    if ((c == ':' && i + 1 < n && s[i + 1] == ':') || (c == '-' && i + 1 < n && s[i + 1] == '>')) {
      out.push_back({Kind::punct, b, b + 2, s.substr(b, 2)});
      i += 2;
      continue;
    }
    out.push_back({Kind::punct, b, b + 1, std::string(1, c)});
    ++i;
  }
  return out;
}

struct Edit {
  size_t begin, end;
  std::string text;
};

// Where an offset is, for messages: the last line marker before it and the lines since.
std::string location(const std::string& s, size_t offset, const std::string& name) {
  std::string file = name;
  long line = 1;
  size_t i = 0;
  while (i < offset && i < s.size()) {
    const size_t eol = std::min(s.find('\n', i), s.size());
    if (s[i] == '#' && i + 1 < s.size() && s[i + 1] == ' ' && i + 2 < s.size() &&
        std::isdigit(static_cast<unsigned char>(s[i + 2]))) {
      line = std::strtol(s.c_str() + i + 2, nullptr, 10) - 1;
      const size_t q = s.find('"', i);
      if (q < eol) file = s.substr(q + 1, s.find('"', q + 1) - q - 1);
    }
    ++line;
    i = eol + 1;
  }
  return file + ":" + std::to_string(line - 1 > 0 ? line - 1 : 1);
}

std::string join(const std::vector<Token>& t, size_t from, size_t to) {
  std::string out;
  for (size_t i = from; i < to; ++i) {
    const Token& k = t[i];
    if (!out.empty() && (k.kind == Kind::identifier || k.kind == Kind::number || k.kind == Kind::literal) &&
        (ident_char(out.back()) || out.back() == '"' || out.back() == '\''))
      out += ' ';
    out += k.text;
  }
  return out;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

class Rewriter {
 public:
  Rewriter(const std::string& source, const std::string& name) : s_(source), name_(name), t_(lex(source)) {}

  Result run() {
    std::vector<bool> function_scope;  // one per open brace: inside a function body?
    for (size_t i = 0; i < t_.size(); ++i) {
      const Token& k = t_[i];
      if (k.kind == Kind::punct && k.text == "{") {
        function_scope.push_back((!function_scope.empty() && function_scope.back()) || opens_body(i));
      } else if (k.kind == Kind::punct && k.text == "}") {
        if (!function_scope.empty()) function_scope.pop_back();
      } else if (k.kind == Kind::identifier && k.text == "__shared__") {
        const bool local = !function_scope.empty() && function_scope.back();
        i = shared_declaration(i, local);
      } else if (is_triple(i, '<')) {
        launch(i);
        i += 2;
      } else if (k.kind == Kind::identifier && !globals_.empty()) {
        global_use(i);
      }
      if (!result_.error.empty()) break;
    }
    std::sort(edits_.begin(), edits_.end(), [](const Edit& a, const Edit& b) { return a.begin < b.begin; });
    std::string out;
    out.reserve(s_.size() + edits_.size() * 64);
    size_t at = 0;
    for (const Edit& e : edits_) {
      out.append(s_, at, e.begin - at);
      out += e.text;
      out.append(static_cast<size_t>(std::count(s_.begin() + static_cast<long>(e.begin),
                                                s_.begin() + static_cast<long>(e.end), '\n')),
                 '\n');
      at = e.end;
    }
    out.append(s_, at, std::string::npos);
    result_.text = std::move(out);
    return result_;
  }

 private:
  bool is_punct(size_t i, const char* p) const {
    return i < t_.size() && t_[i].kind == Kind::punct && t_[i].text == p;
  }
  bool is_ident(size_t i, const char* p) const {
    return i < t_.size() && t_[i].kind == Kind::identifier && t_[i].text == p;
  }
  // Three adjacent one-character tokens `c`: `<<<` or `>>>`.
  bool is_triple(size_t i, char c) const {
    const std::string one(1, c);
    return i + 2 < t_.size() && t_[i].text == one && t_[i + 1].text == one && t_[i + 2].text == one &&
           t_[i].kind == Kind::punct && t_[i + 1].kind == Kind::punct && t_[i + 2].kind == Kind::punct &&
           t_[i + 1].begin == t_[i].end && t_[i + 2].begin == t_[i + 1].end;
  }

  // Does the `{` at i open a function body (or a lambda's)? After `)` (parameters, or a statement
  // inside a function anyway) or a function's trailing qualifier.
  bool opens_body(size_t i) const {
    if (i == 0) return false;
    const Token& p = t_[i - 1];
    if (p.kind == Kind::punct) return p.text == ")";
    static const char* const after[] = {"const",   "noexcept", "override", "final",
                                        "mutable", "volatile", "try"};
    for (const char* a : after)
      if (p.text == a) return true;
    // `-> type {`: a trailing return type; look back over the type to the `->`.
    for (size_t j = i; j-- > 0 && i - j < 16;) {
      if (t_[j].text == ";" || t_[j].text == "{" || t_[j].text == "}") break;
      if (t_[j].text == "->") return j > 0 && t_[j - 1].text == ")";
    }
    return false;
  }

  void fail(size_t token, const std::string& why) {
    if (result_.error.empty()) result_.error = location(s_, t_[token].begin, name_) + ": error: " + why;
  }

  // ---- kernel<<<grid, block[, shared[, stream]]>>>(args) -------------------------------------------
  void launch(size_t open) {
    // The kernel expression, read backwards: a parenthesised expression, or a qualified name with
    // template arguments (`ns::k<T, 4>`).
    size_t start = open;
    auto group_start = [&](size_t close_at) -> size_t {  // the opener of the group closed at close_at
      const std::string close = t_[close_at].text, opener = close == ">" ? "<" : "(";
      int depth = 0;
      for (size_t j = close_at;; --j) {
        if (t_[j].text == close) ++depth;
        if (t_[j].text == opener && --depth == 0) return j;
        if (j == 0) return t_.size();
      }
    };
    if (start > 0 && t_[start - 1].text == ")") {
      start = group_start(start - 1);
      if (start == t_.size()) return fail(open, "a <<< whose kernel expression has no opening (");
    } else {
      for (;;) {
        if (start > 0 && t_[start - 1].text == ">") {  // template arguments, then their name
          start = group_start(start - 1);
          if (start == t_.size()) return fail(open, "a <<< whose kernel expression has no opening <");
        }
        if (start == 0 || t_[start - 1].kind != Kind::identifier) break;
        --start;
        if (start == 0 || t_[start - 1].text != "::") break;
        --start;  // `::`, then a name (or nothing: a leading ::)
      }
    }
    if (start == open) return fail(open, "<<< without a kernel before it");
    // The configuration: up to `>>>` at depth 0.
    std::vector<std::pair<size_t, size_t>> args;
    size_t arg_start = open + 3, j = open + 3;
    int depth = 0;
    for (; j < t_.size(); ++j) {
      const std::string& x = t_[j].text;
      if (t_[j].kind == Kind::punct && (x == "(" || x == "[" || x == "{")) ++depth;
      if (t_[j].kind == Kind::punct && (x == ")" || x == "]" || x == "}")) --depth;
      if (depth == 0 && is_triple(j, '>')) break;
      if (depth == 0 && x == ",") {
        args.emplace_back(arg_start, j);
        arg_start = j + 1;
      }
      if (depth < 0 || x == ";") return fail(open, "a <<< without its >>>");
    }
    if (j >= t_.size()) return fail(open, "a <<< without its >>>");
    args.emplace_back(arg_start, j);
    if (args.size() < 2 || args.size() > 4)
      return fail(open, "a launch takes <<<grid, block[, shared bytes[, stream]]>>>, not " +
                            std::to_string(args.size()) + " arguments");
    const std::string kernel = join(t_, start, open);
    std::string text = "::mg_emu::cuda_launch(" + kernel + ", " + quoted(kernel) + ", __PRETTY_FUNCTION__";
    for (const auto& a : args) {
      if (a.first == a.second) return fail(open, "an empty launch argument");
      text += ", " + s_.substr(t_[a.first].begin, t_[a.second - 1].end - t_[a.first].begin);
    }
    text += ")";
    edits_.push_back({t_[start].begin, t_[j + 2].end, text});
    ++result_.launches;
  }

  // ---- __shared__ declarations -----------------------------------------------------------------------
  struct Declarator {
    std::string name, type;  // type: a type-id, e.g. float[32][33] or float *
  };

  size_t shared_declaration(size_t at, bool local) {
    size_t begin = at;
    while (begin > 0) {
      const std::string& p = t_[begin - 1].text;
      if (t_[begin - 1].kind == Kind::punct && (p == ";" || p == "{" || p == "}" || p == ":" || p == ")"))
        break;
      --begin;
    }
    size_t end = at;
    int depth = 0;
    for (; end < t_.size(); ++end) {
      const std::string& x = t_[end].text;
      if (t_[end].kind != Kind::punct) continue;
      if (x == "(" || x == "[" || x == "{") ++depth;
      if (x == ")" || x == "]" || x == "}") --depth;
      if (depth == 0 && x == ";") break;
      if (depth < 0) break;
    }
    if (end >= t_.size() || t_[end].text != ";") {
      fail(at, "a __shared__ declaration without its ';'");
      return at;
    }
    // Drop the storage words and collect the alignment asked for.
    bool is_extern = false;
    long align = 16;
    std::vector<Token> rest;
    for (size_t i = begin; i < end; ++i) {
      const std::string& x = t_[i].text;
      if (x == "__shared__" || x == "static" || x == "__device__" || x == "__forceinline__" || x == "inline")
        continue;
      if (x == "extern") {
        is_extern = true;
        continue;
      }
      if ((x == "__align__" || x == "alignas" || x == "__attribute__") && is_punct(i + 1, "(")) {
        const size_t close = matching(i + 1);
        for (size_t j = i + 1; j < close; ++j)
          if (t_[j].kind == Kind::number)
            align = std::max(align, std::strtol(t_[j].text.c_str(), nullptr, 0));
        i = close;
        continue;
      }
      if (x == "extern" || x == "\"C\"") continue;
      rest.push_back(t_[i]);
    }
    std::vector<Declarator> decls;
    if (!declarators(rest, decls)) {
      fail(at,
           "a __shared__ declaration the emulation build cannot read (one variable per name, "
           "e.g. `__shared__ float tile[32][33];`)");
      return end;
    }
    std::string text;
    for (const Declarator& d : decls) {
      const bool unbounded = d.type.size() >= 2 && d.type.compare(d.type.size() - 2, 2, "[]") == 0;
      if (is_extern && !unbounded) {
        fail(at, "extern __shared__ " + d.name +
                     " must be an array of unknown size, e.g. `extern __shared__ float " + d.name + "[];`");
        return end;
      }
      std::string value;
      if (is_extern) {
        value = "::mg_emu::dynamic_shared<" + d.type + ">()";
      } else {
        const std::string tag = local ? "[]{}" : "mg_emu_shared_tag_" + d.name + "{}";
        value = "::mg_emu::block_shared<" + d.type + ", " + std::to_string(align) + ">(" + tag +
                ", __builtin_FILE(), __builtin_LINE())";
      }
      if (local) {
        text += (is_extern ? "auto const " : "auto& ") + d.name + " = " + value + "; ";
      } else {
        const std::string accessor = "mg_emu_shared_" + d.name;
        if (!is_extern) text += "struct mg_emu_shared_tag_" + d.name + " {}; ";
        text += std::string("inline ") + (is_extern ? "auto " : "auto& ") + accessor + "() { return " +
                value + "; } ";
        globals_[d.name] = accessor;
      }
      ++result_.shared;
    }
    edits_.push_back({t_[begin].begin, t_[end].end, text});
    return end;
  }

  // A later use of a namespace-scope __shared__ name: a call of its accessor (not after `.`/`->`).
  void global_use(size_t i) {
    auto it = globals_.find(t_[i].text);
    if (it == globals_.end()) return;
    if (i > 0 && (t_[i - 1].text == "." || t_[i - 1].text == "->")) return;
    const bool qualified = i > 0 && t_[i - 1].text == "::";
    edits_.push_back({t_[i].begin, t_[i].end, qualified ? it->second + "()" : "(" + it->second + "())"});
  }

  size_t matching(size_t open) const {
    int depth = 0;
    for (size_t j = open; j < t_.size(); ++j) {
      if (t_[j].text == "(") ++depth;
      if (t_[j].text == ")" && --depth == 0) return j;
    }
    return t_.size() - 1;
  }

  // Splits `float a[4], *b, c[2][3]` into (a, float[4]), (b, float *), (c, float[2][3]).
  static bool declarators(const std::vector<Token>& t, std::vector<Declarator>& out) {
    // Pieces separated by depth-0 commas (angle brackets count before the first `[`).
    std::vector<std::vector<Token>> pieces(1);
    int depth = 0, angle = 0;
    for (const Token& k : t) {
      const std::string& x = k.text;
      if (k.kind == Kind::punct) {
        if (x == "(" || x == "[" || x == "{") ++depth;
        if (x == ")" || x == "]" || x == "}") --depth;
        if (depth == 0 && x == "<") ++angle;
        if (depth == 0 && x == ">") --angle;
        if (depth == 0 && angle == 0 && x == ",") {
          pieces.emplace_back();
          continue;
        }
      }
      pieces.back().push_back(k);
    }
    std::string base;
    for (size_t p = 0; p < pieces.size(); ++p) {
      const std::vector<Token>& v = pieces[p];
      // The name: the last identifier at depth 0 before the first depth-0 `[` or `=`.
      size_t name = v.size(), stop = v.size();
      depth = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        const std::string& x = v[i].text;
        if (v[i].kind == Kind::punct && depth == 0 && (x == "[" || x == "=")) {
          stop = i;
          break;
        }
        if (v[i].kind == Kind::punct && (x == "(" || x == "<")) ++depth;
        if (v[i].kind == Kind::punct && (x == ")" || x == ">")) --depth;
        if (depth == 0 && v[i].kind == Kind::identifier) name = i;
      }
      if (name == v.size()) return false;
      for (size_t i = stop; i < v.size(); ++i)
        if (v[i].text == "=") return false;  // __shared__ variables take no initializer
      // What precedes the name: the specifiers (first piece only) and the pointer operators.
      size_t ops = 0;
      if (p == 0) {
        ops = name;
        while (ops > 0 && (v[ops - 1].text == "*" || v[ops - 1].text == "&" ||
                           ((v[ops - 1].text == "const" || v[ops - 1].text == "__restrict__" ||
                             v[ops - 1].text == "volatile") &&
                            ops >= 2 && v[ops - 2].text == "*")))
          --ops;
        base = join(v, 0, ops);
        if (base.empty()) return false;
      }
      std::string type = base;
      const std::string ptr = join(v, ops, name), arrays = join(v, name + 1, v.size());
      if (!ptr.empty()) type += " " + ptr;
      type += arrays;
      out.push_back({v[name].text, type});
    }
    return true;
  }

  const std::string& s_;
  std::string name_;
  std::vector<Token> t_;
  std::vector<Edit> edits_;
  std::map<std::string, std::string> globals_;  // namespace-scope __shared__ name -> accessor
  Result result_;
};

}  // namespace

Result rewrite_cuda(const std::string& source, const std::string& name) {
  return Rewriter(source, name).run();
}

}  // namespace mg_emu::rewrite
