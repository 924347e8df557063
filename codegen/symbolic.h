// Symbolic dims: one compiled plan for every size of the dims that vary between calls (a decode
// loop's sequence length, a batch size), like torch's automatic dynamic shapes.
//
// kiln's model code reads sizes as plain integers (x.size(1)), so a symbol cannot be followed
// through the user's arithmetic. Instead the function is traced three times: at the real sizes
// of the call and at two probe assignments (distinct primes) of the symbols. The three graphs
// must be the same program: same ops, operands, dtypes, devices, constants and attributes, where
// only sizes may differ. A node's type dims that differ are symbolic (Node::sym_dims); the size
// attributes of views that differ (reshape/expand sizes, slice bounds) must each be one formula
// offset + scale·s (or scale·s·t) that predicts all three traces (Node::sym_attrs). Anything else
// — a constant built from a size, an op that appears only at some sizes, an attribute no formula
// explains — makes the function not symbolic in those dims, and the caller compiles per size.
//
// Guards at call time check what stays static: the rank, dtype and device of every input, every
// static dim, and that the dims of one symbol agree. A call whose symbol values lie outside the
// range the traces covered is traced once more at its sizes and must be the same program there
// (SameProgramAt): a branch on a size, a dim of size 1 squeezed, a slice bound that turns
// negative are found, and such sizes get a plan of their own; a pass widens the range. Limitation
// (stated, not checked): control flow inside a verified range that no traced size shows (a branch
// on size == 100 between traces at 97 and 131) is not detected (torch guards such branches;
// kiln's model API has no symbolic integers).
//
//   std::optional<SymbolicShapes> s = SymbolsBetween(first_types, new_types);
//   absl::StatusOr<ir::Graph> g = TraceSymbolic(fn, new_types, *s);
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ir/tracer.h"

namespace kiln::codegen {

struct SymbolicShapes {
  struct Symbol {
    std::vector<std::pair<int, int>> dims;  // (input, dim) pairs that carry it
  };
  std::vector<Symbol> symbols;

  bool empty() const { return symbols.empty(); }
  // The call's value of each symbol.
  std::vector<int64_t> Values(absl::Span<const Tensor> inputs) const;
  // Whether `inputs` fit `traced` under these symbols (the guard).
  bool Admits(const std::vector<TensorType>& traced, absl::Span<const Tensor> inputs) const;
  // "s0 = input0[1] = input1[1]; s1 = input0[0]" (the report).
  std::string Describe() const;
};

// Symbols for the dims where two signatures of equal rank, dtype and device differ, one per group
// of dims whose values agree in both; nullopt when they differ in more than sizes.
std::optional<SymbolicShapes> SymbolsBetween(const std::vector<TensorType>& a,
                                             const std::vector<TensorType>& b);
// Symbols for dims the user named ((input, dim) pairs); dims with equal sizes in `types` share a
// symbol. Errors name a dim that does not exist.
absl::StatusOr<SymbolicShapes> NamedSymbols(const std::vector<TensorType>& types,
                                            const std::vector<std::pair<int, int>>& dims);

// Traces `fn` at `types` and at two probe sizes of `symbols`, checks the traces are one program,
// and returns the graph at `types` with sym_dims and sym_attrs set; an error says why the
// function is not symbolic in those dims.
// `whole_inputs` (may be null): per output, the input it is, whole, at every traced size (an
// OutputAlias with whole_input set), else nullopt; an output that is a view of an input (not all
// of it) is then an error (a symbolic plan would return a copy where eager returns the view).
absl::StatusOr<ir::Graph> TraceSymbolic(
    const ir::TensorFn& fn, const std::vector<TensorType>& types, const SymbolicShapes& symbols,
    std::vector<std::optional<ir::OutputAlias>>* whole_inputs = nullptr);

// The symbol values of TraceSymbolic's three traces (the call's and the probes').
std::vector<std::vector<int64_t>> TracedValues(const std::vector<TensorType>& types,
                                               const SymbolicShapes& symbols);

// OK when `fn` traced at `types` with the symbols set to `values` is the program `symbolic` (a
// graph TraceSymbolic returned) at those values: the same nodes, static dims and attributes, its
// size formulas giving the traced sizes. An error (a user exception while tracing included) says
// where it differs.
absl::Status SameProgramAt(const ir::TensorFn& fn, const ir::Graph& symbolic,
                           const std::vector<TensorType>& types, const SymbolicShapes& symbols,
                           absl::Span<const int64_t> values);

// The attributes of view node `n` at the given symbol values (its sym_attrs evaluated).
OpAttrs InstantiateAttrs(const ir::Node& n, absl::Span<const int64_t> symbol_values);

}  // namespace kiln::codegen
