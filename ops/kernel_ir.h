// The kernel IR: what one generated kernel computes per element, as a short SSA list.
//
// A program reads its kernel inputs (loads), applies registry ops (one instruction per op, each
// the leaf of its row's scalar function and CUDA expression), and stores some of its values into
// the kernel outputs. Identical instructions are one value (hash-consed on insertion), so a value
// with several users is computed once and a renderer prints it once: generated source grows
// linearly with the program, whatever the reuse. Where an element is (the index expression of
// each load and store) is the kernel family's business: the elementwise skeletons
// (codegen/families/pointwise/elementwise_cuda.h) and the softmax skeleton render loads and stores
// with their own indexing around the same instruction list; the CPU evaluator
// (codegen/fused_kernel.h) runs it with strided loops.
//
//   kir::Program p({DType::kBFloat16, DType::kBFloat16});
//   int x = p.Load(0), u = p.Load(1);
//   int g = p.Apply(OpId::kGelu, {x}, gelu_attrs, DType::kBFloat16);
//   p.Store(p.Apply(OpId::kMul, {g, u}, {}, DType::kBFloat16), DType::kBFloat16);
//   std::cout << p.ToString();
//     %0 = load in0 : bf16
//     %1 = load in1 : bf16
//     %2 = gelu(%0) {approximate=tanh} : bf16
//     %3 = mul(%2, %1) : bf16
//     store out0 = %3 : bf16
#pragma once

#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "ops/op_def.h"

namespace kiln::kir {

struct Instr {
  enum class Kind : uint8_t { kLoad, kOp };
  Kind kind = Kind::kOp;
  DType dtype = DType::kFloat32;     // the value's dtype: the input's (load) or the op's result
  int input = -1;                    // kLoad: which kernel input
  OpId op = OpId::kNumOps;           // kOp
  OpAttrs attrs;                     // kOp
  absl::InlinedVector<int, 3> args;  // kOp: earlier values
};

class Program {
 public:
  Program() = default;
  explicit Program(std::vector<DType> input_types) : input_types_(std::move(input_types)) {}

  // Adds (or finds the identical) instruction; returns its value id.
  int Load(int input);
  int Apply(OpId op, absl::Span<const int> args, const OpAttrs& attrs, DType dtype);
  // Declares kernel output `outputs().size()` as `value`, stored as `dtype`.
  void Store(int value, DType dtype);

  const std::vector<DType>& input_types() const { return input_types_; }
  const std::vector<Instr>& values() const { return values_; }
  const Instr& value(int v) const { return values_[v]; }
  const std::vector<int>& outputs() const { return outputs_; }
  const std::vector<DType>& output_types() const { return output_types_; }
  int num_inputs() const { return static_cast<int>(input_types_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  // Whether `$scalar` of the ops is a kernel parameter (eager kernels: one kernel serves every
  // scalar) rather than a literal baked into the source (fused kernels).
  bool scalar_param() const { return scalar_param_; }
  void set_scalar_param(bool on) { scalar_param_ = on; }
  // With scalar_param: whether the scalar is an integer (integer instructions then read it as a
  // long long; a fractional one is compared as a double, exactly: x == 2.5 is false for ints).
  bool scalar_integral() const { return scalar_integral_; }
  void set_scalar_integral(bool on) { scalar_integral_ = on; }

  // The program as text, one line per instruction and store (dumps, tests).
  std::string ToString() const;

 private:
  int Add(Instr instr);

  std::vector<DType> input_types_;
  std::vector<Instr> values_;
  std::vector<int> outputs_;
  std::vector<DType> output_types_;
  bool scalar_param_ = false;
  bool scalar_integral_ = true;
  std::unordered_map<std::string, int> index_;  // an instruction's key -> its value
};

// Appends every attribute (the rows of kAttrRows, ops/op_def.h), bit-exact, to `key` (instruction
// identity, kernel cache keys).
void AppendAttrKey(const OpAttrs& attrs, std::string* key);

// True when every field but `scalar` holds the same bits in both (0.0 and -0.0 differ, as their
// keys do); compares in place, without building a key.
bool SameAttrsButScalar(const OpAttrs& x, const OpAttrs& y);

}  // namespace kiln::kir
