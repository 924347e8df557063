// einsum (see ops.h): the equation parsed into one label per dim, then the operands contracted
// left to right, each pair as one matmul (torch's strategy without path optimisation): labels
// in both operands and needed later are batch dims, those in both and not needed later are summed
// by the matmul, the rest ride along as its M and N; a label no later operand or the output needs
// is summed out of its operand first. Written with permute, reshape, expand, sum and matmul, so it
// traces and compiles as they do.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/ops.h"
#include "runtime/status.h"

namespace kiln {
namespace {

using Labels = std::vector<int>;  // one label per dim: 0-51 letters, 52+ the ellipsis' dims
constexpr int kEllipsisBase = 52;

int LetterLabel(char c) { return c >= 'A' && c <= 'Z' ? c - 'A' : 26 + (c - 'a'); }

// The subscript of a label, for errors ("'i'", or "of the ellipsis").
std::string LabelName(int l) {
  if (l >= kEllipsisBase) return "of the ellipsis";
  return absl::StrCat("'", std::string(1, static_cast<char>(l < 26 ? 'A' + l : 'a' + l - 26)), "'");
}

struct Equation {
  std::vector<std::string> inputs;  // each operand's subscripts, "..." kept
  std::string output;
  bool explicit_output = false;
};

Equation Split(const std::string& eq) {
  std::string text;
  for (char c : eq) {
    if (c != ' ') text += c;
  }
  Equation e;
  const size_t arrow = text.find("->");
  e.explicit_output = arrow != std::string::npos;
  const std::string lhs = e.explicit_output ? text.substr(0, arrow) : text;
  if (e.explicit_output) e.output = text.substr(arrow + 2);
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    e.inputs.push_back(lhs.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return e;
}

// The labels of subscripts `s` for a tensor of rank `rank` (the ellipsis right-aligned among
// `ellipsis_rank` shared dims), or the error.
Labels ParseTerm(const std::string& s, int64_t rank, int64_t ellipsis_rank, const std::string& what,
                 bool* has_ellipsis) {
  Labels labels;
  int64_t explicit_dims = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 3, "...") == 0) {
      KILN_CHECK(!*has_ellipsis, "einsum: ", what, " '", s, "' has more than one ellipsis");
      *has_ellipsis = true;
      labels.push_back(-1);  // placeholder, expanded below
      i += 2;
      continue;
    }
    const char c = s[i];
    KILN_CHECK((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'), "einsum: ", what, " '", s,
               "' has '", std::string(1, c), "'; subscripts are letters and one '...'");
    labels.push_back(LetterLabel(c));
    ++explicit_dims;
  }
  const int64_t e = *has_ellipsis ? rank - explicit_dims : 0;
  KILN_CHECK(rank < 0 || (*has_ellipsis ? e >= 0 : explicit_dims == rank), "einsum: ", what, " '",
             s, "' has ", explicit_dims, " subscripts", *has_ellipsis ? " and an ellipsis" : "",
             " for a tensor of rank ", rank);
  Labels out;
  for (int l : labels) {
    if (l != -1) {
      out.push_back(l);
      continue;
    }
    const int64_t n = rank < 0 ? ellipsis_rank : e;  // the output's ellipsis: all shared dims
    for (int64_t j = 0; j < n; ++j) {
      out.push_back(kEllipsisBase + static_cast<int>(ellipsis_rank - n + j));
    }
  }
  return out;
}

bool Has(const Labels& l, int x) { return std::find(l.begin(), l.end(), x) != l.end(); }

// An operand with a label per dim.
struct Term {
  Tensor t;
  Labels labels;
};

// `term` with the dims whose labels are not in `keep` summed out.
Term SumOut(Term term, const Labels& keep) {
  std::vector<int64_t> dims;
  Labels kept;
  for (size_t d = 0; d < term.labels.size(); ++d) {
    if (Has(keep, term.labels[d])) {
      kept.push_back(term.labels[d]);
    } else {
      dims.push_back(static_cast<int64_t>(d));
    }
  }
  if (!dims.empty()) term.t = sum(term.t, dims);
  return {term.t, kept};
}

// `term` permuted to `order` (labels it has) and expanded to the labels' sizes.
Tensor Arrange(const Term& term, const Labels& order, const std::vector<int64_t>& size) {
  std::vector<int64_t> perm;
  Shape shape;
  for (int l : order) {
    perm.push_back(std::find(term.labels.begin(), term.labels.end(), l) - term.labels.begin());
    shape.push_back(size[l]);
  }
  return expand(permute(term.t, perm), shape);
}

int64_t Product(const Labels& labels, const std::vector<int64_t>& size) {
  int64_t p = 1;
  for (int l : labels) p *= size[l];
  return p;
}

// a and b contracted over their shared labels that `later` does not need.
Term Contract(const Term& a, const Term& b, const Labels& later, const std::vector<int64_t>& size) {
  Labels batch, summed, a_only, b_only;
  for (int l : a.labels) {
    if (!Has(b.labels, l)) {
      a_only.push_back(l);
    } else {
      (Has(later, l) ? batch : summed).push_back(l);
    }
  }
  for (int l : b.labels) {
    if (!Has(a.labels, l)) b_only.push_back(l);
  }
  Labels a_order = batch, b_order = batch;
  a_order.insert(a_order.end(), a_only.begin(), a_only.end());
  a_order.insert(a_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), summed.begin(), summed.end());
  b_order.insert(b_order.end(), b_only.begin(), b_only.end());
  Shape batch_shape;
  for (int l : batch) batch_shape.push_back(size[l]);
  const int64_t m = Product(a_only, size), k = Product(summed, size), n = Product(b_only, size);
  Shape a_shape = batch_shape, b_shape = batch_shape;
  a_shape.insert(a_shape.end(), {m, k});
  b_shape.insert(b_shape.end(), {k, n});
  const Tensor product = matmul(reshape(Arrange(a, a_order, size), a_shape),
                                reshape(Arrange(b, b_order, size), b_shape));
  Labels labels = batch;
  labels.insert(labels.end(), a_only.begin(), a_only.end());
  labels.insert(labels.end(), b_only.begin(), b_only.end());
  Shape shape;
  for (int l : labels) shape.push_back(size[l]);
  return {reshape(product, shape), labels};
}

