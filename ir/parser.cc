// The graph text parser (see parser.h): recursive descent straight over the text, one method per
// construct of the grammar below. Whitespace (newlines included) and `//` comments separate
// tokens anywhere.
//
//   graph     := 'graph' '(' [input {',' input}] ')' '{' {statement} return '}'
//   input     := ref ':' type
//   statement := ref '=' ( 'constant' '"' name '"' ':' type
//                        | 'fusion' [name] operands ':' type '{' graph '}'
//                        | op_name operands [attrs] ':' type )
//   return    := 'return' [ref {',' ref}]
//   operands  := '(' [ref {',' ref}] ')'
//   attrs     := '{' [key '=' value {',' key '=' value}] '}'
//   type      := dtype '[' [int {',' int}] ']' ['@' ('cpu' | 'meta' | 'cuda' [':' int])]
//   ref       := '%' digits
//
// Internally strings are absl::string_view: Debian's Abseil has its own string_view type, which
// absl::StrCat takes and std::string_view is not.
#include "ir/parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "runtime/status.h"

namespace kiln::ir {
namespace {

// Nesting limit of fusion bodies, so that hostile input cannot exhaust the stack.
constexpr int kMaxNesting = 32;

// Value numbers of one graph body as written in the text -> ids in the Graph being built.
using Scope = std::map<int64_t, ValueId>;
using ValueList = absl::InlinedVector<ValueId, 3>;

bool IsWordStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)); }

// Stores a parsed value, or passes its error on.
template <typename T>
absl::Status Set(absl::StatusOr<T> value, T* out) {
  if (!value.ok()) return value.status();
  *out = *std::move(value);
  return absl::OkStatus();
}

class Parser {
 public:
  explicit Parser(absl::string_view text) : text_(text) {}

  absl::StatusOr<OpAttrs> ParseAttrsOnly(const OpDef& def) {
    OpAttrs attrs;
    KILN_RETURN_IF_ERROR(Attrs(def, &attrs));
    SkipSpace();
    if (!AtEnd()) return Error("expected the end after the attributes");
    return attrs;
  }

  absl::StatusOr<Graph> ParseTop() {
    Graph graph;
    KILN_RETURN_IF_ERROR(ParseBody(&graph));
    SkipSpace();
    if (!AtEnd()) return Error("unexpected text after the end of the graph");
    return graph;
  }

