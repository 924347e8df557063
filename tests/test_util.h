// Shared helpers of the kiln test suites: tolerances per dtype, element-wise closeness with a
// readable first mismatch, and the GPU skip rule.
//
// GPU tests call KILN_SKIP_WITHOUT_GPU(): without a GPU they skip with a message, unless the
// environment sets KILN_REQUIRE_GPU=1 (the GPU machine's run), where a missing GPU fails.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "runtime/build_config.h"
#include "runtime/dtype.h"
#include "runtime/status.h"
#include "runtime/storage.h"

namespace kiln {

struct Tolerance {
  double atol, rtol;
};

inline Tolerance ToleranceFor(DType t) {
  switch (t) {
    case DType::kFloat16:
      return {2e-3, 2e-3};
    case DType::kBFloat16:
      return {1e-2, 1.6e-2};
    case DType::kFloat32:
      return {1e-5, 1e-5};
    default:
      return {0, 0};
  }
}

// The tolerance of a result of dtype `t` against `reference`, mainly relative (the numerics
// policy, docs/ARCHITECTURE.md): the dtype's relative term, plus an absolute term scaled to the
// values at hand instead of a fixed one: `half_fraction` (1e-3) x the largest finite |reference
// value| for half precision, the relative term x that for float32. A fixed absolute 1e-2 let a
// bf16 value of 0.05 be 20 % wrong; here it is held to its dtype's precision unless it is a
// thousandth of the largest. Integer and bool results are exact.
inline Tolerance RelativeToleranceFor(DType t, const std::vector<double>& reference,
                                      double half_fraction = 1e-3) {
  if (!IsFloatingPoint(t)) return {0, 0};
  double largest = 0;
  for (double v : reference) {
    if (std::isfinite(v)) largest = std::max(largest, std::fabs(v));
  }
  const double rtol = ToleranceFor(t).rtol;
  return {(t == DType::kFloat32 ? rtol : half_fraction) * largest, rtol};
}

// `run` throws kiln::Error whose message contains each of `words` (the op, the shapes, the rule).
template <typename... Words>
void ExpectThrowsWith(const std::function<void()>& run, const Words&... words) {
  const std::vector<std::string> all = {std::string(words)...};
  try {
    run();
    ADD_FAILURE() << "no error; expected one saying \"" << all.at(0) << "\"";
  } catch (const Error& e) {
    for (const std::string& w : all) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "missing \"" << w << "\" in: " << e.what();
    }
  }
}

inline void ExpectClose(const std::vector<double>& got, const std::vector<double>& want,
                        Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    const bool same_inf = std::isinf(want[i]) && got[i] == want[i];
    const double err = std::fabs(got[i] - want[i]);
    if (both_nan || same_inf || err <= tol.atol + tol.rtol * std::fabs(want[i])) continue;
    if (++bad <= 3) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", expected " << want[i]
                    << " (|err| " << err << " > " << tol.atol << " + " << tol.rtol << "·|ref|)";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// The integer in environment variable `name` (at least `min`), or `fallback` when it is unset:
// the fuzzers' and the differential's knobs for longer hunts (KILN_FUZZ_PROGRAMS, ...).
inline int EnvInt(const char* name, int fallback, int min = 1) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::max(min, std::atoi(v)) : fallback;
}

// The message of the kiln::Error that `f()` throws, or "(no error)".
template <typename F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// A local TCP port nothing listens on now (the kernel's pick for port 0), for tests that serve a
// store; another process may take it before the test does (rare).
inline int FreeTcpPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

inline bool GpuPresent() { return HasAllocator(DeviceType::kCUDA); }
inline bool GpuRequired() {
  const char* v = std::getenv("KILN_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace kiln

// NVRTC compiles generated CUDA sources without a GPU, in a build with CUDA (build_config.h).
#define KILN_SKIP_WITHOUT_NVRTC()                                                              \
  do {                                                                                         \
    if constexpr (!::kiln::kWithCuda) GTEST_SKIP() << "kiln was built without CUDA: no NVRTC"; \
  } while (0)

#define KILN_SKIP_WITHOUT_GPU()                                                     \
  do {                                                                              \
    if (!::kiln::GpuPresent()) {                                                    \
      if (::kiln::GpuRequired()) FAIL() << "KILN_REQUIRE_GPU=1 but no CUDA device"; \
      GTEST_SKIP() << "no CUDA device (or kiln built without the CUDA backend)";    \
    }                                                                               \
  } while (0)