// The operands contracted left to right into the output's labels: before each step, what no
// later operand or the output needs is summed out of the operand.
Tensor ContractAll(const std::vector<Term>& terms, const Labels& out,
                   const std::vector<int64_t>& size) {
  auto needed_after = [&](size_t i) {  // the labels of the operands after i, and the output's
    Labels later = out;
    for (size_t j = i + 1; j < terms.size(); ++j) {
      later.insert(later.end(), terms[j].labels.begin(), terms[j].labels.end());
    }
    return later;
  };
  Term acc = SumOut(terms[0], needed_after(0));
  for (size_t i = 1; i < terms.size(); ++i) {
    const Labels later = needed_after(i);
    Labels keep = later;
    keep.insert(keep.end(), acc.labels.begin(), acc.labels.end());
    acc = Contract(acc, SumOut(terms[i], keep), later, size);
  }
  acc = SumOut(acc, out);
  // To the output's order and sizes (a label of size 1 in every operand stays 1).
  return contiguous(Arrange(acc, out, size));
}

}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& operands) {
  const Equation e = Split(equation);
  KILN_CHECK(e.inputs.size() == operands.size(), "einsum: '", equation, "' has ", e.inputs.size(),
             " operand subscripts for ", operands.size(), " tensors");
  // The ellipsis covers the most dims any operand gives it.
  int64_t ellipsis_rank = 0;
  for (size_t i = 0; i < operands.size(); ++i) {
    KILN_CHECK(operands[i].defined(), "einsum: operand ", i, " is an undefined tensor");
    int64_t letters = 0;
    for (char c : e.inputs[i]) letters += c != '.';
    if (e.inputs[i].find("...") != std::string::npos) {
      ellipsis_rank = std::max(ellipsis_rank, operands[i].dim() - letters);
    }
  }
  std::vector<Term> terms;
  std::vector<int64_t> size(kEllipsisBase + ellipsis_rank, -1);
  std::vector<int> count(size.size(), 0);
  for (size_t i = 0; i < operands.size(); ++i) {
    const std::string what = absl::StrCat("operand ", i);
    bool ellipsis = false;
    Labels labels = ParseTerm(e.inputs[i], operands[i].dim(), ellipsis_rank, what, &ellipsis);
    for (size_t d = 0; d < labels.size(); ++d) {
      const int l = labels[d];
      KILN_CHECK(std::count(labels.begin(), labels.end(), l) == 1 || l >= kEllipsisBase,
                 "einsum: ", what, " '", e.inputs[i], "' repeats a subscript (a diagonal), ",
                 "which is not supported");
      const int64_t s = operands[i].size(static_cast<int64_t>(d));
      KILN_CHECK(size[l] == -1 || size[l] == s || size[l] == 1 || s == 1, "einsum: the dim ",
                 LabelName(l), " of ", what, " has size ", s, " where another operand's has ",
                 size[l], " (sizes must agree or be 1), in '", equation, "'");
      if (size[l] == -1 || size[l] == 1) size[l] = s;
      ++count[l];
    }
    terms.push_back({operands[i], std::move(labels)});
  }
  Labels out;
  if (e.explicit_output) {
    bool ellipsis = false;
    out = ParseTerm(e.output, -1, ellipsis_rank, "the output", &ellipsis);
    for (int l : out) {
      KILN_CHECK(std::count(out.begin(), out.end(), l) == 1, "einsum: the output '", e.output,
                 "' repeats a subscript");
      KILN_CHECK(size[l] != -1, "einsum: the output '", e.output,
                 "' has a subscript no operand has, in '", equation, "'");
    }
  } else {  // implicit: the ellipsis, then the letters seen once, in order
    for (int l = kEllipsisBase; l < static_cast<int>(size.size()); ++l) out.push_back(l);
    for (int l = 0; l < kEllipsisBase; ++l) {
      if (count[l] == 1) out.push_back(l);
    }
  }
  return WithErrorContext([&] { return absl::StrCat("einsum '", equation, "'"); },
                          [&] { return ContractAll(terms, out, size); });
}

}  // namespace kiln