 private:
  // Lexing.
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }
  void SkipSpace();
  bool Consume(char c);
  absl::Status Expect(char c, absl::string_view context);
  absl::string_view PeekWord();
  absl::string_view Word();
  absl::Status ErrorAt(size_t pos, absl::string_view message) const;
  absl::Status Error(absl::string_view message) const { return ErrorAt(pos_, message); }

  // Literals and types.
  absl::StatusOr<int64_t> Integer(absl::string_view what);
  absl::StatusOr<double> Number(absl::string_view what);
  absl::StatusOr<bool> Bool(absl::string_view what);
  absl::StatusOr<Shape> IntList(absl::string_view what);
  absl::StatusOr<DType> ParseDType(absl::string_view context);
  absl::StatusOr<Device> ParseDevice();
  absl::StatusOr<TensorType> Type(absl::string_view context);

  // Values.
  absl::StatusOr<int64_t> RefNumber(absl::string_view context);
  absl::StatusOr<ValueId> Use(const Scope& scope);
  absl::StatusOr<ValueList> Operands(const Scope& scope, absl::string_view what);
  absl::StatusOr<int64_t> NewValue(const Scope& scope, absl::string_view context);

  // Structure.
  absl::Status ParseBody(Graph* g);
  absl::Status Inputs(Graph* g, Scope* scope);
  absl::Status Statement(Graph* g, Scope* scope);
  absl::StatusOr<ValueId> Constant(Graph* g);
  absl::StatusOr<ValueId> Fusion(Graph* g, const Scope& scope);
  absl::StatusOr<ValueId> Result(Graph* g, const Scope& scope);
  absl::StatusOr<ValueId> OpCall(Graph* g, const Scope& scope);
  absl::Status Attrs(const OpDef& def, OpAttrs* attrs);
  absl::Status Attr(const OpDef& def, uint32_t* seen, OpAttrs* attrs);
  // One attribute's value, by the type of its row (ops/op_def.h kAttrRows).
  absl::Status AttrValue(absl::string_view what, double* v) { return Set(Number(what), v); }
  absl::Status AttrValue(absl::string_view what, Scalar* v);
  absl::Status AttrValue(absl::string_view what, int64_t* v) { return Set(Integer(what), v); }
  absl::Status AttrValue(absl::string_view what, bool* v) { return Set(Bool(what), v); }
  absl::Status AttrValue(absl::string_view what, Shape* v) { return Set(IntList(what), v); }
  absl::Status AttrValue(absl::string_view what, DType* v) {
    return Set(ParseDType(absl::StrCat("for ", what)), v);
  }
  absl::Status AttrValue(absl::string_view what, Epilogue* v);
  absl::Status AttrValue(absl::string_view what, GeluApprox* v);
  absl::Status AttrValue(absl::string_view what, ReduceOp* v);
  // An enum attribute written by its name (`name` of each of its `count` values).
  template <typename E>
  absl::Status NamedValue(absl::string_view what, const char* (*name)(E), int count, E* v) {
    SkipSpace();
    const size_t start = pos_;
    const absl::string_view word = Word();
    std::vector<std::string> names;
    for (int i = 0; i < count; ++i) {
      names.push_back(name(static_cast<E>(i)));
      if (word == names.back()) {
        *v = static_cast<E>(i);
        return absl::OkStatus();
      }
    }
    pos_ = start;
    return Error(absl::StrCat("expected one of ", absl::StrJoin(names, ", "), " for ", what));
  }
  absl::Status Return(Graph* g, const Scope& scope);

  absl::string_view text_;
  size_t pos_ = 0;
  int nesting_ = 0;
};

void Parser::SkipSpace() {
  while (!AtEnd()) {
    if (std::isspace(static_cast<unsigned char>(Peek()))) {
      ++pos_;
    } else if (text_.substr(pos_, 2) == "//") {
      while (!AtEnd() && Peek() != '\n') ++pos_;
    } else {
      return;
    }
  }
}

bool Parser::Consume(char c) {
  SkipSpace();
  if (AtEnd() || Peek() != c) return false;
  ++pos_;
  return true;
}

absl::Status Parser::Expect(char c, absl::string_view context) {
  if (Consume(c)) return absl::OkStatus();
  return Error(absl::StrCat("expected '", std::string(1, c), "' ", context));
}

absl::string_view Parser::PeekWord() {
  SkipSpace();
  size_t end = pos_;
  if (end < text_.size() && IsWordStart(text_[end])) {
    while (end < text_.size() && IsWordChar(text_[end])) ++end;
  }
  return text_.substr(pos_, end - pos_);
}

absl::string_view Parser::Word() {
  const absl::string_view word = PeekWord();
  pos_ += word.size();
  return word;
}

absl::Status Parser::ErrorAt(size_t pos, absl::string_view message) const {
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < pos && i < text_.size(); ++i) {
    if (text_[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("line ", line, ", col ", pos - line_start + 1, ": ", message));
}

absl::StatusOr<int64_t> Parser::Integer(absl::string_view what) {
  SkipSpace();
  const size_t start = pos_;
  if (Peek() == '-') ++pos_;
  while (!AtEnd() && IsDigit(Peek())) ++pos_;
  int64_t value = 0;
  const char* first = text_.data() + start;
  const char* last = text_.data() + pos_;
  const auto [ptr, ec] = std::from_chars(first, last, value);
  if (pos_ == start || ec != std::errc() || ptr != last) {
    pos_ = start;
    return Error(absl::StrCat("expected an integer for ", what));
  }
  return value;
}

absl::StatusOr<double> Parser::Number(absl::string_view what) {
  SkipSpace();
  const size_t start = pos_;
  if (Peek() == '-' || Peek() == '+') ++pos_;
  while (!AtEnd()) {
    const char c = Peek();
    const char prev = pos_ > start ? text_[pos_ - 1] : '\0';
    const bool exponent_sign = (c == '-' || c == '+') && (prev == 'e' || prev == 'E');
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && !exponent_sign) break;
    ++pos_;
  }
  // from_chars takes "-inf", "nan", "1e-05" but no leading '+'.
  const char* first = text_.data() + start + (pos_ > start && text_[start] == '+' ? 1 : 0);
  const char* last = text_.data() + pos_;
  double value = 0;
  const auto [ptr, ec] = std::from_chars(first, last, value);
  if (first == last || ec != std::errc() || ptr != last) {
    const std::string token(text_.substr(start, pos_ - start));
    pos_ = start;
    return Error(absl::StrCat("expected a number for ", what,
                              token.empty() ? "" : absl::StrCat(", got '", token, "'")));
  }
  return value;
}

