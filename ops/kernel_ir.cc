// The kernel IR (see kernel_ir.h).
#include "ops/kernel_ir.h"

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status.h"

namespace kiln::kir {
namespace {

std::string DoubleText(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::isnan(v)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

// The attributes an elementwise row reads, as text ("" when none).
std::string AttrText(const OpDef& def, const OpAttrs& a) {
  std::vector<std::string> parts;
  if (def.attr_fields & kAttrScalar) parts.push_back("scalar=" + a.scalar.ToString());
  if (def.attr_fields & kAttrApproximate) {
    parts.push_back(a.approximate == GeluApprox::kTanh ? "approximate=tanh" : "approximate=none");
  }
  if (def.attr_fields & kAttrDType) parts.push_back(absl::StrCat("dtype=", DTypeName(a.dtype)));
  if (def.attr_fields & kAttrEps) parts.push_back("eps=" + DoubleText(a.eps));
  if (def.attr_fields & kAttrDim) parts.push_back(absl::StrCat("dim=", a.dim));
  return parts.empty() ? "" : absl::StrCat(" {", absl::StrJoin(parts, ", "), "}");
}

}  // namespace

namespace {

// OpAttrs has exactly the fields the attribute table (kAttrRows) names: an aggregate takes at
// most as many initializers as it has fields.
struct AnyField {
  template <typename T>
  operator T() const;  // NOLINT: converts to any field's type, only in unevaluated contexts
};
template <typename... F>
constexpr bool kTakesInitializers = requires {
  OpAttrs{std::declval<F>()...};
};
template <size_t... I>
constexpr bool TakesFields(std::index_sequence<I...>) {
  return kTakesInitializers<decltype(static_cast<void>(I), AnyField{})...>;
}
constexpr size_t kListedFields = kNumAttrRows;
static_assert(TakesFields(std::make_index_sequence<kListedFields>()) &&
                  !TakesFields(std::make_index_sequence<kListedFields + 1>()),
              "OpAttrs gained a field: add its row to kAttrRows (ops/op_def.h)");

template <typename T>
void AppendFieldBits(const T& v, std::string* key) {
  if constexpr (std::is_same_v<T, Scalar>) {  // the kind, then the value (no padding bytes)
    key->push_back(v.is_bool() ? 'b' : v.is_integer() ? 'i' : 'f');
    AppendFieldBits(v.is_integer() ? v.to_int64() : std::bit_cast<int64_t>(v.to_double()), key);
  } else if constexpr (requires { v.size(); }) {  // Shape, Strides: the elements, then the count
    for (int64_t e : v) key->append(reinterpret_cast<const char*>(&e), sizeof(e));
    const int64_t n = static_cast<int64_t>(v.size());
    key->append(reinterpret_cast<const char*>(&n), sizeof(n));
  } else {
    key->append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
}

template <typename T>
bool FieldBitsEqual(const T& x, const T& y) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::bit_cast<uint64_t>(static_cast<double>(x)) ==
           std::bit_cast<uint64_t>(static_cast<double>(y));
  } else {
    return x == y;
  }
}

template <typename T>
constexpr bool IsScalarRow(const AttrRow<T>& row) {
  if constexpr (std::is_same_v<T, Scalar>) {
    return row.member == &OpAttrs::scalar;
  } else {
    return false;
  }
}

}  // namespace

void AppendAttrKey(const OpAttrs& a, std::string* key) {
  ForEachAttrRow([&](const auto& row) { AppendFieldBits(a.*row.member, key); });
}

bool SameAttrsButScalar(const OpAttrs& x, const OpAttrs& y) {
  return std::apply(
      [&](const auto&... row) {
        return ((IsScalarRow(row) || FieldBitsEqual(x.*row.member, y.*row.member)) && ...);
      },
      kAttrRows);
}

namespace {

std::string KeyOf(const Instr& in) {
  std::string key;
  key.push_back(static_cast<char>(in.kind));
  key.push_back(static_cast<char>(in.dtype));
  key.append(reinterpret_cast<const char*>(&in.input), sizeof(in.input));
  const uint16_t op = static_cast<uint16_t>(in.op);
  key.append(reinterpret_cast<const char*>(&op), sizeof(op));
  for (int a : in.args) key.append(reinterpret_cast<const char*>(&a), sizeof(a));
  if (in.kind == Instr::Kind::kOp) AppendAttrKey(in.attrs, &key);
  return key;
}

}  // namespace

int Program::Add(Instr instr) {
  auto [it, inserted] = index_.try_emplace(KeyOf(instr), static_cast<int>(values_.size()));
  if (inserted) values_.push_back(std::move(instr));
  return it->second;
}

int Program::Load(int input) {
  KILN_CHECK(input >= 0 && input < num_inputs(), "kernel IR: load of input ", input, " of ",
             num_inputs());
  Instr in;
  in.kind = Instr::Kind::kLoad;
  in.input = input;
  in.dtype = input_types_[input];
  return Add(std::move(in));
}

int Program::Apply(OpId op, absl::Span<const int> args, const OpAttrs& attrs, DType dtype) {
  const OpDef& def = GetOpDef(op);
  KILN_CHECK(def.is_elementwise() && static_cast<int>(args.size()) >= def.min_inputs &&
                 static_cast<int>(args.size()) <= def.max_inputs,
             "kernel IR: ", def.name, " with ", args.size(),
             " operands is not an elementwise instruction");
  Instr in;
  in.op = op;
  in.attrs = attrs;
  in.dtype = dtype;
  for (int a : args) {
    KILN_CHECK(a >= 0 && a < static_cast<int>(values_.size()), "kernel IR: ", def.name,
               " uses undefined value %", a);
    in.args.push_back(a);
  }
  return Add(std::move(in));
}

void Program::Store(int value, DType dtype) {
  KILN_CHECK(value >= 0 && value < static_cast<int>(values_.size()), "kernel IR: store of %",
             value);
  outputs_.push_back(value);
  output_types_.push_back(dtype);
}

std::string Program::ToString() const {
  std::string s;
  for (size_t v = 0; v < values_.size(); ++v) {
    const Instr& in = values_[v];
    if (in.kind == Instr::Kind::kLoad) {
      absl::StrAppend(&s, "%", v, " = load in", in.input, " : ", DTypeName(in.dtype), "\n");
      continue;
    }
    const OpDef& def = GetOpDef(in.op);
    absl::StrAppend(
        &s, "%", v, " = ", def.name, "(",
        absl::StrJoin(in.args, ", ", [](std::string* o, int a) { absl::StrAppend(o, "%", a); }),
        ")", scalar_param_ ? "" : AttrText(def, in.attrs), " : ", DTypeName(in.dtype), "\n");
  }
  for (size_t o = 0; o < outputs_.size(); ++o) {
    absl::StrAppend(&s, "store out", o, " = %", outputs_[o], " : ", DTypeName(output_types_[o]),
                    "\n");
  }
  return s;
}

}  // namespace kiln::kir
