// Error model of kiln.
//
// Infrastructure code (passes, codegen, CUDA/NVRTC calls, file IO) returns absl::Status /
// absl::StatusOr and propagates with KILN_RETURN_IF_ERROR / KILN_ASSIGN_OR_RETURN. The
// model-writing API (ops, modules, tensors) throws kiln::Error, which carries such a status, so
// that `gelu(add(x, b))` stays readable:
//
//   KILN_CHECK(a.dim() == 2, "matmul: expected a 2-D tensor, got ", a.shape_string());
//   KILN_ASSIGN_OR_RETURN(Plan plan, Lower(graph));
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace kiln {

// Thrown by the model-writing API. what() is the status message; status() keeps the code.
class Error : public std::runtime_error {
 public:
  explicit Error(absl::Status status)
      : std::runtime_error(std::string(status.message())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }
  absl::StatusCode code() const { return status_.code(); }

 private:
  absl::Status status_;
};

// Throws kiln::Error if `status` is not OK.
inline void ThrowIfError(const absl::Status& status) {
  if (!status.ok()) throw Error(status);
}

// Returns the value of `result` or throws its status as kiln::Error.
template <typename T>
T ValueOrThrow(absl::StatusOr<T> result) {
  if (!result.ok()) throw Error(result.status());
  return *std::move(result);
}

// Runs f(); a kiln::Error it throws is rethrown with context() ("Module: the rule") in front of
// its message and its code kept, so an error from an op deep inside a module names the module.
// `context` is called only on an error (no string is built on the path that succeeds).
template <typename C, typename F>
decltype(auto) WithErrorContext(C&& context, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const Error& e) {
    throw Error(absl::Status(e.code(), absl::StrCat(context(), ": ", e.what())));
  }
}

}  // namespace kiln

#define KILN_STATUS_CONCAT_INNER_(a, b) a##b
#define KILN_STATUS_CONCAT_(a, b) KILN_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define KILN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status kiln_status_ = (expr);        \
    if (!kiln_status_.ok()) return kiln_status_; \
  } while (0)

#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(*tmp)

// `KILN_ASSIGN_OR_RETURN(T x, StatusOrExpr);` declares x from the value or returns the error.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_STATUS_CONCAT_(kiln_statusor_, __LINE__), lhs, expr)

// Throws kiln::Error(kInvalidArgument) with the concatenated message unless `cond` holds.
#define KILN_CHECK(cond, ...)                                                                    \
  do {                                                                                           \
    if (!(cond)) throw ::kiln::Error(::absl::InvalidArgumentError(::absl::StrCat(__VA_ARGS__))); \
  } while (0)

// Throws kiln::Error(kInvalidArgument) with the concatenated message (a KILN_CHECK that always
// fails, for the end of a switch or a lookup).
#define KILN_FAIL(...) \
  throw ::kiln::Error(::absl::InvalidArgumentError(::absl::StrCat(__VA_ARGS__)))