// A scalar attribute: digits alone ("3", "-2") are an integer, "true" / "false" a bool, anything
// else ("3.0", "1e+30", "inf") a floating value (Scalar::ToString).
absl::Status Parser::AttrValue(absl::string_view what, Scalar* v) {
  SkipSpace();
  const size_t start = pos_;
  if (const absl::string_view word = Word(); word == "true" || word == "false") {
    *v = Scalar(word == "true");
    return absl::OkStatus();
  }
  pos_ = start;
  KILN_ASSIGN_OR_RETURN(const double d, Number(what));
  absl::string_view token = text_.substr(start, pos_ - start);
  if (!token.empty() && (token[0] == '+' || token[0] == '-')) token.remove_prefix(1);
  if (token.empty() || !std::all_of(token.begin(), token.end(), IsDigit)) {
    *v = Scalar(d);
    return absl::OkStatus();
  }
  int64_t i = 0;
  const char* first = text_.data() + start + (text_[start] == '+' ? 1 : 0);
  const auto [ptr, ec] = std::from_chars(first, text_.data() + pos_, i);
  if (ec != std::errc() || ptr != text_.data() + pos_) {
    pos_ = start;
    return Error(absl::StrCat("the integer for ", what, " is outside int64"));
  }
  *v = Scalar(i);
  return absl::OkStatus();
}

absl::StatusOr<bool> Parser::Bool(absl::string_view what) {
  SkipSpace();
  const size_t start = pos_;
  const absl::string_view word = Word();
  if (word == "true") return true;
  if (word == "false") return false;
  pos_ = start;
  return Error(absl::StrCat("expected true or false for ", what));
}

absl::StatusOr<Shape> Parser::IntList(absl::string_view what) {
  KILN_RETURN_IF_ERROR(Expect('[', absl::StrCat("to open ", what)));
  Shape values;
  if (Consume(']')) return values;
  do {
    KILN_ASSIGN_OR_RETURN(int64_t v, Integer(what));
    values.push_back(v);
  } while (Consume(','));
  KILN_RETURN_IF_ERROR(Expect(']', absl::StrCat("to close ", what)));
  return values;
}

absl::StatusOr<DType> Parser::ParseDType(absl::string_view context) {
  SkipSpace();
  const size_t start = pos_;
  const absl::string_view word = Word();
  if (word.empty()) return Error(absl::StrCat("expected a type like f32[2, 3] ", context));
  for (int i = 0; i < kNumDTypes; ++i) {
    const auto t = static_cast<DType>(i);
    if (word == ShortDTypeName(t) || word == DTypeName(t)) return t;
  }
  return ErrorAt(start, absl::StrCat("unknown dtype '", word,
                                     "' (expected f32, f16, bf16, bool, i32 or i64)"));
}

