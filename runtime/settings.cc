// The KILN_* settings table and its parsers (see settings.h).
#include "runtime/settings.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "runtime/status.h"

namespace kiln {
namespace {

using Kind = Setting::Kind;

const Setting& Find(const char* name, Kind kind) {
  for (const Setting& s : Settings()) {
    if (std::string(s.name) == name) {
      KILN_CHECK(s.kind == kind, "settings: ", name, " is read as the wrong kind");
      return s;
    }
  }
  KILN_FAIL("settings: ", name, " is not in kiln's settings table (runtime/settings.cc)");
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The raw value, or the table's default when unset.
std::string Raw(const Setting& s) {
  const char* v = std::getenv(s.name);
  return v != nullptr ? v : s.fallback;
}

// 1/0 for a boolean word, -1 for anything else.
int BoolWord(const std::string& v) {
  const std::string l = Lower(v);
  if (l == "1" || l == "on" || l == "true" || l == "yes") return 1;
  if (l == "0" || l == "off" || l == "false" || l == "no") return 0;
  return -1;
}

// What a setting accepts, in words (choices separated by commas: a Markdown table holds them).
std::string Values(const Setting& s) {
  switch (s.kind) {
    case Kind::kBool:
      return "1/0, on/off, true/false, yes/no";
    case Kind::kLevel:
      return s.choices;
    case Kind::kChoice:
      return absl::StrJoin(absl::StrSplit(s.choices, '|'), ", ");
    case Kind::kPath:
      return "a path";
    case Kind::kNames:
      return "names separated by commas";
  }
  return "";
}

}  // namespace

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> table = {
      {"KILN_COMPILE", Kind::kBool, "on", "",
       "off: compile() with CompileOptions::Mode::kDefault runs the function eagerly"},
      {"KILN_CUDA_GRAPHS", Kind::kBool, "off", "",
       "on: every compiled function replays its plan as a CUDA graph "
       "(CompileOptions::cuda_graphs)"},
      {"KILN_DEBUG", Kind::kLevel, "0", "0..4",
       "1: one line per compile (CompileReport::Summary()) and CUDA graph; 2: the explain log; "
       "3: kernel sources; 4: the graph after every pass"},
      {"KILN_DUMP", Kind::kPath, "", "",
       "a folder: each compile writes its graphs, kernels and explain log to DIR/compile_NNN"},
      {"KILN_CACHE_DIR", Kind::kPath, "", "",
       "the on-disk NVRTC kernel cache (default ~/.cache/kiln; an unusable folder turns it off)"},
      {"KILN_RETIME", Kind::kBool, "off", "",
       "on: per-shape choices (GEMV or cuBLASLt, fused epilogue or not) are timed again, not read "
       "from the cache directory, and stored anew"},
      {"KILN_STARTUP", Kind::kBool, "on", "",
       "off: library start-up (cuBLASLt's handle and heuristic tables) is paid at first use "
       "instead of on a background thread from the device's first allocation (runtime/startup.h)"},
      {"KILN_BACKGROUND_COMPILE", Kind::kBool, "off", "",
       "on: a kernel no cache has whose family has a fallback (the gemm family's Hopper GEMM) "
       "compiles on a background thread while the plan's first calls run the fallback (a CUDA "
       "graph capture waits for it); off: compile() compiles it"},
      {"KILN_GEMV", Kind::kChoice, "auto", "on|off|auto",
       "linears with few rows: kiln's GEMV (on), cuBLASLt (off), or timed once per shape (auto)"},
      {"KILN_GEMV_MMA", Kind::kBool, "on", "",
       "off: kiln's GEMV keeps its FMA loop for 2..8 rows instead of tensor cores (A/B)"},
      {"KILN_GEMV_NORM_FOLD", Kind::kBool, "on", "",
       "off: kiln's norm GEMV keeps its prologue (statistics, the normalised rows in shared "
       "memory) instead of folding the norm into the column sums (one row of bf16/f16; 2..8 rows "
       "of bf16 on tensor cores) (A/B)"},
      {"KILN_GEMV_GLU", Kind::kBool, "off", "",
       "on: a GLU MLP's gate/up projection after a norm and act(gate) * up run as one gated GEMV "
       "for few rows (CompileOptions::gated_gemv's default; off: on the H100 it loses its "
       "per-shape timing to the norm GEMV and the product kernel)"},
      {"KILN_GEMV_CHAIN", Kind::kBool, "off", "",
       "on: a compiled plan launches consecutive one-row GEMVs of a decode step as one chain "
       "kernel instead of one launch each (measured slower than one launch each: off by default)"},
      {"KILN_GEMM", Kind::kChoice, "cublas", "auto|kiln|cublas",
       "linears kiln's sm_90a GEMM can run (bf16/f16, no activation): timed once per shape against "
       "cuBLASLt (auto), always kiln's (kiln), or cuBLASLt only (cublas)"},
      {"KILN_GEMV_PRELOAD", Kind::kChoice, "rule", "rule|off|always",
       "where the GEMV loads its first weights before its dependency wait: where no kernel that "
       "may still run writes them (rule), never (off: an L2 prefetch only; A/B), or always "
       "(unsafe: "
       "to check that the race test catches a broken rule)"},
      {"KILN_PDL", Kind::kBool, "on", "",
       "off: kiln's kernels launch plainly, not as programmatic dependent launches that overlap "
       "the previous kernel's tail (sm_90 and later; A/B)"},
      {"KILN_CAPTURE_ARENA_MB", Kind::kLevel, "64", "0..4096",
       "the largest arena (MiB) a captured CUDA graph's intermediates and outputs take instead of "
       "graph memory nodes, which keep its kernels apart (0: graph memory nodes only; A/B)"},
      {"KILN_PDL_GRAPHS", Kind::kBool, "on", "",
       "off: kernels captured into a CUDA graph launch plainly, not as programmatic dependents "
       "(graph edges that overlap each kernel with its predecessor's tail; A/B)"},
      {"KILN_FLASH_SMALL_GRID", Kind::kBool, "on", "",
       "off: flash attention keeps 128-row tiles for small grids (A/B)"},
      {"KILN_FLASH_SM90", Kind::kBool, "on", "",
       "off: attention without a mask runs the mma.sync flash kernel on sm_90 too, not the Hopper "
       "kernel (TMA, wgmma; A/B)"},
      {"KILN_FLASH_SM90_BLOCK_N", Kind::kLevel, "0", "0..256",
       "keys per K/V tile of the Hopper attention kernel, a multiple of 16 in 64..256 (0: its "
       "plan's; A/B)"},
      {"KILN_FLASH_SM90_STAGES", Kind::kLevel, "0", "0..8",
       "K/V tiles in flight in the Hopper attention kernel, 2..8 (0: its plan's; A/B)"},
      {"KILN_FLASH_SM90_CONSUMERS", Kind::kLevel, "0", "0..3",
       "warpgroups sharing a K/V tile in the Hopper attention kernel: 1 (CTAs of 64 rows, several "
       "an SM) or 2..3 (64 rows each, one persistent CTA an SM; 0: its plan's; A/B)"},
      {"KILN_FLASH_L2_SECTIONS", Kind::kBool, "on", "",
       "off: the flash attention kernels' CTAs run each row tile over every (batch, head) in "
       "turn, not over sections of heads whose K/V fit in L2 (the mma.sync kernel always does for "
       "causal attention; A/B)"},
      {"KILN_FLASH_SM90_EXP2_FMA", Kind::kLevel, "-1", "-1..8",
       "of every 8 exponentials of the Hopper attention kernel's softmax, how many are computed "
       "by a polynomial on the FMA pipe instead of the MUFU unit's ex2 (-1: its plan's; A/B)"},
      {"KILN_FLASH_SM90_PINGPONG", Kind::kBool, "on", "",
       "off: the Hopper attention kernel's consumer warpgroups (persistent form) issue their "
       "wgmma unordered, not in turns (ping-pong; A/B)"},
      {"KILN_FLASH_SM90_DYNAMIC", Kind::kBool, "on", "",
       "off: the Hopper attention kernel's persistent CTAs take every gridDim.x-th causal work "
       "item, not the next one free from a counter (FlashAttention-3's tile scheduler; A/B)"},
      {"KILN_FD_CLUSTER", Kind::kBool, "on", "",
       "off: the decode attention kernel's key splits merge through a workspace and a second "
       "kernel instead of one thread-block cluster per row (sm_90 and later; A/B)"},
      {"KILN_KV_APPEND", Kind::kBool, "on", "",
       "off: a compiled KV-cache append fused with the attention reading the cache runs as "
       "index_copy kernels before the attention kernel, not inside it (A/B)"},
      {"KILN_KV_ROPE", Kind::kBool, "off", "",
       "on: a compiled decode step's rotary embedding of the query and the new keys runs inside "
       "the attention kernel that appends the keys to the cache (CompileOptions::kv_rope's "
       "default; off, the default: a pointwise kernel before it; the kernel has not run on a GPU)"},
      {"KILN_CUDA_GRAPH_DOT", Kind::kPath, "", "",
       "a prefix: each captured CUDA graph is written as PREFIX.N.dot (Graphviz)"},
      {"KILN_DISABLED_FAMILIES", Kind::kNames, "", "",
       "kernel families every compile leaves out, e.g. norm_linear,softmax (added to "
       "CompileOptions::disabled_families; a name that is no family is an error at compile())"},
      {"KILN_EW_UNROLL", Kind::kLevel, "4", "1..4",
       "16-byte vectors per thread per iteration in generated contiguous kernels (A/B)"},
      {"KILN_EW_ROWS_UNROLL", Kind::kLevel, "4", "1..4",
       "rows per thread per iteration in generated rows kernels (A/B)"},
      {"KILN_EW_BLOCKS_PER_SM", Kind::kLevel, "96", "1..512",
       "blocks per SM of a generated contiguous kernel's grid, at most (its threads loop over the "
       "rest; A/B)"},
      {"KILN_EW_SMALL", Kind::kBool, "on", "",
       "off: contiguous work of one block runs the generated _contig kernel, not the straight-line "
       "_small one (A/B)"},
      {"KILN_EW_STREAM", Kind::kBool, "off", "",
       "on: generated contiguous/rows kernels load and store with streaming hints (A/B)"},
      {"KILN_CAT_SINK_CUDA", Kind::kBool, "on", "",
       "off: on CUDA, an elementwise op reading a cat no longer computes on the cat's parts "
       "(transformers' rotary embedding then takes several kernels; CompileOptions::"
       "cuda_cat_sinking's default; on the CPU it always does)"},
      {"KILN_EW_COMBINE", Kind::kBool, "on", "",
       "off: small independent pointwise kernels (a decode step's RoPE of q and of k) run apart "
       "instead of as one combo kernel (CompileOptions::horizontal_fusion's default)"},
  };
  return table;
}

std::string SettingsTable() {
  std::string s = "| variable | values | default | what it does |\n|---|---|---|---|\n";
  for (const Setting& v : Settings()) {
    absl::StrAppend(&s, "| `", v.name, "` | ", Values(v), " | ", *v.fallback ? v.fallback : "unset",
                    " | ", v.meaning, " |\n");
  }
  return s;
}

bool EnvBool(const char* name) {
  const Setting& s = Find(name, Kind::kBool);
  const std::string v = Raw(s);
  const int b = BoolWord(v);
  KILN_CHECK(b >= 0, name, "='", v, "': expected ", Values(s));
  return b == 1;
}

int EnvLevel(const char* name) {
  const Setting& s = Find(name, Kind::kLevel);
  const std::vector<std::string> range = absl::StrSplit(s.choices, "..");
  const int lo = std::atoi(range[0].c_str()), hi = std::atoi(range[1].c_str());
  const std::string v = Raw(s);
  char* end = nullptr;
  const long n = std::strtol(v.c_str(), &end, 10);
  const bool number = !v.empty() && *end == '\0' && n >= -1000 && n <= 1000;
  const int level = number ? static_cast<int>(n) : BoolWord(v);
  KILN_CHECK(level >= lo && level <= hi, name, "='", v, "': expected a level in ", s.choices,
             " (or on/off)");
  return level;
}

std::string EnvChoice(const char* name) {
  const Setting& s = Find(name, Kind::kChoice);
  const std::string v = Lower(Raw(s));
  for (absl::string_view c : absl::StrSplit(s.choices, '|')) {
    if (v == c) return v;
  }
  KILN_FAIL(name, "='", Raw(s), "': expected one of ", s.choices);
}

std::string EnvPath(const char* name) { return Raw(Find(name, Kind::kPath)); }

std::vector<std::string> EnvNames(const char* name) {
  std::vector<std::string> names;
  for (absl::string_view part : absl::StrSplit(Raw(Find(name, Kind::kNames)), ',')) {
    const absl::string_view trimmed = absl::StripAsciiWhitespace(part);
    if (!trimmed.empty()) names.emplace_back(trimmed);
  }
  return names;
}

}  // namespace kiln