absl::StatusOr<Device> Parser::ParseDevice() {
  SkipSpace();
  const size_t start = pos_;
  const absl::string_view word = Word();
  if (word == "cpu") return kCPU;
  if (word == "meta") return kMeta;
  if (word == "cuda") {
    if (Peek() != ':') return CUDA(0);
    ++pos_;
    KILN_ASSIGN_OR_RETURN(int64_t index, Integer("the CUDA device index"));
    if (index < 0 || index > 1024) return ErrorAt(start, "CUDA device index out of range");
    return CUDA(static_cast<int>(index));
  }
  return ErrorAt(start,
                 absl::StrCat("unknown device '", word, "' (expected cpu, meta, cuda or cuda:N)"));
}

absl::StatusOr<TensorType> Parser::Type(absl::string_view context) {
  TensorType type;
  KILN_ASSIGN_OR_RETURN(type.dtype, ParseDType(context));
  SkipSpace();
  const size_t shape_at = pos_;
  KILN_ASSIGN_OR_RETURN(type.shape, IntList("the shape"));
  for (int64_t d : type.shape) {
    if (d < 0) return ErrorAt(shape_at, absl::StrCat("negative dimension ", d, " in a shape"));
  }
  type.device = CUDA(0);
  if (Consume('@')) {
    KILN_ASSIGN_OR_RETURN(type.device, ParseDevice());
  }
  return type;
}

absl::StatusOr<int64_t> Parser::RefNumber(absl::string_view context) {
  SkipSpace();
  if (Peek() != '%') return Error(absl::StrCat("expected a value like %0 ", context));
  const size_t start = pos_++;
  while (!AtEnd() && IsDigit(Peek())) ++pos_;
  int64_t number = 0;
  const char* first = text_.data() + start + 1;
  const char* last = text_.data() + pos_;
  const auto [ptr, ec] = std::from_chars(first, last, number);
  if (first == last || ec != std::errc()) {
    return ErrorAt(start, "expected digits after '%' (values are written %0, %1, ...)");
  }
  return number;
}

absl::StatusOr<ValueId> Parser::Use(const Scope& scope) {
  SkipSpace();
  const size_t start = pos_;
  KILN_ASSIGN_OR_RETURN(int64_t number, RefNumber("as an operand"));
  const auto it = scope.find(number);
  if (it == scope.end()) return ErrorAt(start, absl::StrCat("undefined value %", number));
  return it->second;
}

absl::StatusOr<ValueList> Parser::Operands(const Scope& scope, absl::string_view what) {
  KILN_RETURN_IF_ERROR(Expect('(', absl::StrCat("after ", what)));
  ValueList values;
  if (Consume(')')) return values;
  do {
    KILN_ASSIGN_OR_RETURN(ValueId v, Use(scope));
    values.push_back(v);
  } while (Consume(','));
  KILN_RETURN_IF_ERROR(Expect(')', "after operands"));
  return values;
}

// Reads the number of a value being defined; it must be new in `scope`.
absl::StatusOr<int64_t> Parser::NewValue(const Scope& scope, absl::string_view context) {
  SkipSpace();
  const size_t start = pos_;
  KILN_ASSIGN_OR_RETURN(int64_t number, RefNumber(context));
  if (scope.contains(number)) return ErrorAt(start, absl::StrCat("redefinition of %", number));
  return number;
}

absl::Status Parser::ParseBody(Graph* g) {
  if (++nesting_ > kMaxNesting) return Error("fusion bodies are nested too deeply");
  if (PeekWord() != "graph") return Error("expected 'graph' at the start of a graph");
  Word();
  KILN_RETURN_IF_ERROR(Expect('(', "after 'graph'"));
  Scope scope;
  KILN_RETURN_IF_ERROR(Inputs(g, &scope));
  KILN_RETURN_IF_ERROR(Expect('{', "after the graph inputs"));
  while (PeekWord() != "return") {
    if (AtEnd() || Peek() == '}') return Error("missing 'return' at the end of the graph");
    KILN_RETURN_IF_ERROR(Statement(g, &scope));
  }
  KILN_RETURN_IF_ERROR(Return(g, scope));
  KILN_RETURN_IF_ERROR(Expect('}', "after the returned values"));
  --nesting_;
  return absl::OkStatus();
}

absl::Status Parser::Inputs(Graph* g, Scope* scope) {
  if (Consume(')')) return absl::OkStatus();
  do {
    KILN_ASSIGN_OR_RETURN(int64_t number, NewValue(*scope, "for a graph input"));
    KILN_RETURN_IF_ERROR(Expect(':', absl::StrCat("after graph input %", number)));
    KILN_ASSIGN_OR_RETURN(TensorType type, Type("after ':'"));
    (*scope)[number] = g->AddInput(std::move(type));
  } while (Consume(','));
  return Expect(')', "after the graph inputs");
}

absl::Status Parser::Statement(Graph* g, Scope* scope) {
  KILN_ASSIGN_OR_RETURN(int64_t number,
                        NewValue(*scope, "at the start of a statement (or 'return')"));
  KILN_RETURN_IF_ERROR(Expect('=', absl::StrCat("after %", number)));
  absl::StatusOr<ValueId> id;
  const absl::string_view word = PeekWord();
  if (word == "constant") {
    id = Constant(g);
  } else if (word == "fusion") {
    id = Fusion(g, *scope);
  } else if (word == "result") {
    id = Result(g, *scope);
  } else {
    id = OpCall(g, *scope);
  }
  if (!id.ok()) return id.status();
  (*scope)[number] = *id;
  return absl::OkStatus();
}

absl::StatusOr<ValueId> Parser::Constant(Graph* g) {
  Word();  // "constant"
  KILN_RETURN_IF_ERROR(Expect('"', "before the constant's name"));
  const size_t end = text_.find_first_of("\"\n", pos_);
  if (end == absl::string_view::npos || text_[end] != '"') {
    return Error("unterminated constant name (missing closing '\"')");
  }
  Node node;
  node.kind = NodeKind::kConstant;
  node.name = std::string(text_.substr(pos_, end - pos_));
  pos_ = end + 1;
  KILN_RETURN_IF_ERROR(Expect(':', "after the constant's name"));
  KILN_ASSIGN_OR_RETURN(node.type, Type("after ':'"));
  return g->AddNode(std::move(node));
}

absl::StatusOr<ValueId> Parser::Fusion(Graph* g, const Scope& scope) {
  Word();  // "fusion"
  Node node;
  node.kind = NodeKind::kFusion;
  node.name = std::string(Word());
  KILN_ASSIGN_OR_RETURN(node.inputs, Operands(scope, "the fusion's name"));
  KILN_RETURN_IF_ERROR(Expect(':', "after the fusion's operands"));
  KILN_ASSIGN_OR_RETURN(node.type, Type("after ':'"));
  KILN_RETURN_IF_ERROR(Expect('{', "before the fusion body"));
  auto body = std::make_shared<Graph>();
  KILN_RETURN_IF_ERROR(ParseBody(body.get()));
  KILN_RETURN_IF_ERROR(Expect('}', "after the fusion body"));
  node.body = std::move(body);
  return g->AddNode(std::move(node));
}

// 'result' %fusion '#' index ':' type; the verifier checks it against the fusion's body.
absl::StatusOr<ValueId> Parser::Result(Graph* g, const Scope& scope) {
  Word();  // "result"
  SkipSpace();
  KILN_ASSIGN_OR_RETURN(ValueId fusion, Use(scope));
  KILN_RETURN_IF_ERROR(Expect('#', "before the result's index"));
  KILN_ASSIGN_OR_RETURN(int64_t index, Integer("after '#'"));
  if (index < 1 || index > INT32_MAX) {
    return Error(absl::StrCat("the result index ", index, " is out of range (1 .. 2^31 - 1)"));
  }
  KILN_RETURN_IF_ERROR(Expect(':', "after the result's index"));
  Node node;
  node.kind = NodeKind::kResult;
  node.inputs = {fusion};
  node.index = static_cast<int>(index);
  KILN_ASSIGN_OR_RETURN(node.type, Type("after ':'"));
  return g->AddNode(std::move(node));
}

absl::StatusOr<ValueId> Parser::OpCall(Graph* g, const Scope& scope) {
  SkipSpace();
  const size_t start = pos_;
  const absl::string_view name = Word();
  if (name.empty()) return Error("expected an op name, 'constant' or 'fusion' after '='");
  const OpDef* def = FindOpDef(std::string_view(name.data(), name.size()));
  if (def == nullptr) return ErrorAt(start, absl::StrCat("unknown op '", name, "'"));
  KILN_ASSIGN_OR_RETURN(ValueList inputs, Operands(scope, absl::StrCat("op name '", name, "'")));
  OpAttrs attrs;
  KILN_RETURN_IF_ERROR(Attrs(*def, &attrs));
  KILN_RETURN_IF_ERROR(Expect(':', "before the result type"));
  KILN_ASSIGN_OR_RETURN(TensorType type, Type("after ':'"));
  return g->AddOpWithType(def->id, inputs, attrs, std::move(type));
}

absl::Status Parser::Attrs(const OpDef& def, OpAttrs* attrs) {
  if (!Consume('{')) return absl::OkStatus();
  if (Consume('}')) return absl::OkStatus();
  uint32_t seen = 0;
  do {
    KILN_RETURN_IF_ERROR(Attr(def, &seen, attrs));
  } while (Consume(','));
  return Expect('}', "after the attributes");
}

static_assert(kNumAttrRows <= 32, "Parser::Attr tracks the attributes seen in 32 bits");

absl::Status Parser::Attr(const OpDef& def, uint32_t* seen, OpAttrs* attrs) {
  SkipSpace();
  const size_t start = pos_;
  const absl::string_view key = Word();
  if (key.empty()) return Error("expected an attribute name");
  int index = 0;
  bool found = false;
  absl::Status status;
  ForEachAttrRow([&](const auto& row) {
    if (found || key != row.key) {
      index += !found;
      return;
    }
    found = true;
    if (!(def.attr_fields & row.field)) {
      status = ErrorAt(start, absl::StrCat("op '", def.name, "' has no attribute '", key, "'"));
    } else if (*seen & (1u << index)) {
      status = ErrorAt(start, absl::StrCat("duplicate attribute '", key, "'"));
    } else {
      *seen |= 1u << index;
      status = Expect('=', absl::StrCat("after attribute '", key, "'"));
      if (status.ok()) status = AttrValue(absl::StrCat("'", key, "'"), &(attrs->*row.member));
    }
  });
  if (!found) return ErrorAt(start, absl::StrCat("unknown attribute '", key, "'"));
  return status;
}

absl::Status Parser::AttrValue(absl::string_view what, GeluApprox* v) {
  SkipSpace();
  const size_t start = pos_;
  const absl::string_view word = Word();
  if (word == "tanh" || word == "none") {
    *v = word == "tanh" ? GeluApprox::kTanh : GeluApprox::kNone;
    return absl::OkStatus();
  }
  pos_ = start;
  return Error(absl::StrCat("expected tanh or none for ", what));
}

absl::Status Parser::AttrValue(absl::string_view what, Epilogue* epilogue) {
  return NamedValue(what, EpilogueName, kNumEpilogues, epilogue);
}

absl::Status Parser::AttrValue(absl::string_view what, ReduceOp* op) {
  return NamedValue(what, ReduceOpName, kNumReduceOps, op);
}

absl::Status Parser::Return(Graph* g, const Scope& scope) {
  Word();  // "return"
  std::vector<ValueId> outputs;
  SkipSpace();
  if (Peek() == '%') {
    do {
      KILN_ASSIGN_OR_RETURN(ValueId v, Use(scope));
      outputs.push_back(v);
    } while (Consume(','));
  }
  g->SetOutputs(std::move(outputs));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Graph> ParseGraph(std::string_view text) {
  return Parser(absl::string_view(text.data(), text.size())).ParseTop();
}

absl::StatusOr<OpAttrs> ParseAttrs(const OpDef& def, std::string_view text) {
  return Parser(absl::string_view(text.data(), text.size())).ParseAttrsOnly(def);
}

}  // namespace kiln::ir
